// moonmoe/backend/cpu/blas.hpp: BlasOps<cpu> (backend/blas.hpp), on Eigen.
//
// GEMM goes to the engine gemm_engine.hpp chooses for the CPU and the product: Eigen's GEBP kernel (or BLAS when
// built with EIGEN_USE_BLAS), except X W^T with few rows of X, which skips packing (gemm_small.hpp); the library's
// packed AVX-512 kernel (gemm_packed.hpp); or oneDNN's matmul (onednn.hpp). For a fixed thread count every result
// is a function of the inputs alone: Eigen's and oneDNN's GEMMs are split into panels by shape and thread count, each
// panel one single-threaded product; the packed kernel cuts C into parts of its own and sums every element in one
// order, so its results do not depend on the thread count at all.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <span>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "gemm_engine.hpp"
#include "gemm_packed.hpp"
#include "gemm_small.hpp"
#include "gemm_small_bf16.hpp"
#include "map.hpp"
#include "memory.hpp"  // gemm_bf16 widens its operands into f32 tensors
#include "onednn.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {
template <class T>
using RowMajor = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using ConstMap = Eigen::Map<const RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using MutMap = Eigen::Map<RowMajor<T>, Eigen::Unaligned, Eigen::OuterStride<>>;

template <class T>
ConstMap<T> as_matrix(View<const T, 2> v) {
    return ConstMap<T>(v.data, v.shape[0], v.shape[1], Eigen::OuterStride<>(v.strides[0]));
}
template <class T>
MutMap<T> as_matrix(View<T, 2> v) {
    return MutMap<T>(v.data, v.shape[0], v.shape[1], Eigen::OuterStride<>(v.strides[0]));
}

/// How Ops::gemm splits C [m, n] = op(A) op(B) over `threads` threads: into `chunks` panels of `width` columns
/// (along_n) or rows, cut from the larger side. Each panel is one single-threaded product that re-packs the whole
/// other operand, which costs about 1/width of the panel's arithmetic (4-8% at width 256 for Eigen, measured): so a
/// panel is at least PanelSizes::min_width wide and gemm_min_chunk_flops of work (smaller ones cost more to hand to
/// a thread than they save), and there are at most `per_thread` panels per thread, enough for the threads that run
/// to take over the panels of one that is descheduled; every thread gets one where the product has a panel of 256
/// for each. One thread: one panel, unless max_width (if not 0) asks for narrower ones.
/// Decided by the shape and the thread count alone, so results are repeatable for a fixed thread count.
struct GemmSplit {
    bool along_n;
    index_t chunks, width;
};
struct PanelSizes {
    index_t min_width, per_thread, max_width;
};
inline constexpr double gemm_min_chunk_flops = 8e6;
/// Eigen's: each panel one GEBP product with Eigen's own blocking.
inline constexpr PanelSizes eigen_panels{256, 4, 0};
/// oneDNN's (onednn.hpp), measured on the Xeon of docs/cpu_gemm.md (oneDNN 2.6.3): one f32 call over all of X W
/// [1024, 7168] took 490-558 ms on one thread, the same in panels of 2048 columns 192-204 ms (dY^T X [2048, 7168]
/// 415-433 -> 209 ms; o_proj's X W^T 885-985 -> 818-865 ms): oneDNN packs the whole wide operand per call, a
/// panel's part stays in the caches. At two threads, panels of 768 or more, two per thread, took 0.84-0.93x the
/// time of Eigen's 256 / four per thread (q_a 99 -> 83 ms, X W [2048, 2048] 70 -> 57 ms): each re-packs the other
/// operand, which oneDNN's packing makes dearer than Eigen's.
inline constexpr PanelSizes onednn_panels{768, 2, 2048};
/// The rows of op(A) for which a product on oneDNN whose C rows are not contiguous (a panel of C's columns, a pitched
/// C) is written into a dense scratch first (onednn_dense_c): oneDNN 2.6.3's brgemm matmul takes only a dense C and
/// otherwise falls back to its gemm:jit kernels, which on AMD Zen 5 took 1.1-1.6x brgemm's time from 17 to 192 rows
/// (X W^T [96, 2048] x 7168 in two panels at two threads: f32 8.2 against 7.0 ms, bf16 4.3 against 3.5), but 0.75x
/// at one row and 0.9-1.0x at 1024 (docs/cpu_gemm.md, "AMD Zen 5: oneDNN's panels written dense").
inline constexpr index_t onednn_dense_c_min_rows = 2, onednn_dense_c_max_rows = 255;
inline GemmSplit gemm_split(index_t m, index_t n, index_t k, int threads, PanelSizes sizes = eigen_panels) {
    const bool along_n = n >= m;
    const index_t L = along_n ? n : m;
    const double flops = 2.0 * double(m) * double(n) * double(k);
    const index_t most = threads > 1 ? sizes.per_thread * index_t(threads) : 1;
    const index_t by_flops = index_t(std::min(flops / gemm_min_chunk_flops, double(most)));
    index_t chunks = std::min(L / sizes.min_width, by_flops);
    chunks = std::max(chunks, std::min({index_t(threads), L / eigen_panels.min_width, by_flops}));
    chunks = std::clamp<index_t>(chunks, 1, most);
    if (sizes.max_width > 0) chunks = std::max(chunks, (L + sizes.max_width - 1) / sizes.max_width);
    const index_t width = ((L + chunks - 1) / chunks + 15) / 16 * 16;  // whole SIMD widths
    return {along_n, (L + width - 1) / width, width};
}

