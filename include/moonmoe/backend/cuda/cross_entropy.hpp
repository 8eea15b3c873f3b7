// moonmoe/backend/cuda/cross_entropy.hpp: RowOps<cuda>::cross_entropy's rows on a GPU, a block of 256 threads per
// row.
// header-check: nvcc-only
//
// The portable functor (cuda/rows.hpp, CrossEntropyRow) gives a row to one thread: over K2's 163,840 columns that is
// 163,840 serial loads per thread, a row pitch apart across a warp (uncoalesced), and a few thousand rows leave most
// of the device idle. Here the 256 threads of a block read consecutive columns of their row (coalesced) in three
// passes: the row's maximum, the sum of exp(z - max) in double, then the gradient (softmax - onehot) / count written
// as the loss's. The arithmetic is the functor's (double exp and log, the gradient rounded to float, the target's
// 1 / count subtracted in float), summed in another order (per thread, then a tree), so results agree to rounding,
// not bitwise; the per-row losses still go to a scratch that one thread sums in row order.
#pragma once

#include "fast/warp.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else warp.hpp has stopped with an #error

#include <cmath>

#include "../../tensor/tensor.hpp"

namespace moonmoe::backend::cuda_detail {

inline constexpr int cross_entropy_threads = 256;

/// The block's reduction of v (every thread gets it): the sum, or the maximum when `max`.
template <bool max, class T>
__device__ T block_reduce(T v) {
    __shared__ T warps[cross_entropy_threads / 32];
    if constexpr (max) v = cuda_fast::group_max(v);
    else
        v = cuda_fast::group_sum(v);
    __syncthreads();  // a previous call's readers are done with `warps`
    if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = v;
    __syncthreads();
    T r = warps[0];
    for (int w = 1; w < cross_entropy_threads / 32; ++w) r = max ? (warps[w] > r ? warps[w] : r) : r + warps[w];
    return r;
}

/// Row blockIdx.x: its loss (0 when ignored) into per_row, and its gradient row when dz is set, scaled by
/// weights[row] or, without weights, by 1 / count (Threads = cross_entropy_threads; a template, as every kernel of
/// a header must be).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    cross_entropy_rows_kernel(const float* z, index_t z_pitch, const index_t* targets, index_t ignore, index_t count,
                              const float* weights, index_t V, float* dz, index_t dz_pitch, double* per_row) {
    const index_t t = blockIdx.x;
    const float* zr = z + t * z_pitch;
    float* dr = dz ? dz + t * dz_pitch : nullptr;
    const index_t target = targets[t];
    if (target == ignore) {
        if (threadIdx.x == 0) per_row[t] = 0.0;
        if (dr)
            for (index_t v = threadIdx.x; v < V; v += cross_entropy_threads) dr[v] = 0.0f;
        return;
    }
    float m = -INFINITY;
    for (index_t v = threadIdx.x; v < V; v += cross_entropy_threads) m = zr[v] > m ? zr[v] : m;
    m = block_reduce<true>(m);
    double sum = 0.0;
    for (index_t v = threadIdx.x; v < V; v += cross_entropy_threads) sum += ::exp(double(zr[v] - m));
    sum = block_reduce<false>(sum);
    const double lse = double(m) + ::log(sum);
    if (threadIdx.x == 0) per_row[t] = lse - double(zr[target]);
    if (dr && weights) {
        const double w = weights[t];
        for (index_t v = threadIdx.x; v < V; v += cross_entropy_threads) {
            const double p = ::exp(double(zr[v]) - lse);
            dr[v] = float((v == target ? p - 1.0 : p) * w);
        }
    } else if (dr) {
        const float share = 1.0f / float(count);
        for (index_t v = threadIdx.x; v < V; v += cross_entropy_threads) {
            const float g = float(::exp(double(zr[v]) - lse) / double(count));
            dr[v] = v == target ? g - share : g;
        }
    }
}

/// Every row of cross_entropy: one block each, on the current stream.
inline void cross_entropy_rows(const float* z, index_t z_pitch, const index_t* targets, index_t ignore, index_t count,
                               const float* weights, index_t rows, index_t V, float* dz, index_t dz_pitch,
                               double* per_row) {
    if (rows == 0) return;
    cross_entropy_rows_kernel<cross_entropy_threads><<<unsigned(rows), cross_entropy_threads, 0, current_stream()>>>(
        z, z_pitch, targets, ignore, count, weights, V, dz, dz_pitch, per_row);
    cuda_fast::check_launch("cross_entropy_rows_kernel<<<rows, 256, 0, current_stream()>>>");
}

}  // namespace moonmoe::backend::cuda_detail

#endif  // defined(MOONMOE_CUDA_EMULATED)
