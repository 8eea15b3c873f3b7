// moonmoe/rl/objective.hpp: the policy objective Kimi K2 was post-trained with (Kimi K2 technical report, section
// 3.2.3, "RL Algorithm", the K1.5 algorithm), budget control's penalty, and the PTX loss beside it.
//
// For a prompt x with K sampled responses y_1..y_K, rewards r_i and the sampling policy's log-probabilities
// log pi_old(y_i | x):
//
//   L_x = (1/K) sum_i (r_i - rbar - tau (log pi_theta(y_i | x) - log pi_old(y_i | x)))^2,   rbar = (1/K) sum_j r_j
//
// and a batch of prompts averages L_x over them (the report's expectation over x). log pi_theta(y | x) is the sum,
// over the response's tokens, of log softmax(z)[token] of the model's logits for the packed (prompt, response)
// sequence (prompt tokens masked out): the same function of the weights as the rollout's logp (rl/sampling.hpp), so
// on-policy the ratio is exactly 1. Its gradient flows through log pi_theta only:
//
//   dL/d log pi_theta(y_i | x) = -(2 tau / (K P)) (r_i - rbar - tau (log pi_theta(y_i|x) - log pi_old(y_i|x)))
//
// for P prompts in the batch, and each response token's logits get that times (onehot - softmax).
//
// Budget control (same section): a response that reached its token budget was truncated by the rollout
// (rl/rollout.hpp, Rollout::truncated()); its reward is lowered by `budget_penalty` before the group's mean is
// taken (the caller's reward function still judges the truncated text; a caller who wants a fixed reward for a cut
// response returns it there and leaves the penalty at 0).
//
// The PTX loss (same section): the mean next-token cross-entropy of a separate batch of curated text, times
// `ptx_weight`, added to the objective in the same step (its gradient accumulated into the same parameters).
#pragma once

#include <cmath>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../config/rl.hpp"
#include "../nn/cross_entropy.hpp"
#include "../nn/transformer.hpp"
#include "../tensor/transfer.hpp"
#include "rollout.hpp"

namespace moonmoe::rl {

/// One sampled response with what the objective needs of it.
struct Sample {
    std::vector<index_t> prompt, response;
    double reward = 0.0;     ///< r(x, y): the caller's
    double old_logp = 0.0;   ///< log pi_old(y | x): Rollout::sequence_logp()
    bool truncated = false;  ///< reached its token budget (Rollout::truncated())

    static Sample of(const Rollout& r, double reward) {
        return {r.prompt, r.response, reward, r.sequence_logp(), r.truncated()};
    }
};

/// The K responses to one prompt.
struct Group {
    std::vector<Sample> samples;
};

struct Objective {
    double tau = 1.0;             ///< the regularisation of log(pi_theta / pi_old), > 0
    double budget_penalty = 0.0;  ///< subtracted from the reward of a truncated response
    double ptx_weight = 0.0;      ///< the PTX loss's weight (0: no PTX batch)

    /// A model type's RL<...> settings (config/rl.hpp).
    static constexpr Objective of(const RLConfig& c) { return {c.tau, c.budget_penalty, c.ptx_weight}; }

    void validate() const {
        if (!(tau > 0.0) || !std::isfinite(tau))
            throw std::invalid_argument("rl::Objective: tau must be finite and > 0, not " + std::to_string(tau));
        if (!std::isfinite(budget_penalty))
            throw std::invalid_argument("rl::Objective: budget_penalty must be finite, not " +
                                        std::to_string(budget_penalty));
        if (!(ptx_weight >= 0.0) || !std::isfinite(ptx_weight))
            throw std::invalid_argument("rl::Objective: ptx_weight must be finite and >= 0, not " +
                                        std::to_string(ptx_weight));
    }
};

/// A batch of curated text for the PTX loss: token ids laid out as `layout` (labels = the ids, as pre-training).
struct PtxBatch {
    std::vector<index_t> ids;
    nn::TokenLayout layout;
};

/// What one objective evaluation found.
struct ObjectiveValue {
    double loss = 0.0;          ///< rl_loss + ptx_weight * ptx_loss
    double rl_loss = 0.0;       ///< the mean over prompts of L_x
    double ptx_loss = 0.0;      ///< the PTX batch's mean cross-entropy (0 without one)
    double mean_reward = 0.0;   ///< over every sample, after budget penalties
    std::vector<double> logp;   ///< log pi_theta(y | x) per sample, groups in order
    std::vector<double> dlogp;  ///< dL / d log pi_theta(y | x) per sample
};

/// The objective and its gradient with respect to each sample's log pi_theta, from those log-probabilities: the
/// scalar part of the step, shared by every layout. `logp` holds the samples of `groups` in order.
inline ObjectiveValue k15_objective(std::span<const Group> groups, std::span<const double> logp, const Objective& o) {
    o.validate();
    ObjectiveValue v;
    v.logp.assign(logp.begin(), logp.end());
    v.dlogp.assign(logp.size(), 0.0);
    if (groups.empty()) return v;
    std::size_t total = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
        if (groups[g].samples.empty())
            throw std::invalid_argument("rl::k15_objective: group " + std::to_string(g) + " has no samples");
        total += groups[g].samples.size();
    }
    if (total != logp.size())
        throw std::invalid_argument("rl::k15_objective: " + std::to_string(logp.size()) + " log-probabilities for " +
                                    std::to_string(total) + " samples");
    const double P = double(groups.size());
    std::size_t i = 0;
    for (std::size_t g = 0; g < groups.size(); ++g) {
        const auto& samples = groups[g].samples;
        const double K = double(samples.size());
        std::vector<double> r(samples.size());
        double mean = 0.0;
        for (std::size_t k = 0; k < samples.size(); ++k) {
            r[k] = samples[k].reward - (samples[k].truncated ? o.budget_penalty : 0.0);
            if (!std::isfinite(r[k]))
                throw std::invalid_argument("rl::k15_objective: sample " + std::to_string(k) + " of group " +
                                            std::to_string(g) + " has a non-finite reward");
            mean += r[k];
            v.mean_reward += r[k];
        }
        mean /= K;
        double lx = 0.0;
        for (std::size_t k = 0; k < samples.size(); ++k, ++i) {
            const double a = r[k] - mean - o.tau * (logp[i] - samples[k].old_logp);
            lx += a * a;
            v.dlogp[i] = -2.0 * o.tau * a / (K * P);
        }
        v.rl_loss += lx / K / P;
    }
    v.mean_reward /= double(total);
    v.loss = v.rl_loss;
    return v;
}