/// Cuts C [m, n] = op(A) op(B) into gemm_split's panels of these sizes and runs panel(op(A)'s part, op(B)'s part,
/// C's part) for each on the pool: a panel of columns takes all of op(A), a panel of rows all of op(B). k is op(A)'s
/// columns.
template <class T, class TC, class Panel>
void for_each_panel(Trans ta, Trans tb, View<const T, 2> A, View<const T, 2> B, View<TC, 2> C, index_t k, Panel&& panel,
                    PanelSizes sizes = eigen_panels) {
    const index_t m = C.shape[0], n = C.shape[1];
    const GemmSplit s = gemm_split(m, n, k, parallel_depth > 0 ? 1 : threads(), sizes);
    parallel_chunks(s.chunks, [&](index_t p) {
        const index_t lo = p * s.width, w = std::min(s.width, (s.along_n ? n : m) - lo);
        if (s.along_n) {  // columns [lo, lo + w) of C and of op(B)
            const View<const T, 2> b = tb == Trans::no
                                           ? View<const T, 2>(B.data + lo, {k, w}, B.strides)
                                           : View<const T, 2>(B.data + lo * B.strides[0], {w, k}, B.strides);
            panel(A, b, View<TC, 2>(C.data + lo, {m, w}, C.strides));
        } else {  // rows [lo, lo + w) of C and of op(A)
            const View<const T, 2> a = ta == Trans::no ? View<const T, 2>(A.data + lo * A.strides[0], {w, k}, A.strides)
                                                       : View<const T, 2>(A.data + lo, {k, w}, A.strides);
            panel(a, B, View<TC, 2>(C.data + lo * C.strides[0], {w, n}, C.strides));
        }
    });
}

/// Runs product(s) with s a copy of C [m, n] in this thread's scratch, its rows `pitch` apart (pitch >= n; C's values
/// copied in first where the product reads C, beta != 0), then copies s into C.
template <class TC, class Product>
void through_scratch(View<TC, 2> C, index_t pitch, bool reads_c, Product&& product) {
    const index_t m = C.shape[0], n = C.shape[1];
    thread_local std::vector<TC> scratch;
    scratch.resize(std::size_t(m * pitch));
    const View<TC, 2> s(scratch.data(), {m, n}, {pitch, 1});
    for (index_t i = 0; reads_c && i < m; ++i) std::copy_n(C.data + i * C.strides[0], n, s.data + i * pitch);
    product(s);
    for (index_t i = 0; i < m; ++i) std::copy_n(s.data + i * pitch, n, C.data + i * C.strides[0]);
}

/// product(C) on oneDNN: through a dense scratch where C's rows are not contiguous and op(A) has the rows for which
/// that is faster (onednn_dense_c_min_rows), else on C as it is.
template <class TC, class Product>
void onednn_dense_c(View<TC, 2> C, bool reads_c, Product&& product) {
    const index_t m = C.shape[0];
    if (C.strides[0] != C.shape[1] && m >= onednn_dense_c_min_rows && m <= onednn_dense_c_max_rows)
        through_scratch<TC>(C, C.shape[1], reads_c, product);
    else
        product(C);
}

