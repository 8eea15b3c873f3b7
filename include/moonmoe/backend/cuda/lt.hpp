// moonmoe/backend/cuda/lt.hpp: the bf16 products of BlasOps<cuda> (gemm_bf16, gemm_bf16_strided_batched) on
// cuBLASLt, the algorithm chosen once per shape.
// header-check: nvcc-only
//
// cublasLtMatmul with bf16 operands, CUBLAS_COMPUTE_32F (bf16 tensor cores, f32 accumulation), f32 alpha and beta,
// C and D the same f32 or bf16 matrix. What picks an algorithm is the column-major call (cuda/layout.hpp's
// translation), the batch, C's type and the operands' alignments (cuBLASLt's default preference assumes 256-byte
// aligned pointers; a view into the middle of a tensor is less aligned, so each pointer's alignment is part of the
// key and of the preference). The first product of a key builds its descriptors and asks
// cublasLtMatmulAlgoGetHeuristic for the best algorithm within a 32 MiB workspace; later ones reuse both (a host
// lookup: no heuristic call per product). Each thread keeps its own cache and cuBLASLt handle, and one workspace per
// stream it has run products on (products queued on two streams must not share one). A shape for which the heuristic
// finds no algorithm returns false, and the caller runs cublasGemmEx instead.
#pragma once

#include "memory.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error
#if MOONMOE_CUDA_EMULATED
#error "moonmoe: backend/cuda/lt.hpp is nvcc-only; the emulated CUDA backend serves cuBLAS calls on the host"
#endif

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <type_traits>
#include <unordered_map>

#include "../../numeric/bf16.hpp"
#include "layout.hpp"

namespace moonmoe::backend::cuda_detail {

inline constexpr std::size_t lt_workspace_bytes = std::size_t(32) << 20;  // NVIDIA's advice for Hopper

/// What picks a cuBLASLt algorithm (the file comment).
struct LtKey {
    int op_first, op_second;
    std::int64_t m, n, k, ld_first, ld_second, ldc;
    std::int64_t count, stride_first, stride_second, stride_c;
    bool c_is_bf16;
    std::uint32_t align_first, align_second, align_c;
    int device;
    bool operator==(const LtKey&) const = default;
};

struct LtKeyHash {
    std::size_t operator()(const LtKey& k) const {
        std::size_t h = 0;
        const auto mix = [&h](std::int64_t v) {
            h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        };
        for (std::int64_t v : {std::int64_t(k.op_first), std::int64_t(k.op_second), k.m, k.n, k.k, k.ld_first,
                               k.ld_second, k.ldc, k.count, k.stride_first, k.stride_second, k.stride_c,
                               std::int64_t(k.c_is_bf16), std::int64_t(k.align_first), std::int64_t(k.align_second),
                               std::int64_t(k.align_c), std::int64_t(k.device)})
            mix(v);
        return h;
    }
};

/// The largest power of two up to 256 dividing the address and, for a batch, the step between its matrices.
inline std::uint32_t lt_alignment(const void* p, std::int64_t step_bytes) {
    const std::uint64_t a = reinterpret_cast<std::uintptr_t>(p) | std::uint64_t(step_bytes);
    std::uint32_t x = 256;
    while (x > 1 && a % x != 0) x /= 2;
    return x;
}

/// One key's descriptors and algorithm; `found` false where the heuristic had none.
class LtPlan {
public:
    LtPlan(cublasLtHandle_t handle, const LtKey& key) {
        MOONMOE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = static_cast<cublasOperation_t>(key.op_first);
        const cublasOperation_t tb = static_cast<cublasOperation_t>(key.op_second);
        MOONMOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        MOONMOE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        const bool na = ta == CUBLAS_OP_N, nb = tb == CUBLAS_OP_N;
        first_ = layout(CUDA_R_16BF, na ? key.m : key.k, na ? key.k : key.m, key.ld_first, key.count, key.stride_first);
        second_ =
            layout(CUDA_R_16BF, nb ? key.k : key.n, nb ? key.n : key.k, key.ld_second, key.count, key.stride_second);
        c_ = layout(key.c_is_bf16 ? CUDA_R_16BF : CUDA_R_32F, key.m, key.n, key.ldc, key.count, key.stride_c);
        cublasLtMatmulPreference_t pref = nullptr;
        MOONMOE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const std::uint64_t workspace = lt_workspace_bytes;
        MOONMOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                                  &workspace, sizeof workspace));
        const std::pair<cublasLtMatmulPreferenceAttributes_t, std::uint32_t> aligns[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_first},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_second},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c}};
        for (const auto& [attribute, bytes] : aligns)
            MOONMOE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes));
        cublasLtMatmulHeuristicResult_t result{};
        int returned = 0;
        const cublasStatus_t status =
            cublasLtMatmulAlgoGetHeuristic(handle, op_, first_, second_, c_, c_, pref, 1, &result, &returned);
        cublasLtMatmulPreferenceDestroy(pref);
        found_ = status == CUBLAS_STATUS_SUCCESS && returned > 0;
        if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) MOONMOE_CUBLAS_CHECK(status);
        if (found_) algo_ = result.algo, workspace_ = result.workspaceSize;
    }
    LtPlan(const LtPlan&) = delete;
    LtPlan& operator=(const LtPlan&) = delete;
    ~LtPlan() {  // unchecked: also at thread exit, when the context may be gone
        if (c_) cublasLtMatrixLayoutDestroy(c_);
        if (second_) cublasLtMatrixLayoutDestroy(second_);
        if (first_) cublasLtMatrixLayoutDestroy(first_);
        if (op_) cublasLtMatmulDescDestroy(op_);
    }

    bool found() const { return found_; }
    std::size_t workspace() const { return workspace_; }

    /// D = C = alpha op(first) op(second) + beta C on `stream`.
    void run(cublasLtHandle_t handle, float alpha, const void* first, const void* second, float beta, void* c,
             void* workspace, cudaStream_t stream) const {
        MOONMOE_CUBLAS_CHECK(cublasLtMatmul(handle, op_, &alpha, first, first_, second, second_, &beta, c, c_, c, c_,
                                            &algo_, workspace, workspace_, stream));
    }

