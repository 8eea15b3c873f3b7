// moonmoe/backend/cuda/blas.hpp: BlasOps<cuda> (backend/blas.hpp), on cuBLAS.
//
// Every product is a row-major request translated by cuda/layout.hpp's to_cublas into the column-major call cuBLAS
// takes (operands swapped, row pitches as leading dimensions, nothing copied), then one cublasGemmEx,
// cublasGemmStridedBatchedEx or cublas<S|D>syrk call on this thread's handle and current stream (64-bit sizes).
// FP32 products use CUBLAS_COMPUTE_32F_PEDANTIC: no TF32 or other reduced-precision emulation, so results stay
// FP32 products as on the CPU. In the emulated mode the same column-major arguments go to layout.hpp's host
// implementations, so the translation is what the tests check.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <span>
#include <string>
#include <type_traits>

#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "layout.hpp"
#if !MOONMOE_CUDA_EMULATED
#include "fast/select.hpp"
#include "grouped_gemm.hpp"  // one grouped cuBLAS call: bf16 always, f32 opt-in (fast/select.hpp)
#include "lt.hpp"            // the bf16 products on cuBLASLt
#endif

namespace moonmoe::backend {

namespace cuda_detail {

#if !MOONMOE_CUDA_EMULATED
static_assert(int(CUBLAS_OP_N) == int(CublasOp::n) && int(CUBLAS_OP_T) == int(CublasOp::t),
              "cuda/layout.hpp's CublasOp must carry cuBLAS's values");
inline cublasOperation_t cublas_op(CublasOp op) { return static_cast<cublasOperation_t>(int(op)); }

template <class T>
inline constexpr cudaDataType data_type = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
template <class T>
inline constexpr cublasComputeType_t compute_type =
    std::is_same_v<T, float> ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_64F_PEDANTIC;
#endif

template <class T>
void require_real() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "BlasOps<cuda>: T is float or double");
}

/// The column-major product C' = op(first) op(second) of a translated request, on cuBLAS or its host stand-in.
template <class T>
void cublas_gemm(const CublasGemm& g, T alpha, const T* first, const T* second, T beta, T* C) {
    require_real<T>();
#if MOONMOE_CUDA_EMULATED
    host_gemm<T>(g.op_first, g.op_second, g.m, g.n, g.k, alpha, first, g.ld_first, second, g.ld_second, beta, C, g.ldc);
#else
    MOONMOE_CUBLAS_CHECK(cublasGemmEx_64(cublas_handle(), cublas_op(g.op_first), cublas_op(g.op_second), g.m, g.n, g.k,
                                         &alpha, first, data_type<T>, g.ld_first, second, data_type<T>, g.ld_second,
                                         &beta, C, data_type<T>, g.ldc, compute_type<T>, CUBLAS_GEMM_DEFAULT));
#endif
}

/// The same for `count` products, operand i at pointer + i * stride (a stride of 0 reuses one operand).
template <class T>
void cublas_gemm_strided_batched(const CublasGemm& g, T alpha, const T* first, index_t stride_first, const T* second,
                                 index_t stride_second, T beta, T* C, index_t stride_c, index_t count) {
    require_real<T>();
#if MOONMOE_CUDA_EMULATED
    host_gemm_strided_batched<T>(g.op_first, g.op_second, g.m, g.n, g.k, alpha, first, g.ld_first, stride_first, second,
                                 g.ld_second, stride_second, beta, C, g.ldc, stride_c, count);
#else
    MOONMOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
        cublas_handle(), cublas_op(g.op_first), cublas_op(g.op_second), g.m, g.n, g.k, &alpha, first, data_type<T>,
        g.ld_first, stride_first, second, data_type<T>, g.ld_second, stride_second, &beta, C, data_type<T>, g.ldc,
        stride_c, count, compute_type<T>, CUBLAS_GEMM_DEFAULT));
#endif
}

