// moonmoe/backend/cuda/sdpa.hpp: AttentionOps<cuda>'s bf16 path: a fused scaled-dot-product attention engine over
// packed bf16 operands (cuDNN's, cuda/cudnn.hpp), and QK-Clip's exact per-head maximum logit on tensor cores.
//
// Taken for attention_forward / attention_backward when the queries say their values are bf16 (the bf16 policy:
// AttentionQueries::values), every query head has its own key / value head (MLA), and an engine is registered:
//   nvcc        cuDNN's fused SDPA, registered by including <moonmoe/backend/cuda/cudnn.hpp> in one translation
//               unit of the program (cudnn-frontend's headers take about 90 s of nvcc per translation unit, so the
//               CUDA backend does not include them itself)
//   otherwise   PortableSdpa below: the same packing, statistics and gradient splits around the portable functors
//               run on the bf16 values, outputs and gradients rounded to bf16. It is the emulation's engine (so CI
//               checks everything but cuDNN's kernels), the engine of an nvcc program without cuDNN's, and the one a
//               call falls back to where cuDNN declines its shape (cuDNN wants head sizes that are multiples of 8:
//               K2's 192 and 128 are, the tiny test models' 12 and 8 are not). Every path keeps the bf16 contract:
//               the f32 attention of the bf16 operands, its outputs and gradients rounded to bf16 (first seen on an
//               H100, 2026-11-27: the declined calls ran the f32 path and returned o unrounded)
// The glue, in the order it runs:
//   forward    Q [T, H, dq] and K [T, H, dq] packed in bf16 from the query and key parts (the key's rope part,
//              one head shared by all, is copied to every head: cuDNN takes one K tensor with one head stride;
//              this copy is T H d_rope bf16 values, at K2's 4096 tokens 32 MiB per layer, a tenth of the bytes the
//              engine reads and writes), V [T, H, dv]; the engine writes O [T, H, dv] bf16 and its statistics
//              (the log-sum-exp of each row's scaled scores, [T, H] f32); O is widened into o, the statistics
//              reordered into the backend contract's lse (per sequence, head-major)
//   maxima     when max_logit is asked for (a forward that records them: nn/pass.hpp): the exact maximum of the
//              scaled causal scores per head, not the log-sum-exp's bound, as bf16 products with f32 accumulation
//              (BlasOps::gemm_bf16_strided_batched, the heads a batch) over blocks of query rows against the keys
//              they see, then a row and a head reduction: its cost is reported beside the attention's
//              (bench/attention.cpp)
//   backward   Q, K, V packed again, O and dO rounded to bf16, lse back to the engine's order; the engine writes
//              dQ, dK, dV in bf16; dQ and dK are split into the parts and widened into the gradients (dk[1], the
//              rope key's, per head: the caller sums the heads, as the contract says)
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <algorithm>
#include <atomic>
#include <cmath>
#include <span>

#include "../../config/precision.hpp"
#include "../../tensor/tensor.hpp"
#include "../attention.hpp"
#include "attention_portable.hpp"
#include "blas.hpp"

namespace moonmoe::backend {

namespace cuda_detail {

/// One fused attention call: packed sequences (host offsets) of `tokens` rows, `heads` heads, causal.
struct SdpaProblem {
    index_t tokens, heads, dim_qk, dim_v;
    std::span<const index_t> offsets;
    index_t longest;  ///< the longest sequence
    float scale;
};

/// A fused causal attention over packed bf16 [T, H, d] operands with f32 softmax and accumulation. Statistics are
/// [T, H] f32: each row's log-sum-exp of its scaled scores. Calls are queued on the current stream; false, with
/// nothing queued, where the engine does not support the problem (the portable path runs instead).
class SdpaEngine {
public:
    virtual ~SdpaEngine() = default;
    virtual const char* name() const = 0;
    virtual bool forward(const SdpaProblem& p, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* stats) = 0;
    virtual bool backward(const SdpaProblem& p, const bf16* q, const bf16* k, const bf16* v, const bf16* o,
                          const bf16* d_o, const float* stats, bf16* dq, bf16* dk, bf16* dv) = 0;
};

inline std::atomic<SdpaEngine*>& registered_sdpa() {
    static std::atomic<SdpaEngine*> engine{nullptr};
    return engine;
}

/// Makes `e` the engine of the bf16 attention path (cuda/cudnn.hpp does, at static initialisation).
inline bool register_sdpa_engine(SdpaEngine* e) {
    registered_sdpa().store(e, std::memory_order_release);
    return true;
}

/// Element k of a [T, H, d] packing: c < d_first from `first` (row t, head h), the rest from `second`.
struct PackHeads {
    const float* first;
    index_t first_row, first_head, d_first;
    const float* second;  // null when there is one part
    index_t second_row, second_head;
    bf16* out;
    index_t heads, dim;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t c = k % dim, th = k / dim, h = th % heads, t = th / heads;
        const float x = c < d_first ? first[t * first_row + h * first_head + c]
                                    : second[t * second_row + h * second_head + (c - d_first)];
        out[k] = bf16::from_float(x);
    }
};

/// Element k of a [T, H, d] bf16 packing widened into `first` (c < d_first) and `second` (the rest; skipped when
/// null), strided views.
struct UnpackHeads {
    const bf16* in;
    float* first;
    index_t first_row, first_head, d_first;
    float* second;
    index_t second_row, second_head;
    index_t heads, dim;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t c = k % dim, th = k / dim, h = th % heads, t = th / heads;
        const float x = in[k].to_float();
        if (c < d_first) first[t * first_row + h * first_head + c] = x;
        else if (second)
            second[t * second_row + h * second_head + (c - d_first)] = x;
    }
};

