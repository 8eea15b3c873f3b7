// moonmoe/backend/attention.hpp: the attention (RoPE, causal attention forward and backward with per-head maximum
// logits, decoding) primitives.
//
// Activations are [rows, heads, dim] views with a unit last stride (a head's columns of a wide activation, no
// copy). Scores are scale * sum over parts p of Q_p K_p^T: one part for MHA, two for MLA (nope and rope, so its
// keys are never concatenated). Keys and values have kv_heads heads; query head h reads key/value head
// h / (heads / kv_heads); a head stride of 0 shares one key among all heads (MLA's rope key, the latent cache).
// Sequences are packed rows: sequence s holds rows [offsets[s], offsets[s + 1]) (offsets on the host); attention
// never crosses a sequence boundary. The log-sum-exps of head h of sequence s are `length(s)` values at
// offsets[s] * heads + h * length(s) of an lse tensor [tokens * heads].
//
// AttentionOps<B>:
//   rope(x, positions, inv_freq, attention_factor, interleave, transpose)
//                                rotates every head of x [rows, heads, dim] in place, as HF DeepseekV3 does
//                                (nn/rope.hpp): angle = positions[r] * inv_freq[i] (f32), cos / sin times
//                                attention_factor; with interleave the pairs (x[2i], x[2i+1]) are gathered into
//                                the half-split order first. transpose applies the inverse order and rotation
//                                transposed (the backward). positions [rows], inv_freq [dim / 2]
//   attention_forward(q, kv, offsets, scale, o, lse, max_logit)
//                                o = softmax(causal scores) V per (sequence, head); writes the log-sum-exps into
//                                lse and max-accumulates each head's largest scaled score into max_logit [heads]
//   attention_backward(q, kv, offsets, scale, o, lse, d_o, grads)
//                                recomputes P from lse; dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)) * scale,
//                                dQ_p = dS K_p, dK_p = dS^T Q_p. grads.dq / dk / dv are written; the query heads of
//                                one key/value head add into its dK, dV in head order. dk and dv need non-zero head
//                                strides (MLA passes per-head rope key gradients and sums them with sum_heads)
//   attention_decode(q, caches, offsets, scale, o)
//                                the rows of sequence s (its newest tokens) attend to caches[s]: L keys of which
//                                the rows are the last, so row i sees keys j <= L - length(s) + i
#pragma once

#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

/// The queries of an attention call: `parts` views [rows, heads, dim_p].
template <class B>
struct AttentionQueries {
    int parts = 1;
    View<const float, 3, B> q[2];
};

/// Keys (one view per query part, [rows, kv_heads, dim_p]) and values [rows, kv_heads, dim_v].
template <class B>
struct AttentionKeys {
    View<const float, 3, B> k[2];
    View<const float, 3, B> v;
};

/// The gradients attention_backward writes, shaped as the operands they belong to.
template <class B>
struct AttentionGrads {
    View<float, 3, B> dq[2], dk[2];
    View<float, 3, B> dv;
};

template <class B>
struct AttentionOps {
    static_assert(missing_backend<B>, "moonmoe: no attention primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
