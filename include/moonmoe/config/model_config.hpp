// moonmoe/config/model_config.hpp: the whole configuration as one literal value, and the rules it must obey.
//
// `Model<...>::config` is a constexpr ModelConfig (Dynamic = -1 where a size is not in the type); a configuration
// resolved from `config.json` at run time is the same struct. Each rule is written once, below, and checked two
// ways: by a static_assert in Model<...> (message in domain words) and by validate() at run time. A rule whose
// sizes are still Dynamic passes; it is checked again once the sizes are known.
#pragma once

#include <stdexcept>
#include <string>

#include "attention.hpp"
#include "backend.hpp"
#include "dims.hpp"
#include "moe.hpp"
#include "optimizer.hpp"
#include "parallel.hpp"
#include "rope.hpp"

namespace moonmoe {

struct ModelConfig {
    DimsConfig dims;
    AttentionConfig attention;
    RopeConfig rope;
    MoEConfig moe;
    OptimizerConfig optimizer;
    ParallelConfig parallel;
    BackendKind backend;

    /// True when every size is fixed (no Dynamic left), so exact counts can be computed.
    constexpr bool is_static() const {
        const index_t sizes[] = {dims.hidden, dims.layers, dims.dense_layers, dims.vocab, dims.dense_hidden,
                                 attention.heads, attention.kv_heads, attention.q_rank, attention.kv_rank,
                                 attention.nope_dim, attention.rope_dim, attention.v_dim, moe.experts, moe.top_k,
                                 moe.shared, moe.expert_hidden, moe.groups, moe.top_groups, parallel.pp,
                                 parallel.ep, parallel.virtual_stages, rope.max_positions};
        for (index_t s : sizes)
            if (s == Dynamic) return false;
        return true;
    }
    constexpr index_t moe_layers() const { return dims.layers - dims.dense_layers; }
};

namespace rules {
namespace detail {
// True if any operand is still Dynamic: such a rule is deferred to run time.
template <class... T>
constexpr bool open(T... v) { return ((v == Dynamic) || ...); }
}  // namespace detail

// X(name, message, condition on `c`). Keep conditions total: they run on unchecked input.
#define MOONMOE_CONFIG_RULES(X)                                                                                     \
    X(positive_sizes, "sizes must be positive: Hidden, Layers, Vocab, DenseHidden, Heads, KVRank, VDim, Experts, "  \
                      "TopK, ExpertHidden must be at least 1",                                                      \
      (c.dims.hidden == Dynamic || c.dims.hidden > 0) && (c.dims.layers == Dynamic || c.dims.layers > 0) &&         \
          (c.dims.vocab == Dynamic || c.dims.vocab > 0) &&                                                          \
          (c.dims.dense_hidden == Dynamic || c.dims.dense_hidden > 0) &&                                            \
          (c.attention.heads == Dynamic || c.attention.heads > 0) &&                                                \
          (c.attention.v_dim == Dynamic || c.attention.v_dim > 0) &&                                                \
          (c.attention.kind != AttentionKind::mla || c.attention.kv_rank == Dynamic || c.attention.kv_rank > 0) &&  \
          (c.moe.experts == Dynamic || c.moe.experts > 0) && (c.moe.top_k == Dynamic || c.moe.top_k > 0) &&         \
          (c.moe.expert_hidden == Dynamic || c.moe.expert_hidden > 0))                                              \
    X(dense_layers_fit, "Dims: DenseLayers must be between 0 and Layers",                                          \
      detail::open(c.dims.dense_layers, c.dims.layers) ||                                                          \
          (c.dims.dense_layers >= 0 && c.dims.dense_layers <= c.dims.layers))                                       \
    X(norm_eps_positive, "Dims: NormEps must be positive", c.dims.norm_eps > 0.0)                                  \
    X(q_rank_valid, "MLA: QRank must be positive, or 0 (NoQCompression) for a direct q_proj",                      \
      detail::open(c.attention.q_rank) || c.attention.q_rank >= 0)                                                 \
    X(head_dims_fit, "Attention: head dims do not fit: NopeDim must be >= 0 and RopeDim > 0 and even (RoPE rotates " \
                     "pairs); for MHA, RopeDim must not exceed HeadDim",                                           \
      (detail::open(c.attention.nope_dim) || c.attention.nope_dim >= 0) &&                                         \
          (detail::open(c.attention.rope_dim) || (c.attention.rope_dim > 0 && c.attention.rope_dim % 2 == 0)))      \
    X(kv_heads_divide_heads, "MHA: KVHeads must divide Heads (each key/value head serves a whole group)",           \
      detail::open(c.attention.heads, c.attention.kv_heads) ||                                                     \
          (c.attention.kv_heads > 0 && c.attention.heads % c.attention.kv_heads == 0))                              \
    X(top_k_within_experts, "MoE: TopK must not exceed Experts", detail::open(c.moe.top_k, c.moe.experts) ||        \
                                                                     c.moe.top_k <= c.moe.experts)                 \
    X(shared_nonnegative, "MoE: Shared (shared experts) must be 0 or more", detail::open(c.moe.shared) ||            \
                                                                              c.moe.shared >= 0)                   \
    X(groups_divide_experts, "MoE: Groups must divide Experts evenly",                                             \
      detail::open(c.moe.groups, c.moe.experts) || (c.moe.groups > 0 && c.moe.experts % c.moe.groups == 0))        \
    X(top_groups_within_groups, "MoE: TopGroups must be between 1 and Groups",                                     \
      detail::open(c.moe.top_groups, c.moe.groups) || (c.moe.top_groups >= 1 && c.moe.top_groups <= c.moe.groups)) \
    X(group_score_needs_two, "MoE: with Groups > 1 each group needs at least 2 experts (a group scores as the sum "  \
                             "of its top 2)",                                                                      \
      detail::open(c.moe.groups, c.moe.experts) || c.moe.groups <= 1 || c.moe.experts / c.moe.groups >= 2)          \
    X(top_k_within_top_groups, "MoE: TopK must not exceed the experts of TopGroups groups (TopGroups * Experts / "  \
                               "Groups)",                                                                          \
      detail::open(c.moe.top_k, c.moe.top_groups, c.moe.groups, c.moe.experts) || c.moe.groups <= 0 ||             \
          c.moe.top_k <= c.moe.top_groups * (c.moe.experts / c.moe.groups))                                        \
    X(routed_scale_positive, "MoE: RoutedScale must be positive", c.moe.routed_scale > 0.0)                        \
    X(rope_theta_positive, "RoPE: Theta must be greater than 1", c.rope.theta > 1.0)                               \
    X(yarn_valid, "YaRN: Factor must be >= 1, OriginalMaxPositions positive and BetaFast >= BetaSlow > 0",          \
      !c.rope.yarn || (c.rope.factor >= 1.0 && c.rope.original_max_positions > 0 && c.rope.beta_slow > 0.0 &&       \
                       c.rope.beta_fast >= c.rope.beta_slow))                                                      \
    X(parallel_positive, "Parallel: PP, EP, DP and VirtualStages must be at least 1 (or Dynamic for DP)",           \
      (c.parallel.pp == Dynamic || c.parallel.pp >= 1) && (c.parallel.ep == Dynamic || c.parallel.ep >= 1) &&       \
          (c.parallel.dp == Dynamic || c.parallel.dp >= 1) &&                                                      \
          (c.parallel.virtual_stages == Dynamic || c.parallel.virtual_stages >= 1))                                \
    X(experts_divide_over_ep, "Parallel: Experts must be divisible by EP (each expert-parallel rank holds the "     \
                              "same number of experts)",                                                           \
      detail::open(c.moe.experts, c.parallel.ep) || (c.parallel.ep > 0 && c.moe.experts % c.parallel.ep == 0))     \
    X(layers_fill_chunks, "Parallel: every pipeline chunk needs a layer: Layers must be at least PP * VirtualStages", \
      detail::open(c.dims.layers, c.parallel.pp, c.parallel.virtual_stages) ||                                     \
          c.dims.layers >= c.parallel.pp * c.parallel.virtual_stages)                                              \
    X(even_split_divides, "Parallel: Layers do not split over the pipeline as configured: EvenSplit needs Layers "  \
                          "to be a multiple of PP * VirtualStages",                                                \
      c.parallel.split != SplitKind::even || detail::open(c.dims.layers, c.parallel.pp, c.parallel.virtual_stages) || \
          (c.parallel.pp * c.parallel.virtual_stages > 0 &&                                                        \
           c.dims.layers % (c.parallel.pp * c.parallel.virtual_stages) == 0))                                      \
    X(uneven_split_divides, "Parallel: Layers do not split over the pipeline as configured: UnevenSplit<First, "    \
                            "Last> needs First, Last >= 1 and the remaining layers to be a positive multiple of "  \
                            "the PP * VirtualStages - 2 middle chunks",                                            \
      c.parallel.split != SplitKind::uneven ||                                                                     \
          detail::open(c.dims.layers, c.parallel.pp, c.parallel.virtual_stages) ||                                 \
          (c.parallel.split_first >= 1 && c.parallel.split_last >= 1 &&                                           \
           (c.parallel.pp * c.parallel.virtual_stages == 2                                                         \
                ? c.parallel.split_first + c.parallel.split_last == c.dims.layers                                  \
                : (c.parallel.pp * c.parallel.virtual_stages > 2 &&                                                \
                   c.dims.layers - c.parallel.split_first - c.parallel.split_last >=                               \
                       c.parallel.pp * c.parallel.virtual_stages - 2 &&                                            \
                   (c.dims.layers - c.parallel.split_first - c.parallel.split_last) %                              \
                           (c.parallel.pp * c.parallel.virtual_stages - 2) ==                                      \
                       0))))                                                                                       \
    X(micro_batches_fill_pipeline, "Parallel: MicroBatches must be at least PP, or the pipeline never fills",        \
      detail::open(c.parallel.micro_batches, c.parallel.pp) || c.parallel.micro_batches >= c.parallel.pp)          \
    X(muon_valid, "Muon: Momentum must be in [0, 1), NSSteps >= 1, WeightDecay >= 0, LearningRate > 0",             \
      c.optimizer.muon.momentum >= 0.0 && c.optimizer.muon.momentum < 1.0 && c.optimizer.muon.ns_steps >= 1 &&      \
          c.optimizer.muon.weight_decay >= 0.0 && c.optimizer.muon.learning_rate > 0.0)                            \
    X(adamw_valid, "AdamW: Beta1 and Beta2 must be in [0, 1), Eps > 0, WeightDecay >= 0, LearningRate > 0",        \
      c.optimizer.adamw.beta1 >= 0.0 && c.optimizer.adamw.beta1 < 1.0 && c.optimizer.adamw.beta2 >= 0.0 &&         \
          c.optimizer.adamw.beta2 < 1.0 && c.optimizer.adamw.eps > 0.0 && c.optimizer.adamw.weight_decay >= 0.0 &&  \
          c.optimizer.adamw.learning_rate > 0.0)                                                                   \
    X(qk_clip_valid, "QKClip: tau must be positive and ClipAlpha in [0, 1]",                                       \
      !c.optimizer.qk_clip.enabled || (c.optimizer.qk_clip.tau > 0.0 && c.optimizer.qk_clip.alpha >= 0.0 &&        \
                                       c.optimizer.qk_clip.alpha <= 1.0))                                          \
    X(schedule_valid, "WSD: Warmup, Stable and Decay must be >= 0 and FinalLR in [0, 1]",                          \
      c.optimizer.schedule.warmup >= 0 && c.optimizer.schedule.stable >= 0 && c.optimizer.schedule.decay >= 0 &&    \
          c.optimizer.schedule.final_fraction >= 0.0 && c.optimizer.schedule.final_fraction <= 1.0)

#define MOONMOE_DEFINE_RULE(name, message, ...)                                                                     \
    constexpr bool name(const ModelConfig& c) { return __VA_ARGS__; }
MOONMOE_CONFIG_RULES(MOONMOE_DEFINE_RULE)
#undef MOONMOE_DEFINE_RULE

}  // namespace rules

/// A configuration that breaks a rule; what() lists every broken rule, one per line.
struct config_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

/// Checks every rule on a (resolved) configuration; throws config_error naming each one broken.
inline void validate(const ModelConfig& c) {
    std::string broken;
#define MOONMOE_CHECK_RULE(name, message, ...)                                                                      \
    if (!rules::name(c)) broken += std::string(broken.empty() ? "" : "\n") + message;
    MOONMOE_CONFIG_RULES(MOONMOE_CHECK_RULE)
#undef MOONMOE_CHECK_RULE
    if (!broken.empty()) throw config_error("invalid model configuration:\n" + broken);
}

}  // namespace moonmoe
