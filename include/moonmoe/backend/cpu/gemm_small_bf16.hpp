// moonmoe/backend/cpu/gemm_small_bf16.hpp: C = alpha X W^T + beta C with bf16 X and W and up to a few hundred rows
// of X, on AVX512_BF16's dot products of k-pairs, without packing W.
//
// VDPBF16PS (Intel 64 and IA-32 Architectures Software Developer's Manual, vol. 2) adds to each of 16 f32 lanes the
// products of a pair of bf16 elements, a[2l] b[2l] + a[2l + 1] b[2l + 1]: 32 multiply-adds per instruction, where the
// f32 kernel of gemm_small.hpp widens a bf16 W in registers and does 16 per FMA. On a CPU whose VDPBF16PS runs at its
// FMA's rate (AMD Zen 4: 235 GFLOP/s per core against 117 for f32 FMAs, measured), that is twice the arithmetic and
// no widening. The layouts are gemm_small.hpp's f32 ones with a k-pair where those have one value of k, so that
// every element of C is one chain of VDPBF16PS over the k-pairs in order (s = dp(s, X[i, 2p..2p+1], W[j, 2p..2p+1])
// for p = 0, 1, ...; a last odd k paired with zero), then alpha s (+ beta C[i, j]), whatever the layout:
// - up to 8 rows of X, W's rows in the lanes: 16 rows of W x 16 k-pairs loaded and transposed in registers as 32-bit
//   words (transpose16), each vector (one k-pair of 16 rows of W) dotted with X's k-pair broadcast;
// - more rows of X, X's rows in the lanes: X^T packed as k-pairs (16 rows of X per vector, zeros past m), each k-pair
//   of W broadcast from memory onto up to four vectors of X's rows; k in chunks whose X^T stays near the core, each
//   tile's sums kept between chunks. Beyond 64 rows, X in panels of 32 rows (two vectors), every panel passing each
//   block of W's rows while that block is in L2, so that W, the large operand, is read from memory once and never
//   packed or transposed, where a packing GEMM transposes it (an expert's W of 2048 x 7168 on AMD Zen 5 at two
//   threads, paired runs: 128 tokens 0.89-0.93x oneDNN's time, 192 tokens 0.91-1.0x; docs/cpu_gemm.md).
// So on this kernel a row's bits depend neither on the other rows of X nor on the thread count (batched decoding
// bitwise equal to decoding alone wherever the rules send both here). They differ from the f32 kernels' (which sum k
// one value at a time) in rounding only.
// Measured against oneDNN's and PyTorch's bf16 kernels on the Kimi K2 products in docs/cpu_gemm.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "cpu_features.hpp"
#include "gemm_small.hpp"
#include "memory.hpp"
#include "threads.hpp"

