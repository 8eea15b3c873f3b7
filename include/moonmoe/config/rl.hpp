// moonmoe/config/rl.hpp: `RL<Regularization<tau>, BudgetPenalty<p>, PTXWeight<w>, TemperatureDecay<...>>`, the
// post-training settings of a model type (Kimi K2 technical report, section 3.2.3), each optional:
//
//   Regularization<tau>    tau of the K1.5 objective (rl/objective.hpp), > 0
//   BudgetPenalty<p>       subtracted from the reward of a response truncated at its token budget
//   PTXWeight<w>           the PTX loss's weight (0: none)
//   TemperatureDecay<StartTemperature<a>, FinalTemperature<b>, DecayIterations<n>>
//                          the sampling temperature over RL iterations: a at iteration 0, a cosine from a to b
//                          over n iterations, then b (the report: "a temperature decay schedule, to shift from
//                          exploration to exploitation throughout the training")
//
// The report gives none of these values; the defaults are neutral (tau 1, no penalty, no PTX loss, temperature 1
// throughout) and a model type names what its run uses, e.g.
//   using Tiny = TinyK2::with<RL<Regularization<0.1>, TemperatureDecay<StartTemperature<1.2>,
//                                FinalTemperature<0.7>, DecayIterations<40>>>>;
#pragma once

#include "detail/cmath.hpp"
#include "named.hpp"

namespace moonmoe {
namespace slots {
struct rl;
struct regularization;
struct budget_penalty;
struct ptx_weight;
struct temperature_decay;
struct start_temperature;
struct final_temperature;
struct decay_iterations;
}  // namespace slots

template <auto V>
using StartTemperature = Value<slots::start_temperature, double(V)>;
template <auto V>
using FinalTemperature = Value<slots::final_temperature, double(V)>;
template <long long N>
using DecayIterations = Value<slots::decay_iterations, N>;

struct TemperatureSchedule {
    double start = 1.0, final = 1.0;
    long long iterations = 0;

    /// The sampling temperature of RL iteration `i` (0-based): final + (start - final) (1 + cos(pi i / n)) / 2
    /// for i < n, then final.
    constexpr double at(long long i) const {
        if (iterations <= 0 || i >= iterations) return i < 0 ? start : final;
        if (i <= 0) return start;
        constexpr double pi = 3.14159265358979323846264338327950288;
        const double t = double(i) / double(iterations);
        return final + (start - final) * 0.5 * (1.0 + detail::ccos(pi * t));
    }
    constexpr bool valid() const {
        return start > 0.0 && final > 0.0 && start == start && final == final && iterations >= 0;
    }
};

template <class... Args>
struct TemperatureDecay {
    using slot = slots::temperature_decay;
    using accepted = detail::slot_list<slots::start_temperature, slots::final_temperature, slots::decay_iterations>;
    MOONMOE_CHECK_ARGUMENTS("TemperatureDecay<...>", accepted, Args);
    static constexpr TemperatureSchedule value{
        .start = detail::value_of<slots::start_temperature, 1.0, Args...>,
        .final = detail::value_of<slots::final_temperature, 1.0, Args...>,
        .iterations = detail::value_of<slots::decay_iterations, 0LL, Args...>,
    };
    static_assert(value.valid(), "TemperatureDecay<...>: temperatures must be > 0 and DecayIterations >= 0");
};

template <auto V>
using Regularization = Value<slots::regularization, double(V)>;
template <auto V>
using BudgetPenalty = Value<slots::budget_penalty, double(V)>;
template <auto V>
using PTXWeight = Value<slots::ptx_weight, double(V)>;

struct RLConfig {
    double tau = 1.0;
    double budget_penalty = 0.0;
    double ptx_weight = 0.0;
    TemperatureSchedule temperature{};
};

template <class... Args>
struct RL {
    using slot = slots::rl;
    using accepted =
        detail::slot_list<slots::regularization, slots::budget_penalty, slots::ptx_weight, slots::temperature_decay>;
    MOONMOE_CHECK_ARGUMENTS("RL<...>", accepted, Args);
    using temperature_decay = detail::pick_t<slots::temperature_decay, TemperatureDecay<>, Args...>;
    static constexpr RLConfig value{
        .tau = detail::value_of<slots::regularization, 1.0, Args...>,
        .budget_penalty = detail::value_of<slots::budget_penalty, 0.0, Args...>,
        .ptx_weight = detail::value_of<slots::ptx_weight, 0.0, Args...>,
        .temperature = temperature_decay::value,
    };
    static_assert(value.tau > 0.0, "RL<Regularization<tau>>: tau must be > 0");
    static_assert(value.ptx_weight >= 0.0, "RL<PTXWeight<w>>: w must be >= 0");
};

}  // namespace moonmoe
