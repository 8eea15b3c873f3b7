// moonmoe/config/moe.hpp: the Mixture-of-Experts block and its router.
//
// `MoE<Experts<384>, TopK<8>, Shared<1>, ExpertHidden<2048>>` is Kimi K2 (the default): sigmoid scores, a
// correction bias used only to select experts, no group limit (Groups<1>), top-k weights normalised (with the
// +1e-20 of HF) and scaled by RoutedScale<2.827>. DeepSeek-V3 adds Groups<8>, TopGroups<4>, RoutedScale<2.5>.
//
// Defaults that depend on other arguments follow them; an explicit argument always wins. With `Score<Softmax>`
// (DeepSeek-V2, arXiv 2405.04434 §2.1.2) the defaults are those of DeepSeek-V2: no correction bias, weights not
// normalised, groups scored by their largest expert score (GroupScore<GroupMax>, V2's device-limited routing);
// with `Score<Sigmoid>` those of DeepSeek-V3 / Kimi K2: a correction bias (auxiliary-loss-free balancing, arXiv
// 2412.19437 §2.1.2), normalised weights, groups scored by the sum of their two largest choices (TopTwoSum).
//
// A routing value the type leaves open is read from config.json when a checkpoint is loaded: `Score<AnyScore>`,
// `GroupScore<AnyGroupScore>`, `CorrectionBias<Dynamic>`, `NormTopK<Dynamic>`, `RoutedScale<Dynamic>`. Flags
// left unset follow a Dynamic score (they are read from the file too).
#pragma once

#include <type_traits>

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct moe;
struct experts;
struct top_k;
struct shared;
struct expert_hidden;
struct groups;
struct top_groups;
struct score;
struct correction_bias;
struct norm_top_k;
struct routed_scale;
struct group_score;
}  // namespace slots

/// How router logits become scores.
enum class ScoreFunc { sigmoid, softmax };
struct Sigmoid {
    static constexpr ScoreFunc value = ScoreFunc::sigmoid;
    static constexpr bool dynamic = false;
};
struct Softmax {
    static constexpr ScoreFunc value = ScoreFunc::softmax;
    static constexpr bool dynamic = false;
};
/// The score function of config.json (scoring_func; DeepseekV2ForCausalLM: always softmax).
struct AnyScore {
    static constexpr ScoreFunc value = ScoreFunc::sigmoid;
    static constexpr bool dynamic = true;
};

/// How a group of experts is scored when only TopGroups of Groups may be used (Groups > 1).
enum class GroupScoreFunc {
    top_two_sum,  ///< sum of the group's two largest selection scores (DeepSeek-V3 noaux_tc); dropped groups: -inf
    max,          ///< the group's largest score (DeepSeek-V2 group_limited_greedy); dropped groups' scores: 0
};
struct TopTwoSum {
    static constexpr GroupScoreFunc value = GroupScoreFunc::top_two_sum;
    static constexpr bool dynamic = false;
};
struct GroupMax {
    static constexpr GroupScoreFunc value = GroupScoreFunc::max;
    static constexpr bool dynamic = false;
};
/// The group scoring of config.json (topk_method and architecture).
struct AnyGroupScore {
    static constexpr GroupScoreFunc value = GroupScoreFunc::top_two_sum;
    static constexpr bool dynamic = true;
};

template <index_t N>
using Experts = Value<slots::experts, N>;  ///< n_routed_experts
template <index_t N>
using TopK = Value<slots::top_k, N>;  ///< num_experts_per_tok
template <index_t N>
using Shared = Value<slots::shared, N>;  ///< n_shared_experts
template <index_t N>
using ExpertHidden = Value<slots::expert_hidden, N>;  ///< moe_intermediate_size
template <index_t N>
using Groups = Value<slots::groups, N>;  ///< n_group
template <index_t N>
using TopGroups = Value<slots::top_groups, N>;  ///< topk_group
template <class F>
using Score = Policy<slots::score, F>;  ///< scoring_func: Score<Sigmoid>
template <class F>
using GroupScore = Policy<slots::group_score, F>;  ///< topk_method's group rule
template <auto B>
using CorrectionBias = Value<slots::correction_bias, B>;  ///< e_score_correction_bias (noaux_tc)
template <auto B>
using NormTopK = Value<slots::norm_top_k, B>;  ///< norm_topk_prob
template <auto V>
using RoutedScale = Value<slots::routed_scale, double(V)>;  ///< routed_scaling_factor

