// moonmoe/backend/cuda/attention_portable.hpp: the portable path of AttentionOps<cuda> (cuda/attention.hpp says
// how it works): Thrust functors over counting iterators, the emulated mode's attention and the reference the
// fused kernels and the bf16 engine are checked against.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cmath>
#include <span>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../attention.hpp"

namespace moonmoe::backend::cuda_detail {

/// A [rows, heads, dim] view as a kernel sees it (unit last stride): the row and head strides.
template <class T>
struct HeadRows {
    T* data;
    index_t row, head, dim;
    MOONMOE_HD T* at(index_t r, index_t h) const { return data + r * row + h * head; }
};

template <class T>
HeadRows<T> head_rows(const View<T, 3, cuda>& v) {
    return {v.data, v.strides[0], v.strides[1], v.shape[2]};
}

MOONMOE_HD inline float dot(const float* a, const float* b, index_t n) {
    float s = 0.0f;
    for (index_t c = 0; c < n; ++c) s += a[c] * b[c];
    return s;
}

/// The scaled score of query row r, head h against key row j, key head g: scale * sum over parts of q_p . k_p,
/// each part scaled then added, as the CPU's GEMMs (alpha = scale, then beta = 1 for the second part).
struct Scores {
    int parts;
    HeadRows<const float> q[2], k[2];
    float scale;
    MOONMOE_HD float operator()(index_t r, index_t h, index_t j, index_t g) const {
        float s = scale * dot(q[0].at(r, h), k[0].at(j, g), q[0].dim);
        if (parts == 2) s += scale * dot(q[1].at(r, h), k[1].at(j, g), q[1].dim);
        return s;
    }
};

/// One sequence's rows against its keys: query row q0 + i sees keys k0 + j for j <= first + i (L keys in all).
struct Span {
    index_t q0, n, k0, L, first;
};

MOONMOE_HD inline float as_float(float x) { return x; }
MOONMOE_HD inline float as_float(bf16 x) { return x.to_float(); }

/// One (row, head)'s online softmax (Milakov & Gimelshein, arXiv:1805.02867) accumulating into out[dim_v]: the
/// running maximum m and sum l (in double, as the CPU sums its exponentials); out holds sum_j exp(s_j - m) v_j.
struct OnlineSoftmax {
    float* out;
    index_t dim_v;
    float m = -INFINITY;
    double l = 0.0;

    MOONMOE_HD OnlineSoftmax(float* o, index_t dim) : out(o), dim_v(dim) {
        for (index_t c = 0; c < dim_v; ++c) out[c] = 0.0f;
    }
    /// Adds key j's score s and value row v.
    template <class V>
    MOONMOE_HD void add(float s, const V* v) {
        if (s > m) {  // a new maximum: rescale what was summed under the old one
            const float rescale = ::expf(m - s);
            l *= rescale;
            for (index_t c = 0; c < dim_v; ++c) out[c] *= rescale;
            m = s;
        }
        const float p = ::expf(s - m);
        l += p;
        for (index_t c = 0; c < dim_v; ++c) out[c] += p * as_float(v[c]);
    }
    /// out /= l: the softmax-weighted values.
    MOONMOE_HD void finish() const {
        const float inv = float(1.0 / l);
        for (index_t c = 0; c < dim_v; ++c) out[c] *= inv;
    }
};

/// Forward (and decode) for thread k = i * heads + h: o = softmax(scores) V by an online softmax; lse (of the
/// sequence, at h * n + i) and row_max (at (q0 + i) * heads + h) are written when given.
struct ForwardRow {
    Scores score;
    HeadRows<const float> v;
    HeadRows<float> o;
    Span seq;
    index_t heads, group;
    float* lse;      // the sequence's log-sum-exps, or null
    float* row_max;  // [tokens * heads] scratch, or null

    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k / heads, h = k % heads, g = h / group, r = seq.q0 + i;
        OnlineSoftmax acc(o.at(r, h), v.dim);
        const index_t last = seq.first + i < seq.L - 1 ? seq.first + i : seq.L - 1;
        for (index_t j = 0; j <= last; ++j) acc.add(score(r, h, seq.k0 + j, g), v.at(seq.k0 + j, g));
        acc.finish();
        if (lse) lse[h * seq.n + i] = acc.m + float(::log(acc.l));
        if (row_max) row_max[r * heads + h] = acc.m;
    }
};

