// moonmoe/config/optimizer.hpp: `Optimizer<Muon<...>, QKClip<100.0>>`, i.e. MuonClip, with AdamW for what Muon does
// not take (embeddings, the output head, 1-D parameters), a WSD learning-rate schedule and the rate of the
// auxiliary-loss-free expert balancing.
//
// Defaults are Kimi K2's recipe (Kimi K2 technical report §2.1, Algorithm 1, and §2.5): Muon with momentum 0.95
// (Nesterov), five quintic Newton-Schulz steps, update RMS matched to AdamW (0.2 * sqrt(max(n, m))), weight decay
// 0.1 with the unscaled learning rate, QK-Clip at tau = 100, WSD with a 500-step warm-up, 2e-4 for 10T tokens,
// cosine to 2e-5 over 5.5T tokens at 67M tokens per step. The report is silent on the balancing rate; K2 keeps
// DeepSeek-V3's router (noaux_tc, an e_score_correction_bias in the released checkpoint), so the default is
// DeepSeek-V3's bias update speed gamma = 0.001 (arXiv 2412.19437 §4.2).
#pragma once
#pragma once

#include "detail/cmath.hpp"
#include "named.hpp"
#include "precision.hpp"

namespace moonmoe {
namespace slots {
struct optimizer;
struct muon;
struct adamw;
struct qk_clip;
struct schedule;
struct momentum;
struct nesterov;
struct ns_steps;
struct ns_coefficients;
struct update_scale;
struct weight_decay;
struct learning_rate;
struct beta1;
struct beta2;
struct eps;
struct clip_alpha;
struct clip_scope;
struct ns_products;
struct warmup;
struct stable;
struct decay;
struct final_lr;
struct bias_update_rate;
}  // namespace slots

// ---- Newton-Schulz coefficient schedules: (a, b, c) per iteration, p(x) = a x + b x^3 + c x^5 ----
struct NSCoefficients {
    double a, b, c;
};

/// Keller Jordan's fixed quintic, repeated every iteration (KellerJordan/Muon, torch.optim.Muon default).
struct KellerQuintic {
    static constexpr NSCoefficients table[] = {{3.4445, -4.7750, 2.0315}};
    static constexpr bool cycle = true;  ///< repeat the table; otherwise the last entry repeats past its end
};
/// Polar Express as in modded-nanogpt (normalise by 1.02 * ||X||_F).
struct PolarExpress {
    static constexpr NSCoefficients table[] = {{8.156554524902461, -22.48329292557795, 15.878769915207462},
                                               {4.042929935166739, -2.808917465908714, 0.5000178451051316},
                                               {3.8916678022926607, -2.772484153217685, 0.5060648178503393},
                                               {3.285753657755655, -2.3681294933425376, 0.46449024233003106},
                                               {2.3465413258596377, -1.7097828382687081, 0.42323551169305323}};
    static constexpr bool cycle = false;
    static constexpr double norm_safety = 1.02;
};
/// You's per-iteration quintic (Emerging-Optimizers "quintic"), cycled past five steps.
struct YouQuintic {
    static constexpr NSCoefficients table[] = {{4.0848, -6.8946, 2.9270},
                                               {3.9505, -6.3029, 2.6377},
                                               {3.7418, -5.5913, 2.3037},
                                               {2.8769, -3.1427, 1.2046},
                                               {2.8366, -3.0525, 1.2012}};
    static constexpr bool cycle = true;
};

// ---- Muon update scale policies: the factor on the orthogonalised update of an n x m matrix ----
/// 0.2 * sqrt(max(n, m)): matches AdamW's update RMS so Muon reuses AdamW's lr and weight decay (Moonlight, K2).
template <auto K = 0.2>
struct MatchAdamWRMS {
    static constexpr double factor = double(K);
};
/// sqrt(max(1, n / m)): Keller Jordan's original scale.
struct ShapeScale {};

enum class UpdateScaleKind { match_adamw_rms, shape };

// ---- How Newton-Schulz multiplies: the symmetric products X X^T and A A as SYRKs, or every product in full ----
enum class Products { symmetric, general };
/// X X^T and the polynomial's square as SYRKs: one triangle, mirrored (fewer multiply-adds where the backend has it).
struct SymmetricProducts {
    static constexpr Products value = Products::symmetric;
};
/// Every product in full, as torch.optim.Muon multiplies.
struct GeneralProducts {
    static constexpr Products value = Products::general;
};
/// NSProducts<P>: how Newton-Schulz multiplies. Default: symmetric, in f32 and in bf16 (the backend's syrk_bf16 runs
/// each symmetric product the way that measured fastest on its hardware: optim/newton_schulz.hpp).
template <class P>
using NSProducts = Policy<slots::ns_products, P>;

template <auto V>
using Momentum = Value<slots::momentum, double(V)>;
template <bool B>
using Nesterov = Value<slots::nesterov, B>;
template <int N>
using NSSteps = Value<slots::ns_steps, N>;
template <class C>
using Coefficients = Policy<slots::ns_coefficients, C>;
template <class S>
using UpdateScale = Policy<slots::update_scale, S>;
template <auto V>
using WeightDecay = Value<slots::weight_decay, double(V)>;
template <auto V>
using LearningRate = Value<slots::learning_rate, double(V)>;  ///< peak lr (the schedule multiplies it)
template <auto V>
using Beta1 = Value<slots::beta1, double(V)>;
template <auto V>
using Beta2 = Value<slots::beta2, double(V)>;
template <auto V>
using Eps = Value<slots::eps, double(V)>;

struct MuonConfig {
    bool enabled;  ///< false: AdamW takes the matrices too (NoMuon)
    double momentum;
    bool nesterov;
    int ns_steps;
    UpdateScaleKind scale;
    double scale_factor;  ///< K of MatchAdamWRMS<K>; 1 for ShapeScale
    double weight_decay;
    double learning_rate;
    NumberFormat ns_precision = NumberFormat::f32;  ///< NSPrecision<F>: Newton-Schulz in f32 or bf16
    Products products = Products::symmetric;        ///< NSProducts<P>
};

namespace detail {
template <class S>
struct scale_of;
template <auto K>
struct scale_of<MatchAdamWRMS<K>> {
    static constexpr UpdateScaleKind kind = UpdateScaleKind::match_adamw_rms;
    static constexpr double factor = double(K);
};
template <>
struct scale_of<ShapeScale> {
    static constexpr UpdateScaleKind kind = UpdateScaleKind::shape;
    static constexpr double factor = 1.0;
};
}  // namespace detail

template <class... Args>
struct Muon {
    using slot = slots::muon;
    using accepted = detail::slot_list<slots::momentum, slots::nesterov, slots::ns_steps, slots::ns_coefficients,
                                       slots::update_scale, slots::weight_decay, slots::learning_rate,
                                       slots::ns_precision, slots::ns_products>;
    MOONMOE_CHECK_ARGUMENTS("Muon<...>", accepted, Args);
    using coefficients = detail::policy_of<slots::ns_coefficients, KellerQuintic, Args...>;
    using ns_precision = detail::policy_of<slots::ns_precision, F32, Args...>;
    static_assert(number_format<ns_precision>, "NSPrecision<F>: F is moonmoe::F32 or moonmoe::BF16");
    using scale = detail::scale_of<detail::policy_of<slots::update_scale, MatchAdamWRMS<>, Args...>>;
    using products = detail::policy_of<slots::ns_products, SymmetricProducts, Args...>;
    static constexpr MuonConfig value{
        .enabled = true,
        .momentum = detail::value_of<slots::momentum, 0.95, Args...>,
        .nesterov = detail::value_of<slots::nesterov, true, Args...>,
        .ns_steps = detail::value_of<slots::ns_steps, 5, Args...>,
        .scale = scale::kind,
        .scale_factor = scale::factor,
        .weight_decay = detail::value_of<slots::weight_decay, 0.1, Args...>,
        .learning_rate = detail::value_of<slots::learning_rate, 2e-4, Args...>,
        .ns_precision = ns_precision::format,
        .products = products::value,
    };
};

/// No Muon: every parameter goes to AdamW (as DeepSeek-V3 was trained).
struct NoMuon {
    using slot = slots::muon;
    using coefficients = KellerQuintic;
    using ns_precision = F32;
    static constexpr MuonConfig value{.enabled = false,
                                      .momentum = 0.95,
                                      .nesterov = true,
                                      .ns_steps = 5,
                                      .scale = UpdateScaleKind::match_adamw_rms,
                                      .scale_factor = 0.2,
                                      .weight_decay = 0.1,
                                      .learning_rate = 2e-4};
};

struct AdamWConfig {
    double beta1, beta2, eps, weight_decay, learning_rate;
};

template <class... Args>
struct AdamW {
    using slot = slots::adamw;
    using accepted =
        detail::slot_list<slots::beta1, slots::beta2, slots::eps, slots::weight_decay, slots::learning_rate>;
    MOONMOE_CHECK_ARGUMENTS("AdamW<...>", accepted, Args);
    static constexpr AdamWConfig value{
        .beta1 = detail::value_of<slots::beta1, 0.9, Args...>,
        .beta2 = detail::value_of<slots::beta2, 0.95, Args...>,
        .eps = detail::value_of<slots::eps, 1e-8, Args...>,
        .weight_decay = detail::value_of<slots::weight_decay, 0.1, Args...>,
        .learning_rate = detail::value_of<slots::learning_rate, 2e-4, Args...>,
    };
};

// ---- QK-Clip ----
/// Which logit maximum decides a head's rescaling.
enum class ClipScope {
    per_head,   ///< each head by its own maximum (K2's Algorithm 1)
    per_layer,  ///< all heads of a layer by the layer's maximum (the report's naive form)
};
struct PerHead {
    static constexpr ClipScope value = ClipScope::per_head;
};
struct PerLayer {
    static constexpr ClipScope value = ClipScope::per_layer;
};

template <auto A>
using ClipAlpha = Value<slots::clip_alpha, double(A)>;  ///< MHA: q *= gamma^alpha, k *= gamma^(1-alpha)
template <class S>
using Scope = Policy<slots::clip_scope, S>;

struct QKClipConfig {
    bool enabled;
    double tau;  ///< threshold on the maximum scaled pre-softmax logit
    double alpha;
    ClipScope scope;
};

template <auto Tau, class... Args>
struct QKClip {
    using slot = slots::qk_clip;
    using accepted = detail::slot_list<slots::clip_alpha, slots::clip_scope>;
    MOONMOE_CHECK_ARGUMENTS("QKClip<tau, ...>", accepted, Args);
    static constexpr QKClipConfig value{
        .enabled = true,
        .tau = double(Tau),
        .alpha = detail::value_of<slots::clip_alpha, 0.5, Args...>,
        .scope = detail::policy_of<slots::clip_scope, PerHead, Args...>::value,
    };
    /// Whether ClipAlpha<a> was given: it splits an MHA head's rescaling between q and k, and a Model with MLA
    /// refuses it (MLA's split is fixed, optim/qk_clip.hpp).
    static constexpr bool alpha_given = detail::slot_count<slots::clip_alpha, Args...> > 0;
};
/// Plain Muon: no rescaling after the step.
struct NoQKClip {
    using slot = slots::qk_clip;
    static constexpr bool alpha_given = false;
    static constexpr QKClipConfig value{.enabled = false, .tau = 0.0, .alpha = 0.5, .scope = ClipScope::per_head};
};

// ---- WSD learning-rate schedule: linear warm-up, constant, cosine decay to a final rate ----
template <long long N>
using Warmup = Value<slots::warmup, N>;  ///< steps
template <long long N>
using Stable = Value<slots::stable, N>;  ///< steps at the peak rate after warm-up
template <long long N>
using Decay = Value<slots::decay, N>;  ///< steps of cosine decay
template <auto V>
using FinalLR = Value<slots::final_lr, double(V)>;  ///< as a fraction of the peak rate

struct ScheduleConfig {
    long long warmup, stable, decay;
    double final_fraction;

