// moonmoe/backend/cpu/attention.hpp: AttentionOps<cpu> (backend/attention.hpp).
//
// Attention runs one task per (sequence, head) on the thread pool, each with Eigen GEMMs on its own thread (a
// primitive called inside a parallel body runs inline), an S x S score buffer of its own, and the exact softmax
// below. Results do not depend on the thread count or on where buffers lie.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../attention.hpp"
#include "blas.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {

/// x[j] = exp(x[j] - shift) for j < n (vectorised).
///
/// On a Map, Eigen computes the elements before the first 64-byte boundary and after the last whole packet
/// with std::exp and the rest with its vectorised exp, and the two differ in the last bit: which elements got
/// which depended on the buffer's address. Attention's score rows live in per-call heap buffers, whose
/// addresses depend on what ran before and, at 2 threads, on which thread freed what when, so training runs
/// at 2 threads differed between processes within a few steps. Here every element goes through the
/// vectorised exp, the last partial packet padded in a small buffer: each result depends on its input alone.
inline void exp_shifted(float* x, index_t n, float shift) {
    namespace ei = Eigen::internal;
    using Packet = ei::packet_traits<float>::type;
    constexpr index_t width = ei::packet_traits<float>::size;
    const Packet s = ei::pset1<Packet>(shift);
    index_t j = 0;
    for (; j + width <= n; j += width) ei::pstoreu(x + j, ei::pexp(ei::psub(ei::ploadu<Packet>(x + j), s)));
    if (j < n) {
        float tail[width];
        std::fill(tail, tail + width, shift);
        std::memcpy(tail, x + j, std::size_t(n - j) * sizeof(float));
        ei::pstoreu(tail, ei::pexp(ei::psub(ei::ploadu<Packet>(tail), s)));
        std::memcpy(x + j, tail, std::size_t(n - j) * sizeof(float));
    }
}

/// Softmax of each row in place: exponentials in f32 (exp_shifted), their sum in double. Row i sees only columns
/// t <= causal_first + i (the rest become 0): causal attention whose row 0 sits at key position causal_first.
/// Writes each row's log-sum-exp to lse[i] (if given); returns the largest visible input value.
inline float softmax_rows(View<float, 2> s, index_t causal_first, float* lse = nullptr) {
    const index_t n = s.shape[0], L = s.shape[1];
    float max_value = -INFINITY;
    for (index_t i = 0; i < n; ++i) {
        float* row = s.data + i * s.strides[0];
        const index_t last = causal_first < 0 ? L - 1 : std::min(causal_first + i, L - 1);
        Eigen::Map<Eigen::ArrayXf> visible(row, last + 1);
        const float m = visible.template maxCoeff<Eigen::PropagateNumbers>();  // a NaN score is passed over
        exp_shifted(row, last + 1, m);
        const double sum = visible.template cast<double>().sum();
        const float log_sum = m + float(std::log(sum));
        visible *= float(1.0 / sum);
        for (index_t t = last + 1; t < L; ++t) row[t] = 0.0f;
        if (lse) lse[i] = log_sum;
        max_value = std::max(max_value, m);
    }
    return max_value;
}

/// Rows [r0, r0 + n) of head h of a [rows, heads, dim] view, as a matrix.
template <class T>
View<T, 2> head_rows(const View<T, 3>& x, index_t r0, index_t n, index_t h) {
    return View<T, 2>(x.data + r0 * x.strides[0] + h * x.strides[1], {n, x.shape[2]}, {x.strides[0], 1});
}

/// The heads [h0, h0 + G) of row r of a [rows, heads, dim] view, as a matrix [G, dim].
template <class T>
View<T, 2> group_rows(const View<T, 3>& x, index_t r, index_t h0, index_t G) {
    return View<T, 2>(x.data + r * x.strides[0] + h0 * x.strides[1], {G, x.shape[2]}, {x.strides[1], 1});
}

/// Whether a token's scores [heads, visible] = Q K^T take its bf16 queries and the bf16 cache as they are: on the
/// AMX kernel, or on oneDNN's native bf16 matmul (AVX512_BF16). K2's 64 heads against 4096 rows of 576 at two
/// threads on AMD Zen 4: oneDNN 0.75 ms in panels of 512 keys, the few-rows VDPBF16PS kernel 1.19 ms (built for k
/// in the thousands), the packed kernel on widened queries about twice oneDNN's time (docs/cpu_gemm.md).
inline bool bf16_scores() { return amx_gemm_available() || native_bf16(); }

