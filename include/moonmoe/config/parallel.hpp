// moonmoe/config/parallel.hpp: `Parallel<PP, EP, DP, VirtualStages<V>, ...>`, the process layout as configuration,
// and the constexpr pipeline split it implies.
//
// PP pipeline stages (ranks), each holding V virtual stages ("model chunks") for interleaved 1F1B; EP ranks
// sharing the routed experts of a layer; DP ZeRO-1 data-parallel replicas. Non-expert weights are replicated over
// the EP ranks, so their data-parallel group is EP x DP and the experts' is DP.
// Kimi K2 trained with PP 16 (virtual stages), EP 16 and ZeRO-1 DP (report §2.4.2). The runtimes are in parallel/.
#pragma once

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct parallel;
struct virtual_stages;
struct split;
struct micro_batches;
}  // namespace slots

template <index_t N>
using VirtualStages = Value<slots::virtual_stages, N>;  ///< model chunks per pipeline rank
template <index_t N>
using MicroBatches = Value<slots::micro_batches, N>;  ///< per optimizer step, per DP replica

enum class SplitKind { balanced, even, uneven };

/// Layers spread as evenly as possible over the PP x V chunks; chunks that get one layer fewer are the first and
/// last (they also hold the embedding and the head), then the ones nearest them. The default.
struct BalancedSplit {
    static constexpr SplitKind kind = SplitKind::balanced;
    static constexpr index_t first = 0, last = 0;
};
/// Every chunk holds the same number of layers; Layers must be a multiple of PP x V.
struct EvenSplit {
    static constexpr SplitKind kind = SplitKind::even;
    static constexpr index_t first = 0, last = 0;
};
/// The first and last chunks hold `First` and `Last` layers, the others share the rest evenly (Megatron's
/// decoder_first/last_pipeline_num_layers).
template <index_t First, index_t Last>
struct UnevenSplit {
    static constexpr SplitKind kind = SplitKind::uneven;
    static constexpr index_t first = First, last = Last;
};

template <class S>
using Split = Policy<slots::split, S>;

struct ParallelConfig {
    index_t pp, ep, dp;
    index_t virtual_stages;
    SplitKind split;
    index_t split_first, split_last;  ///< UnevenSplit only
    index_t micro_batches;            ///< Dynamic if not fixed in the type

    constexpr index_t chunks() const { return pp * virtual_stages; }
    /// Ranks of one model replica (the model-parallel group): PP x EP.
    constexpr index_t model_parallel_ranks() const { return pp * ep; }
};

template <index_t PP = 1, index_t EP = 1, index_t DP = 1, class... Options>
struct Parallel {
    using slot = slots::parallel;
    using accepted = detail::slot_list<slots::virtual_stages, slots::split, slots::micro_batches>;
    MOONMOE_CHECK_ARGUMENTS("Parallel<PP, EP, DP, ...>", accepted, Options);
    using split = detail::policy_of<slots::split, BalancedSplit, Options...>;
    static constexpr ParallelConfig value{
        .pp = PP,
        .ep = EP,
        .dp = DP,
        .virtual_stages = detail::value_of<slots::virtual_stages, index_t{1}, Options...>,
        .split = split::kind,
        .split_first = split::first,
        .split_last = split::last,
        .micro_batches = detail::value_of<slots::micro_batches, Dynamic, Options...>,
    };
};

// ---- pipeline split (pure functions; Layers and PP x V static or resolved) ----

/// Number of decoder layers held by model chunk `chunk` (0 .. PP*V-1, in pipeline order). Chunk c runs on
/// pipeline rank c % PP as its virtual stage c / PP (Megatron's interleaved layout).
constexpr index_t layers_in_chunk(const ParallelConfig& p, index_t layers, index_t chunk) {
    const index_t n = p.chunks();
    switch (p.split) {
    case SplitKind::even: return layers / n;
    case SplitKind::uneven:
        if (n == 1) return layers;
        if (chunk == 0) return p.split_first;
        if (chunk == n - 1) return p.split_last;
        return (layers - p.split_first - p.split_last) / (n - 2);
    case SplitKind::balanced: break;
    }
    // balanced: `short_chunks` chunks get base layers, the rest base + 1; short ones taken from both ends inwards.
    const index_t base = layers / n, short_chunks = n - layers % n;
    if (layers % n == 0) return base;
    const index_t from_end = chunk < n - 1 - chunk ? chunk : n - 1 - chunk;         // 0 for the first and last chunk
    const index_t rank_from_ends = 2 * from_end + (chunk < n - 1 - chunk ? 0 : 1);  // 0,1 = ends; 2,3 = next...
    return rank_from_ends < short_chunks ? base : base + 1;
}

/// Index of the first layer of chunk `chunk`.
constexpr index_t first_layer_of_chunk(const ParallelConfig& p, index_t layers, index_t chunk) {
    index_t first = 0;
    for (index_t c = 0; c < chunk; ++c) first += layers_in_chunk(p, layers, c);
    return first;
}

// ---- interleaved 1F1B (Megatron-Core's; parallel/schedule.hpp builds the schedule from these two) ----

/// Warm-up forwards of pipeline rank `rank` with V chunks per rank and M micro-batches per step:
/// 2 (PP - rank - 1) + (V - 1) PP (V = 1: PP - rank - 1), plus `extra` (K2's extra warm-up), at most M V.
constexpr index_t interleaved_warmup(index_t pp, index_t v, index_t rank, index_t micro_batches, index_t extra = 0) {
    const index_t w = (v == 1 ? pp - rank - 1 : 2 * (pp - rank - 1) + (v - 1) * pp) + extra;
    return w < micro_batches * v ? w : micro_batches * v;
}

/// The rank's chunk (0 .. V-1) that its k-th forward runs: groups of PP micro-batches cycle over the chunks. Its
/// k-th backward runs chunk V - 1 - that.
constexpr index_t interleaved_chunk(index_t pp, index_t v, index_t k) { return (k % (pp * v)) / pp; }

/// The micro-batch of a rank's k-th forward (and of its k-th backward).
constexpr index_t interleaved_micro_batch(index_t pp, index_t v, index_t k) { return k / (pp * v) * pp + k % pp; }

/// Fraction of a step the pipeline idles in interleaved 1F1B: (PP - 1) / (V * m) of the ideal time
/// (Narayanan et al. 2021); m micro-batches per step.
constexpr double bubble_fraction(const ParallelConfig& p, index_t micro_batches) {
    return double(p.pp - 1) / double(p.virtual_stages * micro_batches);
}

}  // namespace moonmoe
