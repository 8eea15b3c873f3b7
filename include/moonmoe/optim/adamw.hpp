// moonmoe/optim/adamw.hpp: one AdamW step (torch.optim.AdamW semantics) on any parameter, for what Muon does not
// take: embeddings, the output head, norm gains.
//
//   W *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   W -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)          (t = this step, from 1)
#pragma once

#include <cmath>

#include "../backend/backend.hpp"
#include "../config/optimizer.hpp"

namespace moonmoe::optim {

/// The element-wise AdamW step t (from 1) at learning rate lr.
inline fn::AdamWUpdate adamw_update(const AdamWConfig& c, double lr, long long t) {
    const double bias1 = 1.0 - std::pow(c.beta1, double(t)), bias2 = 1.0 - std::pow(c.beta2, double(t));
    return {.decay = float(1.0 - lr * c.weight_decay),
            .b1 = float(c.beta1),
            .b2 = float(c.beta2),
            .step = float(lr / bias1),
            .root2 = float(std::sqrt(bias2)),
            .eps = float(c.eps)};
}

/// One step on the n elements of a parameter: w, g, m (exp_avg) and v (exp_avg_sq) point into the memory of
/// backend B (host memory for cpu, device memory for cuda) and are never read on the host here.
template <class B = cpu>
void adamw_step(const AdamWConfig& c, double lr, long long t, float* w, const float* g, float* m, float* v, index_t n) {
    backend::Ops<B>::adamw_update(adamw_update(c, lr, t), View<float, 1, B>(w, {n}), View<const float, 1, B>(g, {n}),
                                  View<float, 1, B>(m, {n}), View<float, 1, B>(v, {n}));
}

}  // namespace moonmoe::optim