namespace moonmoe::backend::cpu_detail {

/// The most rows of X that gemm_small_nt_bf16 takes: from 512 rows, oneDNN's packing kernels win on AMD Zen 5, the
/// one CPU where the kernel was timed at these sizes (an expert's W of 2048 x 7168 against 512 tokens: 16.9 against
/// 16.3 ms at two threads; 256 tokens 8.5 against 8.9; docs/cpu_gemm.md).
inline constexpr index_t small_gemm_bf16_rows = 512;

/// Whether gemm_small_nt_bf16 may be called: the running CPU has AVX-512 with AVX512_BF16 (and AVX512BW, for the
/// masked loads of a k tail).
inline bool small_gemm_bf16_available() noexcept {
#if MOONMOE_SMALL_GEMM_AVX512
    return small_gemm_available() && cpu_features().avx512bw && cpu_features().avx512_bf16;
#else
    return false;
#endif
}

/// Whether C = X W^T with bf16 X and W of this shape runs on gemm_small_nt_bf16: as takes_small_gemm (k >= 256,
/// n >= 64), up to small_gemm_bf16_rows rows of X, on a CPU with AVX512_BF16.
inline bool takes_small_gemm_bf16(Trans ta, Trans tb, index_t m, index_t n, index_t k) {
    return ta == Trans::no && tb == Trans::yes && m > 0 && m <= small_gemm_bf16_rows && k >= 256 && n >= 64 &&
           small_gemm_bf16_available();
}

#if MOONMOE_SMALL_GEMM_AVX512
#define MOONMOE_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define MOONMOE_UNROLL_16 _Pragma("GCC unroll 16")

// GCC 12's "may be used uninitialized" on the intrinsics' undefined lanes (gemm_small.hpp says why)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace dp {

/// s + a[2l] b[2l] + a[2l + 1] b[2l + 1] in each lane l: a holds X's k-pairs, b W's (the same order in both layouts).
MOONMOE_TARGET_AVX512_BF16 __attribute__((always_inline)) inline __m512 dot(__m512 s, __m512i a, __m512i b) {
    return _mm512_dpbf16_ps(s, (__m512bh)a, (__m512bh)b);
}

/// k-pair p of a row of k elements as one 32-bit word in every lane: elements 2p and 2p + 1, the second zero where
/// 2p + 1 is k.
MOONMOE_TARGET_AVX512_BF16 inline __m512i pair(const bf16* row, index_t p, index_t k) {
    std::uint32_t word = 0;
    std::memcpy(&word, row + 2 * p, 2 * p + 1 < k ? 4 : 2);
    return _mm512_set1_epi32(int(word));
}

/// k-pair p of a row that has element 2p + 1: one broadcast load.
MOONMOE_TARGET_AVX512_BF16 __attribute__((always_inline)) inline __m512i whole_pair(const bf16* row, index_t p) {
    std::uint32_t word;
    std::memcpy(&word, row + 2 * p, 4);
    return _mm512_set1_epi32(int(word));
}

/// 32 elements of a row from e (the first `count` of them where count < 32, zeros after), as 16 k-pairs.
MOONMOE_TARGET_AVX512_BF16 inline __m512 load_pairs(const bf16* e, index_t count) {
    if (count >= 32) return _mm512_castsi512_ps(_mm512_loadu_si512(e));
    const __mmask32 mask = __mmask32((std::uint64_t(1) << unsigned(std::max<index_t>(count, 0))) - 1u);
    return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(mask, e));
}

/// Brings the line prefetch_bytes past e into L1 (an address: it may lie past the array's end).
MOONMOE_TARGET_AVX512_BF16 inline void prefetch_ahead(const bf16* e) {
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(e) + std::uintptr_t(prefetch_bytes)),
                 _MM_HINT_T0);
}

/// The last step of a vector of sums: alpha s + beta c, c being C's values as the caller loaded them (ignored when
/// beta is 0).
MOONMOE_TARGET_AVX512_BF16 inline __m512 finish(__m512 s, float alpha, float beta, __m512 c) {
    const __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), s);
    return beta != 0.0f ? _mm512_fmadd_ps(_mm512_set1_ps(beta), c, r) : r;
}

/// C [MR rows at c, `rows` (1..16) columns] = alpha X W^T + beta C for MR rows of X at x and `rows` rows of W at w,
/// k elements each: the layout with W's rows in the lanes.
template <int MR>
MOONMOE_TARGET_AVX512_BF16 void rows_tile(const bf16* x, index_t ldx, const bf16* w, index_t ldw, index_t rows,
                                          index_t k, float alpha, float beta, float* c, index_t ldc) {
    __m512 acc[MR];
    MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
    index_t p = 0;  // k-pairs done
    if (rows == 16) {
        for (; 2 * p + 32 <= k; p += 16) {  // 16 whole k-pairs of 16 rows
            __m512 r[16];
            MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
                prefetch_ahead(w + q * ldw + 2 * p);
                r[q] = _mm512_castsi512_ps(_mm512_loadu_si512(w + q * ldw + 2 * p));
            }
            transpose16(r);  // r[s]: k-pair p + s of the 16 rows
            MOONMOE_UNROLL_16 for (int s = 0; s < 16; ++s) {
                MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) acc[i] =
                    dot(acc[i], whole_pair(x + i * ldx, p + s), _mm512_castps_si512(r[s]));
            }
        }
    }
    for (; 2 * p < k; p += 16) {  // rows past a whole 16 of W, or k past whole 32s: zeros loaded, not summed
        const index_t left = k - 2 * p, pairs = std::min<index_t>(16, (left + 1) / 2);
        __m512 r[16];
        MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) r[q] =
            q < rows ? load_pairs(w + q * ldw + 2 * p, left) : _mm512_setzero_ps();
        transpose16(r);
        MOONMOE_UNROLL_16 for (int s = 0; s < 16; ++s) {
            if (s < pairs) {
                MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) acc[i] =
                    dot(acc[i], pair(x + i * ldx, p + s, k), _mm512_castps_si512(r[s]));
            }
        }
    }
    const __mmask16 mask = __mmask16((1u << unsigned(rows)) - 1u);
    MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) {
        const __m512 old = beta != 0.0f ? _mm512_maskz_loadu_ps(mask, c + i * ldc) : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(c + i * ldc, mask, finish(acc[i], alpha, beta, old));
    }
}

