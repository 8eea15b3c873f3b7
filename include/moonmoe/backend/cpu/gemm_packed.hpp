// moonmoe/backend/cpu/gemm_packed.hpp: the library's own GEMM on AVX-512, C = alpha op(A) op(B) + beta C with f32
// or bf16 operands (bf16 widened to f32 as it is packed, exact) and an f32 C, on the pool.
//
// The layout of Goto and van de Geijn ("Anatomy of High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008),
// as BLIS writes it: op(B) is packed in blocks of kc x nc, each cut into micro-panels of kc x 32 with the 32 columns
// of one k contiguous; op(A) is packed once, in micro-panels of 12 rows x kc; a micro-kernel holds a 12 x 32 tile of C
// in 24 AVX-512 registers and, for each k, loads two vectors of the B micro-panel and broadcasts twelve elements of
// the A micro-panel (24 FMAs per 14 loads: 97 % of one core's FMA rate with its operands in L1 and L2). An A
// micro-panel stays in L1 while the kernel runs along the B block, which stays in L2.
//
// Packing is where the forms differ. A W^T (nt: both operands have k contiguous) needs op(B) transposed: 16 x 16
// tiles transposed in registers, widened from bf16 on the way, and each row of W read in consecutive segments of
// kc (the blocks of nc columns outer, k inner), so that the hardware's prefetchers stream W from memory.
// A row-major op(A) is packed as rows (a copy: the kernel's broadcasts take twelve fixed offsets from one pointer),
// a transposed one (dY^T X) as columns.
//
// Every element of C is summed by one thread in one order (k blocks in turn, k in order within a block, one FMA
// chain), whatever the panel it falls in: results depend neither on the thread count nor on where the product is
// cut. Measured against oneDNN's f32 and bf16 kernels and Eigen's on the Kimi K2 products in docs/cpu_gemm.md.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "gemm_small.hpp"
#include "memory.hpp"  // the packed operands are tensors of the CPU backend
#include "threads.hpp"

#if MOONMOE_SMALL_GEMM_AVX512
#define MOONMOE_PACKED_GEMM_AVX512 1
#define MOONMOE_TARGET_AVX512 __attribute__((target("avx512f")))
#else
#define MOONMOE_PACKED_GEMM_AVX512 0
#endif

