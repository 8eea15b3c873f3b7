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
//                                (an empty max_logit: no maxima wanted, none computed)
//   attention_backward(q, kv, offsets, scale, o, lse, d_o, grads)
//                                recomputes P from lse; dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)) * scale,
//                                dQ_p = dS K_p, dK_p = dS^T Q_p. grads.dq / dk / dv are written; the query heads of
//                                one key/value head add into its dK, dV in head order. dk and dv need non-zero head
//                                strides (MLA passes per-head rope key gradients and sums them with sum_heads)
//   attention_decode(q, caches, offsets, scale, o)
//                                the rows of sequence s (its newest tokens) attend to caches[s]: L keys of which
//                                the rows are the last, so row i sees keys j <= L - length(s) + i
//   latent_decode(q, fresh, caches, lengths, offsets, extents, value_dim, scale, o)
//                                MLA's absorbed decode over bf16 latent caches (the latent, then the rotated rope key:
//                                one row of `width` values per token, shared by every head). First row i of sequence
//                                s (fresh [T, width]) is written to row lengths[s] + i of caches[s]; then row i of
//                                sequence s attends, per head, to the rows j <= lengths[s] + i of its cache: scores
//                                scale * q[t, h] . cache[j] over all `width` values (f32 sums of bf16 products), an
//                                f32 softmax, o[t, h] = sum_j p_j cache[j, :value_dim]. lengths [N] is on the
//                                device (nothing waits to read it: a captured decode step replays with new lengths);
//                                extents[s] (host) bounds the keys sequence s's products span: the caller promises
//                                lengths[s] + rows(s) <= extents[s] <= its cache's rows, so a graph's shapes can stay
//                                fixed while the lengths grow. A backend may round the probabilities to bf16 before
//                                the product with the values (tensor cores take bf16: cuda/latent.hpp)
#pragma once

#include <span>
#include <string>

#include "../config/precision.hpp"
#include "../numeric/bf16.hpp"
#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

/// The queries of an attention call: `parts` views [rows, heads, dim_p]. `values` says what the call's operands
/// hold: NumberFormat::bf16 (the bf16 policy: bf16 values in f32 containers) lets a backend run the attention on
/// bf16 operands with f32 softmax and accumulation, as torch's bf16 attention does (CUDA: cuda/sdpa.hpp), its
/// outputs and gradients then rounded to bf16; f32 asks for f32 throughout.
template <class B>
struct AttentionQueries {
    int parts = 1;
    View<const float, 3, B> q[2];
    NumberFormat values = NumberFormat::f32;
};

/// Keys (one view per query part, [rows, kv_heads, dim_p]) and values [rows, kv_heads, dim_v].
template <class B>
struct AttentionKeys {
    View<const float, 3, B> k[2];
    View<const float, 3, B> v;
};

/// One sequence's latent cache for latent_decode: [capacity, width] bf16 rows with a unit last stride.
template <class B>
using LatentRows = View<bf16, 2, B>;

/// The gradients attention_backward writes, shaped as the operands they belong to.
template <class B>
struct AttentionGrads {
    View<float, 3, B> dq[2], dk[2];
    View<float, 3, B> dv;
};

