// moonmoe/config/model_config.hpp: the whole configuration as one literal value, and the rules it must obey.
//
// `Model<...>::config` is a constexpr ModelConfig (Dynamic = -1 where a size is not in the type); a configuration
// resolved from `config.json` at run time is the same struct. Each rule is written once, below, and checked two
// ways: by a static_assert in Model<...> (message in domain words) and by validate() at run time. A rule whose
// sizes are still Dynamic passes; it is checked again once the sizes are known.
#pragma once

#include <cstdio>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "attention.hpp"
#include "backend.hpp"
#include "dims.hpp"
#include "moe.hpp"
#include "optimizer.hpp"
#include "parallel.hpp"
#include "activations.hpp"
#include "precision.hpp"
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
    PrecisionConfig precision{};      ///< Precision<...> (config/precision.hpp); f32 unless the type says otherwise
    ActivationsConfig activations{};  ///< Activations<...> (config/activations.hpp); keep everything in f32 unless set

    /// True when every size is fixed (no Dynamic left, and whether the router has a correction bias), so exact counts
    /// can be computed.
    constexpr bool is_static() const {
        const index_t sizes[] = {dims.hidden,        dims.layers,        dims.dense_layers,
                                 dims.vocab,         dims.dense_hidden,  attention.heads,
                                 attention.kv_heads, attention.q_rank,   attention.kv_rank,
                                 attention.nope_dim, attention.rope_dim, attention.v_dim,
                                 moe.experts,        moe.top_k,          moe.shared,
                                 moe.expert_hidden,  moe.groups,         moe.top_groups,
                                 parallel.pp,        parallel.ep,        parallel.virtual_stages,
                                 rope.max_positions};
        for (index_t s : sizes)
            if (s == Dynamic) return false;
        return !moe.from_file.correction_bias;  // the router's bias is a parameter
    }
    constexpr index_t moe_layers() const { return dims.layers - dims.dense_layers; }
};

/// A value of ModelConfig that a rule reads; validate() prints each broken rule's fields with their values, under
/// the type argument's name (TopK) or, for a configuration read from config.json, the file's field
/// (num_experts_per_tok).
enum class ConfigField {
    hidden,
    layers,
    dense_layers,
    vocab,
    dense_hidden,
    norm_eps,
    heads,
    kv_heads,
    q_rank,
    kv_rank,
    nope_dim,
    rope_dim,
    v_dim,
    max_positions,
    rope_theta,
    yarn_factor,
    original_max_positions,
    beta_fast,
    beta_slow,
    experts,
    top_k,
    shared,
    expert_hidden,
    groups,
    top_groups,
    routed_scale,
    pp,
    ep,
    dp,
    virtual_stages,
    micro_batches,
    split_first,
    split_last,
    muon_momentum,
    muon_ns_steps,
    muon_weight_decay,
    muon_learning_rate,
    adamw_beta1,
    adamw_beta2,
    adamw_eps,
    adamw_weight_decay,
    adamw_learning_rate,
    qk_clip_tau,
    qk_clip_alpha,
    warmup,
    stable,
    decay,
    final_lr,
    bias_update_rate
};