namespace moonmoe::backend::cpu_detail {

/// Whether gemm_packed may be called: the running CPU has AVX-512 (gemm_small.hpp's check).
inline bool packed_gemm_available() noexcept { return small_gemm_available(); }

/// The packed kernel's blocking: a micro-tile of C of mr x nr, op(A) packed in micro-panels of mr rows, op(B) in
/// blocks of kc x nc. kc = 512 and nc = 512 measured best of 256..1024 on the products of docs/cpu_gemm.md.
struct PackedBlocking {
    static constexpr index_t mr = 12, nr = 32, kc = 512, nc = 512;
    static constexpr index_t a_ld = kc;  ///< values from one row of an A micro-panel to the next
};

/// C(j, i) = C(i, j) above the diagonal of a square C, from its lower triangle: tiles of 32 x 32, rows of tiles on
/// the pool.
template <class T>
void mirror_lower(View<T, 2> C) {
    constexpr index_t tile = 32;
    const index_t n = C.shape[0], p = C.strides[0];
    parallel_for((n + tile - 1) / tile, [&](index_t bi) {
        const index_t i0 = bi * tile, i1 = std::min(n, i0 + tile);
        for (index_t j0 = 0; j0 <= i0; j0 += tile)
            for (index_t i = i0; i < i1; ++i)
                for (index_t j = j0; j < std::min(i, j0 + tile); ++j) C.data[j * p + i] = C.data[i * p + j];
    });
}

/// What the library's packed GEMMs (gemm_packed, and gemm_amx.hpp's) do around their kernels, each in its own
/// blocking P (mr, nr, kc, nc): the product with no k, the cut of a narrow C by rows, and the driver that packs op(A)
/// once and shares C's columns out.
namespace packed_driver {

/// C = beta C (C unread when beta is 0): the product when k is 0.
template <class TC>
void scale(float beta, View<TC, 2> C) {
    for (index_t i = 0; i < C.shape[0]; ++i)
        for (index_t j = 0; j < C.shape[1]; ++j) {
            TC& c = C.data[i * C.strides[0] + j];
            c = convert<TC>(beta == 0.0f ? 0.0f : beta * convert<float>(c));
        }
}

/// With more than one thread and a C too narrow to cut into parts of columns (fewer than two parts of 128 columns)
/// but tall: C's rows cut into up to `per_thread` parts per thread of whole micro-panels, product(a, c) run on each
/// part's rows of op(A) and of C, on its own thread. Each part packs all of op(B) again and brings each block of it
/// into L2 again: more parts balance a busy machine's threads, fewer read op(B) less. Returns whether it cut.
template <class P, class TA, class TC, class Product>
bool cut_rows(Trans ta, View<const TA, 2> A, index_t k, View<TC, 2> C, Product product, index_t per_thread = 2) {
    const int t = parallel_depth > 0 ? 1 : threads();
    const index_t m = C.shape[0], n = C.shape[1], nr_panels = (n + P::nr - 1) / P::nr, min_part = 128 / P::nr;
    if (t == 1 || nr_panels >= 2 * min_part || m < 2 * 4 * P::mr) return false;
    const index_t parts = per_thread * t, rows = ((m + parts - 1) / parts + P::mr - 1) / P::mr * P::mr;
    parallel_chunks((m + rows - 1) / rows, [&](index_t c) {
        const index_t r0 = c * rows, r = std::min(rows, m - r0);
        const View<const TA, 2> a = ta == Trans::no ? View<const TA, 2>(A.data + r0 * A.strides[0], {r, k}, A.strides)
                                                    : View<const TA, 2>(A.data + r0, {k, r}, A.strides);
        product(a, View<TC, 2>(C.data + r0 * C.strides[0], {r, n}, C.strides));  // runs on this thread
    });
    return true;
}

/// The parts that C [m, n]'s columns are cut into for threads threads, in micro-panels of nr columns: part c holds
/// columns [bounds[c], bounds[c + 1]). At least min_part panels a part and up to two parts per thread (one part at
/// one thread); the parts' widths differ by at most one panel, the wider ones first (18 panels in 4 parts: 5, 5, 4, 4,
/// so that two threads taking parts in turn get 9 each, where parts of 5, 5, 5, 3 gave one of them 10). With `lower`
/// (a symmetric product computed on and below the diagonal) the parts hold equal shares of the lower triangle instead.
inline std::vector<index_t> column_parts(index_t m, index_t n, index_t nr, index_t min_part, int threads, bool lower) {
    const index_t nr_panels = (n + nr - 1) / nr;
    const index_t parts = threads == 1 ? 1 : std::clamp<index_t>(nr_panels / min_part, 1, 2 * index_t(threads));
    std::vector<index_t> bounds(std::size_t(parts) + 1, n);
    if (!lower) {
        const index_t per = nr_panels / parts, extra = nr_panels % parts;
        for (index_t c = 0; c < parts; ++c) bounds[std::size_t(c)] = std::min(n, (c * per + std::min(c, extra)) * nr);
    } else {  // column panel q holds about m - q nr rows of the triangle
        const auto height = [&](index_t q) { return std::max<index_t>(m - q * nr, 0); };
        index_t total = 0;
        for (index_t q = 0; q < nr_panels; ++q) total += height(q);
        index_t c = 0, sum = 0;
        bounds[0] = 0;
        for (index_t q = 0; q < nr_panels && c + 1 < parts; ++q) {
            sum += height(q);
            if (sum * parts >= total * (c + 1)) bounds[std::size_t(++c)] = std::min(n, (q + 1) * nr);
        }
    }
    return bounds;
}

/// C [m, n] over k in blocking P with packed elements of type TP: op(A) packed once, whole, pack_a(k0, p, dst)
/// writing the micro-panel p of the k block at k0 (the micro-panels shared out on the pool; pack_a nullptr where
/// columns reads op(A) as stored, ap then null); then C's columns cut into column_parts of at least 128 columns,
/// each run as columns(ap, lo, hi, bp) on one thread with a buffer bp for its blocks of op(B).
template <class P, class TP, class PackA, class Columns>
void run(index_t m, index_t n, index_t k, PackA pack_a, Columns columns, bool lower = false) {
    const int t = parallel_depth > 0 ? 1 : threads();
    const index_t panels = (m + P::mr - 1) / P::mr, blocks = (k + P::kc - 1) / P::kc;
    Tensor<TP, 1> a;
    if constexpr (!std::is_same_v<PackA, std::nullptr_t>) {  // nullptr: columns reads op(A) where it is
        a = Tensor<TP, 1>::for_overwrite(Shape<1>{blocks * panels * P::mr * P::a_ld});
        parallel_for(blocks * panels,
                     [&](index_t q) { pack_a((q / panels) * P::kc, q % panels, a.data() + q * P::mr * P::a_ld); });
    }
    const std::vector<index_t> bounds = column_parts(m, n, P::nr, 128 / P::nr, t, lower);
    const index_t parts = index_t(bounds.size()) - 1;
    index_t widest = 0;
    for (index_t c = 0; c < parts; ++c) widest = std::max(widest, bounds[std::size_t(c) + 1] - bounds[std::size_t(c)]);
    const index_t b_values = P::kc * std::min(P::nc, (widest + P::nr - 1) / P::nr * P::nr);
    parallel_chunks(parts, [&](index_t c) {
        const index_t lo = bounds[std::size_t(c)], hi = bounds[std::size_t(c) + 1];
        if (lo >= hi) return;
        auto b = Tensor<TP, 1>::for_overwrite(Shape<1>{b_values});
        columns(static_cast<const TP*>(a.data()), lo, hi, b.data());
    });
}

}  // namespace packed_driver

#if MOONMOE_PACKED_GEMM_AVX512
#define MOONMOE_UNROLL_ALL _Pragma("GCC unroll 16")

namespace packed {

using P = PackedBlocking;

/// The micro-kernel: the mr x nr tile of C at c (rows ldc apart; the first `rows` rows and the columns of masks
/// lo and hi written) gets alpha a b over kc, where a is an A micro-panel (rows_a: row i at a + i kc_stride, else
/// element (i, k) at a + k mr) and b a B micro-panel ([kc][nr]). The first k block writes alpha a b + beta C (C
/// unread when beta is 0), later ones add to C.
template <bool rows_a>
MOONMOE_TARGET_AVX512 inline void micro_kernel(index_t kc, const float* a, const float* b, float* c, index_t ldc,
                                               index_t rows, __mmask16 lo, __mmask16 hi, bool first, float alpha,
                                               float beta) {
    constexpr int M = int(P::mr);
    __m512 c0[M], c1[M];
    MOONMOE_UNROLL_ALL for (int i = 0; i < M; ++i) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
        if (i < rows) {  // rows past C's end are not even addressed
            _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16), _MM_HINT_T0);
        }
    }
    for (index_t k = 0; k < kc; ++k) {
        const __m512 b0 = _mm512_load_ps(b + k * P::nr), b1 = _mm512_load_ps(b + k * P::nr + 16);
        MOONMOE_UNROLL_ALL for (int i = 0; i < M; ++i) {
            const __m512 ai = _mm512_set1_ps(rows_a ? a[i * P::kc + k] : a[k * P::mr + i]);
            c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    MOONMOE_UNROLL_ALL for (int i = 0; i < M; ++i) {
        if (i >= rows) break;
        float* ci = c + i * ldc;
        __m512 v0 = _mm512_mul_ps(va, c0[i]), v1 = _mm512_mul_ps(va, c1[i]);
        if (!first) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(lo, ci));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(hi, ci + 16));
        } else if (beta != 0.0f) {
            v0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(lo, ci), v0);
            v1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(hi, ci + 16), v1);
        }
        _mm512_mask_storeu_ps(ci, lo, v0);
        _mm512_mask_storeu_ps(ci + 16, hi, v1);
    }
}

