// moonmoe/backend/cuda/random.hpp: RandomOps<cuda> (backend/random.hpp): the CPU's counter-based numbers, element by
// element on the device.
//
// Element k = i * cols + j takes the same counters and the same arithmetic as RandomOps<cpu>: uniform fills are
// bitwise the CPU's (their product and sum rounded apart, never one FMA: fn::add_product); normal fills go through
// the device's double log / sqrt / cos, which CUDA documents to within 1-2 ulp of double, so a float result may
// differ from the host's by one float ulp in rare elements (none in the emulated mode, which calls the host's libm).
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cmath>
#include <cstdint>

#include "../functors.hpp"
#include "../random.hpp"

namespace moonmoe::backend {

namespace cuda_detail {

/// x = U(lo, hi) for element (i, j) of a [rows, cols] tensor: lo + (hi - lo) u rounded twice, as on the CPU.
struct UniformAt {
    float lo, hi;
    std::uint64_t seed;
    index_t cols;
    MOONMOE_HD void operator()(index_t i, index_t j, float& x) const {
        x = fn::add_product(lo, hi - lo, float(rng::uniform01(seed, std::uint64_t(i * cols + j))));
    }
};

/// x = N(mean, stddev^2) for element (i, j): Box-Muller on counters 2k and 2k + 1, in double.
struct NormalAt {
    float mean, stddev;
    std::uint64_t seed;
    index_t cols;
    MOONMOE_HD void operator()(index_t i, index_t j, float& x) const {
        const std::uint64_t k = std::uint64_t(i * cols + j);
        const double u1 = rng::uniform01(seed, 2 * k), u2 = rng::uniform01(seed, 2 * k + 1);
        const double z = ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
        x = float(mean + stddev * z);
    }
};

}  // namespace cuda_detail

template <>
struct RandomOps<cuda> {
    /// Fills `out` with U(lo, hi): element k (row-major) depends only on (seed, k), as on the CPU.
    static void fill_uniform(View<float, 2, cuda> out, float lo, float hi, std::uint64_t seed) {
        MapOps<cuda>::map_indexed(cuda_detail::UniformAt{lo, hi, seed, out.shape[1]}, out);
    }

    /// Fills `out` with N(mean, stddev^2): element k (row-major) depends only on (seed, k), as on the CPU.
    static void fill_normal(View<float, 2, cuda> out, float mean, float stddev, std::uint64_t seed) {
        MapOps<cuda>::map_indexed(cuda_detail::NormalAt{mean, stddev, seed, out.shape[1]}, out);
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