/// One k-pair of tokens_tile: V vectors of X^T's pair-row p (of the chunk) dotted with NR k-pairs W[j, 2p..2p+1],
/// each broadcast (q: the pair's index in W's rows).
template <int V, int NR>
MOONMOE_TARGET_AVX512_BF16 __attribute__((always_inline)) inline void tokens_step(const std::uint32_t* xt,
                                                                                  const bf16* w, index_t ldw, index_t p,
                                                                                  index_t q, __m512 (&acc)[V][NR]) {
    __m512i xv[V];
    MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(xt + (p * V + v) * 16);
    MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
        const __m512i wj = whole_pair(w + j * ldw, q);
        MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) acc[v][j] = dot(acc[v][j], xv[v], wj);
    }
}

/// X's rows in the lanes: NR rows of W at w (k elements each) against V vectors of 16 rows of X^T at xt (the chunk's
/// pairs k-pairs [pairs][16 V] from k-pair p0), over the chunk. The sums start at zero on the first chunk, else from
/// `sums` ([NR][V] vectors); they go back to `sums` unless this is the last chunk, which writes rows [0, m) of C's
/// NR columns at c.
template <int V, int NR>
MOONMOE_TARGET_AVX512_BF16 void tokens_tile(const std::uint32_t* xt, const bf16* w, index_t ldw, index_t k, index_t p0,
                                            index_t pairs, float* sums, bool first, bool last, index_t m, float alpha,
                                            float beta, float* c, index_t ldc) {
    __m512 acc[V][NR];
    MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
        MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) acc[v][j] =
            first ? _mm512_setzero_ps() : _mm512_loadu_ps(sums + (j * V + v) * 16);
    }
    const index_t whole = std::min(pairs, k / 2 - p0);  // k-pairs of the chunk with both elements in W
    index_t p = 0;
    for (; p + 16 <= whole; p += 16) {
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) prefetch_ahead(w + j * ldw + 2 * (p0 + p));
        MOONMOE_UNROLL_16 for (int s = 0; s < 16; ++s) tokens_step<V, NR>(xt, w, ldw, p + s, p0 + p + s, acc);
    }
    for (; p < whole; ++p) tokens_step<V, NR>(xt, w, ldw, p, p0 + p, acc);
    if (p < pairs) {  // an odd k's last element, paired with zero
        __m512i xv[V];
        MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_si512(xt + (p * V + v) * 16);
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
            const __m512i wj = pair(w + j * ldw, p0 + p, k);
            MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) acc[v][j] = dot(acc[v][j], xv[v], wj);
        }
    }
    if (!last) {
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
            MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) _mm512_storeu_ps(sums + (j * V + v) * 16, acc[v][j]);
        }
        return;
    }
    // each vector of rows of X transposed in registers (zeros past NR), so that C's rows take NR columns at a time
    // (C's columns gathered and scattered an element at a time had 192 x 2048 x 7168 at 7.3 ms, two threads; 6.7)
    const __mmask16 columns = __mmask16((1u << unsigned(NR)) - 1u);
    MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) {
        __m512 r[16];
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) r[j] = acc[v][j];
        MOONMOE_UNROLL_16 for (int j = NR; j < 16; ++j) r[j] = _mm512_setzero_ps();
        transpose16(r);  // r[l]: row 16 v + l of X against the NR rows of W
        for (index_t l = 0; l < std::min<index_t>(16, m - 16 * v); ++l) {
            float* e = c + (16 * v + l) * ldc;
            const __m512 old = beta != 0.0f ? _mm512_maskz_loadu_ps(columns, e) : _mm512_setzero_ps();
            _mm512_mask_storeu_ps(e, columns, finish(r[l], alpha, beta, old));
        }
    }
}