template <class B>
struct AttentionOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no attention primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// The argument checks every backend's AttentionOps runs before touching data (shapes and strides only), so both
/// backends reject the same calls with the same messages.
namespace contract {

inline void check_heads_view(const char* op, const char* name, const Shape<3>& shape, const Shape<3>& strides,
                             index_t rows, index_t heads, index_t dim) {
    if (shape[0] != rows || shape[1] != heads || (dim >= 0 && shape[2] != dim) || strides[2] != 1)
        throw shape_error(std::string(op) + ": " + name + " is " + shape_string(shape) + ", expected [" +
                          std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                          (dim >= 0 ? std::to_string(dim) : std::string("dim")) + "] with a unit last stride");
}

inline void check_offsets(const char* op, std::span<const index_t> offsets, index_t rows) {
    if (offsets.size() < 2 || offsets.front() != 0 || offsets.back() != rows)
        throw shape_error(std::string(op) + ": offsets must run from 0 to the " + std::to_string(rows) +
                          " query rows (" + std::to_string(offsets.size()) + " given)");
    for (std::size_t s = 0; s + 1 < offsets.size(); ++s)
        if (offsets[s + 1] <= offsets[s])
            throw shape_error(std::string(op) + ": offsets must increase strictly, sequence " + std::to_string(s) +
                              " runs from " + std::to_string(offsets[s]) + " to " + std::to_string(offsets[s + 1]));
}

/// Checks queries and keys of one call; returns kv_heads. Keys have `key_rows` rows (-1: any).
template <class B>
index_t check_operands(const char* op, const AttentionQueries<B>& q, const AttentionKeys<B>& kv, index_t key_rows) {
    if (q.parts != 1 && q.parts != 2)
        throw shape_error(std::string(op) + ": " + std::to_string(q.parts) + " query parts (1 or 2)");
    const index_t rows = q.q[0].shape[0], heads = q.q[0].shape[1];
    const index_t L = key_rows >= 0 ? key_rows : kv.k[0].shape[0], kv_heads = kv.k[0].shape[1];
    if (kv_heads < 1 || heads % kv_heads != 0)
        throw shape_error(std::string(op) + ": " + std::to_string(heads) + " query heads over " +
                          std::to_string(kv_heads) + " key/value heads (must divide)");
    for (int p = 0; p < q.parts; ++p) {
        check_heads_view(op, p ? "q[1]" : "q[0]", q.q[p].shape, q.q[p].strides, rows, heads, -1);
        check_heads_view(op, p ? "k[1]" : "k[0]", kv.k[p].shape, kv.k[p].strides, L, kv_heads, q.q[p].shape[2]);
    }
    check_heads_view(op, "v", kv.v.shape, kv.v.strides, L, kv_heads, -1);
    return kv_heads;
}

/// rope's operands: x [rows, heads, 2 * frequencies] with a unit last stride, positions [rows].
template <class B>
void check_rope(const View<float, 3, B>& x, const View<const index_t, 1, B>& positions,
                const View<const float, 1, B>& inv_freq) {
    const index_t rows = x.shape[0], dim = x.shape[2], half = dim / 2;
    if (dim != 2 * inv_freq.shape[0] || x.strides[2] != 1 || (half > 1 && inv_freq.strides[0] != 1))
        throw shape_error("rope: x " + shape_string(x.shape) + " against inv_freq " + shape_string(inv_freq.shape) +
                          " (dim = 2 * frequencies, unit last stride)");
    if (positions.shape[0] != rows || (rows > 1 && positions.strides[0] != 1))
        throw shape_error("rope: positions " + shape_string(positions.shape) + " for x " + shape_string(x.shape));
}

/// attention_forward's operands; returns the query heads per key/value head.
template <class B>
index_t check_forward(const AttentionQueries<B>& q, const AttentionKeys<B>& kv, std::span<const index_t> offsets,
                      const View<float, 3, B>& o, const View<float, 1, B>& lse, const View<float, 1, B>& max_logit) {
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1];
    check_offsets("attention_forward", offsets, T);
    const index_t G = H / check_operands("attention_forward", q, kv, T);
    check_heads_view("attention_forward", "o", o.shape, o.strides, T, H, kv.v.shape[2]);
    if (lse.numel() != T * H || lse.strides[0] != 1 ||
        (max_logit.numel() != 0 && (max_logit.shape[0] != H || max_logit.strides[0] != 1)))
        throw shape_error("attention_forward: lse " + shape_string(lse.shape) + " and max_logit " +
                          shape_string(max_logit.shape) + " for " + std::to_string(T) + " rows of " +
                          std::to_string(H) + " heads");
    return G;
}

/// attention_backward's operands; returns kv_heads.
template <class B>
index_t check_backward(const AttentionQueries<B>& q, const AttentionKeys<B>& kv, std::span<const index_t> offsets,
                       const View<const float, 3, B>& o, const View<const float, 1, B>& lse,
                       const View<const float, 3, B>& d_o, const AttentionGrads<B>& grads) {
    const char* op = "attention_backward";
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1];
    check_offsets(op, offsets, T);
    const index_t KV = check_operands(op, q, kv, T), dim_v = kv.v.shape[2];
    check_heads_view(op, "o", o.shape, o.strides, T, H, dim_v);
    check_heads_view(op, "d_o", d_o.shape, d_o.strides, T, H, dim_v);
    for (int p = 0; p < q.parts; ++p) {
        check_heads_view(op, p ? "dq[1]" : "dq[0]", grads.dq[p].shape, grads.dq[p].strides, T, H, q.q[p].shape[2]);
        check_heads_view(op, p ? "dk[1]" : "dk[0]", grads.dk[p].shape, grads.dk[p].strides, T, KV, q.q[p].shape[2]);
        if (KV > 1 && grads.dk[p].strides[1] == 0)
            throw shape_error("attention_backward: dk needs a non-zero head stride");
    }
    check_heads_view(op, "dv", grads.dv.shape, grads.dv.strides, T, KV, dim_v);
    if (KV > 1 && grads.dv.strides[1] == 0) throw shape_error("attention_backward: dv needs a non-zero head stride");
    if (lse.numel() != T * H || lse.strides[0] != 1)
        throw shape_error("attention_backward: lse " + shape_string(lse.shape) + " for " + std::to_string(T) +
                          " rows of " + std::to_string(H) + " heads");
    return KV;
}