/// Packs rows [i0, i0 + rows) x columns [k0, k0 + kc) of op(A) into an A micro-panel at dst (mr x kc; rows past
/// `rows` zero): as rows (kc apart) when op(A) is A, as columns ([kc][mr]) when op(A) is A^T.
template <class T>
MOONMOE_TARGET_AVX512 inline void pack_a(Trans ta, View<const T, 2> A, index_t i0, index_t rows, index_t k0, index_t kc,
                                         float* dst) {
    const index_t lda = A.strides[0];
    if (ta == Trans::no) {
        for (index_t i = 0; i < P::mr; ++i) {
            float* d = dst + i * P::kc;
            if (i >= rows) {
                std::fill(d, d + kc, 0.0f);
                continue;
            }
            const T* s = A.data + (i0 + i) * lda + k0;
            index_t k = 0;
            for (; k + 16 <= kc; k += 16) _mm512_storeu_ps(d + k, load16(s + k));
            for (; k < kc; ++k) d[k] = convert<float>(s[k]);
        }
    } else {
        for (index_t k = 0; k < kc; ++k) {
            const T* s = A.data + (k0 + k) * lda + i0;
            float* d = dst + k * P::mr;
            for (index_t i = 0; i < P::mr; ++i) d[i] = i < rows ? convert<float>(s[i]) : 0.0f;
        }
    }
}