/// Column-major SYRK into C's lower triangle: C = alpha op(A) op(A)^T + beta C, op(A) [n, k].
template <class T>
void cublas_syrk_lower(CublasOp trans, index_t n, index_t k, T alpha, const T* A, index_t lda, T beta, T* C,
                       index_t ldc) {
    require_real<T>();
#if MOONMOE_CUDA_EMULATED
    host_syrk_lower<T>(trans, n, k, alpha, A, lda, beta, C, ldc);
#else
    if constexpr (std::is_same_v<T, float>)
        MOONMOE_CUBLAS_CHECK(cublasSsyrk_v2_64(cublas_handle(), CUBLAS_FILL_MODE_LOWER, cublas_op(trans), n, k, &alpha,
                                               A, lda, &beta, C, ldc));
    else
        MOONMOE_CUBLAS_CHECK(cublasDsyrk_v2_64(cublas_handle(), CUBLAS_FILL_MODE_LOWER, cublas_op(trans), n, k, &alpha,
                                               A, lda, &beta, C, ldc));
#endif
}

/// cuBLAS's type of a bf16 product's C: CUDA_R_32F or CUDA_R_16BF.
#if !MOONMOE_CUDA_EMULATED
template <class TC>
inline constexpr cudaDataType bf16_output_type = std::is_same_v<TC, bf16> ? CUDA_R_16BF : CUDA_R_32F;
#endif

/// `count` column-major products with bf16 operands, f32 scalars and accumulation (CUBLAS_COMPUTE_32F: bf16 tensor
/// cores, f32 sums), C f32 or bf16, operand i at pointer + i * stride: cublasLtMatmul with an algorithm cached per
/// shape (cuda/lt.hpp), or where cuBLASLt has none cublasGemmEx for one, else cublasGemmStridedBatchedEx; or their
/// host stand-in.
template <class TC>
void cublas_gemm_bf16(const CublasGemm& g, float alpha, const bf16* first, index_t stride_first, const bf16* second,
                      index_t stride_second, float beta, TC* C, index_t stride_c, index_t count) {
#if MOONMOE_CUDA_EMULATED
    host_gemm_strided_batched<bf16, TC, float>(g.op_first, g.op_second, g.m, g.n, g.k, alpha, first, g.ld_first,
                                               stride_first, second, g.ld_second, stride_second, beta, C, g.ldc,
                                               stride_c, count);
#else
    if (lt_gemm_bf16<TC>(g, alpha, first, stride_first, second, stride_second, beta, C, stride_c, count)) return;
    if (count == 1)
        MOONMOE_CUBLAS_CHECK(cublasGemmEx_64(cublas_handle(), cublas_op(g.op_first), cublas_op(g.op_second), g.m, g.n,
                                             g.k, &alpha, first, CUDA_R_16BF, g.ld_first, second, CUDA_R_16BF,
                                             g.ld_second, &beta, C, bf16_output_type<TC>, g.ldc, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT));
    else
        MOONMOE_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
            cublas_handle(), cublas_op(g.op_first), cublas_op(g.op_second), g.m, g.n, g.k, &alpha, first, CUDA_R_16BF,
            g.ld_first, stride_first, second, CUDA_R_16BF, g.ld_second, stride_second, &beta, C, bf16_output_type<TC>,
            g.ldc, stride_c, count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
#endif
}

/// x = beta x for a product without terms, in f32 and rounded back for a bf16 x; x = 0 when beta is 0 (as BLAS).
template <class TC>
struct ScaleConverted {
    float beta;
    MOONMOE_HD void operator()(TC& x) const { x = convert<TC>(beta == 0.0f ? 0.0f : beta * convert<float>(x)); }
};

/// The row-major request of C = op(A) op(B), after checking shapes (both named on a mismatch) and layouts.
template <class T>
RowMajorGemm checked_gemm(const char* op, Trans ta, Trans tb, const View<const T, 2, cuda>& A,
                          const View<const T, 2, cuda>& B, const View<T, 2, cuda>& C) {
    const contract::GemmShape shape = contract::check_gemm<T>(op, ta, tb, A, B, C);
    require_pitch(op, "A", A.shape[0], A.shape[1], A.strides[0]);
    require_pitch(op, "B", B.shape[0], B.shape[1], B.strides[0]);
    require_pitch(op, "C", C.shape[0], C.shape[1], C.strides[0]);
    return {ta, tb, shape.m, shape.n, shape.k, A.strides[0], B.strides[0], C.strides[0]};
}

