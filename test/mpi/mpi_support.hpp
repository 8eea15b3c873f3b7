// The world communicator of the MPI test binary (test/mpi/main.cpp sets it before the cases run).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include <moonmoe/parallel/mpi.hpp>

namespace moonmoe::testing {

inline std::unique_ptr<parallel::Communicator>& world_communicator() {
    static std::unique_ptr<parallel::Communicator> c;
    return c;
}
inline parallel::Communicator& world() { return *world_communicator(); }

/// The largest difference of a and b over the largest magnitude of b (the difference itself when b is zero).
inline double scaled_error(const float* a, const float* b, index_t n) {
    double diff = 0, scale = 0;
    for (index_t i = 0; i < n; ++i)
        diff = std::max(diff, std::abs(double(a[i]) - b[i])), scale = std::max(scale, std::abs(double(b[i])));
    return scale > 0 ? diff / scale : diff;
}

/// 16 token ids below `vocab` drawn from `seed`: a micro-batch, the same on every rank that asks with that seed.
inline std::vector<index_t> random_ids(index_t vocab, std::uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::vector<index_t> ids(16);
    for (index_t& t : ids) t = index_t(gen() % std::uint64_t(vocab));
    return ids;
}

}  // namespace moonmoe::testing