/// Thread k = i * heads + h of a sequence of `length` rows starting at t0: the contract's lse (head-major per
/// sequence) from the engine's statistics (token-major), or back when `to_stats`.
struct ReorderStats {
    float* lse;
    float* stats;
    index_t t0, length, heads;
    bool to_stats;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k / heads, h = k % heads;
        float& a = lse[t0 * heads + h * length + i];
        float& b = stats[(t0 + i) * heads + h];
        if (to_stats) b = a;
        else
            a = b;
    }
};

/// The contract's lse from the engine's statistics of every sequence of `p`, or back when `to_stats`.
inline void reorder_stats(float* lse, float* stats, const SdpaProblem& p, bool to_stats) {
    for (std::size_t s = 0; s + 1 < p.offsets.size(); ++s) {
        const index_t t0 = p.offsets[s], S = p.offsets[s + 1] - t0;
        launch(S * p.heads, ReorderStats{lse, stats, t0, S, p.heads, to_stats});
    }
}

/// Thread k = h * rows + i: row_max[k] = the largest of scores [heads, rows, keys] row (h, i) over the keys j <=
/// first + i that row sees.
struct CausalRowMax {
    const float* scores;
    float* row_max;
    index_t rows, keys, first;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k % rows, last = first + i < keys - 1 ? first + i : keys - 1;
        const float* s = scores + k * keys;
        float m = -INFINITY;
        for (index_t j = 0; j <= last; ++j) m = s[j] > m ? s[j] : m;
        row_max[k] = m;
    }
};

/// Thread h: max_logit[h] = max(max_logit[h], row_max[h * rows + i] over i).
struct HeadRowsMax {
    const float* row_max;
    float* max_logit;
    index_t rows;
    MOONMOE_HD void operator()(index_t h) const {
        float m = max_logit[h];
        for (index_t i = 0; i < rows; ++i) m = row_max[h * rows + i] > m ? row_max[h * rows + i] : m;
        max_logit[h] = m;
    }
};

/// The query rows of one block of the exact maxima: at most this many score bytes at a time.
inline constexpr index_t max_logit_block_bytes = index_t(64) << 20;

/// max_logit[h] = max(max_logit[h], the largest scaled causal score of head h) over packed bf16 Q, K [T, H, d]:
/// per sequence and block of query rows, one strided-batched bf16 product per block (the heads the batch, f32
/// accumulation, alpha = scale) of the rows against the keys they see, then the row and head maxima.
inline void exact_max_logits(const bf16* q, const bf16* k, const SdpaProblem& p, float* max_logit) {
    const index_t H = p.heads, D = p.dim_qk, pitch = H * D;
    for (std::size_t s = 0; s + 1 < p.offsets.size(); ++s) {
        const index_t t0 = p.offsets[s], S = p.offsets[s + 1] - t0;
        const index_t block = std::max<index_t>(1, std::min<index_t>(S, max_logit_block_bytes / (4 * H * S)));
        for (index_t r0 = 0; r0 < S; r0 += block) {
            const index_t rows = std::min(block, S - r0), keys = r0 + rows;  // the block's last row sees keys < keys
            Tensor<float, 1, cuda> scores({H * rows * keys}), row_max({H * rows});
            BlasOps<cuda>::gemm_bf16_strided_batched<float>(
                H, Trans::no, Trans::yes, p.scale,
                View<const bf16, 2, cuda>(q + (t0 + r0) * pitch, {rows, D}, {pitch, 1}), D,
                View<const bf16, 2, cuda>(k + t0 * pitch, {keys, D}, {pitch, 1}), D, 0.0f,
                View<float, 2, cuda>(scores.data(), {rows, keys}, {keys, 1}), rows * keys);
            launch(H * rows, CausalRowMax{scores.data(), row_max.data(), rows, keys, r0});
            launch(H, HeadRowsMax{row_max.data(), max_logit, rows});
        }
    }
}