namespace rules {
namespace detail {
// True if any operand is still Dynamic: such a rule is deferred to run time.
template <class... T>
constexpr bool open(T... v) {
    return ((v == Dynamic) || ...);
}

// a * b for the rules, saturating instead of overflowing: sizes come from untrusted files, and a rule must stay
// total (2^62 groups times anything is simply "too many", never a wrapped-around small number).
constexpr index_t mul_sat(index_t a, index_t b) {
    constexpr index_t max = 0x7fffffffffffffff, min = -max - 1;
    if (a == 0 || b == 0) return 0;
    const bool negative = (a < 0) != (b < 0);
    const index_t ua = a == min ? max : (a < 0 ? -a : a), ub = b == min ? max : (b < 0 ? -b : b);
    if (ua > max / ub) return negative ? min : max;
    return a * b;
}
}  // namespace detail

// X(name, message, (fields the rule reads), condition on `c`). Keep conditions total: they run on unchecked input.
#define MOONMOE_CONFIG_RULES(X)                                                                                        \
    X(positive_sizes,                                                                                                  \
      "sizes must be positive: Hidden, Layers, Vocab, DenseHidden, Heads, KVRank, VDim, Experts, "                     \
      "TopK, ExpertHidden, MaxPositions must be at least 1",                                                           \
      (F::hidden, F::layers, F::vocab, F::dense_hidden, F::heads, F::kv_rank, F::v_dim, F::experts, F::top_k,          \
       F::expert_hidden, F::max_positions),                                                                            \
      (c.dims.hidden == Dynamic || c.dims.hidden > 0) && (c.dims.layers == Dynamic || c.dims.layers > 0) &&            \
          (c.dims.vocab == Dynamic || c.dims.vocab > 0) &&                                                             \
          (c.dims.dense_hidden == Dynamic || c.dims.dense_hidden > 0) &&                                               \
          (c.attention.heads == Dynamic || c.attention.heads > 0) &&                                                   \
          (c.attention.v_dim == Dynamic || c.attention.v_dim > 0) &&                                                   \
          (c.attention.kind != AttentionKind::mla || c.attention.kv_rank == Dynamic || c.attention.kv_rank > 0) &&     \
          (c.moe.experts == Dynamic || c.moe.experts > 0) && (c.moe.top_k == Dynamic || c.moe.top_k > 0) &&            \
          (c.moe.expert_hidden == Dynamic || c.moe.expert_hidden > 0) &&                                               \
          (c.rope.max_positions == Dynamic || c.rope.max_positions > 0))                                               \
    X(dense_layers_fit, "Dims: DenseLayers must be between 0 and Layers", (F::dense_layers, F::layers),                \
      detail::open(c.dims.dense_layers, c.dims.layers) ||                                                              \
          (c.dims.dense_layers >= 0 && c.dims.dense_layers <= c.dims.layers))                                          \
    X(norm_eps_positive, "Dims: NormEps must be positive and finite in float (the norms compute in f32)",              \
      (F::norm_eps),                                                                                                   \
      is_dynamic(c.dims.norm_eps) || (float(c.dims.norm_eps) > 0.0f && float(c.dims.norm_eps) <= 3.4e38f))             \
    X(q_rank_valid, "MLA: QRank must be positive, or 0 (NoQCompression) for a direct q_proj", (F::q_rank),             \
      detail::open(c.attention.q_rank) || c.attention.q_rank >= 0)                                                     \
    X(head_dims_fit,                                                                                                   \
      "Attention: head dims do not fit: NopeDim must be >= 0 and RopeDim > 0 and even (RoPE rotates "                  \
      "pairs); for MHA, RopeDim must not exceed HeadDim",                                                              \
      (F::nope_dim, F::rope_dim),                                                                                      \
      (detail::open(c.attention.nope_dim) || c.attention.nope_dim >= 0) &&                                             \
          (detail::open(c.attention.rope_dim) || (c.attention.rope_dim > 0 && c.attention.rope_dim % 2 == 0)))         \
    X(kv_heads_divide_heads, "MHA: KVHeads must divide Heads (each key/value head serves a whole group)",              \
      (F::heads, F::kv_heads),                                                                                         \
      detail::open(c.attention.heads, c.attention.kv_heads) ||                                                         \
          (c.attention.kv_heads > 0 && c.attention.heads % c.attention.kv_heads == 0))                                 \
    X(top_k_within_experts, "MoE: TopK must not exceed Experts", (F::top_k, F::experts),                               \
      detail::open(c.moe.top_k, c.moe.experts) || c.moe.top_k <= c.moe.experts)                                        \
    X(shared_nonnegative, "MoE: Shared (shared experts) must be 0 or more", (F::shared),                               \
      detail::open(c.moe.shared) || c.moe.shared >= 0)                                                                 \
    X(groups_divide_experts, "MoE: Groups must divide Experts evenly", (F::groups, F::experts),                        \
      detail::open(c.moe.groups, c.moe.experts) || (c.moe.groups > 0 && c.moe.experts % c.moe.groups == 0))            \
    X(top_groups_within_groups, "MoE: TopGroups must be between 1 and Groups", (F::top_groups, F::groups),             \
      detail::open(c.moe.top_groups, c.moe.groups) || (c.moe.top_groups >= 1 && c.moe.top_groups <= c.moe.groups))     \
    X(group_score_needs_two,                                                                                           \
      "MoE: with Groups > 1 each group needs at least 2 experts (a group scores as the sum "                           \
      "of its top 2)",                                                                                                 \
      (F::groups, F::experts),                                                                                         \
      detail::open(c.moe.groups, c.moe.experts) || c.moe.groups <= 1 || c.moe.experts / c.moe.groups >= 2)             \
    X(top_k_within_top_groups,                                                                                         \
      "MoE: TopK must not exceed the experts of TopGroups groups (TopGroups * Experts / "                              \
      "Groups)",                                                                                                       \
      (F::top_k, F::top_groups, F::groups, F::experts),                                                                \
      detail::open(c.moe.top_k, c.moe.top_groups, c.moe.groups, c.moe.experts) || c.moe.groups <= 0 ||                 \
          c.moe.top_k <= detail::mul_sat(c.moe.top_groups, c.moe.experts / c.moe.groups))                              \
    X(routed_scale_positive, "MoE: RoutedScale must be positive and finite", (F::routed_scale),                        \
      is_dynamic(c.moe.routed_scale) || (c.moe.routed_scale > 0.0 && c.moe.routed_scale <= 1.7e308))                   \
    X(rope_theta_positive, "RoPE: Theta must be greater than 1 and finite", (F::rope_theta),                           \
      is_dynamic(c.rope.theta) || (c.rope.theta > 1.0 && c.rope.theta <= 1.7e308))                                     \
    X(yarn_valid, "YaRN: Factor must be >= 1, OriginalMaxPositions positive and BetaFast >= BetaSlow > 0",             \
      (F::yarn_factor, F::original_max_positions, F::beta_fast, F::beta_slow),                                         \
      !c.rope.yarn || c.rope.from_file.scaling ||                                                                      \
          ((is_dynamic(c.rope.factor) || (c.rope.factor >= 1.0 && c.rope.factor <= 1.7e308)) &&                        \
           (c.rope.original_max_positions == Dynamic || c.rope.original_max_positions > 0) &&                          \
           (is_dynamic(c.rope.beta_slow) || c.rope.beta_slow > 0.0) &&                                                 \
           (is_dynamic(c.rope.beta_fast) || c.rope.beta_fast <= 1.7e308) &&                                            \
           (is_dynamic(c.rope.beta_fast) || is_dynamic(c.rope.beta_slow) || c.rope.beta_fast >= c.rope.beta_slow)))    \
    X(parallel_positive, "Parallel: PP, EP, DP and VirtualStages must be at least 1 (or Dynamic for DP)",              \
      (F::pp, F::ep, F::dp, F::virtual_stages),                                                                        \
      (c.parallel.pp == Dynamic || c.parallel.pp >= 1) && (c.parallel.ep == Dynamic || c.parallel.ep >= 1) &&          \
          (c.parallel.dp == Dynamic || c.parallel.dp >= 1) &&                                                          \
          (c.parallel.virtual_stages == Dynamic || c.parallel.virtual_stages >= 1))                                    \
    X(experts_divide_over_ep,                                                                                          \
      "Parallel: Experts must be divisible by EP (each expert-parallel rank holds the "                                \
      "same number of experts)",                                                                                       \
      (F::experts, F::ep),                                                                                             \
      detail::open(c.moe.experts, c.parallel.ep) || (c.parallel.ep > 0 && c.moe.experts % c.parallel.ep == 0))         \
    X(layers_fill_chunks, "Parallel: every pipeline chunk needs a layer: Layers must be at least PP * VirtualStages",  \
      (F::layers, F::pp, F::virtual_stages),                                                                           \
      detail::open(c.dims.layers, c.parallel.pp, c.parallel.virtual_stages) ||                                         \
          c.dims.layers >= detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages))                                  \
    X(even_split_divides,                                                                                              \
      "Parallel: Layers do not split over the pipeline as configured: EvenSplit needs Layers "                         \
      "to be a multiple of PP * VirtualStages",                                                                        \
      (F::layers, F::pp, F::virtual_stages),                                                                           \
      c.parallel.split != SplitKind::even || detail::open(c.dims.layers, c.parallel.pp, c.parallel.virtual_stages) ||  \
          (detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages) > 0 &&                                            \
           c.dims.layers % detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages) == 0))                            \
    X(uneven_split_divides,                                                                                            \
      "Parallel: Layers do not split over the pipeline as configured: UnevenSplit<First, "                             \
      "Last> needs First, Last >= 1 and the remaining layers to be a positive multiple of "                            \
      "the PP * VirtualStages - 2 middle chunks",                                                                      \
      (F::layers, F::pp, F::virtual_stages, F::split_first, F::split_last),                                            \
      c.parallel.split != SplitKind::uneven ||                                                                         \
          detail::open(c.dims.layers, c.parallel.pp, c.parallel.virtual_stages) ||                                     \
          (c.parallel.split_first >= 1 && c.parallel.split_last >= 1 && c.parallel.split_first < c.dims.layers &&      \
           c.parallel.split_last < c.dims.layers &&                                                                    \
           (detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages) == 2                                             \
                ? c.parallel.split_first + c.parallel.split_last == c.dims.layers                                      \
                : (detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages) > 2 &&                                    \
                   c.dims.layers - c.parallel.split_first - c.parallel.split_last >=                                   \
                       detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages) - 2 &&                                \
                   (c.dims.layers - c.parallel.split_first - c.parallel.split_last) %                                  \
                           (detail::mul_sat(c.parallel.pp, c.parallel.virtual_stages) - 2) ==                          \
                       0))))                                                                                           \
    X(micro_batches_fill_pipeline, "Parallel: MicroBatches must be at least PP, or the pipeline never fills",          \
      (F::micro_batches, F::pp),                                                                                       \
      detail::open(c.parallel.micro_batches, c.parallel.pp) || c.parallel.micro_batches >= c.parallel.pp)              \
    X(muon_valid,                                                                                                      \
      "Muon: Momentum must be in [0, 1), NSSteps in [1, 100], WeightDecay finite and >= 0, LearningRate in (0, 10]",   \
      (F::muon_momentum, F::muon_ns_steps, F::muon_weight_decay, F::muon_learning_rate),                               \
      c.optimizer.muon.momentum >= 0.0 && c.optimizer.muon.momentum < 1.0 && c.optimizer.muon.ns_steps >= 1 &&         \
          c.optimizer.muon.ns_steps <= 100 && c.optimizer.muon.weight_decay >= 0.0 &&                                  \
          c.optimizer.muon.weight_decay <= 1.7e308 && c.optimizer.muon.learning_rate > 0.0 &&                          \
          c.optimizer.muon.learning_rate <= 10.0)                                                                      \
    X(adamw_valid,                                                                                                     \
      "AdamW: Beta1 and Beta2 must be in [0, 1), Eps finite and > 0, WeightDecay finite and >= 0, LearningRate in "    \
      "(0, 10]",                                                                                                       \
      (F::adamw_beta1, F::adamw_beta2, F::adamw_eps, F::adamw_weight_decay, F::adamw_learning_rate),                   \
      c.optimizer.adamw.beta1 >= 0.0 && c.optimizer.adamw.beta1 < 1.0 && c.optimizer.adamw.beta2 >= 0.0 &&             \
          c.optimizer.adamw.beta2 < 1.0 && c.optimizer.adamw.eps > 0.0 && c.optimizer.adamw.eps <= 1.7e308 &&          \
          c.optimizer.adamw.weight_decay >= 0.0 && c.optimizer.adamw.weight_decay <= 1.7e308 &&                        \
          c.optimizer.adamw.learning_rate > 0.0 && c.optimizer.adamw.learning_rate <= 10.0)                            \
    X(qk_clip_valid, "QKClip: tau must be positive and ClipAlpha in [0, 1]", (F::qk_clip_tau, F::qk_clip_alpha),       \
      !c.optimizer.qk_clip.enabled ||                                                                                  \
          (c.optimizer.qk_clip.tau > 0.0 && c.optimizer.qk_clip.alpha >= 0.0 && c.optimizer.qk_clip.alpha <= 1.0))     \
    X(schedule_valid, "WSD: Warmup, Stable and Decay must be >= 0 and FinalLR in [0, 1]",                              \
      (F::warmup, F::stable, F::decay, F::final_lr),                                                                   \
      c.optimizer.schedule.warmup >= 0 && c.optimizer.schedule.stable >= 0 && c.optimizer.schedule.decay >= 0 &&       \
          c.optimizer.schedule.final_fraction >= 0.0 && c.optimizer.schedule.final_fraction <= 1.0)                    \
    X(bias_update_rate_valid, "Optimizer: BiasUpdateRate must be >= 0 and finite", (F::bias_update_rate),              \
      c.optimizer.bias_update_rate >= 0.0 && c.optimizer.bias_update_rate <= 1.7e308)

