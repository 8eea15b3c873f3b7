// moonmoe/backend/cpu/threads.hpp: the CPU thread count and the parallel loop every row kernel runs on.
//
// Work is split statically by index, so for a fixed thread count each element is always computed by the same
// code path and results are bitwise repeatable. Without OpenMP everything runs on one thread.
#pragma once

#include <Eigen/Core>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../../config/named.hpp"

namespace moonmoe {

/// Threads used by GEMM and by the parallel loops (default: what OpenMP chooses, usually the core count).
inline void set_threads(int n) {
#if defined(_OPENMP)
    omp_set_num_threads(n);
#endif
    Eigen::setNbThreads(n);
}

inline int threads() {
#if defined(_OPENMP)
    return omp_get_max_threads();
#else
    return 1;
#endif
}

namespace backend::cpu_detail {

/// Calls f(i) for i in [0, n), in parallel, statically partitioned. f must not write what another i writes.
template <class F>
void parallel_for(index_t n, F&& f) {
#if defined(_OPENMP)
    if (n > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
        for (index_t i = 0; i < n; ++i) f(i);
        return;
    }
#endif
    for (index_t i = 0; i < n; ++i) f(i);
}

}  // namespace backend::cpu_detail
}  // namespace moonmoe