/// Thread h: max_logit[h] = max(max_logit[h], row_max[t * heads + h] over rows t).
struct HeadMax {
    const float* row_max;
    float* max_logit;
    index_t rows, heads;
    MOONMOE_HD void operator()(index_t h) const {
        float m = max_logit[h];
        for (index_t t = 0; t < rows; ++t)
            if (row_max[t * heads + h] > m) m = row_max[t * heads + h];
        max_logit[h] = m;
    }
};

/// Thread k = t * heads + h: delta[k] = rowsum(dO * O) of row t, head h, summed in double (as the CPU).
struct RowDot {
    HeadRows<const float> d_o, o;
    float* delta;
    index_t heads;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t t = k / heads, h = k % heads;
        const float *a = d_o.at(t, h), *b = o.at(t, h);
        double d = 0.0;
        for (index_t c = 0; c < o.dim; ++c) d += double(a[c]) * b[c];
        delta[k] = float(d);
    }
};

/// What the backward's threads share: scores, values, dO, the sequence's lse and every row's delta.
struct BackwardTerms {
    Scores score;
    HeadRows<const float> v, d_o;
    const float* lse;    // the sequence's, at h * S + i
    const float* delta;  // [tokens * heads]
    index_t t0, S, heads, group;

    /// P_ij and dS_ij = P_ij (dO_i . V_j - delta_i) scale for rows t0 + i, t0 + j of head h.
    MOONMOE_HD void p_ds(index_t i, index_t j, index_t h, float& p, float& ds) const {
        const index_t g = h / group;
        p = ::expf(score(t0 + i, h, t0 + j, g) - lse[h * S + i]);
        const float dp = dot(d_o.at(t0 + i, h), v.at(t0 + j, g), v.dim);
        ds = p * (dp - delta[(t0 + i) * heads + h]) * score.scale;
    }
};

/// Thread k = i * heads + h: dQ_p of query row t0 + i, head h = sum over keys j <= i of dS_ij K_p[j].
struct QueryGrads {
    BackwardTerms terms;
    HeadRows<float> dq[2];
    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k / terms.heads, h = k % terms.heads, g = h / terms.group, r = terms.t0 + i;
        const int parts = terms.score.parts;
        for (int p = 0; p < parts; ++p)
            for (index_t c = 0; c < dq[p].dim; ++c) dq[p].at(r, h)[c] = 0.0f;
        for (index_t j = 0; j <= i; ++j) {
            float pij, ds;
            terms.p_ds(i, j, h, pij, ds);
            for (int p = 0; p < parts; ++p) {
                float* out = dq[p].at(r, h);
                const float* kj = terms.score.k[p].at(terms.t0 + j, g);
                for (index_t c = 0; c < dq[p].dim; ++c) out[c] += ds * kj[c];
            }
        }
    }
};

/// Thread k = j * kv_heads + g: dV and dK_p of key row t0 + j, key/value head g = sums over the query heads of its
/// group (in order) and the query rows i >= j of P_ij dO_i and dS_ij Q_p[i].
struct KeyGrads {
    BackwardTerms terms;
    HeadRows<float> dk[2], dv;
    index_t kv_heads;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t j = k / kv_heads, g = k % kv_heads, r = terms.t0 + j, G = terms.group;
        const int parts = terms.score.parts;
        float* dv_row = dv.at(r, g);
        for (index_t c = 0; c < dv.dim; ++c) dv_row[c] = 0.0f;
        for (int p = 0; p < parts; ++p)
            for (index_t c = 0; c < dk[p].dim; ++c) dk[p].at(r, g)[c] = 0.0f;
        for (index_t h = g * G; h < (g + 1) * G; ++h)
            for (index_t i = j; i < terms.S; ++i) {
                float pij, ds;
                terms.p_ds(i, j, h, pij, ds);
                const float* doi = terms.d_o.at(terms.t0 + i, h);
                for (index_t c = 0; c < dv.dim; ++c) dv_row[c] += pij * doi[c];
                for (int p = 0; p < parts; ++p) {
                    float* out = dk[p].at(r, g);
                    const float* qi = terms.score.q[p].at(terms.t0 + i, h);
                    for (index_t c = 0; c < dk[p].dim; ++c) out[c] += ds * qi[c];
                }
            }
    }
};

