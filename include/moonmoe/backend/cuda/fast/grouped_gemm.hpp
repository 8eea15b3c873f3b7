// moonmoe/backend/cuda/fast/grouped_gemm.hpp: the experts' grouped GEMMs for BlasOps<cuda> as one
// cublasGemmGroupedBatchedEx call (cuBLAS 12.5 and later) instead of one cublasGemmEx per segment.
// header-check: nvcc-only
//
// The contract is gemm_grouped's and gemm_grouped_weight_grad's (backend/blas.hpp), selected inside them when
// CudaFastKernels::grouped_gemm is on (fast/select.hpp). Every non-empty segment is one problem of its own group
// (group_size 1: the segments differ in rows), with the row-major to column-major translation of cuda/layout.hpp.
// cuBLAS takes the operand pointers as device arrays: a one-block kernel writes them from the segments passed by
// value (kernel parameters, up to 32 KiB on sm_70 and later with CUDA 12.1+), so nothing waits on the host. Empty
// segments are left to the caller (gemm_grouped skips them, the weight gradient scales its dW_g by beta).
// Compute type CUBLAS_COMPUTE_32F with the handle's default math mode: FP32 products, no TF32; the grouped call
// does not take the _PEDANTIC compute types of the per-segment path, so sums may be ordered differently: results
// agree with the per-segment loop to rounding (test/nvcc/fast_kernels.cu compares them).
#pragma once

#include "warp.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else warp.hpp has stopped with an #error

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../../../tensor/tensor.hpp"
#include "../../blas.hpp"
#include "../layout.hpp"

namespace moonmoe::backend::cuda_fast {

inline constexpr int grouped_max_segments = 512;  // Kimi K2: 384 experts

/// How each problem's three operand pointers follow from its segment: base + unit * step, the unit being the
/// segment's first row (an activation) or its index (a weight matrix).
template <class T>
struct GroupedPointers {
    const T* base[3];  // first, second, C of the column-major call
    index_t step[3];
    bool by_row[3];
    int count;
    index_t segment[grouped_max_segments], first_row[grouped_max_segments];
};

/// out = the first operands of every problem, then the second ones, then the C's (cuBLAS's untyped pointer arrays;
/// only C is written through, and its base came from a mutable view).
template <class T>
__global__ void __launch_bounds__(256) grouped_pointers_kernel(GroupedPointers<T> p, void** out) {
    for (int i = threadIdx.x; i < p.count; i += blockDim.x)
        for (int o = 0; o < 3; ++o)
            out[o * p.count + i] =
                const_cast<T*>(p.base[o] + (p.by_row[o] ? p.first_row[i] : p.segment[i]) * p.step[o]);
}

/// Whether one grouped call takes these segments: at most grouped_max_segments non-empty ones, and products with
/// terms (inner > 0: a product without terms only scales C, which the per-segment path does).
inline bool grouped_gemm_supported(std::span<const index_t> offsets, index_t inner) {
    if (inner <= 0) return false;
    int non_empty = 0;
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g) non_empty += offsets[g + 1] > offsets[g];
    return non_empty <= grouped_max_segments;
}

/// The grouped call's host arrays in cuBLAS's column-major terms, one problem per non-empty segment, and the
/// segments' indices and first rows in `p` (for the pointer kernel).
struct GroupedPlan {
    std::vector<cuda_detail::CublasOp> op_first, op_second;
    std::vector<std::int64_t> m, n, k, ld_first, ld_second, ldc;
};

/// The plan of the products C_g = op(A_g) op(B_g) of the non-empty segments, all of shape `shape` but for the rows
/// that come from the segment (m when rows_are_m, else k).
inline GroupedPlan plan_grouped(cuda_detail::RowMajorGemm shape, bool rows_are_m, GroupedPointers<float>& p,
                                std::span<const index_t> offsets) {
    GroupedPlan plan;
    p.count = 0;
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g) {
        const index_t rows = offsets[g + 1] - offsets[g];
        if (rows == 0) continue;
        cuda_detail::RowMajorGemm r = shape;
        (rows_are_m ? r.m : r.k) = rows;
        const cuda_detail::CublasGemm c = cuda_detail::to_cublas(r);
        plan.op_first.push_back(c.op_first), plan.op_second.push_back(c.op_second);
        plan.m.push_back(c.m), plan.n.push_back(c.n), plan.k.push_back(c.k);
        plan.ld_first.push_back(c.ld_first), plan.ld_second.push_back(c.ld_second), plan.ldc.push_back(c.ldc);
        p.segment[p.count] = index_t(g), p.first_row[p.count] = offsets[g];
        ++p.count;
    }
    return plan;
}

