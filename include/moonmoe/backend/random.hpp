// moonmoe/backend/random.hpp: counter-based random fills, the same numbers on every backend.
//
// RandomOps<B>:
//   fill_uniform(out, lo, hi, seed)      U(lo, hi)
//   fill_normal(out, mean, stddev, seed) N(mean, stddev^2), Box-Muller in double
// Element k (in row-major order of `out`'s shape) depends on (seed, k) alone: splitmix64 of the counter, so a
// tensor filled on the CPU and on the GPU holds the same values, whatever the thread split.
#pragma once

#include <cstdint>

#include "../config/macros.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RandomOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no RNG primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

namespace rng {
/// splitmix64 (Steele, Lea, Flood 2014): a counter-based generator.
MOONMOE_HD inline std::uint64_t mix(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
/// A double in (0, 1) for counter i of stream `seed`.
MOONMOE_HD inline double uniform01(std::uint64_t seed, std::uint64_t i) {
    return (double(mix(seed * 0x100000001B3ull + i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
}  // namespace rng

}  // namespace moonmoe::backend
