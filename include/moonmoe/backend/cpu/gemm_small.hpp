// moonmoe/backend/cpu/gemm_small.hpp: C = alpha X W^T + beta C when X has few rows (a Linear on the handful of
// tokens one expert receives), without packing.
//
// A packing GEMM copies W into its panel layout on every call; with W [2048, 7168] (58 MB) and X [20, 7168] the copy
// costs more than the 0.6 GFLOP of arithmetic, so an MoE's routed experts ran at ~55% of the SGEMM rate. Here W is
// read once, in place, its rows as they are stored:
// - an f32 W: each element of C is one chain of FMAs over k in order (chain_nt): for up to 8 rows of X the vector
//   lanes hold 16 rows of W (transposed 16 x 16 in registers), for more they hold 16 rows of X (X^T packed first,
//   each element of W broadcast from memory), and both give the same bits;
// - a bf16 W (the bf16 policy's weights, gemm_bf16), widened in registers as it streams by: each output is a dot
//   product of a row of X with a row of W, lanes over k (tiles of 4 rows of X by 4 rows of W, 16 AVX-512
//   accumulators, k-chunks of 2048 whose sums are added lane by lane and then to C).
// Threads split the rows of W, so every output is computed by one thread in one order: results depend neither on
// the thread count nor on the number of rows of X.
//
// The kernel is compiled with a function target attribute and taken when the running CPU has AVX-512
// (cpu_features.hpp), whatever the build's -m flags: a portable build (no -march) gets it on AVX-512 machines and
// Eigen's GEMM elsewhere. Built with -mavx512f (e.g. -march=native on such a machine) the check is compiled away.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "cpu_features.hpp"
#include "memory.hpp"
#include "threads.hpp"

// The AVX-512 kernel exists where the compiler can target it per function: GCC and Clang on x86. nvcc's host pass
// sees only the portable path.
#if MOONMOE_CPU_X86_DISPATCH && !defined(__CUDACC__)
#define MOONMOE_SMALL_GEMM_AVX512 1
#include <immintrin.h>
#define MOONMOE_TARGET_AVX512 __attribute__((target("avx512f")))
#else
#define MOONMOE_SMALL_GEMM_AVX512 0
#endif

