// moonmoe/nn/offload.hpp: activation offload for a model's caches (Activations<Offload<true>>, config/activations.hpp;
// Kimi K2 technical report, §2.4.3 "Activation CPU offload"), on a backend that offloads (backend/offload.hpp: the
// CUDA backend). After a layer's forward every matrix its cache keeps (nn/kept.hpp: f32, bf16 or FP8 tiles) moves
// to pinned host memory on the copy stream; the backward prefetches the next layer down while it computes the
// current one, and takes each layer's matrices back before its backward. The per-token statistics and routing
// plans (1/rms, log-sum-exp, the router's scores and plans: under 10 % of a layer's bytes) stay on the device.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "../config/model_config.hpp"
#include "../backend/offload.hpp"
#include "kept.hpp"

namespace moonmoe::nn {

/// Refuses Activations<Offload<true>> on a backend with nothing to offload to (the CPU backend).
template <class B>
void check_offload(bool offload) {
    if (offload && !backend::offloads<B>)
        throw config_error(std::string("Activations<Offload<true>>: activation offload moves what the backward needs "
                                       "from GPU memory to host memory; the ") +
                           B::name +
                           " backend's activations are in host memory already. Offload runs on the CUDA backend "
                           "(nn::Transformer<moonmoe::cuda>); on the CPU use Activations<> without Offload");
}

template <class B>
class KeptOffload {
    static_assert(backend::offloads<B>, "KeptOffload<B>: the backend has no activation offload (backend/offload.hpp)");
    using Host = typename backend::OffloadOps<B>::type;
    template <class T>
    using Ticket = typename Host::template Ticket<T, 2>;

public:
    /// Moves the cache's kept matrices to host memory.
    template <class Cache>
    void offload(Cache& c) {
        c.for_each_kept([&](KeptMatrix<B>& m) {
            if (m.empty()) return;
            Away& a = away_[&m];
            drop(a);  // a stale one: its forward's backward never ran
            a.f32 = host_.offload(std::move(m.f32));
            a.b16 = host_.offload(std::move(m.b16));
            a.codes = host_.offload(std::move(m.fp8.codes));
            a.scales = host_.offload(std::move(m.fp8.scales));
        });
    }
    /// Queues the copies back (they run while the device computes what was queued before them).
    template <class Cache>
    void prefetch(Cache& c) {
        c.for_each_kept([&](KeptMatrix<B>& m) {
            const auto it = away_.find(&m);
            if (it == away_.end()) return;
            host_.prefetch(it->second.f32), host_.prefetch(it->second.b16);
            host_.prefetch(it->second.codes), host_.prefetch(it->second.scales);
        });
    }
    /// The cache's kept matrices back on the device (the compute stream waits for their copies).
    template <class Cache>
    void restore(Cache& c) {
        c.for_each_kept([&](KeptMatrix<B>& m) {
            const auto it = away_.find(&m);
            if (it == away_.end()) return;
            m.f32 = host_.take(it->second.f32);
            m.b16 = host_.take(it->second.b16);
            m.fp8.codes = host_.take(it->second.codes);
            m.fp8.scales = host_.take(it->second.scales);
            away_.erase(it);
        });
    }
    /// Forgets everything still offloaded (a forward whose backward will not run).
    void drop_all() {
        for (auto& [m, a] : away_) drop(a);
        away_.clear();
    }

    const Host& host() const { return host_; }

private:
    struct Away {
        Ticket<float> f32, scales;
        Ticket<bf16> b16;
        Ticket<f8_e4m3> codes;
    };
    void drop(Away& a) { host_.drop(a.f32), host_.drop(a.b16), host_.drop(a.codes), host_.drop(a.scales); }

    Host host_;
    std::map<const KeptMatrix<B>*, Away> away_;
};

}  // namespace moonmoe::nn