#define MOONMOE_DEFINE_RULE(name, message, fields, ...)                                                                \
    constexpr bool name(const ModelConfig& c) { return __VA_ARGS__; }
MOONMOE_CONFIG_RULES(MOONMOE_DEFINE_RULE)
#undef MOONMOE_DEFINE_RULE

}  // namespace rules

/// A configuration that breaks a rule; what() lists every broken rule, one per line.
struct config_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

/// How validate() names the values of a broken rule: by the type's argument (TopK) or, for a configuration
/// read from a Hugging Face config.json, by the file's field (num_experts_per_tok) where there is one.
enum class FieldNames { type_arguments, config_json };

namespace detail {

struct FieldInfo {
    const char* argument;  ///< the named argument of the type: TopK
    const char* hf;        ///< the config.json field, or nullptr where the file has none (parallel, optimizer)
    bool integer;
    index_t count;  ///< the value of an integer field, exact (a double would round INT64_MAX up past the range)
    double real;    ///< the value of a real field
};

inline FieldInfo field_info(const ModelConfig& c, ConfigField f) {
    using F = ConfigField;
    const auto size = [](const char* a, const char* hf, index_t v) { return FieldInfo{a, hf, true, v, 0.0}; };
    const auto real = [](const char* a, const char* hf, double v) { return FieldInfo{a, hf, false, 0, v}; };
    const auto& d = c.dims;
    const auto& a = c.attention;
    const auto& m = c.moe;
    const auto& p = c.parallel;
    const auto& o = c.optimizer;
    switch (f) {
    case F::hidden: return size("Hidden", "hidden_size", d.hidden);
    case F::layers: return size("Layers", "num_hidden_layers", d.layers);
    case F::dense_layers: return size("DenseLayers", "first_k_dense_replace", d.dense_layers);
    case F::vocab: return size("Vocab", "vocab_size", d.vocab);
    case F::dense_hidden: return size("DenseHidden", "intermediate_size", d.dense_hidden);
    case F::norm_eps: return real("NormEps", "rms_norm_eps", d.norm_eps);
    case F::heads: return size("Heads", "num_attention_heads", a.heads);
    case F::kv_heads: return size("KVHeads", "num_key_value_heads", a.kv_heads);
    case F::q_rank: return size("QRank", "q_lora_rank", a.q_rank);
    case F::kv_rank: return size("KVRank", "kv_lora_rank", a.kv_rank);
    case F::nope_dim: return size("NopeDim", "qk_nope_head_dim", a.nope_dim);
    case F::rope_dim: return size("RopeDim", "qk_rope_head_dim", a.rope_dim);
    case F::v_dim: return size("VDim", "v_head_dim", a.v_dim);
    case F::max_positions: return size("MaxPositions", "max_position_embeddings", c.rope.max_positions);
    case F::rope_theta: return real("Theta", "rope_theta", c.rope.theta);
    case F::yarn_factor: return real("Factor", "rope_scaling.factor", c.rope.factor);
    case F::original_max_positions:
        return size("OriginalMaxPositions", "rope_scaling.original_max_position_embeddings",
                    c.rope.original_max_positions);
    case F::beta_fast: return real("BetaFast", "rope_scaling.beta_fast", c.rope.beta_fast);
    case F::beta_slow: return real("BetaSlow", "rope_scaling.beta_slow", c.rope.beta_slow);
    case F::experts: return size("Experts", "n_routed_experts", m.experts);
    case F::top_k: return size("TopK", "num_experts_per_tok", m.top_k);
    case F::shared: return size("Shared", "n_shared_experts", m.shared);
    case F::expert_hidden: return size("ExpertHidden", "moe_intermediate_size", m.expert_hidden);
    case F::groups: return size("Groups", "n_group", m.groups);
    case F::top_groups: return size("TopGroups", "topk_group", m.top_groups);
    case F::routed_scale: return real("RoutedScale", "routed_scaling_factor", m.routed_scale);
    case F::pp: return size("PP", nullptr, p.pp);
    case F::ep: return size("EP", nullptr, p.ep);
    case F::dp: return size("DP", nullptr, p.dp);
    case F::virtual_stages: return size("VirtualStages", nullptr, p.virtual_stages);
    case F::micro_batches: return size("MicroBatches", nullptr, p.micro_batches);
    case F::split_first: return size("UnevenSplit First", nullptr, p.split_first);
    case F::split_last: return size("UnevenSplit Last", nullptr, p.split_last);
    case F::muon_momentum: return real("Muon Momentum", nullptr, o.muon.momentum);
    case F::muon_ns_steps: return size("Muon NSSteps", nullptr, o.muon.ns_steps);
    case F::muon_weight_decay: return real("Muon WeightDecay", nullptr, o.muon.weight_decay);
    case F::muon_learning_rate: return real("Muon LearningRate", nullptr, o.muon.learning_rate);
    case F::adamw_beta1: return real("AdamW Beta1", nullptr, o.adamw.beta1);
    case F::adamw_beta2: return real("AdamW Beta2", nullptr, o.adamw.beta2);
    case F::adamw_eps: return real("AdamW Eps", nullptr, o.adamw.eps);
    case F::adamw_weight_decay: return real("AdamW WeightDecay", nullptr, o.adamw.weight_decay);
    case F::adamw_learning_rate: return real("AdamW LearningRate", nullptr, o.adamw.learning_rate);
    case F::qk_clip_tau: return real("QKClip tau", nullptr, o.qk_clip.tau);
    case F::qk_clip_alpha: return real("ClipAlpha", nullptr, o.qk_clip.alpha);
    case F::warmup: return size("WSD Warmup", nullptr, o.schedule.warmup);
    case F::stable: return size("WSD Stable", nullptr, o.schedule.stable);
    case F::decay: return size("WSD Decay", nullptr, o.schedule.decay);
    case F::final_lr: return real("FinalLR", nullptr, o.schedule.final_fraction);
    case F::bias_update_rate: return real("BiasUpdateRate", nullptr, o.bias_update_rate);
    }
    return {"?", nullptr, false, 0, 0.0};
}

/// " (num_experts_per_tok = 9, n_routed_experts = 8)": the values a broken rule read, by the chosen names.
inline std::string describe_fields(const ModelConfig& c, std::initializer_list<ConfigField> fields, FieldNames names) {
    std::string s;
    for (ConfigField f : fields) {
        const FieldInfo info = field_info(c, f);
        const char* name = names == FieldNames::config_json && info.hf ? info.hf : info.argument;
        std::string value;
        if (info.integer && info.count == Dynamic) value = "Dynamic";
        else if (info.integer)
            value = std::to_string(info.count);
        else {
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.9g", info.real);
            value = buf;
        }
        s += (s.empty() ? " (" : ", ") + std::string(name) + " = " + value;
    }
    return s.empty() ? s : s + ")";
}

}  // namespace detail

/// Checks every rule on a (resolved) configuration; throws config_error naming each one broken, with the values
/// it read (named as `names` says).
inline void validate(const ModelConfig& c, FieldNames names = FieldNames::type_arguments) {
    using F = ConfigField;
    std::string broken;
#define MOONMOE_UNPAREN(...) __VA_ARGS__
#define MOONMOE_CHECK_RULE(name, message, fields, ...)                                                                 \
    if (!rules::name(c))                                                                                               \
        broken += std::string(broken.empty() ? "" : "\n") + message +                                                  \
                  detail::describe_fields(c, {MOONMOE_UNPAREN fields}, names);
    MOONMOE_CONFIG_RULES(MOONMOE_CHECK_RULE)
#undef MOONMOE_CHECK_RULE
#undef MOONMOE_UNPAREN
    if (!broken.empty()) throw config_error("invalid model configuration:\n" + broken);
}

}  // namespace moonmoe
