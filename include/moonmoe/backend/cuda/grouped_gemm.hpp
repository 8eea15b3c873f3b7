// moonmoe/backend/cuda/grouped_gemm.hpp: the experts' grouped GEMMs of BlasOps<cuda> as one
// cublasGemmGroupedBatchedEx call (cuBLAS 12.5 and later) instead of one GEMM per segment.
// header-check: nvcc-only
//
// The contract is gemm_grouped's and gemm_grouped_weight_grad's (backend/blas.hpp). Every non-empty segment is one
// problem of its own group (group_size 1: the segments differ in rows), with the row-major to column-major
// translation of cuda/layout.hpp. cuBLAS takes the operand pointers as device arrays: a one-block kernel writes them
// from the segments passed by value (kernel parameters, up to 32 KiB on sm_70 and later with CUDA 12.1+), so nothing
// waits on the host; the row counts are host arrays, which the MoE has on the host already (its one host wait per
// layer). Empty segments are left to the caller (gemm_grouped skips them, the weight gradient scales its dW_g).
//
// Types, with compute type CUBLAS_COMPUTE_32F (f32 accumulation) and f32 alpha and beta:
//   f32 operands, f32 C      the opt-in fast path of Precision<F32> (fast/select.hpp: grouped_gemm); FP32 products
//                            (no TF32), but the grouped call takes no _PEDANTIC compute type, so sums may be ordered
//                            otherwise than the per-segment loop's: results agree to rounding
//   bf16 operands, bf16 C    Precision<BF16>'s expert projections (nn/moe.hpp), which round their outputs to bf16 as
//                            they are written: bf16 tensor cores, one call per projection and layer
//   bf16 operands, f32 C     the expert weight gradients (f32, as the K2 report keeps them); tried once per process,
//                            and where this cuBLAS refuses the mixed types (CUBLAS_STATUS_NOT_SUPPORTED or
//                            _INVALID_VALUE) the caller's per-segment loop serves instead (grouped_mixed_types()
//                            says which)
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error
#if MOONMOE_CUDA_EMULATED
#error "moonmoe: backend/cuda/grouped_gemm.hpp is nvcc-only; the emulated CUDA backend loops over the segments"
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "layout.hpp"

namespace moonmoe::backend::cuda_detail {

inline constexpr int grouped_max_segments = 512;  // Kimi K2: 384 experts

/// How each problem's three operand pointers follow from its segment: base + unit * step, the unit being the
/// segment's first row (an activation) or its index (a weight matrix).
struct GroupedPointers {
    const void* base[3];  // first, second, C of the column-major call
    index_t step[3];      // in elements
    int element_bytes[3];
    bool by_row[3];
    int count;
    index_t segment[grouped_max_segments], first_row[grouped_max_segments];
};

/// out = the first operands of every problem, then the second ones, then the C's (cuBLAS's untyped pointer arrays;
/// only C is written through, and its base came from a mutable view). A template, as every kernel of a header
/// must be: its instances may be defined in every translation unit.
template <int Threads>
__global__ void __launch_bounds__(Threads) grouped_pointers_kernel(GroupedPointers p, void** out) {
    for (int i = threadIdx.x; i < p.count; i += Threads)
        for (int o = 0; o < 3; ++o) {
            const index_t unit = p.by_row[o] ? p.first_row[i] : p.segment[i];
            out[o * p.count + i] =
                const_cast<char*>(static_cast<const char*>(p.base[o]) + unit * p.step[o] * p.element_bytes[o]);
        }
}

/// Whether one grouped call takes these segments: at most grouped_max_segments non-empty ones, and products with
/// terms (inner > 0: a product without terms only scales C, which the per-segment path does).
inline bool grouped_gemm_supported(std::span<const index_t> offsets, index_t inner) {
    if (inner <= 0) return false;
    int non_empty = 0;
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g) non_empty += offsets[g + 1] > offsets[g];
    return non_empty <= grouped_max_segments;
}

template <class T>
inline constexpr cudaDataType grouped_type = std::is_same_v<T, bf16> ? CUDA_R_16BF : CUDA_R_32F;

/// Whether this cuBLAS takes bf16 operands with an f32 C in one grouped call: unknown until the first try.
enum class MixedTypes : int { unknown, taken, refused };
inline std::atomic<MixedTypes>& mixed_types_state() {
    static std::atomic<MixedTypes> s{MixedTypes::unknown};
    return s;
}

