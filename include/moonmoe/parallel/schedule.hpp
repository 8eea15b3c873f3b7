// moonmoe/parallel/schedule.hpp: the pipeline schedule as a pure function, Megatron-Core's interleaved 1F1B
// (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
// arXiv 2104.04473, §2.2; the Kimi K2 technical report, §2.4.2, trains with it and one extra warm-up micro-batch).
//
// The layers are cut into PP x V consecutive virtual stages; pipeline rank r holds the V chunks that are virtual
// stages r, r + PP, r + 2 PP, ... (chunk c of rank r is virtual stage c PP + r). A rank's schedule is the ordered
// list of what it computes: (forward | backward, micro-batch, chunk). With M micro-batches there are M V virtual
// micro-batches per rank, ordered in groups of PP micro-batches, cycling over the chunks inside each group:
//   k -> micro-batch (k / (PP V)) PP + k % PP, chunk (k / PP) % V     (backward: chunk V - 1 - that)
// and run as
//   warm-up    forwards 0 .. W-1,  W = 2 (PP - r - 1) + (V - 1) PP  [+ extra warm-up], at most M V
//              (V = 1: plain 1F1B, W = PP - r - 1 [+ extra])
//   steady     forward W + k, then backward k, for k = 0 .. M V - W - 1
//   cool-down  the remaining backwards.
// With equal forward and backward times per chunk and free communication the pipeline idles (PP - 1) / (V M) of
// the ideal time (the bubble), and rank r holds at most W + 1 micro-batches' activations of its chunks at once.
// V > 1 needs M to be a multiple of PP (else the groups leave dependency bubbles), and every schedule needs at least
// PP micro-batches (fewer hang real implementations); both are refused.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../config/macros.hpp"
#include "../config/parallel.hpp"
#include "../tensor/shape.hpp"

namespace moonmoe::parallel {

enum class Pass : std::uint8_t { forward, backward };

/// One entry of a rank's schedule.
struct Step {
    Pass pass;
    index_t micro_batch;
    index_t chunk;  ///< the rank's chunk, 0 .. V-1 (virtual stage chunk * PP + rank)
    constexpr bool operator==(const Step&) const = default;
};

/// The shape of a pipeline schedule.
struct PipelineShape {
    index_t pp = 1;             ///< pipeline ranks
    index_t v = 1;              ///< chunks (virtual stages) per rank
    index_t micro_batches = 1;  ///< per optimizer step
    index_t extra_warmup = 0;   ///< K2's trick: forwards added to the warm-up to hide the expert all-to-all

    index_t virtual_stages() const { return pp * v; }
    index_t virtual_stage(index_t rank, index_t chunk) const { return chunk * pp + rank; }
};

/// Refuses a shape no schedule exists for, naming the numbers.
inline void check_shape(const PipelineShape& s) {
    const auto str = [](index_t x) { return std::to_string(x); };
    if (s.pp < 1 || s.v < 1 || s.micro_batches < 1 || s.extra_warmup < 0)
        throw std::invalid_argument("pipeline schedule: PP " + str(s.pp) + ", V " + str(s.v) + ", micro-batches " +
                                    str(s.micro_batches) + ", extra warm-up " + str(s.extra_warmup) +
                                    ": the first three must be at least 1, the last at least 0");
    if (s.micro_batches < s.pp)
        throw std::invalid_argument("pipeline schedule: " + str(s.micro_batches) + " micro-batches for " + str(s.pp) +
                                    " pipeline ranks: a step needs at least as many micro-batches as ranks");
    if (s.v > 1 && s.micro_batches % s.pp != 0)
        throw std::invalid_argument("pipeline schedule: with " + str(s.v) + " chunks per rank (interleaved 1F1B) the " +
                                    "micro-batches must be a multiple of PP " + str(s.pp) + "; got " +
                                    str(s.micro_batches));
}

/// The number of warm-up forwards of `rank`.
inline index_t warmup_forwards(const PipelineShape& s, index_t rank) {
    check_shape(s);
    if (rank < 0 || rank >= s.pp)
        throw std::invalid_argument("pipeline schedule: rank " + std::to_string(rank) + " outside [0, " +
                                    std::to_string(s.pp) + ")");
    return interleaved_warmup(s.pp, s.v, rank, s.micro_batches, s.extra_warmup);
}

/// Virtual micro-batch k of a rank (its k-th forward): micro-batch and chunk.
inline Step virtual_micro_batch(const PipelineShape& s, index_t k, Pass pass) {
    const index_t chunk = interleaved_chunk(s.pp, s.v, k);
    return {pass, interleaved_micro_batch(s.pp, s.v, k), pass == Pass::forward ? chunk : s.v - 1 - chunk};
}

/// Rank `rank`'s schedule: 2 M V steps, in the order it runs them.
inline std::vector<Step> interleaved_1f1b(const PipelineShape& s, index_t rank) {
    const index_t warmup = warmup_forwards(s, rank), total = s.micro_batches * s.v;
    std::vector<Step> out;
    out.reserve(std::size_t(2 * total));
    for (index_t k = 0; k < warmup; ++k) out.push_back(virtual_micro_batch(s, k, Pass::forward));
    for (index_t k = 0; k + warmup < total; ++k) {
        out.push_back(virtual_micro_batch(s, k + warmup, Pass::forward));
        out.push_back(virtual_micro_batch(s, k, Pass::backward));
    }
    for (index_t k = total - warmup; k < total; ++k) out.push_back(virtual_micro_batch(s, k, Pass::backward));
    return out;
}

/// The bubble fraction the schedule should show: (PP - 1) / (V M) (config/parallel.hpp's bubble_fraction).
inline double predicted_bubble(const PipelineShape& s) {
    return bubble_fraction(ParallelConfig{s.pp, 1, 1, s.v, SplitKind::balanced, 0, 0, s.micro_batches},
                           s.micro_batches);
}

}  // namespace moonmoe::parallel
