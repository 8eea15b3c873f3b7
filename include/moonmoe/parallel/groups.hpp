// moonmoe/parallel/groups.hpp: one process's place in a `Parallel<PP, EP, DP>` run: its coordinates, the four
// groups it belongs to as communicators (parallel/layout.hpp defines them), and the pieces of the model it holds.
//
//   ProcessGroups g(world, config.parallel);     every rank calls it (collective); a world of the wrong size is
//                                                refused on every rank, naming both sizes
//   nn::Transformer<B> part(config, model_part(config, g.at), expert_dispatcher<B>(g));
//
// The pieces: pipeline rank p holds the chunks (virtual stages) p, p + PP, ... with their layers as the
// configuration's split assigns them (config/parallel.hpp), the embedding if it holds virtual stage 0, the final
// norm and lm_head if it holds the last one, and of every MoE layer the routed experts [ep E / EP, (ep + 1) E / EP).
// Token streams: each (ep, dp) pair of coordinates runs its own micro-batches through the pipeline (the EP ranks of
// an expert group are data-parallel for everything but the experts), so a step sees EP x DP streams (replicas).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "../nn/transformer.hpp"
#include "comm.hpp"
#include "expert_parallel.hpp"
#include "layout.hpp"

namespace moonmoe::parallel {

struct ProcessGroups {
    RankLayout layout;
    Coordinates at;
    Communicator& world;
    std::unique_ptr<Communicator> pipeline;  ///< same (ep, dp); group rank = pp: activations, losses
    /// The pipeline group again, for the gradients: a channel of their own, since NCCL matches sends and receives
    /// by order per communicator, and with interleaved stages two ranks exchange both kinds in differing orders.
    std::unique_ptr<Communicator> pipeline_backward;
    std::unique_ptr<Communicator> expert;     ///< same (pp, dp); group rank = ep
    std::unique_ptr<Communicator> dense_dp;   ///< same pp; group rank = dp EP + ep (the replica)
    std::unique_ptr<Communicator> expert_dp;  ///< same (pp, ep); group rank = dp

    ProcessGroups(Communicator& w, const ParallelConfig& c) : layout(c), world(w) {
        layout.check_world(w.size(), "moonmoe::parallel (" + w.name() + ")");
        at = layout.coordinates(w.rank());
        const auto s = [](index_t x) { return std::to_string(x); };
        const int replica_index = int(replica());
        pipeline = w.split(int(at.dp * layout.ep + at.ep), int(at.pp),
                           "pipeline group of ep " + s(at.ep) + ", dp " + s(at.dp));
        pipeline_backward = w.split(int(at.dp * layout.ep + at.ep), int(at.pp),
                                    "pipeline group of ep " + s(at.ep) + ", dp " + s(at.dp) + " (gradients)");
        expert =
            w.split(int(at.pp * layout.dp + at.dp), int(at.ep), "expert group of pp " + s(at.pp) + ", dp " + s(at.dp));
        dense_dp = w.split(int(at.pp), replica_index, "data-parallel group of pp " + s(at.pp));
        expert_dp = w.split(int(at.pp * layout.ep + at.ep), int(at.dp),
                            "expert data-parallel group of pp " + s(at.pp) + ", ep " + s(at.ep));
    }

    /// This rank's token stream, 0 .. replicas() - 1: dp EP + ep.
    index_t replica() const { return at.dp * layout.ep + at.ep; }
    index_t replicas() const { return layout.ep * layout.dp; }

    /// Every group's traffic since the last reset, summed (parallel/comm.hpp, Traffic), and the reset.
    Traffic traffic() const {
        Traffic t;
        for (const Communicator* c :
             {&world, pipeline.get(), pipeline_backward.get(), expert.get(), dense_dp.get(), expert_dp.get()})
            t.bytes += c->traffic().bytes, t.seconds += c->traffic().seconds;
        return t;
    }
    void reset_traffic() {
        for (Communicator* c :
             {&world, pipeline.get(), pipeline_backward.get(), expert.get(), dense_dp.get(), expert_dp.get()})
            c->reset_traffic();
    }
};

/// The layers of chunk `chunk` (0 .. V-1) of pipeline rank `pp`: whole-model indices [first, second).
inline std::pair<index_t, index_t> chunk_layers(const ModelConfig& c, index_t pp, index_t chunk) {
    const index_t stage = chunk * c.parallel.pp + pp;
    const index_t first = first_layer_of_chunk(c.parallel, c.dims.layers, stage);
    return {first, first + layers_in_chunk(c.parallel, c.dims.layers, stage)};
}

/// The pieces of the model the rank at `at` holds (the header comment).
inline nn::ModelPart model_part(const ModelConfig& c, Coordinates at) {
    nn::ModelPart p;
    const index_t V = c.parallel.virtual_stages, stages = c.parallel.chunks();
    for (index_t v = 0; v < V; ++v) {
        const auto [first, last] = chunk_layers(c, at.pp, v);
        for (index_t l = first; l < last; ++l) p.layers.push_back(l);
    }
    p.embedding = at.pp == 0;
    p.head = at.pp == (stages - 1) % c.parallel.pp;
    p.expert_count = c.moe.experts / c.parallel.ep;
    p.first_expert = at.ep * p.expert_count;
    return p;
}

/// The dispatcher of this rank's MoE layers: over its expert group when EP > 1, local otherwise.
///   nn::Transformer<B> part(config, model_part(config, g.at), expert_dispatcher<B>(g));
template <class B>
std::shared_ptr<nn::Dispatcher<B>> expert_dispatcher(ProcessGroups& g) {
    if (g.layout.ep == 1) return nn::local_dispatcher<B>();
    return std::make_shared<ExpertParallelDispatcher<B>>(*g.expert);
}

}  // namespace moonmoe::parallel
