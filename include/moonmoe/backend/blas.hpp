// moonmoe/backend/blas.hpp: matrix products. Matrices are row-major 2-D views whose rows are contiguous (unit
// column stride; the row pitch strides[0] may be larger, so a head's columns of a wide activation are a matrix
// without a copy). T is float or double unless a function says otherwise. Shapes are checked and both named
// on a mismatch.
//
// BlasOps<B>:
//   gemm<T>(ta, tb, alpha, A, B, beta, C)       C = alpha op(A) op(B) + beta C
//   linear(x, W, y, accumulate)                 y = x W^T (+ y): the Linear layer, W [out, in]
//   syrk<T>(alpha, A, beta, C)                  C = alpha A A^T + beta C, C symmetric [n, n]
//   gemm_strided_batched(count, ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c)
//                                               C_i = alpha op(A_i) op(B_i) + beta C_i, operand i at data + i *
//                                               stride; a stride of 0 reuses A or B (MLA's shared rope key), C's
//                                               is refused for more than one product (they would race on C)
//   gemm_grouped<T, TC>(tw, alpha, X, W, beta, Y, offsets)
//                                               Y[o_g : o_g+1] = alpha X[o_g : o_g+1] op(W_g) + beta Y[...] for
//                                               every group g: the expert GEMMs over the segments of a dispatch
//                                               plan; W [groups, ...] stacked, offsets on the host (groups + 1)
//   gemm_grouped_weight_grad(alpha, dY, X, beta, dW, offsets)
//                                               dW_g = alpha dY[seg g]^T X[seg g] + beta dW_g: the expert weight
//                                               gradients, dW [groups, n, k]
// A group with no rows does nothing (and leaves dW_g times beta). Both take T = float, or T = bf16 for the bf16
// policy: bf16 X, W (dY, X), f32 accumulation into an f32 dW, and into a Y of TC = float or bf16 (each segment a
// gemm_bf16<TC>: a bf16 Y is the f32 result rounded once, as the bf16 policy rounds a projection's output).
//
// Mixed precision (the bf16 policy, docs/precision.md): operands in bf16, products accumulated in f32, alpha and
// beta f32, C in f32 or bf16 (TC = float or bf16; a bf16 C is read as f32 and the result rounded once to nearest
// even). Every bf16 value is exact in f32, so the only rounding beyond an f32 product's is that of a bf16 C.
//   gemm_bf16<TC>(ta, tb, alpha, A, B, beta, C)  C = alpha op(A) op(B) + beta C, A and B bf16
//   gemm_bf16_strided_batched<TC>(count, ta, tb, alpha, A, stride_a, B, stride_b, beta, C, stride_c)
//                                               the same for count products, operand i at data + i * stride
//   syrk_bf16<TC>(alpha, X, beta, C)            C = alpha X X^T + beta C, X bf16 [n, k], C symmetric [n, n] (both
//                                               triangles written, each element rounded once, as gemm_bf16 would)
// The CPU backend runs each product on the engine measured fastest for it (cpu/gemm_engine.hpp: oneDNN's native
// bf16 kernels, or the operands widened to f32 and its f32 GEMM / SYRK); the CUDA backend calls cublasGemmEx /
// cublasGemmStridedBatchedEx (or cuBLASLt) with CUDA_R_16BF operands and CUBLAS_COMPUTE_32F (bf16 tensor cores, f32
// accumulation).
#pragma once

#include <span>
#include <string>
#include <type_traits>

#include "../numeric/bf16.hpp"
#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

/// Whether a GEMM operand is used as stored or transposed.
enum class Trans : bool { no = false, yes = true };

