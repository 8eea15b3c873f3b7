// moonmoe/backend/offload.hpp: which backends can offload activations to host memory (Kimi K2 technical report,
// §2.4.3 "Activation CPU offload"), the offload family of the backend contract. `OffloadOps<B>::type` is the
// backend's mover where `offloads<B>` is true: the CUDA backend's HostOffload (backend/cuda/offload.hpp). A backend
// whose memory is the host's has nothing to offload to: models asking for Activations<Offload<true>> there are
// refused (nn/offload.hpp). Unlike the families that Ops<B> gathers (backend/backend.hpp), this one is optional: its
// primary definition is the answer "no offload", not a compile error, and only a backend that offloads specialises
// it. (The model's policy Offload<bool>, config/activations.hpp, is what asks for it.)
#pragma once

namespace moonmoe::backend {

template <class B>
struct OffloadOps {
    static constexpr bool available = false;
};

template <class B>
inline constexpr bool offloads = OffloadOps<B>::available;

}  // namespace moonmoe::backend