/// Thread k = (r * heads + h) * half + i rotates pair i of row r, head h of x into out (HF-exact f32 math, as
/// AttentionOps<cpu>::rope: angle = inv_freq[i] * float(position), cosf / sinf of it times attention_factor).
/// Device cosf / sinf are within 2 ulp of the rounded result (CUDA C++ Programming Guide, "Mathematical
/// Functions", single precision) where glibc's are within 1, so on the GPU a rotated value may differ from the
/// CPU's by a few ulp (the test's 1e-4 relative tolerance against double holds on both); the emulated mode calls
/// glibc and matches the CPU bitwise.
struct RopePair {
    HeadRows<const float> x;
    HeadRows<float> out;
    const index_t* positions;
    const float* inv_freq;
    float attention_factor;
    bool interleave, transpose;
    index_t heads, half;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k % half, rh = k / half, h = rh % heads, r = rh / heads;
        const float angle = inv_freq[i] * float(positions[r]);  // f32, as HF's inv_freq @ position_ids
        const float c = ::cosf(angle) * attention_factor, s = ::sinf(angle) * attention_factor;
        const float* v = x.at(r, h);
        float* w = out.at(r, h);
        const index_t lo = interleave ? 2 * i : i, hi = interleave ? 2 * i + 1 : i + half;
        if (!transpose) {  // gather to half-split order, then rotate
            const float a = v[lo], b = v[hi];
            w[i] = a * c - b * s;
            w[i + half] = b * c + a * s;
        } else {  // rotate back, then scatter to the stored order
            const float a = v[i] * c + v[i + half] * s, b = v[i + half] * c - v[i] * s;
            w[lo] = a;
            w[hi] = b;
        }
    }
};

/// Thread k: element k of src [rows, heads, dim] into dst (the interleaved rope's copy back).
struct CopyHeads {
    HeadRows<const float> src;
    HeadRows<float> dst;
    index_t heads;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t c = k % src.dim, rh = k / src.dim, h = rh % heads, r = rh / heads;
        dst.at(r, h)[c] = src.at(r, h)[c];
    }
};

inline Scores scores(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv, float scale) {
    Scores s{q.parts, {head_rows(q.q[0]), {}}, {head_rows(kv.k[0]), {}}, scale};
    if (q.parts == 2) s.q[1] = head_rows(q.q[1]), s.k[1] = head_rows(kv.k[1]);
    return s;
}

/// attention_forward's portable path (the file comment), after the contract's checks; G query heads per key head.
inline void portable_attention_forward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                                       std::span<const index_t> offsets, float scale, View<float, 3, cuda> o,
                                       View<float, 1, cuda> lse, View<float, 1, cuda> max_logit, index_t G) {
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
    const bool maxima = max_logit.numel() != 0;
    Tensor<float, 1, cuda> row_max({maxima ? T * H : 0});
    const Scores sc = scores(q, kv, scale);
    for (index_t s = 0; s < N; ++s) {
        const index_t t0 = offsets[s], S = offsets[s + 1] - t0;
        launch(S * H, ForwardRow{sc, head_rows(kv.v), head_rows(o), Span{t0, S, t0, S, 0}, H, G, lse.data + t0 * H,
                                 maxima ? row_max.data() : nullptr});
    }
    if (maxima) launch(H, HeadMax{row_max.data(), max_logit.data, T, H});
}

/// attention_backward's portable path, after the contract's checks; KV key / value heads.
inline void portable_attention_backward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                                        std::span<const index_t> offsets, float scale, View<const float, 3, cuda> o,
                                        View<const float, 1, cuda> lse, View<const float, 3, cuda> d_o,
                                        const AttentionGrads<cuda>& grads, index_t KV) {
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], N = index_t(offsets.size()) - 1, G = H / KV;
    Tensor<float, 1, cuda> delta({T * H});
    launch(T * H, RowDot{head_rows(d_o), head_rows(o), delta.data(), H});
    HeadRows<float> dq[2] = {head_rows(grads.dq[0]), {}}, dk[2] = {head_rows(grads.dk[0]), {}};
    if (q.parts == 2) dq[1] = head_rows(grads.dq[1]), dk[1] = head_rows(grads.dk[1]);
    for (index_t s = 0; s < N; ++s) {
        const index_t t0 = offsets[s], S = offsets[s + 1] - t0;
        const BackwardTerms terms{
            scores(q, kv, scale), head_rows(kv.v), head_rows(d_o), lse.data + t0 * H, delta.data(), t0, S, H, G};
        launch(S * H, QueryGrads{terms, {dq[0], dq[1]}});
        launch(S * KV, KeyGrads{terms, {dk[0], dk[1]}, head_rows(grads.dv), KV});
    }
}

}  // namespace moonmoe::backend::cuda_detail

#endif  // defined(MOONMOE_CUDA_EMULATED)
