// moonmoe/rl/pipeline.hpp: the K1.5 objective (rl/objective.hpp) and the PTX loss through a pipeline
// (parallel/pipeline.hpp): what Trainer::rl_step runs in layouts with PP > 1.
//
// The objective couples a prompt's K responses through log pi_theta of each, which the last stage knows only once
// every token of the response went forward, while the 1F1B schedule starts a micro-batch's backward before the later
// micro-batches' forwards. So one step runs two passes over the same micro-batches:
//   1. forward only (Pipeline::evaluate, an inference pass: no router load, no QK-Clip maxima, nothing kept): the
//      last stage sums each response's token log-probabilities; an all-reduce over the pipeline group gives every
//      rank log pi_theta of each sample, and k15_objective dL / d log pi_theta;
//   2. the 1F1B schedule (Pipeline::run), the PTX batch's sequences packed beside the responses: the last stage
//      writes each token's logit gradient, -(dL / d log pi_theta(y_s)) (softmax - onehot) for a response token of
//      sample s and (ptx_weight / N) (softmax - onehot) for each of the PTX batch's N targets, and the backwards
//      accumulate the gradient of L + ptx_weight * PTX into the part's parameters.
// The responses' forward runs twice: the step costs about 4/3 of a training step on the same tokens, and keeps the
// 1F1B schedule's memory (at most a warm-up's worth of micro-batches in flight), which one pass keeping every
// micro-batch's activations until the objective is known would not.
//
// Micro-batches: the samples in order, cut into M contiguous runs of about equal tokens (each at least one sample),
// and the PTX batch's sequences likewise (a run may hold none). Every rank of a pipeline group passes the same
// groups; the replicas (EP x DP) pass their own, as with Trainer::step.
#pragma once

#include <algorithm>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../parallel/pipeline.hpp"
#include "objective.hpp"

namespace moonmoe::rl {

namespace detail {

/// Where n items of the given sizes are cut into `parts` contiguous runs of about equal total size: part p is
/// [cuts[p], cuts[p + 1]). With `nonempty`, each run holds at least one item (n >= parts).
inline std::vector<std::size_t> balanced_cuts(std::span<const index_t> sizes, index_t parts, bool nonempty) {
    const std::size_t n = sizes.size();
    std::vector<index_t> prefix(n + 1, 0);
    std::partial_sum(sizes.begin(), sizes.end(), prefix.begin() + 1);
    std::vector<std::size_t> cuts = {0};
    for (index_t p = 1; p < parts; ++p) {
        const index_t target = (prefix[n] * p + parts / 2) / parts;
        std::size_t c = std::size_t(std::lower_bound(prefix.begin(), prefix.end(), target) - prefix.begin());
        if (nonempty) c = std::clamp(c, cuts.back() + 1, n - std::size_t(parts - p));
        cuts.push_back(std::max(c, cuts.back()));
    }
    cuts.push_back(n);
    return cuts;
}

/// One micro-batch of an RL step through the pipeline.
struct RlMicroBatch {
    std::vector<index_t> ids;      ///< the samples' packed (prompt, response) tokens, then PTX sequences
    std::vector<index_t> targets;  ///< each token's target (ignore_index where none)
    std::vector<index_t> sample;   ///< each token's sample (index over all the step's samples), -1 for PTX
    std::vector<index_t> lengths;
    std::vector<index_t> positions;
    index_t rl_tokens = 0;     ///< the first rl_tokens tokens are the samples'
    index_t rl_sequences = 0;  ///< in the first rl_sequences sequences

    /// Appends sequences [first, last) of a packed batch (ids, their targets, its layout), each token marked as
    /// sample `sample_of(s)` of its sequence s.
    template <class SampleOf>
    void append(std::size_t first, std::size_t last, std::span<const index_t> all_ids,
                std::span<const index_t> all_targets, const nn::TokenLayout& l, SampleOf sample_of) {
        for (std::size_t s = first; s < last; ++s) {
            const index_t begin = l.begin(index_t(s)), end = l.end(index_t(s));
            ids.insert(ids.end(), all_ids.begin() + begin, all_ids.begin() + end);
            targets.insert(targets.end(), all_targets.begin() + begin, all_targets.begin() + end);
            sample.insert(sample.end(), std::size_t(end - begin), sample_of(s));
            positions.insert(positions.end(), l.positions.begin() + begin, l.positions.begin() + end);
            lengths.push_back(end - begin);
        }
    }