/// The portable engine (the file comment): the portable functors (cuda/attention_portable.hpp) on the bf16 values
/// widened to f32, outputs and gradients rounded to bf16, statistics token-major, as the engine contract says. It
/// takes every problem.
class PortableSdpa final : public SdpaEngine {
public:
    const char* name() const override { return MOONMOE_CUDA_EMULATED ? "portable (emulated)" : "portable"; }

    bool forward(const SdpaProblem& p, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* stats) override {
        const index_t T = p.tokens, H = p.heads;
        Tensor<float, 3, cuda> Q = widen(q, T, H, p.dim_qk), K = widen(k, T, H, p.dim_qk), V = widen(v, T, H, p.dim_v),
                               O({T, H, p.dim_v});
        Tensor<float, 1, cuda> lse({T * H});
        portable_attention_forward({1, {Q.view()}}, {{K.view()}, V.view()}, p.offsets, p.scale, O.view(), lse.view(),
                                   {}, 1);
        narrow(O, o);
        reorder_stats(lse.data(), stats, p, true);
        return true;
    }

    bool backward(const SdpaProblem& p, const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* d_o,
                  const float* stats, bf16* dq, bf16* dk, bf16* dv) override {
        const index_t T = p.tokens, H = p.heads;
        Tensor<float, 3, cuda> Q = widen(q, T, H, p.dim_qk), K = widen(k, T, H, p.dim_qk), V = widen(v, T, H, p.dim_v),
                               O = widen(o, T, H, p.dim_v), dO = widen(d_o, T, H, p.dim_v);
        Tensor<float, 1, cuda> lse({T * H});
        reorder_stats(lse.data(), const_cast<float*>(stats), p, false);
        Tensor<float, 3, cuda> dQ({T, H, p.dim_qk}), dK({T, H, p.dim_qk}), dV({T, H, p.dim_v});
        portable_attention_backward({1, {Q.view()}}, {{K.view()}, V.view()}, p.offsets, p.scale, O.view(), lse.view(),
                                    dO.view(), {{dQ.view()}, {dK.view()}, dV.view()}, H);
        narrow(dQ, dq), narrow(dK, dk), narrow(dV, dv);
        return true;
    }

private:
    static Tensor<float, 3, cuda> widen(const bf16* x, index_t T, index_t H, index_t d) {
        Tensor<float, 3, cuda> out({T, H, d});
        MapOps<cuda>::cast<float, bf16>(View<const bf16, 2, cuda>(x, {T * H, d}, {d, 1}),
                                        out.view().template reshape<2>({T * H, d}));
        return out;
    }
    static void narrow(const Tensor<float, 3, cuda>& x, bf16* out) {
        const index_t rows = x.shape()[0] * x.shape()[1], d = x.shape()[2];
        MapOps<cuda>::cast<bf16, float>(View<const float, 2, cuda>(x.data(), {rows, d}, {d, 1}),
                                        View<bf16, 2, cuda>(out, {rows, d}, {d, 1}));
    }
};

inline SdpaEngine* portable_sdpa() {
    static PortableSdpa engine;
    return &engine;
}

/// The registered engine (cuDNN's), else the portable one.
inline SdpaEngine* sdpa_engine() {
    if (SdpaEngine* e = registered_sdpa().load(std::memory_order_acquire)) return e;
    return portable_sdpa();
}

/// Whether the bf16 path takes this call: bf16 values and as many key / value heads as query heads.
inline bool sdpa_takes(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv) {
    return q.values == NumberFormat::bf16 && kv.k[0].shape[1] == q.q[0].shape[1] && kv.v.shape[1] == q.q[0].shape[1];
}

/// The packed bf16 operands of a call.
struct SdpaOperands {
    SdpaProblem problem;
    Tensor<bf16, 1, cuda> q, k, v;
};

inline SdpaOperands pack_operands(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                                  std::span<const index_t> offsets, float scale) {
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], d0 = q.q[0].shape[2];
    const index_t dq = d0 + (q.parts == 2 ? q.q[1].shape[2] : 0), dv = kv.v.shape[2];
    index_t longest = 0;
    for (std::size_t s = 0; s + 1 < offsets.size(); ++s) longest = std::max(longest, offsets[s + 1] - offsets[s]);
    SdpaOperands ops{{T, H, dq, dv, offsets, longest, scale},
                     Tensor<bf16, 1, cuda>({T * H * dq}),
                     Tensor<bf16, 1, cuda>({T * H * dq}),
                     Tensor<bf16, 1, cuda>({T * H * dv})};
    const bool two = q.parts == 2;
    const auto& q1 = q.q[two ? 1 : 0];
    const auto& k1 = kv.k[two ? 1 : 0];
    launch(T * H * dq, PackHeads{q.q[0].data, q.q[0].strides[0], q.q[0].strides[1], d0, two ? q1.data : nullptr,
                                 q1.strides[0], q1.strides[1], ops.q.data(), H, dq});
    launch(T * H * dq, PackHeads{kv.k[0].data, kv.k[0].strides[0], kv.k[0].strides[1], d0, two ? k1.data : nullptr,
                                 k1.strides[0], k1.strides[1], ops.k.data(), H, dq});
    launch(T * H * dv, PackHeads{kv.v.data, kv.v.strides[0], kv.v.strides[1], dv, nullptr, 0, 0, ops.v.data(), H, dv});
    return ops;
}

