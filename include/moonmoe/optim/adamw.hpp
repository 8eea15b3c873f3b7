// moonmoe/optim/adamw.hpp: one AdamW step (torch.optim.AdamW semantics) on any parameter, for what Muon does not
// take: embeddings, the output head, norm gains.
//
//   W *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   W -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)          (t = this step, from 1)
#pragma once

#include <algorithm>
#include <cmath>

#include <Eigen/Core>

#include "../backend/backend.hpp"
#include "../config/optimizer.hpp"

namespace moonmoe::optim {

template <class B = cpu>
void adamw_step(const AdamWConfig& c, double lr, long long t, float* w, const float* g, float* m, float* v,
                index_t n) {
    const double bias1 = 1.0 - std::pow(c.beta1, double(t)), bias2 = 1.0 - std::pow(c.beta2, double(t));
    const float decay = float(1.0 - lr * c.weight_decay), step = float(lr / bias1);
    const float b1 = float(c.beta1), b2 = float(c.beta2), eps = float(c.eps), root2 = float(std::sqrt(bias2));
    // Blocks of 16k elements over the threads; each block as Eigen array expressions, so the square root and the
    // division vectorise (a scalar loop calling std::sqrt does not, since sqrtf may set errno). Per element the
    // operations and their order are those of the formula above.
    constexpr index_t block = 16384;
    backend::Ops<B>::for_each((n + block - 1) / block, [&](index_t k) {
        const index_t lo = k * block, len = std::min(block, n - lo);
        Eigen::Map<Eigen::ArrayXf> W(w + lo, len), M(m + lo, len), V(v + lo, len);
        const Eigen::Map<const Eigen::ArrayXf> G(g + lo, len);
        W *= decay;
        M += (1.0f - b1) * (G - M);  // exp_avg.lerp_(g, 1 - b1)
        V = V * b2 + (1.0f - b2) * G * G;
        W -= step * M / (V.sqrt() / root2 + eps);
    });
}

}  // namespace moonmoe::optim