/// The grouped call's host arrays in cuBLAS's column-major terms, one problem per non-empty segment; fills the
/// segments' indices and first rows of `p` (for the pointer kernel).
struct GroupedPlan {
    std::vector<cublasOperation_t> op_first, op_second;
    std::vector<std::int64_t> m, n, k, ld_first, ld_second, ldc;
};

/// The plan of the products C_g = op(A_g) op(B_g) of the non-empty segments, all of shape `shape` but for the rows
/// that come from the segment (m when rows_are_m, else k).
inline GroupedPlan plan_grouped(RowMajorGemm shape, bool rows_are_m, GroupedPointers& p,
                                std::span<const index_t> offsets) {
    GroupedPlan plan;
    p.count = 0;
    for (std::size_t g = 0; g + 1 < offsets.size(); ++g) {
        const index_t rows = offsets[g + 1] - offsets[g];
        if (rows == 0) continue;
        RowMajorGemm r = shape;
        (rows_are_m ? r.m : r.k) = rows;
        const CublasGemm c = to_cublas(r);
        plan.op_first.push_back(static_cast<cublasOperation_t>(int(c.op_first)));
        plan.op_second.push_back(static_cast<cublasOperation_t>(int(c.op_second)));
        plan.m.push_back(c.m), plan.n.push_back(c.n), plan.k.push_back(c.k);
        plan.ld_first.push_back(c.ld_first), plan.ld_second.push_back(c.ld_second), plan.ldc.push_back(c.ldc);
        p.segment[p.count] = index_t(g), p.first_row[p.count] = offsets[g];
        ++p.count;
    }
    return plan;
}

/// The problems of `plan` (count of them, each its own group) as one grouped cuBLAS call with operands of type T
/// and C of type TC, the operand pointers in the device array `ptr` (every first operand, then every second, then
/// every C). False, with nothing computed, where cuBLAS refuses bf16 operands with an f32 C (remembered: later calls
/// return false at once).
template <class T, class TC>
bool grouped_gemm_call(const GroupedPlan& plan, void** ptr, int count, float alpha, float beta) {
    constexpr bool mixed = !std::is_same_v<T, TC>;
    if (mixed && mixed_types_state().load(std::memory_order_relaxed) == MixedTypes::refused) return false;
    const std::vector<std::int64_t> size(std::size_t(count), 1);  // one problem per group
    const std::vector<float> alphas(std::size_t(count), alpha), betas(std::size_t(count), beta);
    const cublasStatus_t status = cublasGemmGroupedBatchedEx_64(
        cublas_handle(), plan.op_first.data(), plan.op_second.data(), plan.m.data(), plan.n.data(), plan.k.data(),
        alphas.data(), ptr, grouped_type<T>, plan.ld_first.data(), ptr + count, grouped_type<T>, plan.ld_second.data(),
        betas.data(), ptr + 2 * count, grouped_type<TC>, plan.ldc.data(), count, size.data(), CUBLAS_COMPUTE_32F);
    if (mixed && (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) &&
        mixed_types_state().load(std::memory_order_relaxed) != MixedTypes::taken) {
        mixed_types_state().store(MixedTypes::refused, std::memory_order_relaxed);
        return false;
    }
    MOONMOE_CUBLAS_CHECK(status);
    if (mixed) mixed_types_state().store(MixedTypes::taken, std::memory_order_relaxed);
    return true;
}

/// C_g = alpha op(A_g) op(B_g) + beta C_g for the non-empty segments (plan_grouped) as one grouped call
/// (grouped_gemm_call); false where the types are refused.
template <class T, class TC>
bool grouped_call(RowMajorGemm shape, bool rows_are_m, float alpha, float beta, GroupedPointers& p,
                  std::span<const index_t> offsets) {
    if (!std::is_same_v<T, TC> && mixed_types_state().load(std::memory_order_relaxed) == MixedTypes::refused)
        return false;
    const GroupedPlan plan = plan_grouped(shape, rows_are_m, p, offsets);
    if (p.count == 0) return true;
    // Stream-ordered scratch: released after the cuBLAS call queued on the same stream.
    Tensor<void*, 1, cuda> pointers({3 * index_t(p.count)});
    grouped_pointers_kernel<256><<<1, 256, 0, current_stream()>>>(p, pointers.data());
    check(cudaGetLastError(), "grouped_pointers_kernel<<<1, 256, 0, current_stream()>>>", __FILE__, __LINE__);
    return grouped_gemm_call<T, TC>(plan, pointers.data(), p.count, alpha, beta);
}