namespace moonmoe::backend::cpu_detail {

/// The fast path applies up to this many rows of X (beyond it a packing GEMM reuses W enough to win).
inline constexpr index_t small_gemm_rows = 64;

/// The most rows of X that gemm_small_nn takes (X W reads W once per four rows of X: beyond a decoded token's few
/// rows, packing pays).
inline constexpr index_t small_gemm_nn_rows = 16;

/// Whether gemm_small_nt may be called: the running CPU has AVX-512 (or the build requires it anyway).
inline bool small_gemm_available() noexcept {
#if MOONMOE_SMALL_GEMM_AVX512 && defined(__AVX512F__)
    return true;
#elif MOONMOE_SMALL_GEMM_AVX512
    return cpu_features().avx512f;
#else
    return false;
#endif
}

/// `if (have_small_gemm && ...)`: small_gemm_available() where a bool is expected (the CPU is queried on first use,
/// never during static initialisation, so one process always takes the same path).
struct SmallGemmAvailable {
    explicit operator bool() const noexcept { return small_gemm_available(); }
};
inline constexpr SmallGemmAvailable have_small_gemm{};

/// Whether C = op(X) op(W) of this form and shape runs on gemm_small_nt: X W^T with a few rows of X against a weight
/// big enough that packing it would cost more than the arithmetic (k >= 256, n >= 64), on a CPU with the kernel.
/// gemm<float>, gemm_bf16 and the engine names of reports all ask this one question.
inline bool takes_small_gemm(Trans ta, Trans tb, index_t m, index_t n, index_t k) {
    return ta == Trans::no && tb == Trans::yes && m > 0 && m <= small_gemm_rows && k >= 256 && n >= 64 &&
           small_gemm_available();
}

/// Whether C = X W (no transposes) runs on gemm_small_nn: up to 16 rows of X (a decoded token's), on a CPU with the
/// kernel. Asked by gemm_bf16 where its engine is `library`.
inline bool takes_small_gemm_nn(Trans ta, Trans tb, index_t m) {
    return ta == Trans::no && tb == Trans::no && m > 0 && m <= small_gemm_nn_rows && small_gemm_available();
}

#if MOONMOE_SMALL_GEMM_AVX512
// GCC 12 warns that the _mm512_undefined_*() inside intrinsics (the widening in load16 of a bf16 row, the unpacks of
// transpose16) "may be used uninitialized" where they are inlined into the kernels below, in a program built without
// -mavx512f (a false positive: those lanes are all overwritten).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

/// The sum of the 16 lanes, halves first, then quarters, then pairs: the order of GCC's _mm512_reduce_add_ps, spelt
/// out because GCC 12's reads an undefined register (_mm256_undefined_pd), which -Wall reports as uninitialised in
/// every program built without -mavx512f; and so that GCC and Clang builds sum in one order.
MOONMOE_TARGET_AVX512 inline float reduce_add(__m512 v) {
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    float h[8], q[4];
    for (int i = 0; i < 8; ++i) h[i] = t[i] + t[i + 8];
    for (int i = 0; i < 4; ++i) q[i] = h[i] + h[i + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/// 16 consecutive elements of a row as f32: loaded, or widened from bf16 (exact: a bf16's bits are the high half of
/// the f32's). With `count` < 16, the first count elements and zeros after them.
MOONMOE_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
MOONMOE_TARGET_AVX512 inline __m512 load16(const bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
MOONMOE_TARGET_AVX512 inline __m512 load16(const float* p, index_t count) {
    return _mm512_maskz_loadu_ps(__mmask16((1u << unsigned(count)) - 1u), p);
}
MOONMOE_TARGET_AVX512 inline __m512 load16(const bf16* p, index_t count) {
    bf16 t[16] = {};
    std::copy(p, p + count, t);
    return load16(t);
}

/// The loops over the tile's rows unrolled whatever the optimisation level, so its MR x NR accumulators stay in
/// registers: GCC 12 at -O2 (CMake's RelWithDebInfo) kept them on the stack, a load and a store around every FMA,
/// and ran 16 rows x 2048 x 7168 in 16.2 ms against 4.7 ms unrolled (-O3 unrolls them anyway: 5.1 ms).
#define MOONMOE_UNROLL _Pragma("GCC unroll 4")
#define MOONMOE_UNROLL_16 _Pragma("GCC unroll 16")

/// Where to prefetch a tile's rows of w while its loop is at k: prefetch_bytes further along each row, and near a
/// row's end as far into the rows of the next tile (w + NR rows), which the same thread takes next. One core streams
/// w from memory at 10-13 GB/s on its own and at 12-15 GB/s with these prefetches (an Intel Xeon with 2 vCPUs:
/// X W^T of one token with a bf16 o_proj, 117 MB, 9.0-9.8 -> 8.1-8.4 ms; q_b's short rows, 38 MB, 3.45-4.62 ->
/// 3.06-3.13 ms; docs/cpu_gemm.md), since the hardware prefetchers alone leave part of the core's outstanding misses
/// unused. Prefetching past the end of w is harmless (a prefetch never faults).
inline constexpr index_t prefetch_bytes = 512;
template <int NR, class TW>
inline const char* ahead(const TW* w, index_t ldw, index_t j, index_t k, index_t k0, index_t k1) {
    constexpr index_t d = prefetch_bytes / index_t(sizeof(TW));
    const index_t element = k + d < k1 ? j * ldw + k + d : (NR + j) * ldw + k0 + (k + d - k1);
    // an address, not a pointer into w: it may lie past w's end
    return reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(w) + std::uintptr_t(element) * sizeof(TW));
}

/// out[i][j] = sum over [k0, k1) of x_i . w_j for MR rows of x (f32) and NR rows of w (f32 or bf16).
template <int MR, int NR, class TW>
MOONMOE_TARGET_AVX512 inline void dot_tile(const float* x, index_t ldx, const TW* w, index_t ldw, index_t k0,
                                           index_t k1, float (&out)[4][4]) {
    __m512 acc[MR][NR];
    MOONMOE_UNROLL for (int i = 0; i < MR; ++i) {
        MOONMOE_UNROLL for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    }
    index_t k = k0;
    for (; k + 16 <= k1; k += 16) {
        __m512 wv[NR];
        MOONMOE_UNROLL for (int j = 0; j < NR; ++j) _mm_prefetch(ahead<NR>(w, ldw, j, k, k0, k1), _MM_HINT_T0);
        MOONMOE_UNROLL for (int j = 0; j < NR; ++j) wv[j] = load16(w + j * ldw + k);
        MOONMOE_UNROLL for (int i = 0; i < MR; ++i) {
            const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
            MOONMOE_UNROLL for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    if (k < k1) {
        __m512 wv[NR];
        MOONMOE_UNROLL for (int j = 0; j < NR; ++j) wv[j] = load16(w + j * ldw + k, k1 - k);
        MOONMOE_UNROLL for (int i = 0; i < MR; ++i) {
            const __m512 xv = load16(x + i * ldx + k, k1 - k);
            MOONMOE_UNROLL for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) out[i][j] = reduce_add(acc[i][j]);
}

/// dot_tile for a tile of mr x nr (1..4 each) chosen at run time.
template <int MR, class TW>
MOONMOE_TARGET_AVX512 inline void dot_tile_rows(index_t nr, const float* x, index_t ldx, const TW* w, index_t ldw,
                                                index_t k0, index_t k1, float (&out)[4][4]) {
    switch (nr) {
    case 1: dot_tile<MR, 1>(x, ldx, w, ldw, k0, k1, out); break;
    case 2: dot_tile<MR, 2>(x, ldx, w, ldw, k0, k1, out); break;
    case 3: dot_tile<MR, 3>(x, ldx, w, ldw, k0, k1, out); break;
    default: dot_tile<MR, 4>(x, ldx, w, ldw, k0, k1, out); break;
    }
}
template <class TW>
MOONMOE_TARGET_AVX512 inline void dot_tile_any(index_t mr, index_t nr, const float* x, index_t ldx, const TW* w,
                                               index_t ldw, index_t k0, index_t k1, float (&out)[4][4]) {
    switch (mr) {
    case 1: dot_tile_rows<1>(nr, x, ldx, w, ldw, k0, k1, out); break;
    case 2: dot_tile_rows<2>(nr, x, ldx, w, ldw, k0, k1, out); break;
    case 3: dot_tile_rows<3>(nr, x, ldx, w, ldw, k0, k1, out); break;
    default: dot_tile_rows<4>(nr, x, ldx, w, ldw, k0, k1, out); break;
    }
}

/// Transposes the 16 x 16 tile held as 16 rows in r: row i of the result is column i of the tile.
MOONMOE_TARGET_AVX512 __attribute__((always_inline)) inline void transpose16(__m512 (&r)[16]) {
    __m512 t[16], u[16];
    MOONMOE_UNROLL_16 for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    MOONMOE_UNROLL_16 for (int i = 0; i < 4; ++i) {  // quads within each 128-bit lane
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    MOONMOE_UNROLL_16 for (int i = 0; i < 4; ++i) {  // 128-bit lanes, in two steps
        t[i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0xDD);
        t[8 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0xDD);
    }
    MOONMOE_UNROLL_16 for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
        r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
    }
}

/// f32 W. Every element of C is one chain of fused multiply-adds over k in order, s = fma(X[i, p], W[j, p], s) for
/// p = 0, 1, ..., k - 1 from s = 0, then alpha s (+ beta C[i, j]), computed in one of two layouts that give the same
/// bits, so a row's result depends neither on the other rows nor on the threads:
/// - W's rows in the lanes (up to rows_in_lanes_max rows of X; a decoded token): 16 rows of W are loaded as 16
///   vectors of 16 consecutive k, transposed in registers, and each vector (one k, 16 rows of W) is multiplied by
///   X[i, k] broadcast; the 16 sums of a vector are 16 consecutive elements of a row of C. Its 64 shuffles per block
///   keep pace with W's bytes from memory (one token against o_proj's W: 13.5 ms at one thread, the lanes-over-k
///   kernel, dot_tile above, 14.0).
/// - X's rows in the lanes (more rows): X^T is packed first (k x 16 rows per vector, zeros past m), and each element
///   of W is broadcast from memory onto up to four vectors of X's rows: one FMA per element of W per 16 rows of X,
///   with no horizontal sums. W's rows stream at close to the core's read rate while it computes: 16 x 2048 x 7168
///   in 3.1-3.3 ms at one thread, where the lanes-over-k kernel above (dot_tile) took 4.6-5.1 (an Intel Xeon with
///   AMX, 2 vCPUs: docs/cpu_gemm.md, "f32 few-rows products as chains of FMAs").
/// (dot_tile sums each lane over every 16th k and then adds the lanes; it stays for a bf16 W, whose elements cannot
/// be broadcast straight from memory.)
inline constexpr index_t rows_in_lanes_max = 8;

/// Brings the line prefetch_bytes past p into L1: an address, not a pointer (it may lie past the end of p's array;
/// a prefetch never faults).
MOONMOE_TARGET_AVX512 inline void prefetch_ahead(const float* p) {
    _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) + std::uintptr_t(prefetch_bytes)),
                 _MM_HINT_T0);
}

/// C [MR rows at c, `rows` (1..16) columns] = alpha X W^T + beta C for MR rows of X at x and `rows` rows of W at w:
/// the layout with W's rows in the lanes.
template <int MR>
MOONMOE_TARGET_AVX512 inline void chain_rows_tile(const float* x, index_t ldx, const float* w, index_t ldw,
                                                  index_t rows, index_t k, float alpha, float beta, float* c,
                                                  index_t ldc) {
    __m512 acc[MR];
    MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) acc[i] = _mm512_setzero_ps();
    index_t p = 0;
    if (rows == 16) {
        for (; p + 16 <= k; p += 16) {
            __m512 r[16];
            MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
                prefetch_ahead(w + q * ldw + p);
                r[q] = _mm512_loadu_ps(w + q * ldw + p);
            }
            transpose16(r);
            MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
                MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) acc[i] =
                    _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + p + q]), r[q], acc[i]);
            }
        }
    }
    for (; p < k; p += 16) {  // the rows past a whole 16 of W, or k past a whole 16: zeros loaded, not summed
        const index_t step = std::min<index_t>(16, k - p);
        __m512 r[16];
        MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) r[q] =
            q < rows ? load16(w + q * ldw + p, step) : _mm512_setzero_ps();
        transpose16(r);
        MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
            if (q < step) {
                MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) acc[i] =
                    _mm512_fmadd_ps(_mm512_set1_ps(x[i * ldx + p + q]), r[q], acc[i]);
            }
        }
    }
    const __mmask16 mask = __mmask16((1u << unsigned(rows)) - 1u);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    MOONMOE_UNROLL_16 for (int i = 0; i < MR; ++i) {
        __m512 v = _mm512_mul_ps(va, acc[i]);
        if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, c + i * ldc), v);
        _mm512_mask_storeu_ps(c + i * ldc, mask, v);
    }
}