/// The packed (prompt, response) sequences of the groups' samples, in order, and each token's target: the next
/// token where that is a response token, else ignored (the prompt is masked).
struct PackedResponses {
    std::vector<index_t> ids, targets, lengths;
    nn::TokenLayout layout;
};

inline PackedResponses pack_responses(std::span<const Group> groups, index_t vocab) {
    PackedResponses p;
    for (std::size_t g = 0; g < groups.size(); ++g)
        for (std::size_t k = 0; k < groups[g].samples.size(); ++k) {
            const Sample& s = groups[g].samples[k];
            const std::string where = "rl: sample " + std::to_string(k) + " of group " + std::to_string(g);
            if (s.prompt.empty() || s.response.empty())
                throw std::invalid_argument(where + " has an empty " + (s.prompt.empty() ? "prompt" : "response"));
            for (std::size_t t = 0; t < s.prompt.size() + s.response.size(); ++t) {
                const index_t id = t < s.prompt.size() ? s.prompt[t] : s.response[t - s.prompt.size()];
                if (id < 0 || id >= vocab)
                    throw std::out_of_range(where + ": token " + std::to_string(t) + " is " + std::to_string(id) +
                                            ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
                p.ids.push_back(id);
            }
            const std::size_t n = s.prompt.size() + s.response.size();
            for (std::size_t t = 0; t < n; ++t)
                p.targets.push_back(t + 1 >= s.prompt.size() && t + 1 < n ? p.ids[p.ids.size() - n + t + 1]
                                                                          : nn::ignore_index);
            p.lengths.push_back(index_t(n));
        }
    p.layout = nn::TokenLayout::packed(p.lengths);
    return p;
}

/// log pi_theta(y | x) of every sample: the sums of its response tokens' log-probabilities (double, in order).
inline std::vector<double> sequence_logps(const PackedResponses& p, std::span<const float> token_logp) {
    std::vector<double> out;
    for (index_t s = 0; s < p.layout.sequences(); ++s) {
        double sum = 0.0;
        for (index_t t = p.layout.begin(s); t < p.layout.end(s); ++t)
            if (p.targets[std::size_t(t)] != nn::ignore_index) sum += token_logp[std::size_t(t)];
        out.push_back(sum);
    }
    return out;
}

/// The objective's forward and backward on a whole model: the packed responses forward (a training pass),
/// log pi_theta per sample, the objective, its gradient into every parameter's grad (+=, as train_step), then the
/// PTX batch's loss and gradient times ptx_weight. The optimizer's step is the caller's.
template <class B>
ObjectiveValue k15_train_step(nn::Transformer<B>& model, std::span<const Group> groups, const Objective& o,
                              const PtxBatch* ptx = nullptr) {
    o.validate();
    if (o.ptx_weight > 0.0 && !ptx)
        throw std::invalid_argument("rl::k15_train_step: ptx_weight is " + std::to_string(o.ptx_weight) +
                                    " but no PTX batch was given");
    const PackedResponses p = pack_responses(groups, model.config.dims.vocab);
    typename nn::Transformer<B>::Cache cache;
    const Tensor<float, 2, B> logits = model.forward(p.ids.data(), p.layout, cache, nn::Pass::training);
    const std::vector<float> token_logp = nn::token_log_probs<B>(logits.view(), p.targets.data());
    ObjectiveValue v = k15_objective(groups, sequence_logps(p, token_logp), o);
    std::vector<float> dlogp(p.targets.size(), 0.0f);
    for (index_t s = 0; s < p.layout.sequences(); ++s)
        for (index_t t = p.layout.begin(s); t < p.layout.end(s); ++t)
            dlogp[std::size_t(t)] = float(v.dlogp[std::size_t(s)]);
    Tensor<float, 2, B> dlogits(logits.shape());
    nn::token_log_probs<B>(logits.view(), p.targets.data(), dlogp, dlogits.view());
    model.backward(dlogits.view(), cache);
    if (o.ptx_weight > 0.0) {
        v.ptx_loss = model.train_step(ptx->ids.data(), ptx->layout, float(o.ptx_weight));
        v.loss = v.rl_loss + o.ptx_weight * v.ptx_loss;
    }
    return v;
}

}  // namespace moonmoe::rl