/// attention_decode's operands: every sequence's cache, all before any work.
template <class B>
void check_decode(const AttentionQueries<B>& q, std::span<const AttentionKeys<B>> caches,
                  std::span<const index_t> offsets, const View<float, 3, B>& o) {
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
    check_offsets("attention_decode", offsets, T);
    if (index_t(caches.size()) != N)
        throw shape_error("attention_decode: " + std::to_string(caches.size()) + " caches for " + std::to_string(N) +
                          " sequences");
    for (index_t s = 0; s < N; ++s) {
        const AttentionKeys<B>& kv = caches[std::size_t(s)];
        if (kv.k[0].shape[0] < offsets[s + 1] - offsets[s])
            throw shape_error("attention_decode: sequence " + std::to_string(s) + " has " +
                              std::to_string(offsets[s + 1] - offsets[s]) + " new rows but its cache only " +
                              std::to_string(kv.k[0].shape[0]) + " keys");
        check_operands("attention_decode", q, kv, -1);
        check_heads_view("attention_decode", "o", o.shape, o.strides, T, H, kv.v.shape[2]);
    }
}

/// latent_decode's operands (shapes only: the device lengths are the caller's promise, see the file comment).
template <class B>
void check_latent_decode(const View<const bf16, 3, B>& q, const View<const bf16, 2, B>& fresh,
                         std::span<const LatentRows<B>> caches, const View<const index_t, 1, B>& lengths,
                         std::span<const index_t> offsets, std::span<const index_t> extents, index_t value_dim,
                         const View<float, 3, B>& o) {
    const char* op = "latent_decode";
    const index_t T = q.shape[0], H = q.shape[1], W = q.shape[2], N = index_t(offsets.size()) - 1;
    check_offsets(op, offsets, T);
    if (q.strides[0] != H * W || q.strides[1] != W || q.strides[2] != 1)
        throw shape_error(std::string(op) + ": q " + shape_string(q.shape) + " must be contiguous");
    if (fresh.shape[0] != T || fresh.shape[1] != W || fresh.strides[1] != 1)
        throw shape_error(std::string(op) + ": fresh is " + shape_string(fresh.shape) + ", expected [" +
                          std::to_string(T) + ", " + std::to_string(W) + "] with a unit last stride");
    if (value_dim < 1 || value_dim > W)
        throw shape_error(std::string(op) + ": value_dim " + std::to_string(value_dim) + " outside [1, " +
                          std::to_string(W) + "]");
    if (index_t(caches.size()) != N || index_t(extents.size()) != N || lengths.shape[0] != N ||
        (N > 1 && lengths.strides[0] != 1))
        throw shape_error(std::string(op) + ": " + std::to_string(caches.size()) + " caches, " +
                          std::to_string(extents.size()) + " extents and " + std::to_string(lengths.shape[0]) +
                          " lengths for " + std::to_string(N) + " sequences");
    for (index_t s = 0; s < N; ++s) {
        const LatentRows<B>& c = caches[std::size_t(s)];
        const index_t rows = offsets[s + 1] - offsets[s], e = extents[std::size_t(s)];
        if (c.shape[1] != W || c.strides[1] != 1 || c.strides[0] < W)
            throw shape_error(std::string(op) + ": cache of sequence " + std::to_string(s) + " is " +
                              shape_string(c.shape) + ", expected [capacity, " + std::to_string(W) +
                              "] with a unit last stride");
        if (e < rows || e > c.shape[0])
            throw shape_error(std::string(op) + ": sequence " + std::to_string(s) + " spans " + std::to_string(e) +
                              " keys for " + std::to_string(rows) + " new rows in a cache of " +
                              std::to_string(c.shape[0]) + " (rows <= extent <= capacity)");
    }
    check_heads_view(op, "o", o.shape, o.strides, T, H, value_dim);
    if (o.strides[1] != value_dim || o.strides[0] != H * value_dim)
        throw shape_error(std::string(op) + ": o " + shape_string(o.shape) + " must be contiguous");
}

}  // namespace contract

}  // namespace moonmoe::backend
