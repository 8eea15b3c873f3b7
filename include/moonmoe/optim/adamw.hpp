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

template <class B = cpu>
void adamw_step(const AdamWConfig& c, double lr, long long t, float* w, const float* g, float* m, float* v,
                index_t n) {
    const double bias1 = 1.0 - std::pow(c.beta1, double(t)), bias2 = 1.0 - std::pow(c.beta2, double(t));
    const float decay = float(1.0 - lr * c.weight_decay), step = float(lr / bias1);
    const float b1 = float(c.beta1), b2 = float(c.beta2), eps = float(c.eps), root2 = float(std::sqrt(bias2));
    backend::Ops<B>::for_each(n, [&](index_t i) {
        w[i] *= decay;
        m[i] += (1.0f - b1) * (g[i] - m[i]);                 // exp_avg.lerp_(g, 1 - b1)
        v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
        w[i] -= step * m[i] / (std::sqrt(v[i]) / root2 + eps);
    });
}

}  // namespace moonmoe::optim