/// k-pairs [p0, p1) of X's rows as X^T [pair][16 V] 32-bit words (row i of X in lane i % 16 of vector i / 16, zeros
/// past m and past k), 16 x 16 pairs at a time.
MOONMOE_TARGET_AVX512_BF16 inline void pack_x_pairs(View<const bf16, 2> X, index_t V, index_t p0, index_t p1,
                                                    std::uint32_t* xt) {
    const index_t m = X.shape[0], k = X.shape[1];
    for (index_t p = p0; p < p1; p += 16) {
        const index_t pairs = std::min<index_t>(16, p1 - p);
        for (index_t v = 0; v < V; ++v) {
            __m512 r[16];
            MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
                const index_t i = 16 * v + q;
                r[q] = i < m ? load_pairs(X.data + i * X.strides[0] + 2 * p, std::min(2 * pairs, k - 2 * p))
                             : _mm512_setzero_ps();
            }
            transpose16(r);  // r[s]: k-pair p + s of the 16 rows
            MOONMOE_UNROLL_16 for (int s = 0; s < 16; ++s) {
                if (s < pairs) _mm512_storeu_ps(reinterpret_cast<float*>(xt + ((p + s) * V + v) * 16), r[s]);
            }
        }
    }
}

/// The tiles of X's rows in the lanes, for V vectors of rows: NR rows of W per tile (at most 24 sums in registers,
/// beside V vectors of X and a broadcast k-pair of W), as gemm_small.hpp's chain_tile_rows.
template <int V>
inline constexpr int tile_rows = chain_tile_rows<V>;

/// Rows [j0, j0 + rows) of W in tiles of tile_rows<V>, then of 2, then of 1.
template <int V>
MOONMOE_TARGET_AVX512_BF16 void tokens_rows(const std::uint32_t* xt, const bf16* w, index_t ldw, index_t k, index_t j0,
                                            index_t rows, index_t p0, index_t pairs, float* sums, bool first, bool last,
                                            index_t m, float alpha, float beta, float* c, index_t ldc) {
    constexpr int NR = tile_rows<V>;
    index_t j = j0;
    for (; j + NR <= j0 + rows; j += NR)
        tokens_tile<V, NR>(xt, w + j * ldw, ldw, k, p0, pairs, sums + j * V * 16, first, last, m, alpha, beta, c + j,
                           ldc);
    for (; j + 2 <= j0 + rows; j += 2)
        tokens_tile<V, 2>(xt, w + j * ldw, ldw, k, p0, pairs, sums + j * V * 16, first, last, m, alpha, beta, c + j,
                          ldc);
    for (; j < j0 + rows; ++j)
        tokens_tile<V, 1>(xt, w + j * ldw, ldw, k, p0, pairs, sums + j * V * 16, first, last, m, alpha, beta, c + j,
                          ldc);
}