/// gemm_grouped (backend/blas.hpp) over the non-empty segments: Y[seg g] = alpha X[seg g] op(W_g) + beta Y[seg g],
/// as one grouped call; false where the types are refused (grouped_call). Checks what the per-segment gemm would
/// (every segment has the same columns, so once).
template <class T, class TC>
bool gemm_grouped(Trans tw, float alpha, View<const T, 2, cuda> X, View<const T, 3, cuda> W, float beta,
                  View<TC, 2, cuda> Y, std::span<const index_t> offsets) {
    const index_t groups = W.shape[0];
    if (groups == 0 || X.shape[0] == 0) return true;
    const contract::GemmShape s = contract::check_gemm_operands("gemm_grouped", Trans::no, tw, X, W[0], Y);
    require_pitch("gemm_grouped", "X", X.shape[0], X.shape[1], X.strides[0]);
    require_pitch("gemm_grouped", "W", W.shape[1], W.shape[2], W.strides[1]);
    require_pitch("gemm_grouped", "Y", Y.shape[0], Y.shape[1], Y.strides[0]);
    if (s.n == 0) return true;
    // Row-major Y_g = X_g op(W_g) is column-major Y_g^T = op(W_g)^T X_g^T: W_g first, X_g second.
    GroupedPointers p{};
    p.base[0] = W.data, p.step[0] = W.strides[0], p.element_bytes[0] = sizeof(T), p.by_row[0] = false;
    p.base[1] = X.data, p.step[1] = X.strides[0], p.element_bytes[1] = sizeof(T), p.by_row[1] = true;
    p.base[2] = Y.data, p.step[2] = Y.strides[0], p.element_bytes[2] = sizeof(TC), p.by_row[2] = true;
    return grouped_call<T, TC>({Trans::no, tw, 0, s.n, s.k, X.strides[0], W.strides[1], Y.strides[0]}, true, alpha,
                               beta, p, offsets);
}

/// gemm_grouped_weight_grad (backend/blas.hpp) over the non-empty segments: dW_g = alpha dY[seg g]^T X[seg g] +
/// beta dW_g, as one grouped call; false where the types are refused. The caller scales the empty segments' dW_g.
template <class T>
bool gemm_grouped_weight_grad(float alpha, View<const T, 2, cuda> dY, View<const T, 2, cuda> X, float beta,
                              View<float, 3, cuda> dW, std::span<const index_t> offsets) {
    if (dW.shape[0] == 0 || X.shape[0] == 0) return true;
    const contract::GemmShape s =
        contract::check_gemm_operands("gemm_grouped_weight_grad", Trans::yes, Trans::no, dY, X, dW[0]);
    require_pitch("gemm_grouped_weight_grad", "dY", dY.shape[0], dY.shape[1], dY.strides[0]);
    require_pitch("gemm_grouped_weight_grad", "X", X.shape[0], X.shape[1], X.strides[0]);
    require_pitch("gemm_grouped_weight_grad", "dW", dW.shape[1], dW.shape[2], dW.strides[1]);
    if (s.m == 0 || s.n == 0) return true;
    // Row-major dW_g = dY_g^T X_g is column-major dW_g^T = X_g^T dY_g: X_g first, dY_g second.
    GroupedPointers p{};
    p.base[0] = X.data, p.step[0] = X.strides[0], p.element_bytes[0] = sizeof(T), p.by_row[0] = true;
    p.base[1] = dY.data, p.step[1] = dY.strides[0], p.element_bytes[1] = sizeof(T), p.by_row[1] = true;
    p.base[2] = dW.data, p.step[2] = dW.strides[0], p.element_bytes[2] = sizeof(float), p.by_row[2] = false;
    return grouped_call<T, float>({Trans::yes, Trans::no, s.m, s.n, 0, dY.strides[0], X.strides[0], dW.strides[1]},
                                  false, alpha, beta, p, offsets);
}

}  // namespace moonmoe::backend::cuda_detail

namespace moonmoe::backend {

/// Which way the expert weight gradients of Precision<BF16> go on this GPU: "grouped" (one cuBLAS call with bf16
/// operands and an f32 gradient), "per-segment" (this cuBLAS refused the mixed types), or "untried".
inline const char* cuda_grouped_mixed_types() {
    switch (cuda_detail::mixed_types_state().load(std::memory_order_relaxed)) {
    case cuda_detail::MixedTypes::taken: return "grouped";
    case cuda_detail::MixedTypes::refused: return "per-segment";
    default: return "untried";
    }
}

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