/// One k of chain_tokens_tile: V vectors of X^T's row p times NR elements W[j, p], each broadcast.
template <int V, int NR>
MOONMOE_TARGET_AVX512 __attribute__((always_inline)) inline void chain_tokens_step(const float* xt, const float* w,
                                                                                   index_t ldw, index_t p,
                                                                                   __m512 (&acc)[V][NR]) {
    __m512 xv[V];
    MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) xv[v] = _mm512_loadu_ps(xt + (p * V + v) * 16);
    MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
        const __m512 wj = _mm512_set1_ps(w[j * ldw + p]);
        MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) acc[v][j] = _mm512_fmadd_ps(xv[v], wj, acc[v][j]);
    }
}

/// X's rows in the lanes: NR rows of W at w (at the chunk's first k) against V vectors of 16 rows of X^T at xt
/// (the chunk's [kn][16 V], packed), over the chunk's kn values of k. The sums start at zero on the first chunk of k,
/// else from `sums` ([NR][V] vectors); they go back to `sums` unless this is the last chunk, which writes rows
/// [0, m) of C's NR columns at c.
template <int V, int NR>
MOONMOE_TARGET_AVX512 inline void chain_tokens_tile(const float* xt, const float* w, index_t ldw, index_t kn,
                                                    float* sums, bool first, bool last, index_t m, float alpha,
                                                    float beta, float* c, index_t ldc) {
    __m512 acc[V][NR];
    MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
        MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) acc[v][j] =
            first ? _mm512_setzero_ps() : _mm512_loadu_ps(sums + (j * V + v) * 16);
    }
    index_t p = 0;
    for (; p + 16 <= kn; p += 16) {
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) prefetch_ahead(w + j * ldw + p);
        MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) chain_tokens_step<V, NR>(xt, w, ldw, p + q, acc);
    }
    for (; p < kn; ++p) chain_tokens_step<V, NR>(xt, w, ldw, p, acc);
    if (!last) {
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
            MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) _mm512_storeu_ps(sums + (j * V + v) * 16, acc[v][j]);
        }
        return;
    }
    // the arithmetic of chain_rows_tile's, on a vector of C's column gathered and scattered through t
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    alignas(64) float t[16] = {};
    MOONMOE_UNROLL_16 for (int v = 0; v < V; ++v) {
        const index_t lanes = std::min<index_t>(16, m - 16 * v);
        MOONMOE_UNROLL_16 for (int j = 0; j < NR; ++j) {
            float* e = c + 16 * v * ldc + j;
            __m512 r = _mm512_mul_ps(va, acc[v][j]);
            if (beta != 0.0f) {
                for (index_t l = 0; l < lanes; ++l) t[l] = e[l * ldc];
                r = _mm512_fmadd_ps(vb, _mm512_load_ps(t), r);
            }
            _mm512_store_ps(t, r);
            for (index_t l = 0; l < lanes; ++l) e[l * ldc] = t[l];
        }
    }
}

