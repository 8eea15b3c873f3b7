// moonmoe/nn/router.hpp: the MoE gate as HF DeepseekV3 (and DeepseekV2) computes it, in f32, with backward.
//
//   s = sigmoid(u W^T)  (or softmax)           scores, [tokens, experts]
//   choice = s + e_score_correction_bias        used only to select
//   groups: keep the TopGroups groups with the largest sum of their top-2 choices; others' choices become -inf
//           (transformers 5.23 modeling_deepseek_v3.py:151; older HF code says 0.0, which differs only when every
//           kept choice is negative). GroupScore<GroupMax> (DeepSeek-V2's group_limited_greedy, transformers 5.23
//           modeling_deepseek_v2.py DeepseekV2TopkRouter): a group's score is its largest score, and the dropped
//           groups' scores become 0.0, as there (softmax scores are positive, so they are never chosen over a
//           kept expert unless softmax underflows to 0)
//   idx = top-k(choice); w = s[idx]; w /= sum(w) + 1e-20 (NormTopK); w *= RoutedScale
// The gradient reaches W and u through the unbiased scores s of the chosen experts (selection is discrete).
// The correction bias gets no gradient; update_bias() moves it by gamma * sign(mean load - load), from the tokens
// that the training forwards routed: forwards run with count_load off (measurements, such as the optimizer's
// QK-Clip re-measure) leave the counts alone.
// The optional sequence-wise balance loss alpha * sum_i f_i P_i adds its gradient through s.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "../config/moe.hpp"
#include "../backend/functors.hpp"
#include "layout.hpp"
#include "linear.hpp"

namespace moonmoe::nn {

/// The experts each token uses: idx[t * k + j] and their weights, for `tokens` tokens.
struct Routing {
    index_t tokens = 0, k = 0;
    std::vector<index_t> idx;
    std::vector<float> weight;
};

template <class B = cpu>
struct Router {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    MoEConfig cfg{};
    Param<2, B> weight;  ///< mlp.gate.weight [experts, hidden]
    Param<1, B> bias;    ///< mlp.gate.e_score_correction_bias [experts]; no gradient
    std::vector<index_t> load;  ///< tokens routed to each expert by counted forwards since the last update_bias()
    bool count_load = true;     ///< false: forward leaves `load` alone (a measurement, not a training forward)
    float balance_alpha = 0.0f;  ///< weight of the sequence-wise balance loss (0: off)
    /// When set, forward uses these experts (t * K + j) instead of selecting: the routing weights stay smooth
    /// functions of the input, which is what a finite-difference check of the gradient needs.
    const std::vector<index_t>* fixed_selection = nullptr;

    struct Cache {
        Mat u, scores;    ///< input [T, hidden]; scores s [T, E]
        Mat aux_grad;     ///< d(balance loss)/ds [T, E] when the loss is on
        Routing routing;
    };

    Router() = default;
    Router(const MoEConfig& c, index_t hidden)
        : cfg(c), weight({c.experts, hidden}, ParamKind::matrix), bias({c.experts}, ParamKind::router_bias),
          load(static_cast<std::size_t>(c.experts), 0) {}

    index_t experts() const { return cfg.experts; }

