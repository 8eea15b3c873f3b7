// moonmoe/rl/rollout.hpp: sampling responses to prompts with the model being trained (the rollout of an RL
// iteration), in batched decoding with the latent KV cache.
//
//   std::vector<rl::RolloutRequest> requests = {{.prompt = ids, .seed = 7, .budget = 64, .sampling = {.temperature =
//   1}}}; std::vector<rl::Rollout> out = rl::rollout(model, requests, {.stop_tokens = {eos}});
//
// Every request is prefilled in one batch, then every unfinished sequence is fed its last token per step. A
// sequence ends at one of its stop tokens (kept as the response's last token), at its token budget (the response
// is truncated there: Finish::budget, which budget control penalises, rl/objective.hpp), or where its context is
// full (the model's max_position_embeddings: Finish::context).
//
// Decoding is an inference pass (nn/pass.hpp): it feeds no router load and records no QK-Clip maxima, so a rollout
// between two training steps leaves the next step exactly as it would have been.
//
// Reproducibility: the draws are rl/sampling.hpp's (per-sequence seed and token index). Batched, a sequence's
// logits are those it gets decoded alone up to the rounding of GEMMs over a different number of rows (bitwise equal
// where the CPU's row-independent kernel runs: test/unit/nn_packed.cpp), so a draw on a knife edge can differ with
// the batch's composition. RolloutOptions::isolated decodes each sequence on its own instead: its tokens are then
// the same bits whatever else is requested (at a fixed thread count), at the cost of reading the weights once per
// sequence per step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../nn/transformer.hpp"
#include "../tensor/transfer.hpp"
#include "sampling.hpp"

namespace moonmoe::rl {

struct RolloutRequest {
    std::vector<index_t> prompt;
    std::uint64_t seed = 0;  ///< the sequence's random stream (rl/sampling.hpp)
    index_t budget = 0;      ///< the most response tokens; required (> 0): budget control's per-task limit
    SamplingParams sampling{};
};

enum class Finish {
    stop,     ///< ended with one of the stop tokens (the response's last token)
    budget,   ///< reached its token budget: truncated
    context,  ///< the model's context (max_position_embeddings) is full: truncated
};

inline const char* finish_name(Finish f) {
    switch (f) {
    case Finish::stop: return "stop";
    case Finish::budget: return "budget";
    case Finish::context: return "context";
    }
    return "?";
}

struct Rollout {
    std::vector<index_t> prompt, response;
    std::vector<float> logp;           ///< per response token: the model's log-probability (pi_old)
    std::vector<float> sampling_logp;  ///< per response token: under the distribution it was drawn from
    Finish finish = Finish::stop;