/// Columns [p0, p1) of X as rows of X^T [k][16 V] (row i of X in lane i % 16 of vector i / 16, zeros past m), 16 x 16
/// at a time.
MOONMOE_TARGET_AVX512 inline void pack_x_transposed(View<const float, 2> X, index_t V, index_t p0, index_t p1,
                                                    float* xt) {
    const index_t m = X.shape[0];
    for (index_t p = p0; p < p1; p += 16) {
        const index_t step = std::min<index_t>(16, p1 - p);
        for (index_t v = 0; v < V; ++v) {
            __m512 r[16];
            MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
                const index_t i = 16 * v + q;
                r[q] = i < m ? load16(X.data + i * X.strides[0] + p, step) : _mm512_setzero_ps();
            }
            transpose16(r);
            MOONMOE_UNROLL_16 for (int q = 0; q < 16; ++q) {
                if (q < step) _mm512_storeu_ps(xt + ((p + q) * V + v) * 16, r[q]);
            }
        }
    }
}

/// The tiles of X's rows in the lanes, for V vectors of rows: NR rows of W per tile, so V x NR sums (up to 24 of
/// the 32 registers) beside V vectors of X and one broadcast element of W. One vector (9-16 rows of X) takes 10 rows
/// of W, not 12: each row of a tile is a stream from memory, and with both cores streaming, 10 streams a core kept
/// pace better (16 x 2048 x 7168 at two threads 1.24-1.40 against 1.38-1.45 ms, at one thread 2.37-2.52 against
/// 2.43-2.51; AMD Zen 5, docs/cpu_gemm.md, "AMD Zen 5: the f32 expert of 16 tokens").
template <int V>
inline constexpr int chain_tile_rows = V == 1   ? 10
                                       : V == 2 ? 12
                                       : V == 3 ? 8
                                                : 6;

