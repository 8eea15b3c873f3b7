// moonmoe/parallel/traffic.hpp: the bytes one rank sends to other ranks in one training step (Pipeline::run, then
// DistributedOptimizer::step), from the configuration, counted as parallel/comm.hpp's Traffic counts them (the
// volume a bandwidth-optimal algorithm sends), for comparison with what a run measures.
//
//   pipeline  exact: each micro-batch's activations [T, H] f32 to the next virtual stage and their gradients to the
//             previous one, for every chunk of the rank that has such a neighbour; and the micro-batches' losses
//             (an all-reduce of M floats over the pipeline group)
//   expert    the expectation under uniform routing: per MoE layer and micro-batch, each of the rank's T K
//             (token, expert) pairs leaves the rank with probability (EP - 1) / EP, as a row of H floats forward
//             (dispatch) and back (return), and backward as H + 1 floats each way (the output gradient and the
//             routing weight; the input gradient and the weight's gradient); plus the expert counts of the plan
//   zero      flat ZeRO-1 (ZeRO-1 with AdamW): a reduce-scatter of the gradients and an all-gather of the
//             parameters, each (n - 1) / n of a group's floats, per group (dense: EP x DP ranks; experts: DP);
//             plus the step's statistics (QK-Clip's maxima, router loads, the non-finite flag). Ours shares whole
//             parameters out, so a rank's figure depends on its share (it sends the others' shares of the
//             gradients and its own share of the parameters); summed over a group it is this one times the
//             group's size
#pragma once

#include "../config/accounting.hpp"
#include "layout.hpp"

namespace moonmoe::parallel {

struct StepTraffic {
    double pipeline = 0, expert = 0, zero = 0;
    double total() const { return pipeline + expert + zero; }
};

/// The bytes the rank at `at` sends in one step of `tokens` tokens per micro-batch (see the header comment).
inline StepTraffic step_traffic(const ModelConfig& c, Coordinates at, index_t tokens) {
    const ParallelConfig& par = c.parallel;
    const double H = double(c.dims.hidden), T = double(tokens), f32 = 4, i64 = 8;
    const index_t M = par.micro_batches, stages = par.chunks();
    const ParameterCounts p = count_parameters(c);
    // all-reduce of n elements of `bytes` over `size` ranks, as comm.hpp counts it (integer division included)
    const auto all_reduce = [](index_t n, index_t bytes, index_t size) {
        return double(bytes * n * 2 * (size - 1) / size);
    };
    StepTraffic t;
    index_t layers = 0, moe_layers = 0, dense_layers = 0;
    for (index_t v = 0; v < par.virtual_stages; ++v) {
        const index_t stage = v * par.pp + at.pp;
        const index_t first = first_layer_of_chunk(par, c.dims.layers, stage),
                      n = layers_in_chunk(par, c.dims.layers, stage);
        for (index_t l = first; l < first + n; ++l) (l < c.dims.dense_layers ? dense_layers : moe_layers) += 1;
        layers += n;
        if (stage + 1 < stages) t.pipeline += double(M) * T * H * f32;  // activations forward
        if (stage > 0) t.pipeline += double(M) * T * H * f32;           // their gradients backward
    }
    t.pipeline += all_reduce(M, 4, par.pp);
    const double E = double(c.moe.experts), EP = double(par.ep);
    if (par.ep > 1) {
        const double rows = T * double(c.moe.top_k) * (EP - 1) / EP;
        const double counts = i64 * (E - E / EP);
        t.expert = double(moe_layers * M) * (rows * (4 * H + 2) * f32 + counts);
    }
    // the part's trained floats, by group
    const index_t H_ = c.dims.hidden, router_weight = c.moe.experts * H_;
    const bool first = at.pp == 0, last = at.pp == (stages - 1) % par.pp;
    const double dense_floats =
        double(layers * (p.attention_layer.total() + 2 * H_) + dense_layers * p.dense_mlp_layer +
               moe_layers * (p.shared_experts_layer + router_weight) + (first ? p.embedding : 0) +
               (last ? p.lm_head + H_ : 0));
    const double expert_floats = double(moe_layers * (p.routed_experts_layer / par.ep));
    const index_t n_dense = par.ep * par.dp, n_expert = par.dp;
    t.zero = 2 * dense_floats * f32 * double(n_dense - 1) / double(n_dense) +
             2 * expert_floats * f32 * double(n_expert - 1) / double(n_expert);
    t.zero += double(layers) * all_reduce(c.attention.heads, 4, n_dense) +
              double(moe_layers) * all_reduce(c.moe.experts, 8, n_dense) + all_reduce(1, 8, par.pp * par.ep * par.dp);
    return t;
}

}  // namespace moonmoe::parallel
