// moonmoe/backend/cpu/random.hpp: RandomOps<cpu> (backend/random.hpp).
#pragma once

#include <cmath>

#include "../../tensor/tensor.hpp"
#include "../random.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct RandomOps<cpu> {
    /// Fills `out` with U(lo, hi) from a counter-based generator: element i depends only on (seed, i).
    static void fill_uniform(View<float, 2> out, float lo, float hi, std::uint64_t seed) {
        const index_t cols = out.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t r) {
            for (index_t j = 0; j < cols; ++j)
                out.data[r * out.strides[0] + j] =
                    lo + (hi - lo) * float(rng::uniform01(seed, std::uint64_t(r * cols + j)));
        });
    }

    /// Fills `out` with N(mean, std^2) from a counter-based generator: element i depends only on (seed, i).
    static void fill_normal(View<float, 2> out, float mean, float stddev, std::uint64_t seed) {
        const index_t cols = out.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t r) {
            for (index_t j = 0; j < cols; ++j) {
                const std::uint64_t i = std::uint64_t(r * cols + j);
                const double u1 = rng::uniform01(seed, 2 * i), u2 = rng::uniform01(seed, 2 * i + 1);
                const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
                out.data[r * out.strides[0] + j] = float(mean + stddev * z);
            }
        });
    }
};

}  // namespace moonmoe::backend
