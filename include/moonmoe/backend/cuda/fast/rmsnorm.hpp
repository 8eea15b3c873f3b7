// moonmoe/backend/cuda/fast/rmsnorm.hpp: RMSNorm forward and backward's dx for RowOps<cuda>, a warp per row (a
// block of 256 threads per row for wide rows).
// header-check: nvcc-only
//
// The contract is RowOps' (backend/rows.hpp), selected inside rmsnorm_forward / rmsnorm_backward when
// CudaFastKernels::rmsnorm is on (fast/select.hpp). The portable functors give a row to one thread, whose loads fall
// a row pitch apart; here the lanes of a warp read consecutive columns (coalesced) and the row's sum of squares
// (forward) or dot of weight * dy with x (backward) is reduced by shuffles. The partial sums are in double, as the
// portable path's, but added in another order (per lane, then a tree), so results agree to rounding, not bitwise.
// rmsnorm_backward's dweight stays the portable chunked column sums (already one thread per column, coalesced).
#pragma once

#include "warp.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else warp.hpp has stopped with an #error

#include <cmath>

#include "../../../tensor/tensor.hpp"
#include "../../rows.hpp"

namespace moonmoe::backend::cuda_fast {

/// Rows wider than this get a block of 256 threads each, narrower ones a warp (four rows per block of 128).
inline constexpr index_t rmsnorm_block_columns = 2048;

/// The sum of v over the `Threads` threads that share a row (a warp, or a block of 256 with 8 warps).
template <int Threads>
__device__ double row_sum(double v) {
    v = group_sum(v);
    if constexpr (Threads == 32) {
        return v;
    } else {
        __shared__ double warps[Threads / 32];
        __syncthreads();  // a previous call's readers are done
        if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = v;
        __syncthreads();
        double s = 0.0;
        for (int w = 0; w < Threads / 32; ++w) s += warps[w];
        return s;
    }
}

/// The row of this thread's group and its rank in it: a warp per row (blocks of 128), or a block per row.
template <int Threads>
__device__ __forceinline__ index_t row_of_thread(int& rank) {
    if constexpr (Threads == 32) {
        rank = threadIdx.x % 32;
        return index_t(blockIdx.x) * 4 + threadIdx.x / 32;
    } else {
        rank = threadIdx.x;
        return blockIdx.x;
    }
}

template <int Threads>
__global__ void __launch_bounds__(Threads == 32 ? 128 : Threads)
    rmsnorm_forward_kernel(const float* x, index_t x_pitch, const float* w, float eps, float* y, index_t y_pitch,
                           float* rstd, index_t rows, index_t n) {
    int rank = 0;
    const index_t r = row_of_thread<Threads>(rank);
    if (r >= rows) return;  // a whole warp (or block) leaves together
    const float* xr = x + r * x_pitch;
    float* yr = y + r * y_pitch;
    double ss = 0.0;
    for (index_t j = rank; j < n; j += Threads) ss += double(xr[j]) * double(xr[j]);
    ss = row_sum<Threads>(ss);
    const float inv = 1.0f / sqrtf(float(ss / double(n)) + eps);
    if (rank == 0) rstd[r] = inv;
    for (index_t j = rank; j < n; j += Threads) yr[j] = w[j] * (xr[j] * inv);
}

template <int Threads>
__global__ void __launch_bounds__(Threads == 32 ? 128 : Threads)
    rmsnorm_dx_kernel(const float* x, index_t x_pitch, const float* w, const float* rstd, const float* dy,
                      index_t dy_pitch, float* dx, index_t dx_pitch, index_t rows, index_t n, bool accumulate) {
    int rank = 0;
    const index_t r = row_of_thread<Threads>(rank);
    if (r >= rows) return;
    const float *xr = x + r * x_pitch, *gr = dy + r * dy_pitch;
    float* dr = dx + r * dx_pitch;
    double dot = 0.0;
    for (index_t j = rank; j < n; j += Threads) dot += double(w[j] * gr[j]) * double(xr[j]);
    dot = row_sum<Threads>(dot);
    const float inv = rstd[r];
    const float c = float(dot / double(n)) * inv * inv * inv;
    for (index_t j = rank; j < n; j += Threads) {
        const float v = inv * w[j] * gr[j] - c * xr[j];
        dr[j] = accumulate ? dr[j] + v : v;
    }
}

/// rmsnorm_forward (backend/rows.hpp); arguments already checked by the primitive.
inline void rmsnorm_forward(View<const float, 2, cuda> x, View<const float, 1, cuda> weight, float eps,
                            View<float, 2, cuda> y, View<float, 1, cuda> rstd) {
    const index_t rows = x.shape[0], n = x.shape[1];
    if (rows == 0) return;
    if (n > rmsnorm_block_columns) {
        rmsnorm_forward_kernel<256><<<unsigned(rows), 256, 0, current_stream()>>>(
            x.data, x.strides[0], weight.data, eps, y.data, y.strides[0], rstd.data, rows, n);
    } else {
        rmsnorm_forward_kernel<32><<<unsigned((rows + 3) / 4), 128, 0, current_stream()>>>(
            x.data, x.strides[0], weight.data, eps, y.data, y.strides[0], rstd.data, rows, n);
    }
    check_launch("rmsnorm_forward_kernel<<<...>>>");
}

/// rmsnorm_backward's dx (backend/rows.hpp); arguments already checked by the primitive.
inline void rmsnorm_backward_dx(View<const float, 2, cuda> x, View<const float, 1, cuda> weight,
                                View<const float, 1, cuda> rstd, View<const float, 2, cuda> dy, View<float, 2, cuda> dx,
                                bool accumulate_dx) {
    const index_t rows = x.shape[0], n = x.shape[1];
    if (rows == 0) return;
    if (n > rmsnorm_block_columns) {
        rmsnorm_dx_kernel<256><<<unsigned(rows), 256, 0, current_stream()>>>(x.data, x.strides[0], weight.data,
                                                                             rstd.data, dy.data, dy.strides[0], dx.data,
                                                                             dx.strides[0], rows, n, accumulate_dx);
    } else {
        rmsnorm_dx_kernel<32><<<unsigned((rows + 3) / 4), 128, 0, current_stream()>>>(
            x.data, x.strides[0], weight.data, rstd.data, dy.data, dy.strides[0], dx.data, dx.strides[0], rows, n,
            accumulate_dx);
    }
    check_launch("rmsnorm_dx_kernel<<<...>>>");
}

}  // namespace moonmoe::backend::cuda_fast

#endif  // defined(MOONMOE_CUDA_EMULATED)
