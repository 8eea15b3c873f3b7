// moonmoe/nn/attention_core.hpp: causal softmax attention of one head over one sequence, forward and backward,
// shared by MLA and MHA. The modules call it once per (sequence, head) of their token layout, so attention never
// crosses a sequence boundary of a packed batch.
//
// scores = scale * sum over parts p of Q_p K_p^T (MLA has two parts, nope and rope, so its keys are never
// concatenated; MHA has one), P = softmax(scores) over keys j <= i, O = P V. Forward keeps only the per-row
// log-sum-exp; backward recomputes P from it:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)) * scale,  dQ_p = dS K_p,  dK_p = dS^T Q_p.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "../backend/backend.hpp"
#include "../tensor/tensor.hpp"
#include "layout.hpp"

namespace moonmoe::nn {

/// Where the log-sum-exps of head h of sequence s start in a [tokens * heads] buffer: blocks of length(s) values,
/// sequence by sequence, head by head within a sequence.
inline index_t lse_offset(const TokenLayout& layout, index_t heads, index_t s, index_t h) {
    return layout.begin(s) * heads + h * layout.length(s);
}

/// One head of one sequence: S rows each. Parts: 1 or 2 (q, k) pairs summed into the scores.
template <class B = cpu>
struct HeadViews {
    int parts = 1;
    View<const float, 2, B> q[2], k[2];
    View<const float, 2, B> v;
};

/// O = softmax(causal scores) V; lse[i] = log-sum-exp of row i; returns the largest scaled score seen.
template <class B = cpu>
float attention_head_forward(const HeadViews<B>& hv, float scale, View<float, 2, B> o, float* lse) {
    using Ops = backend::Ops<B>;
    using backend::Trans;
    const index_t S = hv.q[0].shape[0];
    std::vector<float> buffer(static_cast<std::size_t>(S * S));
    View<float, 2, B> P(buffer.data(), {S, S});
    for (int p = 0; p < hv.parts; ++p) Ops::gemm(Trans::no, Trans::yes, scale, hv.q[p], hv.k[p], p ? 1.0f : 0.0f, P);
    const float max_logit = Ops::softmax_rows(P, 0, lse);
    Ops::gemm(Trans::no, Trans::no, 1.0f, P, hv.v, 0.0f, o);
    return max_logit;
}

/// Gradients of one head. dq[p], dk[p], dv are written, or added to when `accumulate` (heads sharing K/V).
template <class B = cpu>
void attention_head_backward(const HeadViews<B>& hv, float scale, View<const float, 2, B> o, const float* lse,
                             View<const float, 2, B> d_o, View<float, 2, B>* dq, View<float, 2, B>* dk,
                             View<float, 2, B> dv, bool accumulate_kv) {
    using Ops = backend::Ops<B>;
    using backend::Trans;
    const index_t S = hv.q[0].shape[0], dim_v = hv.v.shape[1];
    std::vector<float> p(static_cast<std::size_t>(S * S)), dp(static_cast<std::size_t>(S * S));
    View<float, 2, B> P(p.data(), {S, S}), dP(dp.data(), {S, S});
    for (int part = 0; part < hv.parts; ++part)
        Ops::gemm(Trans::no, Trans::yes, scale, hv.q[part], hv.k[part], part ? 1.0f : 0.0f, P);
    for (index_t i = 0; i < S; ++i) {  // P again, from the log-sum-exp: the visible part, then zeros
        Ops::exp_shifted(p.data() + i * S, i + 1, lse[i]);
        std::fill(p.begin() + i * S + i + 1, p.begin() + (i + 1) * S, 0.0f);
    }
    const float beta = accumulate_kv ? 1.0f : 0.0f;
    Ops::gemm(Trans::yes, Trans::no, 1.0f, P, d_o, beta, dv);
    Ops::gemm(Trans::no, Trans::yes, 1.0f, d_o, hv.v, 0.0f, dP);
    for (index_t i = 0; i < S; ++i) {
        double d = 0.0;
        for (index_t j = 0; j < dim_v; ++j) d += double(d_o(i, j)) * o(i, j);
        for (index_t j = 0; j < S; ++j) dp[i * S + j] = j <= i ? p[i * S + j] * (dp[i * S + j] - float(d)) * scale : 0.0f;
    }
    for (int part = 0; part < hv.parts; ++part) {
        Ops::gemm(Trans::no, Trans::no, 1.0f, dP, hv.k[part], 0.0f, dq[part]);
        Ops::gemm(Trans::yes, Trans::no, 1.0f, dP, hv.q[part], beta, dk[part]);
    }
}

}  // namespace moonmoe::nn
