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
//                                               stride; a stride of 0 reuses one operand (MLA's shared rope key)
//   gemm_grouped(tw, alpha, X, W, beta, Y, offsets)
//                                               Y[o_g : o_g+1] = alpha X[o_g : o_g+1] op(W_g) + beta Y[...] for
//                                               every group g: the expert GEMMs over the segments of a dispatch
//                                               plan; W [groups, ...] stacked, offsets on the host (groups + 1)
//   gemm_grouped_weight_grad(alpha, dY, X, beta, dW, offsets)
//                                               dW_g = alpha dY[seg g]^T X[seg g] + beta dW_g: the expert weight
//                                               gradients, dW [groups, n, k]
// A group with no rows does nothing (and leaves dW_g times beta).
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

/// Whether a GEMM operand is used as stored or transposed.
enum class Trans : bool { no = false, yes = true };

template <class B>
struct BlasOps {
    static_assert(missing_backend<B>, "moonmoe: no BLAS primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
