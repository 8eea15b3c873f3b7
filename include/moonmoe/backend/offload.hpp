// moonmoe/backend/offload.hpp: which backends can offload activations to host memory (Kimi K2 technical report,
// §2.4.3 "Activation CPU offload"). `Offload<B>::type` is the backend's mover where `offloads<B>` is true: the CUDA
// backend's HostOffload (backend/cuda/offload.hpp). A backend whose memory is the host's has nothing to offload to:
// models asking for Activations<Offload<true>> there are refused (nn/transformer.hpp).
#pragma once

namespace moonmoe::backend {

template <class B>
struct Offload {
    static constexpr bool available = false;
};

template <class B>
inline constexpr bool offloads = Offload<B>::available;

}  // namespace moonmoe::backend