/// X's rows in the lanes, in panels of 16 V rows (all but the last whole): each panel's X^T packed as k-pairs, then k
/// in chunks whose X^T fits 64 KiB per panel while every tile of W passes it (AMD Zen 4, 64 x 2048 x 7168: 9.6-9.8 ms
/// at one thread, 10.0-10.2 with 256 KiB, as the f32 kernel's chunks), the tiles' sums kept between chunks; blocks of
/// tiles on the pool, each block's rows of W passing every panel in a chunk while they are in L2, so that W is read
/// from memory once however many rows X has.
template <int V>
void tokens(float alpha, View<const bf16, 2> X, View<const bf16, 2> W, float beta, View<float, 2> C) {
    const index_t n = W.shape[0], m = X.shape[0], k = X.shape[1], kp = (k + 1) / 2;
    constexpr index_t NR = tile_rows<V>, width = 16 * V, chunk = (index_t(1) << 16) / (4 * width) / 16 * 16;  // k-pairs
    const index_t panels = (m + width - 1) / width, panel_words = kp * width, packs = (kp + 127) / 128;
    const auto panel = [&](index_t t) { return std::min(width, m - t * width); };  // its rows of X
    auto xt = Tensor<std::uint32_t, 1>::for_overwrite(Shape<1>{panels * panel_words});
    parallel_for(panels * packs, [&](index_t q) {
        const index_t t = q / packs, b = q % packs;
        const View<const bf16, 2> x(X.data + t * width * X.strides[0], {panel(t), k}, X.strides);
        pack_x_pairs(x, V, 128 * b, std::min(kp, 128 * b + 128), xt.data() + t * panel_words);
    });
    auto sums = Tensor<float, 1>::for_overwrite(Shape<1>{kp > chunk ? panels * n * width : 0});
    row_blocks_through_chunks(n, tiles_per_block * NR, kp, chunk,
                              [&](index_t j0, index_t rows, index_t p0, index_t pairs, bool first, bool last) {
                                  for (index_t t = 0; t < panels; ++t)
                                      tokens_rows<V>(xt.data() + t * panel_words + p0 * width, W.data, W.strides[0], k,
                                                     j0, rows, p0, pairs, sums.data() + t * n * width, first, last,
                                                     panel(t), alpha, beta, C.data + t * width * C.strides[0],
                                                     C.strides[0]);
                              });
}

/// W's rows in the lanes: tiles of 16 rows of W (the last one short) on the pool.
template <int MR>
void rows(float alpha, View<const bf16, 2> X, View<const bf16, 2> W, float beta, View<float, 2> C) {
    const index_t n = W.shape[0], k = X.shape[1];
    parallel_for((n + 15) / 16, [&](index_t b) {
        const index_t j0 = 16 * b;
        rows_tile<MR>(X.data, X.strides[0], W.data + j0 * W.strides[0], W.strides[0], std::min<index_t>(16, n - j0), k,
                      alpha, beta, C.data + j0, C.strides[0]);
    });
}

}  // namespace dp

/// C [m, n] = alpha X [m, k] W [n, k]^T + beta C with bf16 X and W, rows of every operand contiguous (any m; the
/// engines send it up to small_gemm_bf16_rows): one chain of VDPBF16PS over the k-pairs per element (header comment).
/// Call only when small_gemm_bf16_available().
inline void gemm_small_nt_bf16(float alpha, View<const bf16, 2> X, View<const bf16, 2> W, float beta,
                               View<float, 2> C) {
    const index_t m = X.shape[0];
    if (m == 0 || W.shape[0] == 0) return;
    static_assert(rows_in_lanes_max == 8, "one case of W's rows in the lanes per row count of X");
    switch (m) {
    case 1: return dp::rows<1>(alpha, X, W, beta, C);
    case 2: return dp::rows<2>(alpha, X, W, beta, C);
    case 3: return dp::rows<3>(alpha, X, W, beta, C);
    case 4: return dp::rows<4>(alpha, X, W, beta, C);
    case 5: return dp::rows<5>(alpha, X, W, beta, C);
    case 6: return dp::rows<6>(alpha, X, W, beta, C);
    case 7: return dp::rows<7>(alpha, X, W, beta, C);
    case 8: return dp::rows<8>(alpha, X, W, beta, C);
    default: break;  // X's rows in the lanes
    }
    if (m > 4 * 16) return dp::tokens<2>(alpha, X, W, beta, C);  // panels of 32 rows of X
    switch ((m + 15) / 16) {
    case 1: return dp::tokens<1>(alpha, X, W, beta, C);
    case 2: return dp::tokens<2>(alpha, X, W, beta, C);
    case 3: return dp::tokens<3>(alpha, X, W, beta, C);
    default: return dp::tokens<4>(alpha, X, W, beta, C);
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef MOONMOE_TARGET_AVX512_BF16
#undef MOONMOE_UNROLL_16
#else
inline void gemm_small_nt_bf16(float, View<const bf16, 2>, View<const bf16, 2>, float, View<float, 2>) {}
#endif

}  // namespace moonmoe::backend::cpu_detail
