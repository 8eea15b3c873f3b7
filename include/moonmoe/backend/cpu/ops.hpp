// moonmoe/backend/cpu/ops.hpp: the compute primitives of Backend<cpu>, on Eigen.
//
// Matrices are row-major views whose rows are contiguous (row pitch = strides[0]), so a head's slice of a
// [tokens, heads * dim] activation is a matrix without a copy. GEMM goes to Eigen's GEBP kernel (or to BLAS when
// built with EIGEN_USE_BLAS), except X W^T with few rows of X, which skips packing (gemm_small.hpp); everything
// else is a row-parallel loop (threads.hpp).
//
// For a fixed thread count every result is a function of the inputs alone: not of the timing, nor of where the
// buffers lie in memory (which differs between runs and with thread timing). GEMMs are split into panels by shape
// and thread count, each panel one single-threaded Eigen product; the row loops compute each row the same way on
// any thread; the exponential, whose scalar and vector code round differently, always takes the vector path.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>
#include <cstdint>
#include <cstring>

#include "../../tensor/tensor.hpp"
#include "../backend.hpp"
#include "gemm_small.hpp"
#include "memory.hpp"
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
inline void require_rows(const char* op, const char* name, index_t stride) {
    if (stride != 1)
        throw shape_error(std::string(op) + ": " + name + " must have contiguous rows (unit column stride)");
}

