// moonmoe/backend/cpu/gemm_small.hpp: C = alpha X W^T + beta C when X has few rows (a Linear on the handful of
// tokens one expert receives), without packing.
//
// A packing GEMM copies W into its panel layout on every call; with W [2048, 7168] (58 MB) and X [20, 7168] the copy
// costs more than the 0.6 GFLOP of arithmetic, so an MoE's routed experts ran at ~55% of the SGEMM rate. Here each
// output is a dot product of a row of X with a row of W, both contiguous: tiles of 4 rows of X by 4 rows of W keep
// 16 AVX-512 accumulators, W is streamed once per k-chunk and the X chunk stays in L2 (k-chunks of 2048: 32 rows x
// 8 KB). Threads split the rows of W, so every output is computed by one thread in one order: results do not
// depend on the thread count.
#pragma once

#include <algorithm>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "../../tensor/tensor.hpp"
#include "threads.hpp"

namespace moonmoe::backend::cpu_detail {

/// The fast path applies up to this many rows of X (beyond it a packing GEMM reuses W enough to win).
inline constexpr index_t small_gemm_rows = 64;

#if defined(__AVX512F__)
inline constexpr bool have_small_gemm = true;

/// out[i][j] = sum over [k0, k1) of x_i . w_j for MR rows of x and NR rows of w.
template <int MR, int NR>
inline void dot_tile(const float* x, index_t ldx, const float* w, index_t ldw, index_t k0, index_t k1,
                     float (&out)[4][4]) {
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    index_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        __m512 wv[NR];
        for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * ldw + k);
        for (int i = 0; i < MR; ++i) {
            const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
            for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < k1) {
        const __mmask16 mask = __mmask16((1u << unsigned(k1 - k)) - 1u);
        __m512 wv[NR];
        for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_ps(mask, w + j * ldw + k);
        for (int i = 0; i < MR; ++i) {
            const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + k);
            for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) out[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}

/// dot_tile for a tile of mr x nr (1..4 each) chosen at run time.
template <int MR>
inline void dot_tile_rows(index_t nr, const float* x, index_t ldx, const float* w, index_t ldw, index_t k0, index_t k1,
                          float (&out)[4][4]) {
    switch (nr) {
        case 1: dot_tile<MR, 1>(x, ldx, w, ldw, k0, k1, out); break;
        case 2: dot_tile<MR, 2>(x, ldx, w, ldw, k0, k1, out); break;
        case 3: dot_tile<MR, 3>(x, ldx, w, ldw, k0, k1, out); break;
        default: dot_tile<MR, 4>(x, ldx, w, ldw, k0, k1, out); break;
    }
}
inline void dot_tile_any(index_t mr, index_t nr, const float* x, index_t ldx, const float* w, index_t ldw, index_t k0,
                         index_t k1, float (&out)[4][4]) {
    switch (mr) {
        case 1: dot_tile_rows<1>(nr, x, ldx, w, ldw, k0, k1, out); break;
        case 2: dot_tile_rows<2>(nr, x, ldx, w, ldw, k0, k1, out); break;
        case 3: dot_tile_rows<3>(nr, x, ldx, w, ldw, k0, k1, out); break;
        default: dot_tile_rows<4>(nr, x, ldx, w, ldw, k0, k1, out); break;
    }
}

/// C [m, n] = alpha X [m, k] W [n, k]^T + beta C, m <= small_gemm_rows, rows of every operand contiguous.
inline void gemm_small_nt(float alpha, View<const float, 2> X, View<const float, 2> W, float beta, View<float, 2> C) {
    const index_t m = X.shape[0], n = W.shape[0], k = X.shape[1];
    constexpr index_t kc = 2048;
    const index_t blocks = (n + 3) / 4;
    for (index_t k0 = 0; k0 < k; k0 += kc) {
        const index_t k1 = std::min(k, k0 + kc);
        const bool first = k0 == 0;
        parallel_for(blocks, [&](index_t b) {
            const index_t j0 = 4 * b, nr = std::min<index_t>(4, n - j0);
            for (index_t i0 = 0; i0 < m; i0 += 4) {
                const index_t mr = std::min<index_t>(4, m - i0);
                float out[4][4];
                dot_tile_any(mr, nr, X.data + i0 * X.strides[0], X.strides[0], W.data + j0 * W.strides[0], W.strides[0],
                             k0, k1, out);
                for (index_t i = 0; i < mr; ++i) {
                    float* c = C.data + (i0 + i) * C.strides[0] + j0;
                    for (index_t j = 0; j < nr; ++j) {
                        const float v = alpha * out[i][j];
                        if (!first) c[j] += v;
                        else c[j] = beta == 0.0f ? v : beta * c[j] + v;
                    }
                }
            }
        });
    }
}
#else
inline constexpr bool have_small_gemm = false;
inline void gemm_small_nt(float, View<const float, 2>, View<const float, 2>, float, View<float, 2>) {}
#endif

}  // namespace moonmoe::backend::cpu_detail
