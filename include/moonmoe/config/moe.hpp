// moonmoe/config/moe.hpp: the Mixture-of-Experts block and its router.
//
// `MoE<Experts<384>, TopK<8>, Shared<1>, ExpertHidden<2048>>` is Kimi K2 (the default): sigmoid scores, a
// correction bias used only to select experts, no group limit (Groups<1>), top-k weights normalised (with the
// +1e-20 of HF) and scaled by RoutedScale<2.827>. DeepSeek-V3 adds Groups<8>, TopGroups<4>, RoutedScale<2.5>.
// Routing math: spec/kimi_k2.md §4.
#pragma once

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct moe; struct experts; struct top_k; struct shared; struct expert_hidden; struct groups; struct top_groups;
struct score; struct correction_bias; struct norm_top_k; struct routed_scale;
}  // namespace slots

/// How router logits become scores.
enum class ScoreFunc { sigmoid, softmax };
struct Sigmoid { static constexpr ScoreFunc value = ScoreFunc::sigmoid; };
struct Softmax { static constexpr ScoreFunc value = ScoreFunc::softmax; };

template <index_t N> using Experts = Value<slots::experts, N>;            ///< n_routed_experts
template <index_t N> using TopK = Value<slots::top_k, N>;                 ///< num_experts_per_tok
template <index_t N> using Shared = Value<slots::shared, N>;              ///< n_shared_experts
template <index_t N> using ExpertHidden = Value<slots::expert_hidden, N>; ///< moe_intermediate_size
template <index_t N> using Groups = Value<slots::groups, N>;              ///< n_group
template <index_t N> using TopGroups = Value<slots::top_groups, N>;       ///< topk_group
template <class F> using Score = Policy<slots::score, F>;                 ///< scoring_func: Score<Sigmoid>
template <bool B> using CorrectionBias = Value<slots::correction_bias, B>;///< e_score_correction_bias (noaux_tc)
template <bool B> using NormTopK = Value<slots::norm_top_k, B>;           ///< norm_topk_prob
template <auto V> using RoutedScale = Value<slots::routed_scale, double(V)>;    ///< routed_scaling_factor

struct MoEConfig {
    index_t experts;
    index_t top_k;
    index_t shared;         ///< shared experts, one SwiGLU of width shared * expert_hidden
    index_t expert_hidden;
    index_t groups;         ///< experts are split into `groups`; a token may use experts of `top_groups` groups
    index_t top_groups;
    ScoreFunc score;
    bool correction_bias;   ///< a per-expert bias added to scores for selection only, moved by load balancing
    bool norm_top_k;
    double routed_scale;
};

template <class... Args>
struct MoE {
    using slot = slots::moe;
    using accepted = detail::slot_list<slots::experts, slots::top_k, slots::shared, slots::expert_hidden, slots::groups,
                                       slots::top_groups, slots::score, slots::correction_bias, slots::norm_top_k,
                                       slots::routed_scale>;
    MOONMOE_CHECK_ARGUMENTS("MoE<...>", accepted, Args);
    static constexpr index_t groups = detail::value_of<slots::groups, index_t{1}, Args...>;
    static constexpr MoEConfig value{
        .experts = detail::value_of<slots::experts, index_t{384}, Args...>,
        .top_k = detail::value_of<slots::top_k, index_t{8}, Args...>,
        .shared = detail::value_of<slots::shared, index_t{1}, Args...>,
        .expert_hidden = detail::value_of<slots::expert_hidden, index_t{2048}, Args...>,
        .groups = groups,
        .top_groups = detail::value_of<slots::top_groups, groups, Args...>,
        .score = detail::policy_of<slots::score, Sigmoid, Args...>::value,
        .correction_bias = detail::value_of<slots::correction_bias, true, Args...>,
        .norm_top_k = detail::value_of<slots::norm_top_k, true, Args...>,
        .routed_scale = detail::value_of<slots::routed_scale, 2.827, Args...>,
    };
    template <class... New>
    using with = typename detail::replacing<MoE, New...>::template apply<Args...>;
};

}  // namespace moonmoe