struct MoEConfig {
    index_t experts;
    index_t top_k;
    index_t shared;  ///< shared experts, one SwiGLU of width shared * expert_hidden
    index_t expert_hidden;
    index_t groups;  ///< experts are split into `groups`; a token may use experts of `top_groups` groups
    index_t top_groups;
    ScoreFunc score;
    bool correction_bias;  ///< a per-expert bias added to scores for selection only, moved by load balancing
    bool norm_top_k;
    double routed_scale;  ///< Dynamic (-1.0): from config.json
    GroupScoreFunc group_score;
    /// Which of the values above the type leaves open: resolve() replaces each of them with config.json's value.
    struct FromFile {
        bool score = false, correction_bias = false, norm_top_k = false, group_score = false;
    } from_file{};
};

namespace detail {
/// A routing flag: as given, or (not given) Dynamic with AnyScore, else the default for the score function.
template <auto Given, class ScorePolicy, bool sigmoid_default, bool softmax_default>
constexpr FlagState flag_following_score() {
    constexpr FlagState given = flag_state<Given>();
    if (given != FlagState::unset) return given;
    if (ScorePolicy::dynamic) return FlagState::dynamic;
    const bool on = ScorePolicy::value == ScoreFunc::sigmoid ? sigmoid_default : softmax_default;
    return on ? FlagState::on : FlagState::off;
}
}  // namespace detail

template <class... Args>
struct MoE {
    using slot = slots::moe;
    using accepted = detail::slot_list<slots::experts, slots::top_k, slots::shared, slots::expert_hidden, slots::groups,
                                       slots::top_groups, slots::score, slots::correction_bias, slots::norm_top_k,
                                       slots::routed_scale, slots::group_score>;
    MOONMOE_CHECK_ARGUMENTS("MoE<...>", accepted, Args);
    static constexpr index_t groups = detail::value_of<slots::groups, index_t{1}, Args...>;
    using score = detail::policy_of<slots::score, Sigmoid, Args...>;
    using group_score = detail::policy_of<
        slots::group_score,
        std::conditional_t<score::dynamic, AnyGroupScore,
                           std::conditional_t<score::value == ScoreFunc::softmax, GroupMax, TopTwoSum>>,
        Args...>;
    static constexpr detail::FlagState correction_bias =
        detail::flag_following_score<detail::value_of<slots::correction_bias, detail::unset_flag{}, Args...>, score,
                                     /*sigmoid=*/true, /*softmax=*/false>();
    static constexpr detail::FlagState norm_top_k =
        detail::flag_following_score<detail::value_of<slots::norm_top_k, detail::unset_flag{}, Args...>, score,
                                     /*sigmoid=*/true, /*softmax=*/false>();
    static constexpr MoEConfig value{
        .experts = detail::value_of<slots::experts, index_t{384}, Args...>,
        .top_k = detail::value_of<slots::top_k, index_t{8}, Args...>,
        .shared = detail::value_of<slots::shared, index_t{1}, Args...>,
        .expert_hidden = detail::value_of<slots::expert_hidden, index_t{2048}, Args...>,
        .groups = groups,
        .top_groups = detail::value_of<slots::top_groups, groups, Args...>,
        .score = score::value,
        .correction_bias = correction_bias == detail::FlagState::on,
        .norm_top_k = norm_top_k == detail::FlagState::on,
        .routed_scale = detail::value_of<slots::routed_scale, 2.827, Args...>,
        .group_score = group_score::value,
        .from_file = {.score = score::dynamic,
                      .correction_bias = correction_bias == detail::FlagState::dynamic,
                      .norm_top_k = norm_top_k == detail::FlagState::dynamic,
                      .group_score = group_score::dynamic},
    };
    template <class... New>
    using with = typename detail::replacing<MoE, New...>::template apply<Args...>;
};

}  // namespace moonmoe