// splitmix64: a counter-based generator, so element i gets the same number whatever the thread split.
inline std::uint64_t mix(std::uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
inline double uniform01(std::uint64_t seed, std::uint64_t i) {  // in (0, 1)
    return (double(mix(seed * 0x100000001B3ull + i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

/// How Ops::gemm splits C [m, n] = op(A) op(B) over `threads` threads: into `chunks` panels of `width` columns
/// (along_n) or rows, cut from the larger side. Each panel is one single-threaded Eigen product that re-packs the
/// whole other operand, which costs about 1/width of the panel's arithmetic (4-8% at width 256, measured): so a
/// panel is at least gemm_min_width wide and gemm_min_chunk_flops of work (smaller ones cost more to hand to a
/// thread than they save), and there are at most gemm_chunks_per_thread per thread, enough for the threads that
/// run to take over the panels of one that is descheduled. One thread: one panel, Eigen's own blocking.
/// Decided by the shape and the thread count alone, so results are repeatable for a fixed thread count.
struct GemmSplit {
    bool along_n;
    index_t chunks, width;
};
inline constexpr index_t gemm_min_width = 256;
inline constexpr double gemm_min_chunk_flops = 8e6;
inline constexpr index_t gemm_chunks_per_thread = 4;
inline GemmSplit gemm_split(index_t m, index_t n, index_t k, int threads) {
    const bool along_n = n >= m;
    const index_t L = along_n ? n : m;
    const double flops = 2.0 * double(m) * double(n) * double(k);
    const index_t most = threads > 1 ? gemm_chunks_per_thread * index_t(threads) : 1;
    const index_t by_flops = index_t(std::min(flops / gemm_min_chunk_flops, double(most)));
    const index_t chunks = std::clamp<index_t>(std::min(L / gemm_min_width, by_flops), 1, most);
    const index_t width = ((L + chunks - 1) / chunks + 15) / 16 * 16;  // whole SIMD widths
    return {along_n, (L + width - 1) / width, width};
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
    else if (ta == Trans::no) run(a, b.transpose());
    else if (tb == Trans::no) run(a.transpose(), b);
    else run(a.transpose(), b.transpose());
}
}  // namespace cpu_detail

template <>
struct Ops<cpu> {
    /// C = alpha * op(A) op(B) + beta * C, op = transpose when asked, T = float or double. Shapes are checked
    /// and named on mismatch.
    template <class T = float>
    static void gemm(Trans ta, Trans tb, std::type_identity_t<T> alpha, View<const std::type_identity_t<T>, 2> A,
                     View<const std::type_identity_t<T>, 2> B, std::type_identity_t<T> beta,
                     View<std::type_identity_t<T>, 2> C) {
        using namespace cpu_detail;
        require_rows("gemm", "A", A.strides[1]);
        require_rows("gemm", "B", B.strides[1]);
        require_rows("gemm", "C", C.strides[1]);
        const index_t m = ta == Trans::yes ? A.shape[1] : A.shape[0];
        const index_t k = ta == Trans::yes ? A.shape[0] : A.shape[1];
        const index_t kb = tb == Trans::yes ? B.shape[1] : B.shape[0];
        const index_t n = tb == Trans::yes ? B.shape[0] : B.shape[1];
        if (k != kb || C.shape[0] != m || C.shape[1] != n)
            throw shape_error("gemm: op(A) " + shape_string(Shape<2>{m, k}) + " times op(B) " +
                              shape_string(Shape<2>{kb, n}) + " into C " + shape_string(C.shape));
        auto c = as_matrix<T>(C);
        if (m == 0 || n == 0) return;
        if (k == 0) {
            if (beta == T(0)) c.setZero(); else c *= beta;
            return;
        }
        if constexpr (std::is_same_v<T, float>) {
            if (have_small_gemm && ta == Trans::no && tb == Trans::yes && m <= small_gemm_rows && k >= 256 && n >= 64) {
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
        const GemmSplit s = gemm_split(m, n, k, parallel_depth > 0 ? 1 : threads());
        parallel_chunks(s.chunks, [&](index_t p) {
            const index_t lo = p * s.width, w = std::min(s.width, (s.along_n ? n : m) - lo);
            if (s.along_n) {  // columns [lo, lo + w) of C and of op(B)
                const View<const T, 2> b = tb == Trans::no ? View<const T, 2>(B.data + lo, {k, w}, B.strides)
                                                           : View<const T, 2>(B.data + lo * B.strides[0], {w, k}, B.strides);
                gemm_panel<T>(ta, tb, alpha, A, b, beta, View<T, 2>(C.data + lo, {m, w}, C.strides));
            } else {          // rows [lo, lo + w) of C and of op(A)
                const View<const T, 2> a = ta == Trans::no ? View<const T, 2>(A.data + lo * A.strides[0], {w, k}, A.strides)
                                                           : View<const T, 2>(A.data + lo, {k, w}, A.strides);
                gemm_panel<T>(ta, tb, alpha, a, B, beta, View<T, 2>(C.data + lo * C.strides[0], {w, n}, C.strides));
            }
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
        using namespace cpu_detail;
        require_rows("syrk", "A", A.strides[1]);
        require_rows("syrk", "C", C.strides[1]);
        const index_t n = A.shape[0], k = A.shape[1];
        if (C.shape[0] != n || C.shape[1] != n)
            throw shape_error("syrk: A " + shape_string(A.shape) + " gives an [" + std::to_string(n) + ", " +
                              std::to_string(n) + "] result, C is " + shape_string(C.shape));
        constexpr index_t block = 256;
        const index_t nb = (n + block - 1) / block;
        std::vector<std::pair<index_t, index_t>> blocks;  // (i, j), j <= i: one parallel region for all of them
        for (index_t i = 0; i < nb; ++i)
            for (index_t j = 0; j <= i; ++j) blocks.emplace_back(i * block, j * block);
        parallel_chunks(index_t(blocks.size()), [&](index_t b) {
            const auto [i, j] = blocks[std::size_t(b)];
            const index_t bi = std::min(block, n - i), bj = std::min(block, n - j);
            gemm<T>(Trans::no, Trans::yes, alpha, View<const T, 2>(A.data + i * A.strides[0], {bi, k}, A.strides),
                    View<const T, 2>(A.data + j * A.strides[0], {bj, k}, A.strides), beta,
                    View<T, 2>(C.data + i * C.strides[0] + j, {bi, bj}, C.strides));
        });
        auto c = as_matrix<T>(C);
        c.template triangularView<Eigen::StrictlyUpper>() = c.transpose();
    }

    /// dst = src (same shape, any row pitch)
    template <class T = float>
    static void copy(View<const std::type_identity_t<T>, 2> src, View<std::type_identity_t<T>, 2> dst) {
        if (src.shape != dst.shape) throw_shape_mismatch("copy", src.shape, dst.shape);
        const index_t cols = src.shape[1];
        cpu_detail::parallel_for(src.shape[0], [&](index_t i) {
            std::memcpy(dst.data + i * dst.strides[0], src.data + i * src.strides[0], std::size_t(cols) * sizeof(T));
        });
    }

    /// dst[:] = value, rows in parallel (also how fresh pages get faulted in by every thread)
    static void fill(View<float, 2> dst, float value) {
        const index_t cols = dst.shape[1];
        cpu_detail::parallel_for(dst.shape[0], [&](index_t i) {
            float* row = dst.data + i * dst.strides[0];
            for (index_t j = 0; j < cols; ++j) row[j] = value;
        });
    }

    /// x[j] = exp(x[j] - shift) for j < n (vectorised).
    ///
    /// On a Map, Eigen computes the elements before the first 64-byte boundary and after the last whole packet
    /// with std::exp and the rest with its vectorised exp, and the two differ in the last bit: which elements got
    /// which depended on the buffer's address. Attention's score rows live in per-call heap buffers, whose
    /// addresses depend on what ran before and, at 2 threads, on which thread freed what when, so training runs
    /// at 2 threads differed between processes within a few steps. Here every element goes through the
    /// vectorised exp, the last partial packet padded in a small buffer: each result depends on its input alone.
    static void exp_shifted(float* x, index_t n, float shift) {
        namespace ei = Eigen::internal;
        using Packet = ei::packet_traits<float>::type;
        constexpr index_t width = ei::packet_traits<float>::size;
        const Packet s = ei::pset1<Packet>(shift);
        index_t j = 0;
        for (; j + width <= n; j += width) ei::pstoreu(x + j, ei::pexp(ei::psub(ei::ploadu<Packet>(x + j), s)));
        if (j < n) {
            float tail[width];
            std::fill(tail, tail + width, shift);
            std::memcpy(tail, x + j, std::size_t(n - j) * sizeof(float));
            ei::pstoreu(tail, ei::pexp(ei::psub(ei::ploadu<Packet>(tail), s)));
            std::memcpy(x + j, tail, std::size_t(n - j) * sizeof(float));
        }
    }

    /// Softmax of each row in place: exponentials in f32 (Eigen's vectorised exp), their sum in double. With
    /// causal_first >= 0 row i sees only columns t <= causal_first + i (the rest become 0): causal attention whose
    /// row 0 sits at key position causal_first. Writes each row's log-sum-exp to lse (if given); returns the largest
    /// visible input value.
    static float softmax_rows(View<float, 2> s, index_t causal_first = -1, float* lse = nullptr) {
        const index_t n = s.shape[0], L = s.shape[1];
        float max_value = -INFINITY;
        for (index_t i = 0; i < n; ++i) {
            float* row = s.data + i * s.strides[0];
            const index_t last = causal_first < 0 ? L - 1 : std::min(causal_first + i, L - 1);
            Eigen::Map<Eigen::ArrayXf> visible(row, last + 1);
            const float m = visible.maxCoeff();
            exp_shifted(row, last + 1, m);
            const double sum = visible.template cast<double>().sum();
            const float log_sum = m + float(std::log(sum));
            visible *= float(1.0 / sum);
            for (index_t t = last + 1; t < L; ++t) row[t] = 0.0f;
            if (lse) lse[i] = log_sum;
            max_value = std::max(max_value, m);
        }
        return max_value;
    }

    /// Indices of the k largest of v[0..n), largest first; ties go to the lower index.
    static std::vector<index_t> top_k(const float* v, index_t n, index_t k) {
        if (k < 0 || k > n) throw std::invalid_argument("top_k: k = " + std::to_string(k) + " of " + std::to_string(n));
        std::vector<index_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), index_t{0});
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [v](index_t a, index_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
        order.resize(static_cast<std::size_t>(k));
        return order;
    }

    /// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, each operand advancing by its stride (in elements)
    /// between matrices; the batch runs in parallel, each GEMM on one thread.
    static void gemm_batched(index_t count, Trans ta, Trans tb, float alpha, View<const float, 2> A, index_t stride_a,
                             View<const float, 2> B, index_t stride_b, float beta, View<float, 2> C, index_t stride_c) {
        cpu_detail::parallel_for(count, [&](index_t i) {
            View<const float, 2> a(A.data + i * stride_a, A.shape, A.strides), b(B.data + i * stride_b, B.shape, B.strides);
            gemm<float>(ta, tb, alpha, a, b, beta, View<float, 2>(C.data + i * stride_c, C.shape, C.strides));
        });
    }

    /// out[i, :] = in[index[i], :]
    static void gather_rows(View<const float, 2> in, const index_t* index, View<float, 2> out) {
        if (in.shape[1] != out.shape[1]) throw_shape_mismatch("gather_rows", out.shape, in.shape);
        const index_t cols = in.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t i) {
            const float* src = in.data + index[i] * in.strides[0];
            float* dst = out.data + i * out.strides[0];
            for (index_t j = 0; j < cols; ++j) dst[j] = src[j];
        });
    }

    /// out[index[i], :] += scale[i] * in[i, :] (scale may be null = 1), in order of i: repeatable sums.
    static void scatter_add_rows(View<const float, 2> in, const index_t* index, const float* scale,
                                 View<float, 2> out) {
        if (in.shape[1] != out.shape[1]) throw_shape_mismatch("scatter_add_rows", in.shape, out.shape);
        const index_t cols = in.shape[1];
        for (index_t i = 0; i < in.shape[0]; ++i) {
            const float* src = in.data + i * in.strides[0];
            float* dst = out.data + index[i] * out.strides[0];
            const float s = scale ? scale[i] : 1.0f;
            for (index_t j = 0; j < cols; ++j) dst[j] += s * src[j];
        }
    }

    /// Calls f(i) for i in [0, n) in parallel; the element-wise / row kernel launcher.
    template <class F>
    static void for_each(index_t n, F&& f) {
        cpu_detail::parallel_for(n, std::forward<F>(f));
    }

    /// Fills `out` with U(lo, hi) from a counter-based generator: element i depends only on (seed, i).
    static void fill_uniform(View<float, 2> out, float lo, float hi, std::uint64_t seed) {
        const index_t cols = out.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t r) {
            for (index_t j = 0; j < cols; ++j)
                out.data[r * out.strides[0] + j] =
                    lo + (hi - lo) * float(cpu_detail::uniform01(seed, std::uint64_t(r * cols + j)));
        });
    }

    /// Fills `out` with N(mean, std^2) from a counter-based generator: element i depends only on (seed, i).
    static void fill_normal(View<float, 2> out, float mean, float stddev, std::uint64_t seed) {
        const index_t cols = out.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t r) {
            for (index_t j = 0; j < cols; ++j) {
                const std::uint64_t i = std::uint64_t(r * cols + j);
                const double u1 = cpu_detail::uniform01(seed, 2 * i), u2 = cpu_detail::uniform01(seed, 2 * i + 1);
                const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
                out.data[r * out.strides[0] + j] = float(mean + stddev * z);
            }
        });
    }
};

}  // namespace moonmoe::backend