/// C_g = alpha op(A_g) op(B_g) + beta C_g for the non-empty segments (plan_grouped) as one grouped cuBLAS call.
inline void grouped_call(cuda_detail::RowMajorGemm shape, bool rows_are_m, float alpha, float beta,
                         GroupedPointers<float>& p, std::span<const index_t> offsets) {
    const GroupedPlan plan = plan_grouped(shape, rows_are_m, p, offsets);
    if (p.count == 0) return;
    const auto ops = [](const std::vector<cuda_detail::CublasOp>& v) {
        std::vector<cublasOperation_t> out;
        for (cuda_detail::CublasOp op : v) out.push_back(static_cast<cublasOperation_t>(int(op)));
        return out;
    };
    const std::vector<cublasOperation_t> op_first = ops(plan.op_first), op_second = ops(plan.op_second);
    const std::vector<std::int64_t> size(std::size_t(p.count), 1);  // one problem per group
    const std::vector<float> alphas(std::size_t(p.count), alpha), betas(std::size_t(p.count), beta);
    // Stream-ordered scratch: released after the cuBLAS call queued on the same stream.
    Tensor<void*, 1, cuda> pointers({3 * index_t(p.count)});
    grouped_pointers_kernel<float><<<1, 256, 0, current_stream()>>>(p, pointers.data());
    check_launch("grouped_pointers_kernel<<<...>>>");
    void** ptr = pointers.data();
    MOONMOE_CUBLAS_CHECK(cublasGemmGroupedBatchedEx_64(
        cuda_detail::cublas_handle(), op_first.data(), op_second.data(), plan.m.data(), plan.n.data(), plan.k.data(),
        alphas.data(), ptr, CUDA_R_32F, plan.ld_first.data(), ptr + p.count, CUDA_R_32F, plan.ld_second.data(),
        betas.data(), ptr + 2 * p.count, CUDA_R_32F, plan.ldc.data(), p.count, size.data(), CUBLAS_COMPUTE_32F));
}

/// gemm_grouped (backend/blas.hpp): Y[seg g] = alpha X[seg g] op(W_g) + beta Y[seg g] over the non-empty
/// segments. Checks what the per-segment gemm would (every segment has the same columns, so once).
inline void gemm_grouped(Trans tw, float alpha, View<const float, 2, cuda> X, View<const float, 3, cuda> W, float beta,
                         View<float, 2, cuda> Y, std::span<const index_t> offsets) {
    const index_t groups = W.shape[0];
    if (groups == 0 || X.shape[0] == 0) return;
    const contract::GemmShape s = contract::check_gemm<float>("gemm_grouped", Trans::no, tw, X, W[0], Y);
    cuda_detail::require_pitch("gemm_grouped", "X", X.shape[0], X.shape[1], X.strides[0]);
    cuda_detail::require_pitch("gemm_grouped", "W", W.shape[1], W.shape[2], W.strides[1]);
    cuda_detail::require_pitch("gemm_grouped", "Y", Y.shape[0], Y.shape[1], Y.strides[0]);
    if (s.n == 0) return;
    // Row-major Y_g = X_g op(W_g) is column-major Y_g^T = op(W_g)^T X_g^T: W_g first, X_g second.
    GroupedPointers<float> p{};
    p.base[0] = W.data, p.step[0] = W.strides[0], p.by_row[0] = false;
    p.base[1] = X.data, p.step[1] = X.strides[0], p.by_row[1] = true;
    p.base[2] = Y.data, p.step[2] = Y.strides[0], p.by_row[2] = true;
    grouped_call({Trans::no, tw, 0, s.n, s.k, X.strides[0], W.strides[1], Y.strides[0]}, true, alpha, beta, p, offsets);
}

/// gemm_grouped_weight_grad (backend/blas.hpp) for the non-empty segments: dW_g = alpha dY[seg g]^T X[seg g] +
/// beta dW_g. The caller scales the empty segments' dW_g.
inline void gemm_grouped_weight_grad(float alpha, View<const float, 2, cuda> dY, View<const float, 2, cuda> X,
                                     float beta, View<float, 3, cuda> dW, std::span<const index_t> offsets) {
    if (dW.shape[0] == 0 || X.shape[0] == 0) return;
    const contract::GemmShape s =
        contract::check_gemm<float>("gemm_grouped_weight_grad", Trans::yes, Trans::no, dY, X, dW[0]);
    cuda_detail::require_pitch("gemm_grouped_weight_grad", "dY", dY.shape[0], dY.shape[1], dY.strides[0]);
    cuda_detail::require_pitch("gemm_grouped_weight_grad", "X", X.shape[0], X.shape[1], X.strides[0]);
    cuda_detail::require_pitch("gemm_grouped_weight_grad", "dW", dW.shape[1], dW.shape[2], dW.strides[1]);
    if (s.m == 0 || s.n == 0) return;
    // Row-major dW_g = dY_g^T X_g is column-major dW_g^T = X_g^T dY_g: X_g first, dY_g second.
    GroupedPointers<float> p{};
    p.base[0] = X.data, p.step[0] = X.strides[0], p.by_row[0] = true;
    p.base[1] = dY.data, p.step[1] = dY.strides[0], p.by_row[1] = true;
    p.base[2] = dW.data, p.step[2] = dW.strides[0], p.by_row[2] = false;
    grouped_call({Trans::yes, Trans::no, s.m, s.n, 0, dY.strides[0], X.strides[0], dW.strides[1]}, false, alpha, beta,
                 p, offsets);
}

}  // namespace moonmoe::backend::cuda_fast

#endif  // defined(MOONMOE_CUDA_EMULATED)