    void forward(View<const float, 2, B> u, Cache& c) {
        const index_t T = u.shape[0], E = cfg.experts, K = cfg.top_k;
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        c.u = Mat({T, u.shape[1]});
        Ops::copy(u, c.u.view());
        c.scores = Mat({T, E});
        Ops::linear(u, weight.value.view(), c.scores.view());
        Routing& r = c.routing;
        r.tokens = T, r.k = K;
        r.idx.assign(static_cast<std::size_t>(T * K), 0);
        r.weight.assign(static_cast<std::size_t>(T * K), 0.0f);
        const float* b = bias.value.data();
        const index_t G = cfg.groups, per_group = E / G;
        Ops::for_each(T, [&](index_t t) {
            float* s = c.scores.data() + t * E;
            if (cfg.score == ScoreFunc::sigmoid) {
                for (index_t e = 0; e < E; ++e) s[e] = fn::sigmoid(s[e]);
            } else {
                const float m = *std::max_element(s, s + E);
                double sum = 0.0;
                for (index_t e = 0; e < E; ++e) sum += std::exp(double(s[e] - m));
                for (index_t e = 0; e < E; ++e) s[e] = float(std::exp(double(s[e] - m)) / sum);
            }
            std::vector<float> choice(s, s + E);
            if (cfg.correction_bias)
                for (index_t e = 0; e < E; ++e) choice[e] += b[e];
            if (G > 1 && cfg.top_groups < G) {
                std::vector<float> group_score(static_cast<std::size_t>(G));
                const bool group_max = cfg.group_score == GroupScoreFunc::max;
                for (index_t g = 0; g < G; ++g) {  // the group's largest choice, or the sum of its two largest
                    std::vector<float> v(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
                    if (group_max) {
                        group_score[g] = *std::max_element(v.begin(), v.end());
                    } else {
                        std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
                        group_score[g] = v[0] + v[1];
                    }
                }
                std::vector<index_t> order = Ops::top_k(group_score.data(), G, cfg.top_groups);
                std::vector<bool> keep(static_cast<std::size_t>(G), false);
                for (index_t g : order) keep[g] = true;
                const float dropped = group_max ? 0.0f : -INFINITY;
                for (index_t e = 0; e < E; ++e)
                    if (!keep[e / per_group]) choice[e] = dropped;
            }
            std::vector<index_t> chosen = fixed_selection
                                              ? std::vector<index_t>(fixed_selection->begin() + t * K,
                                                                     fixed_selection->begin() + (t + 1) * K)
                                              : Ops::top_k(choice.data(), E, K);
            double sum = 0.0;
            for (index_t j = 0; j < K; ++j) sum += s[chosen[j]];
            for (index_t j = 0; j < K; ++j) {
                float w = s[chosen[j]];
                if (cfg.norm_top_k) w = w / (float(sum) + 1e-20f);
                r.idx[t * K + j] = chosen[j];
                r.weight[t * K + j] = w * float(cfg.routed_scale);
            }
        });
        if (count_load)
            for (index_t i = 0; i < T * K; ++i) ++load[r.idx[i]];
    }

    /// Sequence-wise balance loss alpha * sum_i f_i P_i averaged over the sequences of `layout`; keeps its gradient
    /// with respect to the scores for backward. f_i = E / (K T) * #tokens choosing i, P_i = mean_t s_i / sum_j s_j.
    float balance_loss(Cache& c, const TokenLayout& layout) {
        if (balance_alpha == 0.0f) return 0.0f;
        const index_t E = cfg.experts, K = cfg.top_k, batch = layout.sequences();
        c.aux_grad = Mat({layout.tokens(), E});
        double loss = 0.0;
        for (index_t b = 0; b < batch; ++b) {
            const index_t S = layout.length(b);
            std::vector<double> f(static_cast<std::size_t>(E), 0.0);
            for (index_t t = layout.begin(b); t < layout.end(b); ++t)
                for (index_t j = 0; j < K; ++j) f[c.routing.idx[t * K + j]] += double(E) / double(K * S);
            for (index_t t = layout.begin(b); t < layout.end(b); ++t) {
                const float* s = c.scores.data() + t * E;
                double z = 0.0, fs = 0.0;
                for (index_t e = 0; e < E; ++e) z += s[e], fs += f[e] * s[e];
                for (index_t e = 0; e < E; ++e) {
                    loss += f[e] * s[e] / z / double(S);
                    // d/ds_e of sum_i f_i s_i / z = (f_e - fs / z) / z
                    c.aux_grad(t, e) = float(balance_alpha * (f[e] - fs / z) / z / double(S) / double(batch));
                }
            }
        }
        return float(balance_alpha * loss / double(batch));
    }

    /// dweight [T * K]: gradient of the loss with respect to Routing::weight. Accumulates dW; du += ...
    void backward(const std::vector<float>& dweight, Cache& c, View<float, 2, B> du) {
        const index_t T = c.routing.tokens, E = cfg.experts, K = cfg.top_k;
        Mat dlogits({T, E});
        const float scale = float(cfg.routed_scale);
        Ops::for_each(T, [&](index_t t) {
            const float* s = c.scores.data() + t * E;
            float* d = dlogits.data() + t * E;
            const index_t* idx = c.routing.idx.data() + t * K;
            const float* dw = dweight.data() + t * K;
            if (cfg.norm_top_k) {  // w_k = scale s_k / Z, Z = sum s + 1e-20
                double z = 1e-20, dot = 0.0;
                for (index_t j = 0; j < K; ++j) z += s[idx[j]], dot += double(dw[j]) * s[idx[j]];
                for (index_t j = 0; j < K; ++j) d[idx[j]] += float(scale * (dw[j] / z - dot / (z * z)));
            } else {
                for (index_t j = 0; j < K; ++j) d[idx[j]] += scale * dw[j];
            }
            if (!c.aux_grad.empty())
                for (index_t e = 0; e < E; ++e) d[e] += c.aux_grad(t, e);
            if (cfg.score == ScoreFunc::sigmoid) {
                for (index_t e = 0; e < E; ++e) d[e] *= s[e] * (1.0f - s[e]);
            } else {
                double dot = 0.0;
                for (index_t e = 0; e < E; ++e) dot += double(d[e]) * s[e];
                for (index_t e = 0; e < E; ++e) d[e] = s[e] * (d[e] - float(dot));
            }
        });
        using backend::Trans;
        Ops::gemm(Trans::yes, Trans::no, 1.0f, dlogits.view(), c.u.view(), 1.0f, weight.grad.view());
        Ops::gemm(Trans::no, Trans::no, 1.0f, dlogits.view(), weight.value.view(), 1.0f, du);
        c = Cache{};
    }

    /// The auxiliary-loss-free balancing step: bias_i += gamma * sign(mean load - load_i); resets the counts.
    void update_bias(float gamma) {
        const double mean = double(std::accumulate(load.begin(), load.end(), index_t{0})) / double(cfg.experts);
        float* b = bias.value.data();
        for (index_t e = 0; e < cfg.experts; ++e) {
            const double diff = mean - double(load[e]);
            b[e] += gamma * float((diff > 0) - (diff < 0));
        }
        reset_load();
    }

    /// Forgets the counts without moving the bias (a step skipped for non-finite gradients discards its forwards).
    void reset_load() { std::fill(load.begin(), load.end(), index_t{0}); }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        visit(name + ".weight", weight, f);
        if (cfg.correction_bias) visit(name + ".e_score_correction_bias", bias, f);
    }
};

}  // namespace moonmoe::nn
