// moonmoe/nn/cross_entropy.hpp: mean token cross-entropy over logits, as HF's causal-LM loss computes it.
//
// loss = mean over targets != ignore of (logsumexp(z_t) - z_t[target_t]); dlogits = (softmax(z_t) - onehot) / count.
// causal_targets() gives HF's shift: the target of token i is token i+1 of the same sequence; each sequence's last
// token has none (in a packed layout no target crosses a boundary). The mean runs over every target of the batch,
// as transformers computes the loss of a packed batch (DataCollatorWithFlattening); cross_entropy() of one
// sequence's rows gives that sequence's own loss.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "../backend/backend.hpp"
#include "../tensor/tensor.hpp"
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
    std::vector<double> per_token(static_cast<std::size_t>(T), 0.0);
    backend::Ops<B>::for_each(T, [&](index_t t) {
        const float* z = logits.data + t * logits.strides[0];
        float* dz = dlogits.data ? dlogits.data + t * dlogits.strides[0] : nullptr;
        if (targets[t] == ignore_index) {
            if (dz) for (index_t v = 0; v < V; ++v) dz[v] = 0.0f;
            return;
        }
        float m = z[0];
        for (index_t v = 1; v < V; ++v) m = z[v] > m ? z[v] : m;
        double sum = 0.0;
        for (index_t v = 0; v < V; ++v) sum += std::exp(double(z[v] - m));
        const double lse = double(m) + std::log(sum);
        per_token[t] = lse - double(z[targets[t]]);
        if (dz) {
            for (index_t v = 0; v < V; ++v) dz[v] = float(std::exp(double(z[v]) - lse) / double(count));
            dz[targets[t]] -= 1.0f / float(count);
        }
    });
    double total = 0.0;
    for (double l : per_token) total += l;
    return count ? float(total / double(count)) : 0.0f;
}

}  // namespace moonmoe::nn