/// C = beta C, where a product has no terms (k = 0 or an empty group); C = 0 when beta is 0, as BLAS does.
template <class T>
void scale_or_zero(View<T, 2, cuda> C, T beta) {
    if (beta == T(1)) return;
    if (beta == T(0)) MapOps<cuda>::fill<T>(C, T(0));
    else
        MapOps<cuda>::map(fn::ScaleBy<T>{beta}, C);
}

/// x = C(j, i) below the diagonal, from C's upper triangle: makes a SYRK result whole.
template <class T>
struct MirrorUpper {
    const T* c;
    index_t pitch;
    MOONMOE_HD void operator()(index_t i, index_t j, T& x) const {
        if (i > j) x = c[j * pitch + i];
    }
};

}  // namespace cuda_detail

template <>
struct BlasOps<cuda> {
    /// C = alpha * op(A) op(B) + beta * C, op = transpose when asked, T = float or double. Shapes are checked
    /// and named on mismatch; rows must be contiguous and must not overlap (cuBLAS's leading dimensions).
    template <class T = float>
    static void gemm(Trans ta, Trans tb, std::type_identity_t<T> alpha, View<const std::type_identity_t<T>, 2, cuda> A,
                     View<const std::type_identity_t<T>, 2, cuda> B, std::type_identity_t<T> beta,
                     View<std::type_identity_t<T>, 2, cuda> C) {
        const cuda_detail::RowMajorGemm g = cuda_detail::checked_gemm<T>("gemm", ta, tb, A, B, C);
        if (g.m == 0 || g.n == 0) return;
        if (g.k == 0) return cuda_detail::scale_or_zero<T>(C, beta);
        const cuda_detail::CublasGemm c = cuda_detail::to_cublas(g);
        cuda_detail::cublas_gemm<T>(c, alpha, c.a_is_first ? A.data : B.data, c.a_is_first ? B.data : A.data, beta,
                                    C.data);
    }

    /// y = x W^T (+ y if accumulate): the Linear layer, x [rows, in], W [out, in].
    static void linear(View<const float, 2, cuda> x, View<const float, 2, cuda> W, View<float, 2, cuda> y,
                       bool accumulate = false) {
        gemm<float>(Trans::no, Trans::yes, 1.0f, x, W, accumulate ? 1.0f : 0.0f, y);
    }

    /// C = alpha A A^T + beta C for a symmetric C [n, n]: cuBLAS SYRK fills one triangle (half the FLOPs of a
    /// GEMM), a map mirrors it into the other.
    template <class T = float>
    static void syrk(std::type_identity_t<T> alpha, View<const std::type_identity_t<T>, 2, cuda> A,
                     std::type_identity_t<T> beta, View<std::type_identity_t<T>, 2, cuda> C) {
        contract::check_syrk<T>("syrk", A, C);
        const index_t n = A.shape[0], k = A.shape[1];
        cuda_detail::require_pitch("syrk", "A", n, k, A.strides[0]);
        cuda_detail::require_pitch("syrk", "C", n, n, C.strides[0]);
        if (n == 0) return;
        // Row-major A [n, k] is column-major A^T [k, n]: A A^T is op = T in cuBLAS's terms. Its lower triangle
        // (column-major) is C's upper triangle (row-major), which the mirror copies down.
        cuda_detail::cublas_syrk_lower<T>(cuda_detail::CublasOp::t, n, k, alpha, A.data,
                                          cuda_detail::leading_dimension(n, k, A.strides[0]), beta, C.data,
                                          cuda_detail::leading_dimension(n, n, C.strides[0]));
        MapOps<cuda>::map_indexed(cuda_detail::MirrorUpper<T>{C.data, C.strides[0]}, C);
    }

    /// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count, each operand advancing by its stride (in elements)
    /// between matrices (0 reuses A or B; C's only for one product: cuBLAS would race on it): one
    /// cublasGemmStridedBatchedEx.
    static void gemm_strided_batched(index_t count, Trans ta, Trans tb, float alpha, View<const float, 2, cuda> A,
                                     index_t stride_a, View<const float, 2, cuda> B, index_t stride_b, float beta,
                                     View<float, 2, cuda> C, index_t stride_c) {
        const cuda_detail::RowMajorGemm g = cuda_detail::checked_gemm<float>("gemm_strided_batched", ta, tb, A, B, C);
        contract::check_batch("gemm_strided_batched", count, stride_a, stride_b, stride_c);
        if (count == 0 || g.m == 0 || g.n == 0) return;
        if (g.k == 0) {
            for (index_t i = 0; i < count; ++i)  // no terms: each C_i is only scaled (a corner case, not a hot path)
                cuda_detail::scale_or_zero<float>(View<float, 2, cuda>(C.data + i * stride_c, C.shape, C.strides),
                                                  beta);
            return;
        }
        const cuda_detail::CublasGemm c = cuda_detail::to_cublas(g);
        cuda_detail::cublas_gemm_strided_batched<float>(
            c, alpha, c.a_is_first ? A.data : B.data, c.a_is_first ? stride_a : stride_b,
            c.a_is_first ? B.data : A.data, c.a_is_first ? stride_b : stride_a, beta, C.data, stride_c, count);
    }