/// Keys per oneDNN call of a token's products against its cache, fixed by the number of keys and not by the threads,
/// so that results do not depend on the thread count (oneDNN's order of summation may depend on a product's width):
/// oneDNN makes a primitive per shape and strides (onednn.hpp), and a token's key count changes every token, so
/// products over all its keys made new primitives for every token; in panels of this many only the last panel's
/// size varies (at most this many primitives per shape of queries and cache).
inline constexpr index_t onednn_key_panel = 512;

/// C = alpha A op(B) + beta C for attention's rows A (queries or probabilities) against keys or values B: f32 on the
/// CPU's f32 engine; f32 A and bf16 B (a latent cache as stored) on the packed kernel, which widens B block by block
/// as it packs; bf16 A and B (where bf16_scores holds) on the AMX kernel, which reads B, the cache, straight into its
/// tiles (gemm_amx.hpp), else on oneDNN's bf16 matmul. On oneDNN in panels of keys (onednn_key_panel): the scores'
/// columns through a scratch of fixed width (for_each_fixed_panel), P V's inner size added panel by panel in order
/// (for_each_inner_panel).
template <class Q, class K>
void attention_product(Trans tb, float alpha, View<const Q, 2> a, View<const K, 2> b, float beta, View<float, 2> c) {
    constexpr bool both_bf16 = std::is_same_v<Q, bf16>, both_f32 = std::is_same_v<Q, float> && std::is_same_v<K, float>;
#if MOONMOE_WITH_ONEDNN
    if constexpr (both_bf16 || both_f32) {
        const index_t m = c.shape[0], k = a.shape[1];
        const bool on_onednn =
            both_bf16 ? !amx_gemm_available() : f32_gemm_engine(Trans::no, tb, m) == GemmEngine::onednn;
        if (on_onednn && m > 0 && k > 0) {
            if (tb == Trans::yes)  // the scores: the keys are C's columns
                for_each_fixed_panel<K>(tb, b, beta != 0.0f, c, onednn_key_panel,
                                        [&](View<const K, 2> keys, View<float, 2> s) {
                                            onednn::gemm<K, float>(Trans::no, tb, alpha, a, keys, beta, s);
                                        });
            else  // P V: the keys are the inner size, and P's row stride is the key count
                for_each_inner_panel<Q, K>(a, b, beta, onednn_key_panel,
                                           [&](View<const Q, 2> p, View<const K, 2> values, float beta_p) {
                                               onednn::gemm<K, float>(Trans::no, tb, alpha, p, values, beta_p, c);
                                           });
            return;
        }
    }
#endif
    if constexpr (both_bf16) gemm_amx(Trans::no, tb, alpha, a, b, beta, c);
    else if constexpr (both_f32)
        BlasOps<cpu>::gemm<float>(Trans::no, tb, alpha, a, b, beta, c);
    else
        gemm_packed<float, K>(Trans::no, tb, alpha, a, b, beta, c);
}

/// One new token's G query heads that share their keys, against the L keys it sees: P [G, L] = scale
/// sum_p Q_p [G, d_p] K_p [L, d_p]^T, the exact softmax of each row, O [G, d_v] = P V [L, d_v]; each product on the
/// pool, so every key is read once for all G heads. Queries, keys and values f32, or keys and values bf16 with f32
/// or bf16 queries (attention_product); P f32. `buffer` holds P (reused across tokens, from the library's allocator,
/// whose cached blocks spare a fresh 1 MiB its page faults on every token).
template <class Q, class K>
void decode_token(int parts, const View<const Q, 2>* q, const View<const K, 2>* k, View<const K, 2> v, float scale,
                  Tensor<float, 1>& buffer, View<float, 2> o) {
    const index_t G = q[0].shape[0], L = k[0].shape[0];
    if (buffer.numel() < G * L) buffer = Tensor<float, 1>::for_overwrite({G * L});
    View<float, 2> P(buffer.data(), {G, L});
    for (int p = 0; p < parts; ++p) attention_product(Trans::yes, scale, q[p], k[p], p ? 1.0f : 0.0f, P);
    parallel_for(G, [&](index_t r) { softmax_rows(P.slice(0, r, r + 1), -1); });
    attention_product<float, K>(Trans::no, 1.0f, View<const float, 2>(P), v, 0.0f, o);
}