    bool truncated() const { return finish != Finish::stop; }
    /// log pi_old(response | prompt): the sum of logp in token order (double).
    double sequence_logp() const {
        double s = 0.0;
        for (float l : logp) s += l;
        return s;
    }
};

struct RolloutOptions {
    std::vector<index_t> stop_tokens;  ///< end a response (e.g. the tokenizer's end-of-sequence id)
    bool isolated = false;             ///< decode each sequence alone: bitwise independent of the others
};

namespace detail {

/// Checks the requests against the model before any decoding.
inline void check_requests(const ModelConfig& c, std::span<const RolloutRequest> requests) {
    for (std::size_t i = 0; i < requests.size(); ++i) {
        const RolloutRequest& r = requests[i];
        const std::string where = "rl::rollout: request " + std::to_string(i);
        if (r.prompt.empty()) throw std::invalid_argument(where + " has an empty prompt");
        if (r.budget <= 0)
            throw std::invalid_argument(where + " has a token budget of " + std::to_string(r.budget) +
                                        "; set the most response tokens (budget control), > 0");
        for (std::size_t t = 0; t < r.prompt.size(); ++t)
            if (r.prompt[t] < 0 || r.prompt[t] >= c.dims.vocab)
                throw std::out_of_range(where + ": prompt token " + std::to_string(t) + " is " +
                                        std::to_string(r.prompt[t]) + ", outside the vocabulary [0, " +
                                        std::to_string(c.dims.vocab) + ")");
        if (index_t(r.prompt.size()) >= c.rope.max_positions)
            throw std::invalid_argument(where + ": its prompt has " + std::to_string(r.prompt.size()) +
                                        " tokens, the model's context (max_position_embeddings) " +
                                        std::to_string(c.rope.max_positions) + ": no room for a response");
        r.sampling.validate(where);
    }
}

/// Decodes the requests `which` together until each has ended.
template <class B>
void rollout_batch(nn::Transformer<B>& model, std::span<const RolloutRequest> requests, std::span<const index_t> which,
                   const RolloutOptions& options, std::vector<Rollout>& out) {
    using State = typename nn::Transformer<B>::DecodeState;
    const index_t V = model.config.dims.vocab, context = model.config.rope.max_positions;
    std::vector<State> states;
    states.reserve(which.size());
    for (index_t q : which) {
        const RolloutRequest& r = requests[std::size_t(q)];
        const index_t capacity = std::min<index_t>(index_t(r.prompt.size()) + r.budget, context);
        states.push_back(model.start_decoding(capacity));
        out[std::size_t(q)].prompt = r.prompt;
    }
    std::vector<std::size_t> active(which.size());
    for (std::size_t i = 0; i < which.size(); ++i) active[i] = i;
    std::vector<index_t> ids, counts;
    for (index_t q : which) {
        const auto& p = requests[std::size_t(q)].prompt;
        ids.insert(ids.end(), p.begin(), p.end());
        counts.push_back(index_t(p.size()));
    }
    while (!active.empty()) {
        std::vector<State*> batch;
        for (std::size_t i : active) batch.push_back(&states[i]);
        const Tensor<float, 2, B> logits = model.decode(ids.data(), counts, batch);
        // each sequence's last row, on the host
        std::vector<float> last(active.size() * std::size_t(V));
        std::vector<SamplingParams> params;
        std::vector<std::uint64_t> seeds, indices;
        index_t row = -1;
        for (std::size_t k = 0; k < active.size(); ++k) {
            row += counts[k];
            const std::vector<float> host = to_host(View<const float, 1, B>(logits.data() + row * V, {V}));
            std::copy(host.begin(), host.end(), last.begin() + std::ptrdiff_t(k) * V);
            const RolloutRequest& r = requests[std::size_t(which[active[k]])];
            params.push_back(r.sampling);
            seeds.push_back(r.seed);
            indices.push_back(std::uint64_t(out[std::size_t(which[active[k]])].response.size()));
        }
        const std::vector<Draw> draws = sample_rows(last.data(), index_t(active.size()), V, V, params, seeds, indices);
        std::vector<std::size_t> still;
        ids.clear();
        for (std::size_t k = 0; k < active.size(); ++k) {
            const index_t q = which[active[k]];
            const RolloutRequest& r = requests[std::size_t(q)];
            Rollout& o = out[std::size_t(q)];
            o.response.push_back(draws[k].token);
            o.logp.push_back(draws[k].logp);
            o.sampling_logp.push_back(draws[k].sampling_logp);
            const index_t length = index_t(o.prompt.size() + o.response.size());
            if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), draws[k].token) !=
                options.stop_tokens.end())
                o.finish = Finish::stop;
            else if (index_t(o.response.size()) >= r.budget)
                o.finish = Finish::budget;
            else if (length >= context)
                o.finish = Finish::context;
            else {
                still.push_back(active[k]);
                ids.push_back(draws[k].token);
            }
        }
        active = std::move(still);
        counts.assign(active.size(), 1);
    }
}

}  // namespace detail

/// Samples a response to every request (see the file's comment); out[i] answers requests[i].
template <class B>
std::vector<Rollout> rollout(nn::Transformer<B>& model, std::span<const RolloutRequest> requests,
                             const RolloutOptions& options = {}) {
    detail::check_requests(model.config, requests);
    std::vector<Rollout> out(requests.size());
    if (options.isolated) {
        for (std::size_t i = 0; i < requests.size(); ++i) {
            const index_t one[1] = {index_t(i)};
            detail::rollout_batch(model, requests, one, options, out);
        }
    } else {
        std::vector<index_t> all(requests.size());
        for (std::size_t i = 0; i < requests.size(); ++i) all[i] = index_t(i);
        detail::rollout_batch(model, requests, all, options, out);
    }
    return out;
}

}  // namespace moonmoe::rl