template <class B>
struct BlasOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no BLAS primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// The argument checks every backend's BlasOps runs before touching data (shapes and strides only), so both
/// backends reject the same calls with the same messages. (BlasOps<cuda> also needs rows that do not overlap.)
namespace contract {

inline void require_rows(const char* op, const char* name, index_t stride) {
    if (stride != 1)
        throw shape_error(std::string(op) + ": " + name + " must have contiguous rows (unit column stride)");
}

/// The sizes of C [m, n] = op(A) [m, k] op(B) [k, n].
struct GemmShape {
    index_t m, n, k;
};

/// Checks C = op(A) op(B) (contiguous rows, matching sizes, both named on a mismatch); returns its sizes. The
/// element types are free: the same checks serve gemm<T> and gemm_bf16<TC>.
template <class TA, class TB, class TC, class Bk>
GemmShape check_gemm_operands(const char* op, Trans ta, Trans tb, const View<TA, 2, Bk>& A, const View<TB, 2, Bk>& B,
                              const View<TC, 2, Bk>& C) {
    require_rows(op, "A", A.strides[1]);
    require_rows(op, "B", B.strides[1]);
    require_rows(op, "C", C.strides[1]);
    const index_t m = ta == Trans::yes ? A.shape[1] : A.shape[0];
    const index_t k = ta == Trans::yes ? A.shape[0] : A.shape[1];
    const index_t kb = tb == Trans::yes ? B.shape[1] : B.shape[0];
    const index_t n = tb == Trans::yes ? B.shape[0] : B.shape[1];
    if (k != kb || C.shape[0] != m || C.shape[1] != n)
        throw shape_error(std::string(op) + ": op(A) " + shape_string(Shape<2>{m, k}) + " times op(B) " +
                          shape_string(Shape<2>{kb, n}) + " into C " + shape_string(C.shape));
    return {m, n, k};
}

template <class T, class Bk>
GemmShape check_gemm(const char* op, Trans ta, Trans tb, const View<const T, 2, Bk>& A, const View<const T, 2, Bk>& B,
                     const View<T, 2, Bk>& C) {
    return check_gemm_operands(op, ta, tb, A, B, C);
}

/// gemm_bf16's output type is f32 or bf16.
template <class TC>
inline constexpr bool bf16_gemm_output = std::is_same_v<TC, float> || std::is_same_v<TC, bf16>;

/// A strided batch: a non-negative count and strides (a zero stride reuses A or B; C's, only for one product).
inline void check_batch(const char* op, index_t count, index_t stride_a, index_t stride_b, index_t stride_c) {
    if (count < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0)
        throw shape_error(std::string(op) + ": negative count or stride (count " + std::to_string(count) +
                          ", strides " + std::to_string(stride_a) + ", " + std::to_string(stride_b) + ", " +
                          std::to_string(stride_c) + ")");
    if (count > 1 && stride_c == 0)
        throw shape_error(std::string(op) + ": C's stride is 0 for " + std::to_string(count) +
                          " products (each would overwrite the others)");
}

/// Checks C [n, n] = A A^T, A [n, k] (A and C of one type, or bf16 A and an f32 or bf16 C for syrk_bf16).
template <class T, class TC, class Bk>
void check_syrk(const char* op, const View<const T, 2, Bk>& A, const View<TC, 2, Bk>& C) {
    require_rows(op, "A", A.strides[1]);
    require_rows(op, "C", C.strides[1]);
    const index_t n = A.shape[0];
    if (C.shape[0] != n || C.shape[1] != n)
        throw shape_error(std::string(op) + ": A " + shape_string(A.shape) + " gives an [" + std::to_string(n) + ", " +
                          std::to_string(n) + "] result, C is " + shape_string(C.shape));
}

/// Host offsets of `groups` segments covering rows [0, rows): groups + 1 of them, from 0 to rows, not decreasing.
inline void check_groups(const char* op, index_t groups, std::span<const index_t> offsets, index_t rows) {
    if (index_t(offsets.size()) != groups + 1)
        throw shape_error(std::string(op) + ": " + std::to_string(offsets.size()) + " offsets for " +
                          std::to_string(groups) + " groups (expected groups + 1)");
    if (offsets.front() != 0 || offsets.back() != rows)
        throw shape_error(std::string(op) + ": offsets run from " + std::to_string(offsets.front()) + " to " +
                          std::to_string(offsets.back()) + ", the rows from 0 to " + std::to_string(rows));
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g)
        if (offsets[g + 1] < offsets[g])
            throw shape_error(std::string(op) + ": offsets decrease at group " + std::to_string(g));
}

template <class T, class Bk, class TC>
void check_gemm_grouped(const View<const T, 2, Bk>& X, const View<const T, 3, Bk>& W, const View<TC, 2, Bk>& Y,
                        std::span<const index_t> offsets) {
    static_assert(std::is_same_v<TC, float> || std::is_same_v<T, bf16>, "gemm_grouped: a bf16 Y takes bf16 operands");
    check_groups("gemm_grouped", W.shape[0], offsets, X.shape[0]);
    if (Y.shape[0] != X.shape[0]) throw_shape_mismatch("gemm_grouped: X against Y rows", X.shape, Y.shape);
}

template <class T, class Bk>
void check_gemm_grouped_weight_grad(const View<const T, 2, Bk>& dY, const View<const T, 2, Bk>& X,
                                    const View<float, 3, Bk>& dW, std::span<const index_t> offsets) {
    check_groups("gemm_grouped_weight_grad", dW.shape[0], offsets, X.shape[0]);
    if (dY.shape[0] != X.shape[0])
        throw_shape_mismatch("gemm_grouped_weight_grad: dY against X rows", dY.shape, X.shape);
}

}  // namespace contract

}  // namespace moonmoe::backend