/// One head against its keys: P = softmax(scale sum_p Q_p K_p^T) with row 0 at key causal_first; O = P V.
inline float head_forward(const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv, index_t q0, index_t n,
                          index_t k0, index_t L, index_t h, index_t g, float scale, View<float, 2> o, float* lse) {
    std::vector<float> buffer(static_cast<std::size_t>(n * L));
    View<float, 2> P(buffer.data(), {n, L});
    for (int p = 0; p < q.parts; ++p)
        BlasOps<cpu>::gemm<float>(Trans::no, Trans::yes, scale, head_rows(q.q[p], q0, n, h),
                                  head_rows(kv.k[p], k0, L, g), p ? 1.0f : 0.0f, P);
    const float max_logit = softmax_rows(P, L - n, lse);
    BlasOps<cpu>::gemm<float>(Trans::no, Trans::no, 1.0f, P, head_rows(kv.v, k0, L, g), 0.0f, o);
    return max_logit;
}

}  // namespace cpu_detail

template <>
struct AttentionOps<cpu> {
    /// RoPE in place over x [rows, heads, dim], HF-exact in f32 (nn/rope.hpp).
    static void rope(View<float, 3> x, View<const index_t, 1> positions, View<const float, 1> inv_freq,
                     float attention_factor, bool interleave, bool transpose) {
        contract::check_rope(x, positions, inv_freq);
        const index_t rows = x.shape[0], heads = x.shape[1], dim = x.shape[2], half = dim / 2;
        const float* freq = inv_freq.data;
        cpu_detail::parallel_for(rows, [&](index_t r) {
            std::vector<float> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half)),
                tmp(static_cast<std::size_t>(dim));
            const float pos = float(positions.data[r]);
            for (index_t i = 0; i < half; ++i) {
                const float angle = freq[i] * pos;  // f32, as HF's inv_freq @ position_ids
                c[i] = std::cos(angle) * attention_factor;
                s[i] = std::sin(angle) * attention_factor;
            }
            for (index_t h = 0; h < heads; ++h) {
                float* v = x.data + r * x.strides[0] + h * x.strides[1];
                if (!transpose) {
                    for (index_t i = 0; i < half; ++i) {  // gather to half-split order, then rotate
                        const float a = interleave ? v[2 * i] : v[i], b = interleave ? v[2 * i + 1] : v[i + half];
                        tmp[i] = a * c[i] - b * s[i];
                        tmp[i + half] = b * c[i] + a * s[i];
                    }
                } else {
                    for (index_t i = 0; i < half; ++i) {  // rotate back, then scatter to the stored order
                        const float a = v[i] * c[i] + v[i + half] * s[i];
                        const float b = v[i + half] * c[i] - v[i] * s[i];
                        tmp[interleave ? 2 * i : i] = a;
                        tmp[interleave ? 2 * i + 1 : i + half] = b;
                    }
                }
                std::copy(tmp.begin(), tmp.end(), v);
            }
        });
    }

    /// o = softmax(causal scores) V for every (sequence, head); lse and max_logit as in backend/attention.hpp.
    static void attention_forward(const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv,
                                  std::span<const index_t> offsets, float scale, View<float, 3> o, View<float, 1> lse,
                                  View<float, 1> max_logit) {
        using namespace cpu_detail;
        const index_t H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        const index_t G = contract::check_forward(q, kv, offsets, o, lse, max_logit);
        std::vector<float> task_max(static_cast<std::size_t>(N * H), -INFINITY);
        parallel_for(N * H, [&](index_t task) {
            const index_t s = task / H, h = task % H, t0 = offsets[s], S = offsets[s + 1] - t0;
            task_max[std::size_t(task)] =
                head_forward(q, kv, t0, S, t0, S, h, h / G, scale, head_rows(o, t0, S, h), lse.data + t0 * H + h * S);
        });
        if (max_logit.numel() != 0)
            for (index_t task = 0; task < N * H; ++task)
                max_logit.data[task % H] = std::max(max_logit.data[task % H], task_max[std::size_t(task)]);
    }

    /// Gradients of attention_forward, P recomputed from lse.
    static void attention_backward(const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv,
                                   std::span<const index_t> offsets, float scale, View<const float, 3> o,
                                   View<const float, 1> lse, View<const float, 3> d_o,
                                   const AttentionGrads<cpu>& grads) {
        using namespace cpu_detail;
        const index_t H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        const index_t KV = contract::check_backward(q, kv, offsets, o, lse, d_o, grads), G = H / KV,
                      dim_v = kv.v.shape[2];
        // one task per (sequence, key/value head): the query heads of a group add into the same dK, dV in order
        parallel_for(N * KV, [&](index_t task) {
            const index_t s = task / KV, g = task % KV, t0 = offsets[s], S = offsets[s + 1] - t0;
            std::vector<float> p(static_cast<std::size_t>(S * S)), dp(static_cast<std::size_t>(S * S));
            View<float, 2> P(p.data(), {S, S}), dP(dp.data(), {S, S});
            for (index_t i = 0; i < G; ++i) {
                const index_t h = g * G + i;
                const float beta = i > 0 ? 1.0f : 0.0f;
                for (int part = 0; part < q.parts; ++part)
                    BlasOps<cpu>::gemm<float>(Trans::no, Trans::yes, scale, head_rows(q.q[part], t0, S, h),
                                              head_rows(kv.k[part], t0, S, g), part ? 1.0f : 0.0f, P);
                const float* head_lse = lse.data + t0 * H + h * S;
                for (index_t r = 0; r < S; ++r) {  // P again, from the log-sum-exp: the visible part, then zeros
                    exp_shifted(p.data() + r * S, r + 1, head_lse[r]);
                    std::fill(p.begin() + r * S + r + 1, p.begin() + (r + 1) * S, 0.0f);
                }
                const View<const float, 2> dO = head_rows(d_o, t0, S, h), O = head_rows(o, t0, S, h);
                BlasOps<cpu>::gemm<float>(Trans::yes, Trans::no, 1.0f, P, dO, beta, head_rows(grads.dv, t0, S, g));
                BlasOps<cpu>::gemm<float>(Trans::no, Trans::yes, 1.0f, dO, head_rows(kv.v, t0, S, g), 0.0f, dP);
                for (index_t r = 0; r < S; ++r) {
                    double d = 0.0;
                    const float *dor = dO.data + r * dO.strides[0], *orow = O.data + r * O.strides[0];
                    for (index_t j = 0; j < dim_v; ++j) d += double(dor[j]) * orow[j];
                    for (index_t j = 0; j < S; ++j)
                        dp[r * S + j] = j <= r ? p[r * S + j] * (dp[r * S + j] - float(d)) * scale : 0.0f;
                }
                for (int part = 0; part < q.parts; ++part) {
                    BlasOps<cpu>::gemm<float>(Trans::no, Trans::no, 1.0f, dP, head_rows(kv.k[part], t0, S, g), 0.0f,
                                              head_rows(grads.dq[part], t0, S, h));
                    BlasOps<cpu>::gemm<float>(Trans::yes, Trans::no, 1.0f, dP, head_rows(q.q[part], t0, S, h), beta,
                                              head_rows(grads.dk[part], t0, S, g));
                }
            }
        });
    }

    /// Decoding: the rows of sequence s attend to caches[s], of which they are the last rows. The query heads that
    /// share a key/value head (all of them for MLA's absorbed latent) are one product per new token, so each key is
    /// read once per token instead of once per head: Q_g [G, d] K^T, the exact softmax, P V, each product on the
    /// pool (a decode step reads the whole cache for few FLOPs: per-head products read it H times).
    static void attention_decode(const AttentionQueries<cpu>& q, std::span<const AttentionKeys<cpu>> caches,
                                 std::span<const index_t> offsets, float scale, View<float, 3> o) {
        using namespace cpu_detail;
        const index_t H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        contract::check_decode(q, caches, offsets, o);
        for (index_t s = 0; s < N; ++s) {
            const AttentionKeys<cpu>& kv = caches[std::size_t(s)];
            // key/value heads given with a head stride of 0 (MLA's one latent for all heads) are one head
            bool shared = kv.v.strides[1] == 0;
            for (int p = 0; p < q.parts; ++p) shared = shared && kv.k[p].strides[1] == 0;
            const index_t t0 = offsets[s], n = offsets[s + 1] - t0, KV = shared ? 1 : kv.k[0].shape[1], G = H / KV,
                          L = kv.k[0].shape[0];
            Tensor<float, 1> buffer;
            for (index_t g = 0; g < KV; ++g)
                for (index_t i = 0; i < n; ++i) {
                    const index_t visible = L - n + i + 1;  // token i sees the keys up to its own position
                    View<const float, 2> queries[2], keys[2];
                    for (int p = 0; p < q.parts; ++p) {
                        queries[p] = group_rows(q.q[p], t0 + i, g * G, G);
                        keys[p] = head_rows(kv.k[p], 0, visible, g);
                    }
                    decode_token(q.parts, queries, keys, head_rows(kv.v, 0, visible, g), scale, buffer,
                                 group_rows(o, t0 + i, g * G, G));
                }
        }
    }

    /// MLA's absorbed decode over bf16 latent caches: the new rows appended at the (host-visible) lengths, then per
    /// (sequence, head) the f32 scores of the widened bf16 values, the exact softmax, P times the latent values.
    static void latent_decode(View<const bf16, 3> q, View<const bf16, 2> fresh, std::span<const LatentRows<cpu>> caches,
                              View<const index_t, 1> lengths, std::span<const index_t> offsets,
                              std::span<const index_t> extents, index_t value_dim, float scale, View<float, 3> o) {
        using namespace cpu_detail;
        contract::check_latent_decode<cpu>(q, fresh, caches, lengths, offsets, extents, value_dim, o);
        const index_t H = q.shape[1], W = q.shape[2], N = index_t(offsets.size()) - 1;
        for (index_t s = 0; s < N; ++s)  // the device's promise, checkable here: say which sequence breaks it
            if (lengths.data[s] < 0 || lengths.data[s] + offsets[s + 1] - offsets[s] > extents[std::size_t(s)])
                throw shape_error("latent_decode: sequence " + std::to_string(s) + " holds " +
                                  std::to_string(lengths.data[s]) + " rows; " +
                                  std::to_string(offsets[s + 1] - offsets[s]) + " more exceed its extent of " +
                                  std::to_string(extents[std::size_t(s)]));
        // Per new token, all heads at once (they share the latent keys): scores [H, L] = q K^T, the exact softmax,
        // P times the latent values, each product on the pool, so the keys are read once per token, not once per
        // head. With AVX-512 the products read the bf16 cache as it is (the packed kernel widens the keys block by
        // block as it packs them, gemm_packed.hpp); with AMX the scores take the bf16 queries and cache on its tiles
        // (gemm_amx.hpp: the cache's rows loaded straight into them), with AVX512_BF16 on oneDNN's bf16 matmul
        // (bf16_scores); else every cache's visible rows are widened into a copy first.
        const index_t rows = q.shape[0];
        const bool packed = packed_gemm_available(), bf16_q = packed && bf16_scores();
        auto queries = Tensor<float, 2>::for_overwrite({bf16_q ? 0 : rows * H, W});
        if (!bf16_q) MapOps<cpu>::cast<float, bf16>(View<const bf16, 2>(q.data, {rows * H, W}, {W, 1}), queries.view());
        Tensor<float, 1> buffer;
        for (index_t s = 0; s < N; ++s) {
            const index_t t0 = offsets[s], n = offsets[s + 1] - t0, L = lengths.data[s] + n;
            const LatentRows<cpu>& c = caches[std::size_t(s)];
            for (index_t i = 0; i < n; ++i)
                std::memcpy(c.data + (lengths.data[s] + i) * c.strides[0], fresh.data + (t0 + i) * fresh.strides[0],
                            std::size_t(W) * sizeof(bf16));
            Tensor<float, 2> keys;
            if (!packed) {
                keys = Tensor<float, 2>::for_overwrite({L, W});
                MapOps<cpu>::cast<float, bf16>(View<const bf16, 2>(c.data, {L, W}, c.strides), keys.view());
            }
            for (index_t i = 0; i < n; ++i) {
                const index_t visible = L - n + i + 1;
                const View<float, 2> out(o.data + (t0 + i) * o.strides[0], {H, value_dim}, {o.strides[1], 1});
                if (packed) {  // the bf16 cache as it is (amx implies packed)
                    const View<const bf16, 2> key(c.data, {visible, W}, c.strides),
                        value(c.data, {visible, value_dim}, c.strides);
                    if (bf16_q) {
                        const View<const bf16, 2> query(q.data + (t0 + i) * q.strides[0], {H, W}, {q.strides[1], 1});
                        decode_token(1, &query, &key, value, scale, buffer, out);
                    } else {
                        const View<const float, 2> query = queries.view().slice(0, (t0 + i) * H, (t0 + i + 1) * H);
                        decode_token(1, &query, &key, value, scale, buffer, out);
                    }
                    continue;
                }
                const View<const float, 2> query = queries.view().slice(0, (t0 + i) * H, (t0 + i + 1) * H);
                const View<const float, 2> key = keys.view().slice(0, 0, visible);
                decode_token(1, &query, &key, View<const float, 2>(keys.data(), {visible, value_dim}, {W, 1}), scale,
                             buffer, out);
            }
        }
    }
};

}  // namespace moonmoe::backend