/// Packs rows [k0, k0 + kc) x columns [j0, j0 + nc) of op(B) into B micro-panels ([kc][nr] each, columns past nc
/// zero) at dst. (Software prefetches of B's rows, ahead in the row or into the next segment, made the transposed
/// packing of a bf16 W [2048, 7168] slower here, 3.0 -> 4.6-5.1 ms: the hardware's prefetchers do better alone.)
template <class T>
MOONMOE_TARGET_AVX512 inline void pack_b(Trans tb, View<const T, 2> B, index_t k0, index_t kc, index_t j0, index_t nc,
                                         float* dst) {
    const index_t ldb = B.strides[0];
    for (index_t jp = 0; jp < nc; jp += P::nr) {
        const index_t w = std::min(P::nr, nc - jp);
        float* d = dst + jp * kc;
        if (tb == Trans::no) {  // row k of op(B) is row k of B: 32 contiguous columns
            for (index_t kk = 0; kk < kc; ++kk) {
                const T* s = B.data + (k0 + kk) * ldb + j0 + jp;
                if (w == P::nr) {
                    _mm512_store_ps(d + kk * P::nr, load16(s));
                    _mm512_store_ps(d + kk * P::nr + 16, load16(s + 16));
                } else {
                    for (index_t j = 0; j < P::nr; ++j) d[kk * P::nr + j] = j < w ? convert<float>(s[j]) : 0.0f;
                }
            }
            continue;
        }
        // op(B) = B^T: column j of op(B) is row j0 + jp + j of B, contiguous in k
        index_t kk = 0;
        if (w == P::nr) {
            for (; kk + 16 <= kc; kk += 16) {
                for (index_t h = 0; h < 2; ++h) {
                    const T* s = B.data + (j0 + jp + 16 * h) * ldb + k0 + kk;
                    __m512 r[16];
                    MOONMOE_UNROLL_ALL for (int i = 0; i < 16; ++i) { r[i] = load16(s + i * ldb); }
                    transpose16(r);
                    MOONMOE_UNROLL_ALL for (int i = 0; i < 16; ++i)
                        _mm512_store_ps(d + (kk + i) * P::nr + 16 * h, r[i]);
                }
            }
        }
        for (; kk < kc; ++kk)
            for (index_t j = 0; j < P::nr; ++j)
                d[kk * P::nr + j] = j < w ? convert<float>(B.data[(j0 + jp + j) * ldb + k0 + kk]) : 0.0f;
    }
}