/// C [m, n] = product(A, op(B)'s columns, C's columns) over panels of `width` columns fixed by n, on the pool, each
/// written into the thread's scratch of row stride `width` and then copied into C (through_scratch). For products
/// whose n and C's row stride change from call to call, such as a decoded token's scores against its growing cache:
/// oneDNN makes a primitive per shape and strides (onednn.hpp), so writing C directly made new ones for every panel
/// of every token; through the scratch only the last panel's width varies (at most `width` shapes per m and k). Cut
/// by the shape, not by the threads, so results do not depend on the thread count.
template <class T, class Product>
void for_each_fixed_panel(Trans tb, View<const T, 2> B, bool reads_c, View<float, 2> C, index_t width,
                          Product&& product) {
    const index_t m = C.shape[0], n = C.shape[1], k = tb == Trans::yes ? B.shape[1] : B.shape[0];
    parallel_chunks((n + width - 1) / width, [&](index_t p) {
        const index_t lo = p * width, w = std::min(width, n - lo);
        const View<const T, 2> part = tb == Trans::yes ? View<const T, 2>(B.data + lo * B.strides[0], {w, k}, B.strides)
                                                       : View<const T, 2>(B.data + lo, {k, w}, B.strides);
        through_scratch<float>(View<float, 2>(C.data + lo, {m, w}, C.strides), width, reads_c,
                               [&](View<float, 2> s) { product(part, s); });
    });
}

/// C [m, n] = product(A's columns, B's rows, beta) over panels of `width` of the inner size k, in order: the first
/// panel with the caller's beta, the later ones added (beta 1), A's part copied into the thread's scratch of row
/// stride `width`. For products whose inner size and A's row stride change from call to call, such as a decoded
/// token's P V against its growing cache: through the scratch only the last panel's size varies, so oneDNN makes at
/// most `width` primitives per m and n instead of one per token (for_each_fixed_panel does the same for C's columns).
/// The panels run in turn, each product on the pool as it chooses.
template <class T, class TB, class Product>
void for_each_inner_panel(View<const T, 2> A, View<const TB, 2> B, float beta, index_t width, Product&& product) {
    const index_t m = A.shape[0], k = A.shape[1];
    thread_local std::vector<T> scratch;
    scratch.resize(std::size_t(m * width));
    for (index_t lo = 0; lo < k; lo += width) {
        const index_t w = std::min(width, k - lo);
        for (index_t i = 0; i < m; ++i) std::copy_n(A.data + i * A.strides[0] + lo, w, scratch.data() + i * width);
        product(View<const T, 2>(scratch.data(), {m, w}, {width, 1}),
                View<const TB, 2>(B.data + lo * B.strides[0], {w, B.shape[1]}, B.strides), lo ? 1.0f : beta);
    }
}

/// Rows per panel of syrk_bf16's lower triangle on the few-rows VDPBF16PS kernel (gemm_small_bf16.hpp), and the most
/// rows of X it takes there. X X^T at two threads on AMD Zen 4: 576 x 7168 in panels of 64 / 48 / 32 / 16 rows
/// 7.1 / 6.6 / 6.4 / 6.4 ms (oneDNN's panels 8.0); in panels of 32, 2048 x 7168 79 ms (85), but 4096 x 4096 218-244
/// (205) and 7168 x 8192 1167 (1147), where each panel streams thousands of X's rows from memory and oneDNN's larger
/// panels run nearer its peak.
inline constexpr index_t syrk_few_rows = 32, syrk_few_rows_max_n = 2048;

/// A tile of a SYRK's C [n, n] on or below the diagonal: rows [r0, r1), columns [c0, c1).
struct LowerTile {
    index_t r0, r1, c0, c1;
};

