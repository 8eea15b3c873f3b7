// moonmoe/backend/cuda/layout.hpp: how a row-major product reaches cuBLAS, which is column-major, and a host
// implementation of those column-major calls (the emulated backend's cuBLAS, and the tests' check of the layout).
//
// A row-major matrix X [r, c] with row pitch p is, read column-major, X^T [c, r] with leading dimension p. So
// C = op(A) op(B) (row-major, C [m, n]) is C^T = op(B)^T op(A)^T (column-major, C^T [n, m]): cuBLAS gets B first
// with B's transpose flag, then A with A's, the sizes (n, m, k) and the row pitches as leading dimensions. No data
// moves. Plain constexpr C++20: compiles with any compiler, with or without the CUDA toolkit.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "../../numeric/bf16.hpp"
#include "../../tensor/shape.hpp"
#include "../blas.hpp"

namespace moonmoe::backend::cuda_detail {

/// cuBLAS's operation flags (CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 in cublas_api.h; cuda/blas.hpp checks the values).
enum class CublasOp : int { n = 0, t = 1 };

/// A row-major product C [m, n] = op(A) op(B) with op(A) [m, k], op(B) [k, n] and each matrix's row pitch.
struct RowMajorGemm {
    Trans ta, tb;
    index_t m, n, k;
    index_t pitch_a, pitch_b, pitch_c;
};

/// The column-major call cuBLAS gets: C' [m, n] = op_first(first) op_second(second), with `first` and `second`
/// the pointers of B and A (a_is_first false) or A and B, and C' = C^T in C's own storage.
struct CublasGemm {
    CublasOp op_first, op_second;
    index_t m, n, k;
    index_t ld_first, ld_second, ldc;
    bool a_is_first;
    constexpr bool operator==(const CublasGemm&) const = default;
};

/// A leading dimension cuBLAS accepts (at least 1): the row pitch, or the row length when there is at most one
/// row (the pitch of a single row is never followed, and may be anything in a view).
constexpr index_t leading_dimension(index_t rows, index_t cols, index_t pitch) {
    return std::max<index_t>(rows <= 1 ? cols : pitch, 1);
}

/// Rows stored as op(X) needs them: [k, m] for a transposed A, [m, k] for a plain one.
constexpr index_t stored_rows(Trans t, index_t rows_of_op, index_t cols_of_op) {
    return t == Trans::yes ? cols_of_op : rows_of_op;
}
constexpr index_t stored_cols(Trans t, index_t rows_of_op, index_t cols_of_op) {
    return t == Trans::yes ? rows_of_op : cols_of_op;
}

/// The column-major call for a row-major product: C^T = op(B)^T op(A)^T, B first.
constexpr CublasGemm to_cublas(const RowMajorGemm& g) {
    const auto op = [](Trans t) { return t == Trans::yes ? CublasOp::t : CublasOp::n; };
    return CublasGemm{
        .op_first = op(g.tb),
        .op_second = op(g.ta),
        .m = g.n,
        .n = g.m,
        .k = g.k,
        .ld_first = leading_dimension(stored_rows(g.tb, g.k, g.n), stored_cols(g.tb, g.k, g.n), g.pitch_b),
        .ld_second = leading_dimension(stored_rows(g.ta, g.m, g.k), stored_cols(g.ta, g.m, g.k), g.pitch_a),
        .ldc = leading_dimension(g.m, g.n, g.pitch_c),
        .a_is_first = false,
    };
}

/// cuBLAS needs every leading dimension at least the column-major row count (the row-major row length): a view
/// whose rows overlap (pitch < columns over several rows) cannot be handed to it.
inline void require_pitch(const char* op, const char* name, index_t rows, index_t cols, index_t pitch) {
    if (rows > 1 && pitch < cols)
        throw shape_error(std::string(op) + ": " + name + "'s row pitch " + std::to_string(pitch) +
                          " is smaller than its " + std::to_string(cols) +
                          " columns (cuBLAS needs whole, non-overlapping rows)");
}

// ---- host implementations of the column-major calls, with cuBLAS's argument conventions ----

/// Element (r, c) of op(M) for a column-major M with leading dimension ld.
template <class T>
T op_element(CublasOp op, const T* M, index_t ld, index_t r, index_t c) {
    return op == CublasOp::n ? M[r + c * ld] : M[c + r * ld];
}

/// c = alpha s + beta c from the double sum s; c is not read when beta is 0 (as in BLAS). A bf16 c goes through
/// f32 (convert), where cuBLAS rounds its f32 result once: the two differ only on f32-level ties.
template <class TC, class S>
void blend(TC& c, S alpha, double s, S beta) {
    c = convert<TC>(beta == S(0) ? double(alpha) * s : double(alpha) * s + double(beta) * convert<double>(c));
}

/// cublasGemmEx: C [m, n] = alpha op_a(A) op_b(B) + beta C, column-major, element (i, j) of X at X[i + j ld].
/// C is not read when beta is 0 (as in BLAS). Sums in double; columns of C in parallel where OpenMP is on.
/// T is the operands' type, TC C's and S alpha's and beta's: all T, or bf16 operands with an f32 or bf16 C and f32
/// scalars (CUDA_R_16BF with CUBLAS_COMPUTE_32F).
template <class T, class TC = T, class S = std::conditional_t<std::is_same_v<T, bf16>, float, T>>
void host_gemm(CublasOp op_a, CublasOp op_b, index_t m, index_t n, index_t k, S alpha, const T* A, index_t lda,
               const T* B, index_t ldb, S beta, TC* C, index_t ldc) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (index_t j = 0; j < n; ++j)
        for (index_t i = 0; i < m; ++i) {
            double s = 0.0;
            for (index_t p = 0; p < k; ++p)
                s += convert<double>(op_element(op_a, A, lda, i, p)) * convert<double>(op_element(op_b, B, ldb, p, j));
            blend<TC, S>(C[i + j * ldc], alpha, s, beta);
        }
}

