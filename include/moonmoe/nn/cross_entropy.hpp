// moonmoe/nn/cross_entropy.hpp: mean token cross-entropy over logits, as HF's causal-LM loss computes it.
//
// loss = mean over targets != ignore of (logsumexp(z_t) - z_t[target_t]); dlogits = (softmax(z_t) - onehot) / count.
// causal_targets() gives HF's shift: the target of token i is token i+1 of the same sequence; each sequence's last
// token has none (in a packed layout no target crosses a boundary). The mean runs over every target of the batch,
// as transformers computes the loss of a packed batch (DataCollatorWithFlattening); cross_entropy() of one
// sequence's rows gives that sequence's own loss.
#pragma once

#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../backend/backend.hpp"
#include "../tensor/tensor.hpp"
#include "../tensor/transfer.hpp"
#include "layout.hpp"

namespace moonmoe::nn {

inline constexpr index_t ignore_index = -100;

inline std::vector<index_t> causal_targets(const index_t* ids, const TokenLayout& layout) {
    std::vector<index_t> targets(static_cast<std::size_t>(layout.tokens()), ignore_index);
    for (index_t s = 0; s < layout.sequences(); ++s)
        for (index_t t = layout.begin(s); t + 1 < layout.end(s); ++t) targets[std::size_t(t)] = ids[t + 1];
    return targets;
}

/// Returns the mean loss; writes its gradient with respect to the logits into dlogits when dlogits.data is set.
/// targets are host values: checked here against the vocabulary and counted, then uploaded once.
template <class B = cpu>
float cross_entropy(View<const float, 2, B> logits, const index_t* targets, View<float, 2, B> dlogits = {}) {
    const index_t T = logits.shape[0], V = logits.shape[1];
    index_t count = 0;
    for (index_t t = 0; t < T; ++t) {
        if (targets[t] == ignore_index) continue;
        if (targets[t] < 0 || targets[t] >= V)
            throw std::out_of_range("cross_entropy: target " + std::to_string(targets[t]) + " of token " +
                                    std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
        ++count;
    }
    const Tensor<index_t, 1, B> on_device = to_device<B>(std::span<const index_t>(targets, std::size_t(T)));
    Tensor<float, 1, B> loss({1});
    backend::Ops<B>::cross_entropy(logits, on_device.view(), ignore_index, count, loss.view(), dlogits);
    // Named host sync: the loss is the value the caller returns, logs and checks.
    return to_host(loss)[0];
}

/// -log softmax(z_t)[targets[t]] of every row t (0 where targets[t] is ignore_index), on the host. With dlogits,
/// also writes the gradient of sum_t weights[t] * nll[t] with respect to the logits: weights[t] (softmax(z_t) -
/// onehot). targets are host values, checked against the vocabulary.
template <class B = cpu>
std::vector<float> token_nll(View<const float, 2, B> logits, const index_t* targets,
                             std::span<const float> weights = {}, View<float, 2, B> dlogits = {}) {
    const index_t T = logits.shape[0], V = logits.shape[1];
    for (index_t t = 0; t < T; ++t)
        if (targets[t] != ignore_index && (targets[t] < 0 || targets[t] >= V))
            throw std::out_of_range("token_nll: target " + std::to_string(targets[t]) + " of token " +
                                    std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
    const Tensor<index_t, 1, B> on_device = to_device<B>(std::span<const index_t>(targets, std::size_t(T)));
    Tensor<float, 1, B> on_device_weights;
    if (dlogits.data) {
        if (index_t(weights.size()) != T)
            throw shape_error("token_nll: " + std::to_string(weights.size()) + " weights for " + std::to_string(T) +
                              " rows of logits");
        on_device_weights = to_device<B>(weights);
    }
    Tensor<float, 1, B> nll({T});
    backend::Ops<B>::token_cross_entropy(logits, on_device.view(), ignore_index,
                                         std::as_const(on_device_weights).view(), nll.view(), dlogits);
    return to_host(nll);  // named host sync: the caller sums them per sequence
}

/// log softmax(z_t)[targets[t]] of every row t (0 where targets[t] is ignore_index), on the host. With dlogits, also
/// writes the gradient of sum_t dlogp[t] * logp[t] with respect to the logits: dlogp[t] (onehot - softmax(z_t)) (a
/// policy gradient's backward).
template <class B = cpu>
std::vector<float> token_log_probs(View<const float, 2, B> logits, const index_t* targets,
                                   std::span<const float> dlogp = {}, View<float, 2, B> dlogits = {}) {
    std::vector<float> weights(dlogp.size());
    for (std::size_t t = 0; t < weights.size(); ++t) weights[t] = -dlogp[t];  // the rows' nll gradient scale
    if (dlogits.data && index_t(dlogp.size()) != logits.shape[0])
        throw shape_error("token_log_probs: " + std::to_string(dlogp.size()) + " gradients for " +
                          std::to_string(logits.shape[0]) + " rows of logits");
    std::vector<float> logp = token_nll<B>(logits, targets, weights, dlogits);
    for (float& l : logp) l = -l;
    return logp;
}

/// HF's causal-LM loss of `ids` laid out as `layout` (labels = input_ids): the mean cross-entropy of each token's
/// next token, its gradient written into dlogits scaled by `scale` (a pipeline's 1 / micro-batches).
template <class B = cpu>
float causal_lm_loss(View<const float, 2, B> logits, const index_t* ids, const TokenLayout& layout,
                     View<float, 2, B> dlogits, float scale = 1.0f) {
    const std::vector<index_t> targets = causal_targets(ids, layout);
    const float loss = cross_entropy<B>(logits, targets.data(), dlogits);
    if (scale != 1.0f) backend::Ops<B>::map(fn::ScaleBy<float>{scale}, dlogits);
    return loss;
}

}  // namespace moonmoe::nn