/// C's lower triangle cut into row panels of `rows` rows, each panel's columns up to its last row (the diagonal
/// block whole) cut into pieces of at most `width` columns, starting at multiples of 16; the largest first, so that
/// threads taking them in order finish together. By the shape alone, so results do not depend on the threads.
inline std::vector<LowerTile> lower_tiles(index_t n, index_t rows, index_t width) {
    std::vector<LowerTile> tiles;
    for (index_t r0 = 0; r0 < n; r0 += rows) {
        const index_t r1 = std::min(n, r0 + rows), pieces = (r1 + width - 1) / width;
        for (index_t q = 0; q < pieces; ++q)
            tiles.push_back(
                {r0, r1, r1 * q / pieces / 16 * 16, q + 1 == pieces ? r1 : r1 * (q + 1) / pieces / 16 * 16});
    }
    std::stable_sort(tiles.begin(), tiles.end(), [](const LowerTile& a, const LowerTile& b) {
        return (a.r1 - a.r0) * (a.c1 - a.c0) > (b.r1 - b.r0) * (b.c1 - b.c0);
    });
    return tiles;
}

/// SYRK as products of A's rows against A's rows: product(A's rows of a tile, A's rows of its columns, the tile of
/// C) for each of lower_tiles(n, rows, width) on the pool (one thread each), then the lower triangle mirrored.
template <class T, class TC, class Product>
void syrk_on_tiles(View<const T, 2> A, View<TC, 2> C, index_t rows, index_t width, Product&& product) {
    const index_t k = A.shape[1];
    const std::vector<LowerTile> tiles = lower_tiles(A.shape[0], rows, width);
    parallel_chunks(index_t(tiles.size()), [&](index_t t) {
        const LowerTile& q = tiles[std::size_t(t)];
        product(View<const T, 2>(A.data + q.r0 * A.strides[0], {q.r1 - q.r0, k}, A.strides),
                View<const T, 2>(A.data + q.c0 * A.strides[0], {q.c1 - q.c0, k}, A.strides),
                View<TC, 2>(C.data + q.r0 * C.strides[0] + q.c0, {q.r1 - q.r0, q.c1 - q.c0}, C.strides));
    });
    mirror_lower(C);
}

/// C = alpha op(A) op(B) + beta C with one Eigen product on this thread (Ops::gemm keeps Eigen's threads off).
template <class T>
void gemm_panel(Trans ta, Trans tb, T alpha, View<const T, 2> A, View<const T, 2> B, T beta, View<T, 2> C) {
    auto c = as_matrix<T>(C);
    auto a = as_matrix<T>(A);
    auto b = as_matrix<T>(B);
    auto run = [&](const auto& opa, const auto& opb) {
        if (beta == T(0)) {
            c.noalias() = alpha * (opa * opb);
        } else {
            if (beta != T(1)) c *= beta;
            c.noalias() += alpha * (opa * opb);
        }
    };
    if (ta == Trans::no && tb == Trans::no) run(a, b);
    else if (ta == Trans::no)
        run(a, b.transpose());
    else if (tb == Trans::no)
        run(a.transpose(), b);
    else
        run(a.transpose(), b.transpose());
}

}  // namespace cpu_detail

template <>
struct BlasOps<cpu> {
    /// C = alpha * op(A) op(B) + beta * C, op = transpose when asked, T = float or double. Shapes are checked
    /// and named on mismatch.
    template <class T = float>
    static void gemm(Trans ta, Trans tb, std::type_identity_t<T> alpha, View<const std::type_identity_t<T>, 2> A,
                     View<const std::type_identity_t<T>, 2> B, std::type_identity_t<T> beta,
                     View<std::type_identity_t<T>, 2> C) {
        using namespace cpu_detail;
        const contract::GemmShape shape = contract::check_gemm<T>("gemm", ta, tb, A, B, C);
        const index_t m = shape.m, n = shape.n, k = shape.k;
        auto c = as_matrix<T>(C);
        if (m == 0 || n == 0) return;
        if (k == 0) {
            if (beta == T(0)) c.setZero();
            else
                c *= beta;
            return;
        }
        if constexpr (std::is_same_v<T, float>) {
#if MOONMOE_WITH_ONEDNN
            if (f32_gemm_engine(ta, tb, m) == GemmEngine::onednn) {
                for_each_panel<float, float>(
                    ta, tb, A, B, C, k,
                    [&](View<const float, 2> a, View<const float, 2> b, View<float, 2> c) {
                        onednn_dense_c<float>(c, beta != 0.0f, [&](View<float, 2> out) {
                            onednn::gemm<float, float>(ta, tb, alpha, a, b, beta, out);
                        });
                    },
                    onednn_panels);
                return;
            }
#endif
            if (f32_gemm_engine(ta, tb, m) == GemmEngine::packed) {
                gemm_packed<float, float>(ta, tb, alpha, A, B, beta, C);  // on the pool (gemm_packed.hpp)
                return;
            }
            if (takes_small_gemm(ta, tb, m, n, k)) {
                gemm_small_nt(alpha, A, B, beta, C);  // few rows against a big weight: no packing (gemm_small.hpp)
                return;
            }
        }
#if defined(EIGEN_USE_BLAS)
        gemm_panel<T>(ta, tb, alpha, A, B, beta, C);  // one call: the BLAS runs its own threads
#else
        // Eigen's parallel GEMM waits for its threads in spin loops and splits by the thread count it gets; panels
        // on the pool instead. Re-applied here in case the application changed it.
        if (parallel_depth == 0 && Eigen::nbThreads() != 1) Eigen::setNbThreads(1);
        for_each_panel<T, T>(ta, tb, A, B, C, k, [&](View<const T, 2> a, View<const T, 2> b, View<T, 2> c) {
            gemm_panel<T>(ta, tb, alpha, a, b, beta, c);
        });
#endif
    }