private:
    static cublasLtMatrixLayout_t layout(cudaDataType type, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                                         std::int64_t count, std::int64_t stride) {
        cublasLtMatrixLayout_t l = nullptr;
        MOONMOE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, std::uint64_t(rows), std::uint64_t(cols), ld));
        if (count > 1) {
            const std::int32_t batch = std::int32_t(count);
            MOONMOE_CUBLAS_CHECK(
                cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
            MOONMOE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                                  &stride, sizeof stride));
        }
        return l;
    }

    cublasLtMatmulDesc_t op_ = nullptr;
    cublasLtMatrixLayout_t first_ = nullptr, second_ = nullptr, c_ = nullptr;
    cublasLtMatmulAlgo_t algo_{};
    std::size_t workspace_ = 0;
    bool found_ = false;
};

/// One thread's cuBLASLt handle, plans and workspaces.
class LtContext {
public:
    LtContext() = default;
    LtContext(const LtContext&) = delete;
    LtContext& operator=(const LtContext&) = delete;
    ~LtContext() {  // unchecked, at thread exit
        plans_.clear();
        for (auto& [stream, p] : workspaces_) cudaFree(p);
        if (handle_) cublasLtDestroy(handle_);
    }

    cublasLtHandle_t handle() {
        if (!handle_) MOONMOE_CUBLAS_CHECK(cublasLtCreate(&handle_));
        return handle_;
    }
    const LtPlan& plan(const LtKey& key) {
        auto it = plans_.find(key);
        if (it == plans_.end()) it = plans_.emplace(key, std::make_unique<LtPlan>(handle(), key)).first;
        return *it->second;
    }
    /// The workspace of `stream`, allocated at its first product, stream-ordered (no device-wide wait), and kept for
    /// the thread's life.
    void* workspace(cudaStream_t stream) {
        void*& p = workspaces_[stream];
        if (!p) MOONMOE_CUDA_CHECK(cudaMallocAsync(&p, lt_workspace_bytes, stream));
        return p;
    }

private:
    cublasLtHandle_t handle_ = nullptr;
    std::unordered_map<LtKey, std::unique_ptr<LtPlan>, LtKeyHash> plans_;
    std::unordered_map<cudaStream_t, void*> workspaces_;
};

inline LtContext& lt_context() {
    thread_local LtContext c;
    return c;
}

/// The column-major bf16 product of cublas_gemm_bf16 (blas.hpp) on cuBLASLt: `count` products, operand i at pointer
/// + i * stride. False, with nothing queued, where cuBLASLt has no algorithm for it.
template <class TC>
bool lt_gemm_bf16(const CublasGemm& g, float alpha, const bf16* first, index_t stride_first, const bf16* second,
                  index_t stride_second, float beta, TC* C, index_t stride_c, index_t count) {
    if (count > std::numeric_limits<std::int32_t>::max()) return false;
    int device = 0;
    MOONMOE_CUDA_CHECK(cudaGetDevice(&device));
    const bool batched = count > 1;
    const LtKey key{int(g.op_first),
                    int(g.op_second),
                    g.m,
                    g.n,
                    g.k,
                    g.ld_first,
                    g.ld_second,
                    g.ldc,
                    count,
                    batched ? stride_first : 0,
                    batched ? stride_second : 0,
                    batched ? stride_c : 0,
                    std::is_same_v<TC, bf16>,
                    lt_alignment(first, batched ? stride_first * index_t(sizeof(bf16)) : 0),
                    lt_alignment(second, batched ? stride_second * index_t(sizeof(bf16)) : 0),
                    lt_alignment(C, batched ? stride_c * index_t(sizeof(TC)) : 0),
                    device};
    LtContext& ctx = lt_context();
    const LtPlan& plan = ctx.plan(key);
    if (!plan.found()) return false;
    const cudaStream_t stream = current_stream();
    plan.run(ctx.handle(), alpha, first, second, beta, C, plan.workspace() ? ctx.workspace(stream) : nullptr, stream);
    return true;
}

}  // namespace moonmoe::backend::cuda_detail

#endif  // defined(MOONMOE_CUDA_EMULATED)