/// Rows [j0, j0 + rows) of W (any number) in tiles of chain_tile_rows<V>, then of 4, then of 1.
template <int V>
MOONMOE_TARGET_AVX512 inline void chain_tokens_rows(const float* xt, const float* w, index_t ldw, index_t j0,
                                                    index_t rows, index_t kn, float* sums, bool first, bool last,
                                                    index_t m, float alpha, float beta, float* c, index_t ldc) {
    constexpr int NR = chain_tile_rows<V>;
    index_t j = j0;
    for (; j + NR <= j0 + rows; j += NR)
        chain_tokens_tile<V, NR>(xt, w + j * ldw, ldw, kn, sums + j * V * 16, first, last, m, alpha, beta, c + j, ldc);
    for (; j + 4 <= j0 + rows; j += 4)
        chain_tokens_tile<V, 4>(xt, w + j * ldw, ldw, kn, sums + j * V * 16, first, last, m, alpha, beta, c + j, ldc);
    for (; j < j0 + rows; ++j)
        chain_tokens_tile<V, 1>(xt, w + j * ldw, ldw, kn, sums + j * V * 16, first, last, m, alpha, beta, c + j, ldc);
}

/// The few-rows kernels with X's rows in the lanes, on the pool: W's rows in blocks of `block`, each block through
/// every chunk of k in turn on one thread, run(j0, rows, k0, kn, first chunk, last chunk). One pass of the pool for
/// the product, not one per chunk, which left a thread waiting at every chunk's end (bf16 64 x 2048 x 7168 on AMD
/// Zen 4, two threads: 5.85 -> 4.79 ms, 5.0 with parallel_for's inline start; one thread 9.50 -> 9.38 ms). Each
/// element's sum still runs over the chunks in order, so results do not depend on the threads.
template <class Run>
void row_blocks_through_chunks(index_t n, index_t block, index_t k, index_t chunk, Run&& run) {
    parallel_chunks((n + block - 1) / block, [&](index_t b) {
        const index_t j0 = b * block, rows = std::min(block, n - j0);
        for (index_t k0 = 0; k0 < k; k0 += chunk) {
            const index_t kn = std::min(chunk, k - k0);
            run(j0, rows, k0, kn, k0 == 0, k0 + kn == k);
        }
    });
}