    /// y = x W^T (+ y if accumulate): the Linear layer, x [rows, in], W [out, in].
    static void linear(View<const float, 2> x, View<const float, 2> W, View<float, 2> y, bool accumulate = false) {
        gemm<float>(Trans::no, Trans::yes, 1.0f, x, W, accumulate ? 1.0f : 0.0f, y);
    }

    /// C = alpha A A^T + beta C for a symmetric C [n, n] (SYRK), computing only the blocks on and below the
    /// diagonal with GEMMs (b(b+1)/2 of b^2 blocks of 256 rows: 62% of the FLOPs at n = 1024, tending to 50%),
    /// then mirroring. GEMM blocks keep the fast kernel and its threads, which Eigen's own triangular product lacks.
    template <class T = float>
    static void syrk(std::type_identity_t<T> alpha, View<const std::type_identity_t<T>, 2> A,
                     std::type_identity_t<T> beta, View<std::type_identity_t<T>, 2> C) {
        contract::check_syrk<T>("syrk", A, C);
        constexpr index_t block = 256;
        cpu_detail::syrk_on_tiles<T, T>(A, C, block, block, [&](View<const T, 2> a, View<const T, 2> b, View<T, 2> c) {
            gemm<T>(Trans::no, Trans::yes, alpha, a, b, beta, c);
        });
    }

    /// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, each operand advancing by its stride (in elements)
    /// between matrices (0 reuses A or B; C's only for one product); the batch runs in parallel, each GEMM on one
    /// thread.
    static void gemm_strided_batched(index_t count, Trans ta, Trans tb, float alpha, View<const float, 2> A,
                                     index_t stride_a, View<const float, 2> B, index_t stride_b, float beta,
                                     View<float, 2> C, index_t stride_c) {
        contract::check_gemm<float>("gemm_strided_batched", ta, tb, A, B, C);
        contract::check_batch("gemm_strided_batched", count, stride_a, stride_b, stride_c);
        cpu_detail::parallel_for(count, [&](index_t i) {
            View<const float, 2> a(A.data + i * stride_a, A.shape, A.strides),
                b(B.data + i * stride_b, B.shape, B.strides);
            gemm<float>(ta, tb, alpha, a, b, beta, View<float, 2>(C.data + i * stride_c, C.shape, C.strides));
        });
    }

    /// Y[seg g] = alpha X[seg g] op(W_g) + beta Y[seg g], seg g = rows [offsets[g], offsets[g + 1]); W [groups, ., .].
    /// The groups run one after the other, each GEMM on every thread (a segment is usually hundreds of rows).
    /// T = float, or bf16 (gemm_bf16<TC> per segment, Y f32 or bf16).
    template <class T = float, class TC = float>
    static void gemm_grouped(Trans tw, float alpha, View<const std::type_identity_t<T>, 2> X,
                             View<const std::type_identity_t<T>, 3> W, float beta, View<std::type_identity_t<TC>, 2> Y,
                             std::span<const index_t> offsets) {
        contract::check_gemm_grouped(X, W, Y, offsets);
        for (index_t g = 0; g + 1 < index_t(offsets.size()); ++g) {
            const index_t lo = offsets[g], n = offsets[g + 1] - lo;
            if (n == 0) continue;
            product<T, TC>(Trans::no, tw, alpha, X.slice(0, lo, lo + n), W[g], beta, Y.slice(0, lo, lo + n));
        }
    }

