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
// that the training forwards routed: inference and measurement forwards (nn/pass.hpp) leave the counts alone.
// The optional sequence-wise balance loss alpha * sum_i f_i P_i adds its gradient through s.
// Selection, the backward rows, load counting and the bias step are RoutingOps primitives (backend/routing.hpp).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "../config/moe.hpp"
#include "../tensor/transfer.hpp"
#include "kept.hpp"
#include "layout.hpp"
#include "linear.hpp"
#include "pass.hpp"

namespace moonmoe::nn {

/// The experts each token uses, idx [tokens, k] largest first, and their weights [tokens, k], on the backend.
template <class B = cpu>
struct Routing {
    index_t tokens = 0, k = 0;
    Tensor<index_t, 2, B> idx;
    Tensor<float, 2, B> weight;
};

template <class B = cpu>
struct Router {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    MoEConfig cfg{};
    Param<2, B> weight;          ///< mlp.gate.weight [experts, hidden]
    Param<1, B> bias;            ///< mlp.gate.e_score_correction_bias [experts]; no gradient
    Tensor<index_t, 1, B> load;  ///< tokens routed to each expert by training forwards since the last update_bias()
    /// When set, forward uses these experts (t * K + j) instead of selecting: the routing weights stay smooth
    /// functions of the input, which is what a finite-difference check of the gradient needs. Uploaded each forward.
    const std::vector<index_t>* fixed_selection = nullptr;

    KeptFormat kept_input = KeptFormat::f32;  ///< how u is kept (a value of the compute policy)
    bool keep_input = true;                   ///< false: backward is handed u (a recomputed norm output)

    struct Cache {
        KeptMatrix<B> u;  ///< input [T, hidden], unless the caller recomputes it
        Mat scores;       ///< scores s [T, E]
        Mat aux_grad;     ///< d(balance loss)/ds [T, E] when the loss is on
        Routing<B> routing;
        std::size_t bytes() const {
            return u.bytes() + scores.bytes() + aux_grad.bytes() + routing.idx.bytes() + routing.weight.bytes();
        }
    };

    Router() = default;
    Router(const MoEConfig& c, index_t hidden)
        : cfg(c),
          weight({c.experts, hidden}, ParamKind::matrix),
          bias({c.experts}, ParamKind::router_bias),
          load({c.experts}) {}

    index_t experts() const { return cfg.experts; }

    /// Routes u's tokens; a training forward adds them to `load` (nn/pass.hpp).
    void forward(View<const float, 2, B> u, Cache& c, Pass pass = Pass::training) {
        const index_t T = u.shape[0], K = cfg.top_k;
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        if (keep_input) c.u = KeptMatrix<B>::copy(u, kept_input);
        c.scores = Mat({T, cfg.experts});
        Ops::linear(u, weight.value.view(), c.scores.view());
        Routing<B>& r = c.routing;
        r.tokens = T, r.k = K;
        r.idx = Tensor<index_t, 2, B>({T, K});
        r.weight = Mat({T, K});
        Tensor<index_t, 2, B> fixed;
        if (fixed_selection) {
            if (index_t(fixed_selection->size()) != T * K)
                throw shape_error("Router: fixed_selection holds " + std::to_string(fixed_selection->size()) +
                                  " experts for " + std::to_string(T) + " tokens of top-" + std::to_string(K));
            fixed = to_device<B, 2>(std::span<const index_t>(*fixed_selection), Shape<2>{T, K});
        }
        Ops::route_select(cfg, c.scores.view(), bias.value.view(), fixed.view(), r.idx.view(), r.weight.view());
        if (counts_load(pass)) Ops::histogram(r.idx.view(), 0, load.view());
    }

    /// Sequence-wise balance loss alpha * sum_i f_i P_i averaged over the sequences of `layout` (DeepSeek-V3's
    /// complementary sequence-wise loss, arXiv 2412.19437 §2.1.2); keeps its gradient with respect to the scores for
    /// backward. f_i = E / (K T) * #tokens choosing i, P_i = mean_t s_i / sum_j s_j. A building block for a caller's
    /// own loss: the model's training loss does not add it (Kimi K2 and DeepSeek-V3 balance by the correction bias), so
    /// no model type or router member turns it on.
    float balance_loss(Cache& c, const TokenLayout& layout, double balance_alpha) {
        if (balance_alpha == 0.0) return 0.0f;
        const index_t E = cfg.experts, K = cfg.top_k, batch = layout.sequences();
        // The routing and the scores on the host: the loss is a number the caller reads, and this optional
        // regulariser (off in K2 and V3 training) is computed once per step, so a host pass keeps it simple.
        const std::vector<index_t> idx = to_host(c.routing.idx);
        const std::vector<float> scores = to_host(c.scores);
        std::vector<float> aux(scores.size());
        double loss = 0.0;
        for (index_t b = 0; b < batch; ++b) {
            const index_t S = layout.length(b);
            std::vector<double> f(static_cast<std::size_t>(E), 0.0);
            for (index_t t = layout.begin(b); t < layout.end(b); ++t)
                for (index_t j = 0; j < K; ++j) f[idx[t * K + j]] += double(E) / double(K * S);
            for (index_t t = layout.begin(b); t < layout.end(b); ++t) {
                const float* s = scores.data() + t * E;
                double z = 0.0, fs = 0.0;
                for (index_t e = 0; e < E; ++e) z += s[e], fs += f[e] * s[e];
                for (index_t e = 0; e < E; ++e) {
                    loss += f[e] * s[e] / z / double(S);
                    // d/ds_e of sum_i f_i s_i / z = (f_e - fs / z) / z
                    aux[t * E + e] = float(balance_alpha * (f[e] - fs / z) / z / double(S) / double(batch));
                }
            }
        }
        c.aux_grad = to_device<B, 2>(std::span<const float>(aux), Shape<2>{layout.tokens(), E});
        return float(balance_alpha * loss / double(batch));
    }

    /// dweight [T, K]: gradient of the loss with respect to Routing::weight. Accumulates dW; du += ... `u` is the
    /// forward's input, required when keep_input is false (ignored otherwise).
    void backward(View<const float, 2, B> dweight, Cache& c, View<float, 2, B> du, View<const float, 2, B> u = {}) {
        Mat kept_u;
        u = input_for_backward(c.u, kept_u, u, c.routing.tokens, "Router");
        Mat dlogits({c.routing.tokens, cfg.experts});
        Ops::route_backward(cfg, c.scores.view(), c.routing.idx.view(), dweight, c.aux_grad.view(), dlogits.view());
        using backend::Trans;
        Ops::gemm(Trans::yes, Trans::no, 1.0f, dlogits.view(), u, 1.0f, weight.grad.view());
        Ops::gemm(Trans::no, Trans::no, 1.0f, dlogits.view(), weight.value.view(), 1.0f, du);
        c = Cache{};
    }

    /// The auxiliary-loss-free balancing step: bias_i += gamma * sign(mean load - load_i); resets the counts.
    void update_bias(float gamma) {
        Ops::update_bias(gamma, load.view(), bias.value.view());
        reset_load();
    }

    /// Forgets the counts without moving the bias (a step skipped for non-finite gradients discards its forwards).
    void reset_load() { load.zero(); }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        visit(name + ".weight", weight, f);
        if (cfg.correction_bias) visit(name + ".e_score_correction_bias", bias, f);
    }
};

}  // namespace moonmoe::nn