/// Tiles of W's rows per block of row_blocks_through_chunks (4, 8, 16 and 32 measured within 5 % of each other).
inline constexpr index_t tiles_per_block = 8;

/// gemm_small_nt for an f32 W with X's rows in the lanes, V vectors of them: k in chunks whose X^T stays in L2
/// (256 KiB) while every tile of W passes it, the tiles' sums kept between chunks; blocks of tiles on the pool.
template <int V>
void chain_tokens(float alpha, View<const float, 2> X, View<const float, 2> W, float beta, View<float, 2> C) {
    const index_t n = W.shape[0], m = X.shape[0], k = X.shape[1];
    constexpr index_t NR = chain_tile_rows<V>, kc = (index_t(1) << 18) / (64 * V) / 16 * 16;
    auto xt = Tensor<float, 1>::for_overwrite(Shape<1>{k * V * 16});
    parallel_for((k + 255) / 256,
                 [&](index_t b) { pack_x_transposed(X, V, 256 * b, std::min(k, 256 * b + 256), xt.data()); });
    auto sums = Tensor<float, 1>::for_overwrite(Shape<1>{k > kc ? n * V * 16 : 0});
    row_blocks_through_chunks(n, tiles_per_block * NR, k, kc,
                              [&](index_t j0, index_t rows, index_t k0, index_t kn, bool first, bool last) {
                                  chain_tokens_rows<V>(xt.data() + k0 * V * 16, W.data + k0, W.strides[0], j0, rows, kn,
                                                       sums.data(), first, last, m, alpha, beta, C.data, C.strides[0]);
                              });
}

/// gemm_small_nt for an f32 W with W's rows in the lanes: tiles of 16 rows of W (the last one short) on the pool.
template <int MR>
void chain_rows(float alpha, View<const float, 2> X, View<const float, 2> W, float beta, View<float, 2> C) {
    const index_t n = W.shape[0], k = X.shape[1];
    parallel_for((n + 15) / 16, [&](index_t b) {
        const index_t j0 = 16 * b;
        chain_rows_tile<MR>(X.data, X.strides[0], W.data + j0 * W.strides[0], W.strides[0],
                            std::min<index_t>(16, n - j0), k, alpha, beta, C.data + j0, C.strides[0]);
    });
}