    /// dW_g = alpha dY[seg g]^T X[seg g] + beta dW_g for every group g: dY [rows, n], X [rows, k], dW [groups, n, k].
    /// T = float, or bf16 (gemm_bf16 per segment, f32 dW).
    template <class T = float>
    static void gemm_grouped_weight_grad(float alpha, View<const std::type_identity_t<T>, 2> dY,
                                         View<const std::type_identity_t<T>, 2> X, float beta, View<float, 3> dW,
                                         std::span<const index_t> offsets) {
        contract::check_gemm_grouped_weight_grad(dY, X, dW, offsets);
        for (index_t g = 0; g + 1 < index_t(offsets.size()); ++g) {
            const index_t lo = offsets[g], n = offsets[g + 1] - lo;
            if (n == 0) {
                if (beta != 1.0f) scale_in_place(dW[g], beta);
                continue;
            }
            product<T>(Trans::yes, Trans::no, alpha, dY.slice(0, lo, lo + n), X.slice(0, lo, lo + n), beta, dW[g]);
        }
    }

    /// C = alpha op(A) op(B) + beta C with bf16 operands, f32 accumulation and an f32 or bf16 C (backend/blas.hpp),
    /// rounded once to C's type. On the engine gemm_engine.hpp chooses: oneDNN's native bf16 matmul, in panels on
    /// the pool (cpu/onednn.hpp); for X W^T with few rows, the library's kernel (on AVX512_BF16 both operands as
    /// they are, gemm_small_bf16.hpp; elsewhere gemm_small.hpp: X widened, W widened in registers as it streams by);
    /// or both operands widened to f32 (exact) and the f32 gemm run on them. They differ only in the f32 summation
    /// order. gemm_engine_name() says which runs.
    template <class TC = float>
    static void gemm_bf16(Trans ta, Trans tb, float alpha, View<const bf16, 2> A, View<const bf16, 2> B, float beta,
                          View<std::type_identity_t<TC>, 2> C) {
        static_assert(contract::bf16_gemm_output<TC>, "gemm_bf16: C is float or bf16");
        const contract::GemmShape shape = contract::check_gemm_operands("gemm_bf16", ta, tb, A, B, C);
        const GemmEngine engine = bf16_gemm_engine(ta, tb, shape.m);
#if MOONMOE_WITH_ONEDNN
        if (shape.m > 0 && shape.n > 0 && shape.k > 0 && engine == GemmEngine::onednn) {
            cpu_detail::for_each_panel<bf16, TC>(
                ta, tb, A, B, C, shape.k,
                [&](View<const bf16, 2> a, View<const bf16, 2> b, View<TC, 2> c) {
                    cpu_detail::onednn_dense_c<TC>(c, beta != 0.0f, [&](View<TC, 2> out) {
                        cpu_detail::onednn::gemm<bf16, TC>(ta, tb, alpha, a, b, beta, out);
                    });
                },
                cpu_detail::onednn_panels);
            return;
        }
#endif
        if (engine == GemmEngine::amx) {  // on AMX tiles (gemm_amx.hpp)
            if (shape.m == 0 || shape.n == 0) return;
            cpu_detail::gemm_amx<TC>(ta, tb, alpha, A, B, beta, C);  // a bf16 C rounded in its epilogue
            return;
        }
        if (engine == GemmEngine::packed) {  // widened as it is packed (gemm_packed.hpp)
            if (shape.m == 0 || shape.n == 0) return;
            with_f32_c(beta, C,
                       [&](View<float, 2> c) { cpu_detail::gemm_packed<bf16, bf16>(ta, tb, alpha, A, B, beta, c); });
            return;
        }
        if (engine == GemmEngine::library && cpu_detail::takes_small_gemm_bf16(ta, tb, shape.m, shape.n, shape.k)) {
            // both operands as they are, on VDPBF16PS
            with_f32_c(beta, C, [&](View<float, 2> c) { cpu_detail::gemm_small_nt_bf16(alpha, A, B, beta, c); });
            return;
        }
        const bool few = cpu_detail::takes_small_gemm(ta, tb, shape.m, shape.n, shape.k);
        const Tensor<float, 2> a = widened(A);
        if (engine == GemmEngine::library && few) {  // B streams by, widened in registers
            with_f32_c(beta, C,
                       [&](View<float, 2> c) { cpu_detail::gemm_small_nt<bf16>(alpha, a.view(), B, beta, c); });
            return;
        }
        if (engine == GemmEngine::library && cpu_detail::takes_small_gemm_nn(ta, tb, shape.m)) {  // X W, the same
            with_f32_c(beta, C,
                       [&](View<float, 2> c) { cpu_detail::gemm_small_nn<bf16>(alpha, a.view(), B, beta, c); });
            return;
        }
        // X X^T and A A (Newton-Schulz) multiply a matrix by itself: widened once
        const bool same = B.data == A.data && B.shape == A.shape && B.strides == A.strides;
        const Tensor<float, 2> b = same ? Tensor<float, 2>() : widened(B);
        const View<const float, 2> b32 = same ? a.view() : b.view();
        with_f32_c(beta, C, [&](View<float, 2> c) { gemm<float>(ta, tb, alpha, a.view(), b32, beta, c); });
    }