    /// C = alpha op(A) op(B) + beta C with bf16 operands, f32 accumulation and an f32 or bf16 C (backend/blas.hpp):
    /// one cublasGemmEx with CUDA_R_16BF operands and CUBLAS_COMPUTE_32F.
    template <class TC = float>
    static void gemm_bf16(Trans ta, Trans tb, float alpha, View<const bf16, 2, cuda> A, View<const bf16, 2, cuda> B,
                          float beta, View<std::type_identity_t<TC>, 2, cuda> C) {
        gemm_bf16_strided_batched<TC>(1, ta, tb, alpha, A, 0, B, 0, beta, C, 0);
    }

    /// C_i = alpha op(A_i) op(B_i) + beta C_i for i < count with bf16 operands (gemm_bf16), operand i at data + i *
    /// stride (0 reuses one operand): one cublasGemmStridedBatchedEx.
    template <class TC = float>
    static void gemm_bf16_strided_batched(index_t count, Trans ta, Trans tb, float alpha, View<const bf16, 2, cuda> A,
                                          index_t stride_a, View<const bf16, 2, cuda> B, index_t stride_b, float beta,
                                          View<std::type_identity_t<TC>, 2, cuda> C, index_t stride_c) {
        static_assert(contract::bf16_gemm_output<TC>, "gemm_bf16: C is float or bf16");
        const char* op = count == 1 ? "gemm_bf16" : "gemm_bf16_strided_batched";
        const contract::GemmShape shape = contract::check_gemm_operands(op, ta, tb, A, B, C);
        contract::check_batch(op, count, stride_a, stride_b, stride_c);
        cuda_detail::require_pitch(op, "A", A.shape[0], A.shape[1], A.strides[0]);
        cuda_detail::require_pitch(op, "B", B.shape[0], B.shape[1], B.strides[0]);
        cuda_detail::require_pitch(op, "C", C.shape[0], C.shape[1], C.strides[0]);
        if (count == 0 || shape.m == 0 || shape.n == 0) return;
        if (shape.k == 0) {
            for (index_t i = 0; i < count; ++i)  // no terms: each C_i is only scaled (a corner case)
                MapOps<cuda>::map(cuda_detail::ScaleConverted<TC>{beta},
                                  View<TC, 2, cuda>(C.data + i * stride_c, C.shape, C.strides));
            return;
        }
        const cuda_detail::CublasGemm c =
            cuda_detail::to_cublas({ta, tb, shape.m, shape.n, shape.k, A.strides[0], B.strides[0], C.strides[0]});
        cuda_detail::cublas_gemm_bf16<TC>(c, alpha, c.a_is_first ? A.data : B.data, c.a_is_first ? stride_a : stride_b,
                                          c.a_is_first ? B.data : A.data, c.a_is_first ? stride_b : stride_a, beta,
                                          C.data, stride_c, count);
    }

    /// C = alpha X X^T + beta C with a bf16 X [n, k] and a symmetric C [n, n] (f32 or bf16), each element rounded
    /// once: cuBLAS has no bf16 SYRK, so one full gemm_bf16 (on tensor cores the whole product in one launch beats
    /// blocks of the lower triangle, whose small GEMMs leave most SMs idle), then the upper triangle mirrored below,
    /// so C is exactly symmetric.
    template <class TC = bf16>
    static void syrk_bf16(float alpha, View<const bf16, 2, cuda> X, float beta,
                          View<std::type_identity_t<TC>, 2, cuda> C) {
        contract::check_syrk<bf16>("syrk_bf16", X, C);
        gemm_bf16<TC>(Trans::no, Trans::yes, alpha, X, X, beta, C);
        if (X.shape[0] > 0) MapOps<cuda>::map_indexed(cuda_detail::MirrorUpper<TC>{C.data, C.strides[0]}, C);
    }