/// C = alpha X W^T + beta C for an f32 W of few rows of X (up to small_gemm_rows): one chain of FMAs per element.
inline void chain_nt(float alpha, View<const float, 2> X, View<const float, 2> W, float beta, View<float, 2> C) {
    static_assert(rows_in_lanes_max == 8, "one case of W's rows in the lanes per row count of X");
    switch (X.shape[0]) {
    case 1: return chain_rows<1>(alpha, X, W, beta, C);
    case 2: return chain_rows<2>(alpha, X, W, beta, C);
    case 3: return chain_rows<3>(alpha, X, W, beta, C);
    case 4: return chain_rows<4>(alpha, X, W, beta, C);
    case 5: return chain_rows<5>(alpha, X, W, beta, C);
    case 6: return chain_rows<6>(alpha, X, W, beta, C);
    case 7: return chain_rows<7>(alpha, X, W, beta, C);
    case 8: return chain_rows<8>(alpha, X, W, beta, C);
    default: break;  // more than rows_in_lanes_max rows: X's rows in the lanes
    }
    switch ((X.shape[0] + 15) / 16) {
    case 1: return chain_tokens<1>(alpha, X, W, beta, C);
    case 2: return chain_tokens<2>(alpha, X, W, beta, C);
    case 3: return chain_tokens<3>(alpha, X, W, beta, C);
    default: return chain_tokens<4>(alpha, X, W, beta, C);
    }
}

/// Columns [j0, j0 + nr) of C, all m rows, over k in [k0, k1): written when `first`, else accumulated.
template <class TW>
MOONMOE_TARGET_AVX512 inline void gemm_small_block(float alpha, View<const float, 2> X, View<const TW, 2> W, float beta,
                                                   View<float, 2> C, index_t j0, index_t nr, index_t k0, index_t k1,
                                                   bool first) {
    const index_t m = X.shape[0];
    for (index_t i0 = 0; i0 < m; i0 += 4) {
        const index_t mr = std::min<index_t>(4, m - i0);
        float out[4][4];
        dot_tile_any(mr, nr, X.data + i0 * X.strides[0], X.strides[0], W.data + j0 * W.strides[0], W.strides[0], k0, k1,
                     out);
        for (index_t i = 0; i < mr; ++i) {
            float* c = C.data + (i0 + i) * C.strides[0] + j0;
            for (index_t j = 0; j < nr; ++j) {
                const float v = alpha * out[i][j];
                if (!first) c[j] += v;
                else
                    c[j] = beta == 0.0f ? v : beta * c[j] + v;
            }
        }
    }
}