    /// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count with bf16 operands (gemm_bf16), operand i at data + i *
    /// stride (0 reuses one operand); the batch runs in parallel, each product on one thread.
    template <class TC = float>
    static void gemm_bf16_strided_batched(index_t count, Trans ta, Trans tb, float alpha, View<const bf16, 2> A,
                                          index_t stride_a, View<const bf16, 2> B, index_t stride_b, float beta,
                                          View<std::type_identity_t<TC>, 2> C, index_t stride_c) {
        static_assert(contract::bf16_gemm_output<TC>, "gemm_bf16_strided_batched: C is float or bf16");
        contract::check_gemm_operands("gemm_bf16_strided_batched", ta, tb, A, B, C);
        contract::check_batch("gemm_bf16_strided_batched", count, stride_a, stride_b, stride_c);
        cpu_detail::parallel_for(count, [&](index_t i) {
            gemm_bf16<TC>(ta, tb, alpha, View<const bf16, 2>(A.data + i * stride_a, A.shape, A.strides),
                          View<const bf16, 2>(B.data + i * stride_b, B.shape, B.strides), beta,
                          View<TC, 2>(C.data + i * stride_c, C.shape, C.strides));
        });
    }

    /// C = alpha X X^T + beta C with a bf16 X [n, k] and a symmetric C [n, n] (f32 or bf16), each element rounded
    /// once. Where gemm_bf16 would widen X X^T to f32 (cpu/gemm_engine.hpp), X is widened once and the f32 SYRK runs
    /// on it (half the FLOPs of the product); on the AMX kernel, its tiles on and below the diagonal, each mirrored
    /// as it is written (half the FLOPs too); elsewhere, where bf16 runs natively, the lower triangle in row panels,
    /// each the product of its rows against those up to its last on one thread, then mirrored: panels of 32 rows on
    /// the library's VDPBF16PS kernel where the rules give it X W^T of 32 rows, up to 2048 rows of X (53 % of the
    /// FLOPs at 576), else of n / 8 rows (64 to 256) on oneDNN in pieces of up to 2048 columns (56-63 % of the FLOPs,
    /// 0.58-0.72x the full product's time on AMD Zen 4: docs/cpu_gemm.md; square blocks of 256 had run slower than
    /// the whole product: docs/precision.md). Either way C comes out exactly symmetric.
    template <class TC = bf16>
    static void syrk_bf16(float alpha, View<const bf16, 2> X, float beta, View<std::type_identity_t<TC>, 2> C) {
        static_assert(contract::bf16_gemm_output<TC>, "syrk_bf16: C is float or bf16");
        contract::check_syrk<bf16>("syrk_bf16", X, C);
        const index_t n = X.shape[0], k = X.shape[1];
        const GemmEngine e = bf16_gemm_engine(Trans::no, Trans::yes, n);
        if (e == GemmEngine::amx) {  // the tiles on and below the diagonal, each mirrored as it is written
            cpu_detail::gemm_amx<TC>(Trans::no, Trans::yes, alpha, X, X, beta, C, true);
            return;
        }
        // The lower triangle in row panels, each the X W^T of its rows against the rows up to its last, mirrored: in
        // panels of syrk_few_rows on the library's VDPBF16PS kernel where the rules give X W^T of that many rows to
        // it and n is at most syrk_few_rows_max_n, else on oneDNN in panels of n/8 rows (64-256) cut in pieces of at
        // most 2048 columns. On AMD Zen 4 at two threads, the first against the second: 576 x 7168 6.4 against 8.0 ms,
        // 2048 x 7168 79 against 85, 512 x 16384 12.2 against 16.5 (docs/cpu_gemm.md). The panels cover nothing when n
        // or k is 0, where the full product's beta C is what remains to do.
        const bool tiles = n > 0 && k > 0,
                   few_rows = tiles && n <= cpu_detail::syrk_few_rows_max_n &&
                              cpu_detail::small_gemm_bf16_available() &&
                              (e == GemmEngine::library || e == GemmEngine::onednn) &&
                              bf16_gemm_engine(Trans::no, Trans::yes, cpu_detail::syrk_few_rows) == GemmEngine::library;
        if (few_rows) {
            cpu_detail::syrk_on_tiles<bf16, TC>(
                X, C, cpu_detail::syrk_few_rows, n, [&](View<const bf16, 2> a, View<const bf16, 2> b, View<TC, 2> c) {
                    with_f32_c(beta, c,
                               [&](View<float, 2> c32) { cpu_detail::gemm_small_nt_bf16(alpha, a, b, beta, c32); });
                });
            return;
        }
        if (e == GemmEngine::onednn) {
#if MOONMOE_WITH_ONEDNN
            if (tiles) {
                const index_t rows = std::clamp<index_t>((n / 8 + 15) / 16 * 16, 64, 256);
                cpu_detail::syrk_on_tiles<bf16, TC>(X, C, rows, cpu_detail::onednn_panels.max_width,
                                                    [&](View<const bf16, 2> a, View<const bf16, 2> b, View<TC, 2> c) {
                                                        cpu_detail::onednn::gemm<bf16, TC>(Trans::no, Trans::yes, alpha,
                                                                                           a, b, beta, c);
                                                    });
                return;
            }
#endif
            gemm_bf16<TC>(Trans::no, Trans::yes, alpha, X, X, beta, C);
            cpu_detail::mirror_lower(C);
            return;
        }
        const Tensor<float, 2> x = widened(X);
        with_f32_c(beta, C, [&](View<float, 2> c) { syrk<float>(alpha, x.view(), beta, c); });
    }

private:
    /// gemm<float>, or gemm_bf16<TC>: one segment of the grouped products.
    template <class T, class TC = float>
    static void product(Trans ta, Trans tb, float alpha, View<const T, 2> A, View<const T, 2> B, float beta,
                        View<TC, 2> C) {
        if constexpr (std::is_same_v<T, bf16>) gemm_bf16<TC>(ta, tb, alpha, A, B, beta, C);
        else
            gemm<float>(ta, tb, alpha, A, B, beta, C);
    }

    /// A contiguous f32 copy of a bf16 matrix (exact).
    static Tensor<float, 2> widened(View<const bf16, 2> v) {
        auto out = Tensor<float, 2>::for_overwrite(v.shape);
        MapOps<cpu>::cast<float, bf16>(v, out.view());
        return out;
    }

    /// body(c) on C itself when it is f32; on an f32 copy of a bf16 C (read only when beta is not 0, as in BLAS),
    /// then rounded once into C.
    template <class TC, class Body>
    static void with_f32_c(float beta, View<TC, 2> C, Body&& body) {
        if constexpr (std::is_same_v<TC, float>) {
            body(C);
        } else {
            auto c = Tensor<float, 2>::for_overwrite(C.shape);  // the body writes all of it, reading it where beta != 0
            if (beta != 0.0f) MapOps<cpu>::cast<float, bf16>(C, c.view());
            body(c.view());
            MapOps<cpu>::cast<bf16, float>(c.view(), C);
        }
    }

    static void scale_in_place(View<float, 2> m, float beta) {
        for (index_t i = 0; i < m.shape[0]; ++i)
            for (index_t j = 0; j < m.shape[1]; ++j) m.data[i * m.strides[0] + j] *= beta;
    }
};

}  // namespace moonmoe::backend
