// moonmoe/config/rope.hpp: rotary position embedding with optional YaRN scaling, and the constexpr YaRN numbers.
//
// `RoPE<Theta<50000.0>, MaxPositions<131072>, YaRN<Factor<32.0>, OriginalMaxPositions<4096>, BetaFast<1.0>,
// BetaSlow<1.0>, MScale<1.0>, MScaleAllDim<1.0>>>` is Kimi K2 (the default). The formulas follow Hugging Face
// `transformers` (modeling_rope_utils.py `_compute_yarn_parameters`): the correction range uses
// original_max_position_embeddings, the softmax scale carries get_mscale(factor, mscale_all_dim)^2, and cos/sin carry
// get_mscale(f, mscale) / get_mscale(f, mscale_all_dim).
//
// A value the type leaves open is read from config.json when a checkpoint is loaded: `Theta<Dynamic>`,
// `Interleave<Dynamic>`, any YaRN number `<Dynamic>` (reals are stored as -1.0), or the whole scaling with
// `AnyScaling` (plain or YaRN, and every YaRN number, as the file says).
#pragma once

#include "detail/cmath.hpp"
#include "named.hpp"

namespace moonmoe {
namespace slots {
struct rope;
struct rope_scaling;
struct theta;
struct max_positions;
struct factor;
struct original_max_positions;
struct beta_fast;
struct beta_slow;
struct mscale;
struct mscale_all_dim;
struct interleave;
}  // namespace slots

template <auto V>
using Theta = Value<slots::theta, double(V)>;  ///< rope_theta
template <index_t N>
using MaxPositions = Value<slots::max_positions, N>;  ///< max_position_embeddings
template <auto B>
using Interleave = Value<slots::interleave, B>;  ///< rope_interleave (HF default true)
template <auto V>
using Factor = Value<slots::factor, double(V)>;  ///< rope_scaling.factor
template <index_t N>
using OriginalMaxPositions = Value<slots::original_max_positions, N>;
template <auto V>
using BetaFast = Value<slots::beta_fast, double(V)>;
template <auto V>
using BetaSlow = Value<slots::beta_slow, double(V)>;
template <auto V>
using MScale = Value<slots::mscale, double(V)>;
template <auto V>
using MScaleAllDim = Value<slots::mscale_all_dim, double(V)>;

struct RopeConfig {
    double theta;
    index_t max_positions;
    bool interleave;  ///< checkpoint rope columns are (x0, x1) pairs; HF permutes them to half-split order
    bool yarn;        ///< false: plain RoPE, the YaRN fields below are unused
    double factor;
    index_t original_max_positions;
    double beta_fast, beta_slow, mscale, mscale_all_dim;
    /// Which of the values above the type leaves open: resolve() replaces each of them with config.json's value.
    struct FromFile {
        bool interleave = false;
        bool scaling = false;  ///< AnyScaling: yarn and every YaRN number
    } from_file{};
};

template <class... Args>
struct YaRN {
    using slot = slots::rope_scaling;
    using accepted = detail::slot_list<slots::factor, slots::original_max_positions, slots::beta_fast, slots::beta_slow,
                                       slots::mscale, slots::mscale_all_dim>;
    MOONMOE_CHECK_ARGUMENTS("YaRN<...>", accepted, Args);
    static constexpr bool enabled = true, dynamic = false;
    static constexpr double factor = detail::value_of<slots::factor, 32.0, Args...>;
    static constexpr index_t original_max_positions =
        detail::value_of<slots::original_max_positions, index_t{4096}, Args...>;
    static constexpr double beta_fast = detail::value_of<slots::beta_fast, 1.0, Args...>;
    static constexpr double beta_slow = detail::value_of<slots::beta_slow, 1.0, Args...>;
    static constexpr double mscale = detail::value_of<slots::mscale, 1.0, Args...>;
    static constexpr double mscale_all_dim = detail::value_of<slots::mscale_all_dim, 1.0, Args...>;
};

/// Plain RoPE without position-interpolation scaling.
struct NoScaling {
    using slot = slots::rope_scaling;
    static constexpr bool enabled = false, dynamic = false;
    static constexpr double factor = 1.0;
    static constexpr index_t original_max_positions = 0;
    static constexpr double beta_fast = 0, beta_slow = 0, mscale = 0, mscale_all_dim = 0;
};

/// The scaling of config.json: plain RoPE or YaRN with the file's numbers.
struct AnyScaling {
    using slot = slots::rope_scaling;
    static constexpr bool enabled = true, dynamic = true;
    static constexpr double factor = double(Dynamic);
    static constexpr index_t original_max_positions = Dynamic;
    static constexpr double beta_fast = double(Dynamic), beta_slow = double(Dynamic), mscale = double(Dynamic),
                            mscale_all_dim = double(Dynamic);
};

template <class... Args>
struct RoPE {
    using slot = slots::rope;
    using accepted = detail::slot_list<slots::theta, slots::max_positions, slots::interleave, slots::rope_scaling>;
    MOONMOE_CHECK_ARGUMENTS("RoPE<...>", accepted, Args);
    using scaling = detail::pick_t<slots::rope_scaling, YaRN<>, Args...>;
    static constexpr detail::FlagState interleave =
        detail::flag_state<detail::value_of<slots::interleave, true, Args...>>();
    static constexpr RopeConfig value{
        .theta = detail::value_of<slots::theta, 50000.0, Args...>,
        .max_positions = detail::value_of<slots::max_positions, index_t{131072}, Args...>,
        .interleave = interleave != detail::FlagState::off,
        .yarn = scaling::enabled,
        .factor = scaling::factor,
        .original_max_positions = scaling::original_max_positions,
        .beta_fast = scaling::beta_fast,
        .beta_slow = scaling::beta_slow,
        .mscale = scaling::mscale,
        .mscale_all_dim = scaling::mscale_all_dim,
        .from_file = {.interleave = interleave == detail::FlagState::dynamic, .scaling = scaling::dynamic},
    };
    template <class... New>
    using with = typename detail::replacing<RoPE, New...>::template apply<Args...>;
};

// ---- YaRN numbers (HF `_compute_yarn_parameters`, DeepSeek `precompute_freqs_cis`) ----

/// yarn_get_mscale(s, m) = 1 if s <= 1 else 0.1 * m * ln(s) + 1
constexpr double yarn_mscale(double scale, double m) {
    return scale <= 1.0 ? 1.0 : 0.1 * m * detail::clog(scale) + 1.0;
}

/// Dimension index (of rope_dim/2 frequencies) at which `rotations` full turns fit in the original context.
constexpr double yarn_correction_dim(const RopeConfig& r, index_t rope_dim, double rotations) {
    constexpr double two_pi = 6.283185307179586476925286766559;
    return double(rope_dim) * detail::clog(double(r.original_max_positions) / (rotations * two_pi)) /
           (2.0 * detail::clog(r.theta));
}

struct YarnRange {
    index_t low, high;  ///< frequency i <= low keeps base^(-2i/d); i >= high is divided by factor; linear between
};

constexpr YarnRange yarn_correction_range(const RopeConfig& r, index_t rope_dim) {
    // A theta a hair above 1 puts the dimensions past any index_t; clamped to +-2^53 first, so the conversion is
    // defined and every value a real configuration gives is kept exactly.
    constexpr double most = 9007199254740992.0;
    const auto clamp = [](double x) { return x < -most ? -most : x > most ? most : x; };
    const double low = clamp(detail::cfloor(yarn_correction_dim(r, rope_dim, r.beta_fast)));
    const double high = clamp(detail::cceil(yarn_correction_dim(r, rope_dim, r.beta_slow)));
    return {low < 0 ? 0 : index_t(low), high > double(rope_dim - 1) ? rope_dim - 1 : index_t(high)};
}

/// Multiplier HF applies to cos and sin ("attention_factor"); 1.0 for Kimi K2 and DeepSeek-V3.
constexpr double rope_attention_factor(const RopeConfig& r) {
    return r.yarn ? yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim) : 1.0;
}

/// Softmax scale of attention: qk_head_dim^-1/2, times get_mscale(factor, mscale_all_dim)^2 under YaRN (HF).
constexpr double softmax_scale(const RopeConfig& r, index_t qk_head_dim) {
    double s = 1.0 / detail::csqrt(double(qk_head_dim));
    if (r.yarn && r.mscale_all_dim != 0.0) {
        double m = yarn_mscale(r.factor, r.mscale_all_dim);
        s *= m * m;
    }
    return s;
}

}  // namespace moonmoe