/// C [m, n] = alpha X [m, k] W [n, k]^T + beta C, m <= small_gemm_rows, rows of every operand contiguous; W f32, or
/// bf16 widened in registers as it streams by (a bf16 X is widened by the caller: it is small). Call only when
/// small_gemm_available().
template <class TW = float>
void gemm_small_nt(float alpha, View<const float, 2> X, View<const TW, 2> W, float beta, View<float, 2> C) {
    if constexpr (std::is_same_v<TW, float>) {
        chain_nt(alpha, X, W, beta, C);
    } else {
        const index_t n = W.shape[0], m = X.shape[0], k = X.shape[1];
        constexpr index_t kc = 2048;
        const index_t blocks = (n + 3) / 4;
        const auto block = [&](index_t b, index_t k0) {
            const index_t j0 = 4 * b;
            gemm_small_block<TW>(alpha, X, W, beta, C, j0, std::min<index_t>(4, n - j0), k0, std::min(k, k0 + kc),
                                 k0 == 0);
        };
        if (4 * m * k <= (index_t(1) << 19)) {
            // all of X fits in half of a 1 MiB L2: each block of W runs through every k-chunk at once, so each row of W
            // is one sequential stream instead of pieces a page or two apart (the same operations in the same order)
            parallel_for(blocks, [&](index_t b) {
                for (index_t k0 = 0; k0 < k; k0 += kc) block(b, k0);
            });
        } else {
            for (index_t k0 = 0; k0 < k; k0 += kc) parallel_for(blocks, [&](index_t b) { block(b, k0); });
        }
    }
}
/// Rows [i0, i0 + MR) and columns [j0, j0 + 64) of C = alpha X W + beta C (C unread when beta is 0), `cols` (1..64)
/// of them inside C: for each k, four vectors of W's row k, each multiplied by the MR elements X[i, k].
template <int MR, class TW>
MOONMOE_TARGET_AVX512 inline void axpy_tile(float alpha, const float* x, index_t ldx, const TW* w, index_t ldw,
                                            index_t k, float beta, float* c, index_t ldc, index_t cols) {
    constexpr int V = 4;
    __m512 acc[MR][V];
    MOONMOE_UNROLL for (int i = 0; i < MR; ++i) {
        MOONMOE_UNROLL for (int v = 0; v < V; ++v) acc[i][v] = _mm512_setzero_ps();
    }
    for (index_t p = 0; p < k; ++p) {
        const TW* row = w + p * ldw;
        __m512 wv[V];
        MOONMOE_UNROLL for (int v = 0; v < V; ++v) {  // (no lambda: it would not inherit the AVX-512 target)
            const index_t left = cols - 16 * v;
            wv[v] = left >= 16 ? load16(row + 16 * v) : left > 0 ? load16(row + 16 * v, left) : _mm512_setzero_ps();
        }
        MOONMOE_UNROLL for (int i = 0; i < MR; ++i) {
            const __m512 xi = _mm512_set1_ps(x[i * ldx + p]);
            MOONMOE_UNROLL for (int v = 0; v < V; ++v) acc[i][v] = _mm512_fmadd_ps(xi, wv[v], acc[i][v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < MR; ++i)
        for (int v = 0; v < V; ++v) {
            const index_t left = std::min<index_t>(cols - 16 * v, 16);
            if (left <= 0) break;
            const __mmask16 mask = __mmask16((1u << unsigned(left)) - 1u);
            float* ci = c + i * ldc + 16 * v;
            __m512 r = _mm512_mul_ps(va, acc[i][v]);
            if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(mask, ci), r);
            _mm512_mask_storeu_ps(ci, mask, r);
        }
}

/// C [m, n] = alpha X [m, k] W [k, n] + beta C with few rows of X (m <= small_gemm_nn_rows), rows of every operand
/// contiguous; W f32, or bf16 widened in registers as it streams by. No packing: strips of 64 columns of C (on the
/// pool), each reading its columns of W's rows once per four rows of X. What X W with one token's rows needs, as MLA's
/// absorbed decode does per head (q_nope W_UK[h]). Call only when small_gemm_available().
template <class TW = float>
void gemm_small_nn(float alpha, View<const float, 2> X, View<const TW, 2> W, float beta, View<float, 2> C) {
    const index_t m = X.shape[0], k = X.shape[1], n = W.shape[1];
    if (m == 0 || n == 0) return;
    parallel_for((n + 63) / 64, [&](index_t strip) {
        const index_t j0 = 64 * strip, cols = std::min<index_t>(64, n - j0);
        for (index_t i0 = 0; i0 < m; i0 += 4) {
            const float* x = X.data + i0 * X.strides[0];
            const TW* w = W.data + j0;
            float* c = C.data + i0 * C.strides[0] + j0;
            switch (std::min<index_t>(4, m - i0)) {
            case 1: axpy_tile<1, TW>(alpha, x, X.strides[0], w, W.strides[0], k, beta, c, C.strides[0], cols); break;
            case 2: axpy_tile<2, TW>(alpha, x, X.strides[0], w, W.strides[0], k, beta, c, C.strides[0], cols); break;
            case 3: axpy_tile<3, TW>(alpha, x, X.strides[0], w, W.strides[0], k, beta, c, C.strides[0], cols); break;
            default: axpy_tile<4, TW>(alpha, x, X.strides[0], w, W.strides[0], k, beta, c, C.strides[0], cols); break;
            }
        }
    });
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#undef MOONMOE_TARGET_AVX512
#undef MOONMOE_UNROLL
#undef MOONMOE_UNROLL_16
#else
template <class TW = float>
inline void gemm_small_nt(float, View<const float, 2>, View<const TW, 2>, float, View<float, 2>) {}
template <class TW = float>
inline void gemm_small_nn(float, View<const float, 2>, View<const TW, 2>, float, View<float, 2>) {}
#endif

}  // namespace moonmoe::backend::cpu_detail