    nn::TokenLayout layout(bool with_ptx) const {
        const std::size_t sequences = with_ptx ? lengths.size() : std::size_t(rl_sequences);
        nn::TokenLayout l = nn::TokenLayout::packed(std::span<const index_t>(lengths.data(), sequences));
        l.positions.assign(positions.begin(), positions.begin() + std::ptrdiff_t(l.tokens()));
        return l;
    }
};

}  // namespace detail

/// One RL step's forward and backward through `pipeline` (its M micro-batches; the header comment): the objective of
/// this replica's `groups` and, with o.ptx_weight > 0, the PTX loss of `ptx`, their gradient accumulated (+=) into
/// the pipeline's part. Collective over the pipeline group (and the expert group, for EP > 1). Returns the
/// objective on every rank of the pipeline group (loss and log-probabilities of this replica's samples). `timing`,
/// when given, receives the two passes' time together.
template <class B>
ObjectiveValue k15_train_step(parallel::Pipeline<B>& pipeline, parallel::ProcessGroups& process_groups,
                              std::span<const Group> groups, const Objective& o, const PtxBatch* ptx = nullptr,
                              typename parallel::Pipeline<B>::Timing* timing = nullptr) {
    o.validate();
    const std::string where = process_groups.pipeline->where("rl::k15_train_step");
    if (o.ptx_weight > 0.0 && !ptx)
        throw std::invalid_argument(where + ": ptx_weight is " + std::to_string(o.ptx_weight) +
                                    " but no PTX batch was given");
    const index_t M = pipeline.shape().micro_batches;
    const nn::Transformer<B>& part = pipeline.model();
    const PackedResponses all = pack_responses(groups, part.config.dims.vocab);
    const index_t samples = all.layout.sequences();
    if (samples < M)
        throw std::invalid_argument(where + ": " + std::to_string(samples) + " samples for " + std::to_string(M) +
                                    " pipeline micro-batches; each micro-batch needs at least one sample (give this "
                                    "token stream more samples, or the model type fewer MicroBatches)");

    // the micro-batches: runs of samples, then runs of PTX sequences
    std::vector<detail::RlMicroBatch> mbs(static_cast<std::size_t>(M));
    const std::vector<std::size_t> sample_cuts = detail::balanced_cuts(all.lengths, M, true);
    for (index_t m = 0; m < M; ++m) {
        detail::RlMicroBatch& b = mbs[std::size_t(m)];
        b.append(sample_cuts[std::size_t(m)], sample_cuts[std::size_t(m) + 1], all.ids, all.targets, all.layout,
                 [](std::size_t s) { return index_t(s); });
        b.rl_tokens = index_t(b.ids.size());
        b.rl_sequences = index_t(b.lengths.size());
    }
    index_t ptx_targets = 0;
    if (o.ptx_weight > 0.0) {
        ptx->layout.check_rows(index_t(ptx->ids.size()), "rl::k15_train_step: the PTX batch");
        const std::vector<index_t> targets = nn::causal_targets(ptx->ids.data(), ptx->layout);
        std::vector<index_t> lengths;
        for (index_t s = 0; s < ptx->layout.sequences(); ++s) lengths.push_back(ptx->layout.length(s));
        const std::vector<std::size_t> cuts = detail::balanced_cuts(lengths, M, false);
        for (index_t m = 0; m < M; ++m)
            mbs[std::size_t(m)].append(cuts[std::size_t(m)], cuts[std::size_t(m) + 1], ptx->ids, targets, ptx->layout,
                                       [](std::size_t) { return index_t(-1); });
        for (index_t t : targets) ptx_targets += t != nn::ignore_index;
        if (ptx_targets == 0)
            throw std::invalid_argument(where + ": the PTX batch has no targets (every sequence is one token long)");
    }

    // pass 1: log pi_theta of every sample, forward only
    std::vector<std::vector<index_t>> ids(static_cast<std::size_t>(M));
    std::vector<nn::TokenLayout> layouts(static_cast<std::size_t>(M));
    for (index_t m = 0; m < M; ++m) {
        const detail::RlMicroBatch& b = mbs[std::size_t(m)];
        ids[std::size_t(m)].assign(b.ids.begin(), b.ids.begin() + b.rl_tokens);
        layouts[std::size_t(m)] = b.layout(false);
    }
    std::vector<double> logp(std::size_t(samples), 0.0);
    const auto first =
        pipeline.evaluate(ids, layouts, [&](index_t m, View<const float, 2, B> logits, View<float, 2, B>) {
            const detail::RlMicroBatch& b = mbs[std::size_t(m)];
            const std::vector<float> token_logp = nn::token_log_probs<B>(logits, b.targets.data());
            for (index_t t = 0; t < b.rl_tokens; ++t)
                if (b.targets[std::size_t(t)] != nn::ignore_index)
                    logp[std::size_t(b.sample[std::size_t(t)])] += token_logp[std::size_t(t)];
            return 0.0f;
        });
    process_groups.pipeline->all_reduce(std::span<double>(logp), parallel::ReduceOp::sum);  // from the last stage
    ObjectiveValue v = k15_objective(groups, logp, o);

    // pass 2: the 1F1B schedule with the objective's and the PTX loss's gradient at the last stage
    for (index_t m = 0; m < M; ++m) {
        ids[std::size_t(m)] = mbs[std::size_t(m)].ids;
        layouts[std::size_t(m)] = mbs[std::size_t(m)].layout(true);
    }
    const float ptx_scale = ptx_targets > 0 ? float(o.ptx_weight / double(ptx_targets)) : 0.0f;
    const auto second =
        pipeline.run(ids, layouts, [&](index_t m, View<const float, 2, B> logits, View<float, 2, B> dlogits) {
            const detail::RlMicroBatch& b = mbs[std::size_t(m)];
            std::vector<float> weights(b.ids.size());
            for (std::size_t t = 0; t < weights.size(); ++t)
                weights[t] = b.sample[t] >= 0 ? float(-v.dlogp[std::size_t(b.sample[t])]) : ptx_scale;
            const std::vector<float> nll = nn::token_nll<B>(logits, b.targets.data(), weights, dlogits);
            double ptx_sum = 0.0;  // the micro-batch's share of the PTX loss's numerator
            for (std::size_t t = std::size_t(b.rl_tokens); t < nll.size(); ++t) ptx_sum += nll[t];
            return float(ptx_sum);
        });
    if (ptx_targets > 0) {
        double sum = 0.0;
        for (float l : second.losses) sum += l;
        v.ptx_loss = sum / double(ptx_targets);
        v.loss = v.rl_loss + o.ptx_weight * v.ptx_loss;
    }
    if (timing) *timing = first.timing + second.timing;
    return v;
}

}  // namespace moonmoe::rl