/// cublasGemmStridedBatchedEx: host_gemm on matrix i of each operand at X + i * stride_x.
template <class T, class TC = T, class S = std::conditional_t<std::is_same_v<T, bf16>, float, T>>
void host_gemm_strided_batched(CublasOp op_a, CublasOp op_b, index_t m, index_t n, index_t k, S alpha, const T* A,
                               index_t lda, index_t stride_a, const T* B, index_t ldb, index_t stride_b, S beta, TC* C,
                               index_t ldc, index_t stride_c, index_t count) {
    for (index_t i = 0; i < count; ++i)
        host_gemm<T, TC, S>(op_a, op_b, m, n, k, alpha, A + i * stride_a, lda, B + i * stride_b, ldb, beta,
                            C + i * stride_c, ldc);
}

/// cublasSsyrk / cublasDsyrk with CUBLAS_FILL_MODE_LOWER: the lower triangle (i >= j) of C [n, n] =
/// alpha op(A) op(A)^T + beta C, op(A) [n, k]; the strict upper triangle is neither read nor written.
template <class T>
void host_syrk_lower(CublasOp trans, index_t n, index_t k, T alpha, const T* A, index_t lda, T beta, T* C,
                     index_t ldc) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static)
#endif
    for (index_t j = 0; j < n; ++j)
        for (index_t i = j; i < n; ++i) {
            double s = 0.0;
            for (index_t p = 0; p < k; ++p)
                s += double(op_element(trans, A, lda, i, p)) * double(op_element(trans, A, lda, j, p));
            blend<T, T>(C[i + j * ldc], alpha, s, beta);
        }
}

/// cudaMemcpy2D: `height` rows of `width` bytes, rows `dpitch` / `spitch` bytes apart.
inline void host_memcpy2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                          std::size_t height) {
    for (std::size_t r = 0; r < height; ++r)
        std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
}

/// The byte pitches of a 2-D copy of rows of `cols` elements: cudaMemcpy2D needs pitch >= width, and a single
/// row's pitch is never followed, so it becomes the width.
constexpr std::size_t byte_pitch(index_t rows, index_t cols, index_t pitch, std::size_t element) {
    return std::size_t(leading_dimension(rows, cols, pitch)) * element;
}

}  // namespace moonmoe::backend::cuda_detail