/// The mask of the first `count` (0..16) lanes.
inline __mmask16 lanes(index_t count) {
    return count >= 16 ? __mmask16(0xffff) : __mmask16((1u << unsigned(std::max<index_t>(count, 0))) - 1u);
}

/// Columns [lo, hi) of C over all its m rows, with op(A) packed whole at ap (for each k block, its micro-panels in
/// turn): for each nc columns and each k block, that block of op(B) packed into bp, then the micro-kernel over every
/// A micro-panel and every B micro-panel.
template <bool rows_a, class TB>
MOONMOE_TARGET_AVX512 inline void columns(Trans tb, View<const TB, 2> B, index_t k, float alpha, const float* ap,
                                          float beta, View<float, 2> C, index_t lo, index_t hi, float* bp) {
    const index_t m = C.shape[0], panels = (m + P::mr - 1) / P::mr;
    for (index_t j0 = lo; j0 < hi; j0 += P::nc) {
        const index_t nc = std::min(P::nc, hi - j0);
        for (index_t k0 = 0; k0 < k; k0 += P::kc) {
            const index_t kc = std::min(P::kc, k - k0);
            pack_b<TB>(tb, B, k0, kc, j0, nc, bp);
            const float* a_block = ap + (k0 / P::kc) * panels * P::mr * P::kc;
            for (index_t p = 0; p < panels; ++p) {
                const index_t i0 = p * P::mr;
                for (index_t jp = 0; jp < nc; jp += P::nr) {
                    const index_t w = std::min(P::nr, nc - jp);
                    micro_kernel<rows_a>(kc, a_block + p * P::mr * P::kc, bp + jp * kc,
                                         C.data + i0 * C.strides[0] + j0 + jp, C.strides[0], std::min(P::mr, m - i0),
                                         lanes(w), lanes(w - 16), k0 == 0, alpha, beta);
                }
            }
        }
    }
}

}  // namespace packed

/// C [m, n] = alpha op(A) op(B) + beta C, A and B f32 or bf16 (widened as they are packed), rows of every operand
/// contiguous, on the pool: op(A) is packed once (its micro-panels shared out), then the columns of C are cut into
/// parts of whole micro-panels, each part packing its own blocks of op(B) (a part is at least 128 columns and there
/// are up to two per thread; with fewer columns than that, rows are cut instead, each part packing its rows of op(A)
/// and all of op(B)). Call only when packed_gemm_available().
template <class TA, class TB>
MOONMOE_TARGET_AVX512 void gemm_packed(Trans ta, Trans tb, float alpha, View<const TA, 2> A, View<const TB, 2> B,
                                       float beta, View<float, 2> C) {
    using P = PackedBlocking;
    const index_t m = C.shape[0], n = C.shape[1], k = ta == Trans::no ? A.shape[1] : A.shape[0];
    if (m == 0 || n == 0) return;
    if (k == 0) return packed_driver::scale(beta, C);
    const auto rows_part = [&](View<const TA, 2> a, View<float, 2> c) {
        gemm_packed<TA, TB>(ta, tb, alpha, a, B, beta, c);
    };
    if (packed_driver::cut_rows<P>(ta, A, k, C, rows_part)) return;
    packed_driver::run<P, float>(
        m, n, k,
        [&](index_t k0, index_t p, float* dst) {
            packed::pack_a<TA>(ta, A, p * P::mr, std::min(P::mr, m - p * P::mr), k0, std::min(P::kc, k - k0), dst);
        },
        [&](const float* ap, index_t lo, index_t hi, float* bp) {
            if (ta == Trans::no) packed::columns<true, TB>(tb, B, k, alpha, ap, beta, C, lo, hi, bp);
            else
                packed::columns<false, TB>(tb, B, k, alpha, ap, beta, C, lo, hi, bp);
        });
}
#undef MOONMOE_TARGET_AVX512
#undef MOONMOE_UNROLL_ALL
#else
template <class TA, class TB>
inline void gemm_packed(Trans, Trans, float, View<const TA, 2>, View<const TB, 2>, float, View<float, 2>) {}
#endif

}  // namespace moonmoe::backend::cpu_detail