/// attention_forward on the engine, or the portable engine where it declines (the file comment).
inline void sdpa_forward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                         std::span<const index_t> offsets, float scale, View<float, 3, cuda> o,
                         View<float, 1, cuda> lse, View<float, 1, cuda> max_logit) {
    SdpaOperands ops = pack_operands(q, kv, offsets, scale);
    const SdpaProblem& p = ops.problem;
    const index_t T = p.tokens, H = p.heads, dv = p.dim_v;
    Tensor<bf16, 1, cuda> O({T * H * dv});
    Tensor<float, 1, cuda> stats({T * H});
    if (!sdpa_engine()->forward(p, ops.q.data(), ops.k.data(), ops.v.data(), O.data(), stats.data()))
        portable_sdpa()->forward(p, ops.q.data(), ops.k.data(), ops.v.data(), O.data(), stats.data());
    launch(T * H * dv, UnpackHeads{O.data(), o.data, o.strides[0], o.strides[1], dv, nullptr, 0, 0, H, dv});
    reorder_stats(lse.data, stats.data(), p, false);
    if (max_logit.numel() != 0) exact_max_logits(ops.q.data(), ops.k.data(), p, max_logit.data);
}

/// attention_backward on the engine, or the portable engine where it declines (the file comment).
inline void sdpa_backward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                          std::span<const index_t> offsets, float scale, View<const float, 3, cuda> o,
                          View<const float, 1, cuda> lse, View<const float, 3, cuda> d_o,
                          const AttentionGrads<cuda>& grads) {
    SdpaOperands ops = pack_operands(q, kv, offsets, scale);
    const SdpaProblem& p = ops.problem;
    const index_t T = p.tokens, H = p.heads, dq = p.dim_qk, dv = p.dim_v, d0 = q.q[0].shape[2];
    Tensor<bf16, 1, cuda> O({T * H * dv}), dO({T * H * dv}), dQ({T * H * dq}), dK({T * H * dq}), dV({T * H * dv});
    launch(T * H * dv, PackHeads{o.data, o.strides[0], o.strides[1], dv, nullptr, 0, 0, O.data(), H, dv});
    launch(T * H * dv, PackHeads{d_o.data, d_o.strides[0], d_o.strides[1], dv, nullptr, 0, 0, dO.data(), H, dv});
    Tensor<float, 1, cuda> stats({T * H});
    reorder_stats(const_cast<float*>(lse.data), stats.data(), p, true);
    if (!sdpa_engine()->backward(p, ops.q.data(), ops.k.data(), ops.v.data(), O.data(), dO.data(), stats.data(),
                                 dQ.data(), dK.data(), dV.data()))
        portable_sdpa()->backward(p, ops.q.data(), ops.k.data(), ops.v.data(), O.data(), dO.data(), stats.data(),
                                  dQ.data(), dK.data(), dV.data());
    const bool two = q.parts == 2;
    const View<float, 3, cuda>& q1 = grads.dq[two ? 1 : 0];
    const View<float, 3, cuda>& k1 = grads.dk[two ? 1 : 0];
    launch(T * H * dq, UnpackHeads{dQ.data(), grads.dq[0].data, grads.dq[0].strides[0], grads.dq[0].strides[1], d0,
                                   two ? q1.data : nullptr, q1.strides[0], q1.strides[1], H, dq});
    launch(T * H * dq, UnpackHeads{dK.data(), grads.dk[0].data, grads.dk[0].strides[0], grads.dk[0].strides[1], d0,
                                   two ? k1.data : nullptr, k1.strides[0], k1.strides[1], H, dq});
    launch(T * H * dv,
           UnpackHeads{dV.data(), grads.dv.data, grads.dv.strides[0], grads.dv.strides[1], dv, nullptr, 0, 0, H, dv});
}

}  // namespace cuda_detail

/// The engine of the CUDA backend's bf16 attention path: "cuDNN" (with <moonmoe/backend/cuda/cudnn.hpp>; a shape it
/// declines runs the portable one), "portable" or "portable (emulated)".
inline const char* cuda_attention_engine() { return cuda_detail::sdpa_engine()->name(); }

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
