// moonmoe/nn/gradcheck.hpp: a numerical gradient checker every module's backward is tested with.
//
// For a scalar loss L(theta) and an analytic gradient g, it compares the directional derivative g.v with the
// central difference (L(theta + eps v) - L(theta - eps v)) / (2 eps) along a unit direction v. A direction
// (instead of every coordinate) costs two forwards per check and exercises every element at once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "../backend/memory.hpp"
#include "../config/named.hpp"

namespace moonmoe::nn {

struct GradCheck {
    std::string what;
    double analytic = 0, numeric = 0;
    /// |analytic - numeric| / max(|analytic|, |numeric|, floor)
    double relative_error = 0;
};

namespace detail {
inline double gaussian(std::uint64_t& state) {  // Box-Muller on splitmix64
    auto next = [&state] {
        std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return (double((z ^ (z >> 31)) >> 11) + 0.5) / 9007199254740992.0;
    };
    const double u1 = next(), u2 = next();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
}  // namespace detail

/// Checks `grad` (analytic dL/dx for the n values at x) against central differences of `loss` along a random
/// direction. `x` is restored afterwards. `floor` keeps tiny gradients from inflating the relative error. x and grad
/// point into backend B's memory: the check reads them to the host once and writes each perturbed x back, since the
/// direction and the dot product are computed on the host (a test utility, not a training path).
template <class B = cpu>
GradCheck check_gradient(const std::string& what, float* x, const float* grad, index_t n,
                         const std::function<double()>& loss, double eps = 1e-2, std::uint64_t seed = 1,
                         double floor = 1e-6) {
    using Memory = backend::Memory<B>;
    const std::size_t bytes = std::size_t(n) * sizeof(float);
    std::vector<float> saved(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n)), moved(saved.size());
    Memory::to_host(saved.data(), x, bytes);  // host sync: the direction and g.v are host arithmetic
    Memory::to_host(g.data(), grad, bytes);
    // v = unit(unit(g) + unit(random)): half along the claimed gradient, so the signal g.v ~ |g| / sqrt(2)
    // stands well above f32 noise, half in a random direction, so a gradient off in direction fails too.
    std::vector<double> v(static_cast<std::size_t>(n));
    double rnorm = 0.0, gnorm = 0.0;
    for (auto& d : v) d = detail::gaussian(seed), rnorm += d * d;
    for (index_t i = 0; i < n; ++i) gnorm += double(g[i]) * g[i];
    rnorm = std::sqrt(rnorm), gnorm = std::sqrt(gnorm);
    double norm = 0.0;
    for (index_t i = 0; i < n; ++i) {
        v[i] = v[i] / rnorm + (gnorm > 0 ? g[i] / gnorm : 0.0);
        norm += v[i] * v[i];
    }
    norm = std::sqrt(norm);
    GradCheck r{what};
    for (index_t i = 0; i < n; ++i) v[i] /= norm, r.analytic += double(g[i]) * v[i];
    auto loss_at = [&](double sign) {
        for (index_t i = 0; i < n; ++i) moved[i] = float(saved[i] + sign * eps * v[i]);
        Memory::to_device(x, moved.data(), bytes);
        return loss();
    };
    const double plus = loss_at(1.0), minus = loss_at(-1.0);
    Memory::to_device(x, saved.data(), bytes);
    r.numeric = (plus - minus) / (2.0 * eps);
    r.relative_error = std::abs(r.analytic - r.numeric) / std::max({std::abs(r.analytic), std::abs(r.numeric), floor});
    return r;
}

}  // namespace moonmoe::nn