    /// Multiplier of the peak learning rate at `step` (0-based): (step+1)/warmup during warm-up, 1 while stable,
    /// then final + (1 - final) * (1 + cos(pi * t)) / 2 with t going 0 -> 1 over the decay, then final.
    constexpr double multiplier(long long step) const {
        if (step < warmup) return double(step + 1) / double(warmup);
        step -= warmup;
        if (step < stable) return 1.0;
        step -= stable;
        if (decay <= 0 || step >= decay) return final_fraction;
        constexpr double pi = 3.14159265358979323846264338327950288;
        double t = double(step) / double(decay);
        return final_fraction + (1.0 - final_fraction) * 0.5 * (1.0 + detail::ccos(pi * t));
    }
};

namespace detail {
/// Optimizer steps that consume `tokens` at `tokens_per_step`, rounded to the nearest step.
constexpr long long steps_for_tokens(double tokens, double tokens_per_step) {
    return static_cast<long long>(tokens / tokens_per_step + 0.5);
}
}  // namespace detail

/// Kimi K2 technical report §2.5: "The first 10T tokens were trained with a constant learning rate of 2e-4 after a
/// 500-step warm-up, followed by 5.5T tokens with a cosine decay from 2e-4 to 2e-5", global batch 67M tokens.
/// Read as: the 500 warm-up steps are part of the first 10T tokens; 67M = 67e6 tokens per step (the report gives
/// no more digits). The annealing phase after it (2e-5 to 7e-6 over 400B + 60B tokens) is not part of the WSD.
struct KimiK2Schedule {
    static constexpr double tokens_per_step = 67e6;
    static constexpr long long warmup = 500;
    static constexpr long long stable = detail::steps_for_tokens(10e12, tokens_per_step) - warmup;  // 148,754
    static constexpr long long decay = detail::steps_for_tokens(5.5e12, tokens_per_step);           // 82,090
    static constexpr double final_fraction = 2e-5 / 2e-4;
};

/// DeepSeek-V3 (arXiv 2412.19437 §4.2): "linearly increase from 0 to 2.2e-4 during the first 2K steps", constant
/// "until the model consumes 10T training tokens", cosine decay to 2.2e-5 "in 4.3T tokens"; batch 15360 x 4096
/// tokens. Steps count at that final batch size: the paper ramps the batch up from 3072 sequences over the first
/// 469B tokens without giving the ramp's shape, so the real stable phase had a few thousand steps more. The last
/// 500B tokens at constant 2.2e-5 and 7.3e-6 are not part of the WSD.
struct DeepSeekV3Schedule {
    static constexpr double tokens_per_step = 15360.0 * 4096.0;
    static constexpr long long warmup = 2000;
    static constexpr long long stable = detail::steps_for_tokens(10e12, tokens_per_step) - warmup;  // 156,946
    static constexpr long long decay = detail::steps_for_tokens(4.3e12, tokens_per_step);           // 68,347
    static constexpr double final_fraction = 2.2e-5 / 2.2e-4;
};

template <class... Args>
struct WSD {
    using slot = slots::schedule;
    using accepted = detail::slot_list<slots::warmup, slots::stable, slots::decay, slots::final_lr>;
    MOONMOE_CHECK_ARGUMENTS("WSD<...>", accepted, Args);
    static constexpr ScheduleConfig value{
        .warmup = detail::value_of<slots::warmup, KimiK2Schedule::warmup, Args...>,
        .stable = detail::value_of<slots::stable, KimiK2Schedule::stable, Args...>,
        .decay = detail::value_of<slots::decay, KimiK2Schedule::decay, Args...>,
        .final_fraction = detail::value_of<slots::final_lr, KimiK2Schedule::final_fraction, Args...>,
    };
};

// ---- Auxiliary-loss-free balancing (arXiv 2412.19437 §2.1.2): bias_i += gamma * sign(mean load - load_i) ----
/// gamma, the bias update speed, per optimizer step; BiasUpdateRate<0.0> freezes the correction bias.
template <auto V>
using BiasUpdateRate = Value<slots::bias_update_rate, double(V)>;
/// DeepSeek-V3's gamma "0.001 for the first 14.3T tokens, and 0.0 for the remaining 500B tokens" (§4.2): the first
/// value; setting the optimizer's bias_update_rate to 0 for the last phase is the caller's.
inline constexpr double deepseek_v3_bias_update_rate = 0.001;

struct OptimizerConfig {
    MuonConfig muon;
    AdamWConfig adamw;
    QKClipConfig qk_clip;
    ScheduleConfig schedule;
    double bias_update_rate;  ///< gamma of the auxiliary-loss-free balancing (0: the correction bias stays)
};

/// `Optimizer<Muon<...>, QKClip<tau>, WSD<...>, BiasUpdateRate<gamma>>`; arguments in any order, each optional
/// (Kimi K2's recipe by default).
template <class... Args>
struct Optimizer {
    using slot = slots::optimizer;
    using accepted =
        detail::slot_list<slots::muon, slots::adamw, slots::qk_clip, slots::schedule, slots::bias_update_rate>;
    MOONMOE_CHECK_ARGUMENTS("Optimizer<...>", accepted, Args);
    using muon = detail::pick_t<slots::muon, Muon<>, Args...>;
    using adamw = detail::pick_t<slots::adamw, AdamW<>, Args...>;
    using qk_clip = detail::pick_t<slots::qk_clip, QKClip<100.0>, Args...>;
    using schedule = detail::pick_t<slots::schedule, WSD<>, Args...>;
    using coefficients = typename muon::coefficients;
    static constexpr OptimizerConfig value{
        muon::value, adamw::value, qk_clip::value, schedule::value,
        detail::value_of<slots::bias_update_rate, deepseek_v3_bias_update_rate, Args...>};
};

}  // namespace moonmoe