    /// Y[seg g] = alpha X[seg g] op(W_g) + beta Y[seg g], seg g = rows [offsets[g], offsets[g + 1]) (host offsets);
    /// W [groups, ., .]; T = float, or bf16 with Y f32 or bf16 (TC). Under nvcc bf16 operands go to one grouped
    /// cuBLAS call for all the segments (cuda/grouped_gemm.hpp; with an f32 Y only where this cuBLAS takes the mixed
    /// types), f32 ones to one GEMM per non-empty segment queued on the current stream (or, opt-in, the grouped
    /// call: fast/select.hpp); the emulation runs the per-segment loop.
    template <class T = float, class TC = float>
    static void gemm_grouped(Trans tw, float alpha, View<const std::type_identity_t<T>, 2, cuda> X,
                             View<const std::type_identity_t<T>, 3, cuda> W, float beta,
                             View<std::type_identity_t<TC>, 2, cuda> Y, std::span<const index_t> offsets) {
        contract::check_gemm_grouped(X, W, Y, offsets);
#if !MOONMOE_CUDA_EMULATED
        const bool grouped = std::is_same_v<T, bf16> || cuda_fast_kernels().grouped_gemm;
        if (grouped && cuda_detail::grouped_gemm_supported(offsets, X.shape[1]) &&
            cuda_detail::gemm_grouped<T, TC>(tw, alpha, X, W, beta, Y, offsets))
            return;
#endif
        for (index_t g = 0; g + 1 < index_t(offsets.size()); ++g) {
            const index_t lo = offsets[g], n = offsets[g + 1] - lo;
            if (n == 0) continue;
            product<T, TC>(Trans::no, tw, alpha, X.slice(0, lo, lo + n), W[g], beta, Y.slice(0, lo, lo + n));
        }
    }

    /// dW_g = alpha dY[seg g]^T X[seg g] + beta dW_g for every group g: dY [rows, n], X [rows, k], dW [groups, n, k];
    /// an empty group's dW_g is only scaled by beta. T = float, or bf16 (f32 dW); the paths are gemm_grouped's.
    template <class T = float>
    static void gemm_grouped_weight_grad(float alpha, View<const std::type_identity_t<T>, 2, cuda> dY,
                                         View<const std::type_identity_t<T>, 2, cuda> X, float beta,
                                         View<float, 3, cuda> dW, std::span<const index_t> offsets) {
        contract::check_gemm_grouped_weight_grad(dY, X, dW, offsets);
#if !MOONMOE_CUDA_EMULATED
        const bool grouped = std::is_same_v<T, bf16> || cuda_fast_kernels().grouped_gemm;
        if (grouped && cuda_detail::grouped_gemm_supported(offsets, 1) &&
            cuda_detail::gemm_grouped_weight_grad<T>(alpha, dY, X, beta, dW, offsets)) {
            for (index_t g = 0; g + 1 < index_t(offsets.size()); ++g)
                if (offsets[g + 1] == offsets[g]) cuda_detail::scale_or_zero<float>(dW[g], beta);
            return;
        }
#endif
        for (index_t g = 0; g + 1 < index_t(offsets.size()); ++g) {
            const index_t lo = offsets[g], n = offsets[g + 1] - lo;
            if (n == 0) cuda_detail::scale_or_zero<float>(dW[g], beta);
            else
                product<T>(Trans::yes, Trans::no, alpha, dY.slice(0, lo, lo + n), X.slice(0, lo, lo + n), beta, dW[g]);
        }
    }

private:
    /// gemm<float>, or gemm_bf16<TC>: one segment of the grouped products.
    template <class T, class TC = float>
    static void product(Trans ta, Trans tb, float alpha, View<const T, 2, cuda> A, View<const T, 2, cuda> B, float beta,
                        View<TC, 2, cuda> C) {
        if constexpr (std::is_same_v<T, bf16>) gemm_bf16<TC>(ta, tb, alpha, A, B, beta, C);
        else
            gemm<float>(ta, tb, alpha, A, B, beta, C);
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
