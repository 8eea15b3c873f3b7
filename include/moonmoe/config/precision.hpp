// moonmoe/config/precision.hpp: precision as a policy of the model type, `Model<..., Precision<BF16>>`, and the
// number formats a policy names (F32, BF16), which Muon's Newton-Schulz takes too (`Muon<NSPrecision<BF16>>`,
// config/optimizer.hpp). docs/precision.md says what each policy means and which parts are in place.
//
//   Precision<F32>   the reference: everything in f32, GEMMs in f32 with TF32 off (the default)
//   Precision<BF16>  bf16 compute: weights' working copies, activations and GEMM operands in bf16 on the
//                    tensor cores, f32 accumulation; f32 master weights, gradients and optimizer state; QK-Clip's
//                    maxima and the per-row statistics (RMSNorm's 1/rms, the log-sum-exp) in f32
//   Precision<BF16, Weights<BF16>>
//                    as Kimi K2 trained (report §2.4.2, "BF16 parameters with FP32 gradient buffers"): the matrices
//                    the products read are stored in bf16 and nothing else; their f32 masters exist only where an
//                    optimizer steps them (all of them in one process, the rank's own share under ZeRO-1)
// Whatever the policy, gradients and optimizer state are f32.
#pragma once

#include <concepts>

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct precision;
struct ns_precision;
struct weights;
}  // namespace slots

/// The number formats of the compute path.
enum class NumberFormat { f32, bf16 };

/// IEEE binary32.
struct F32 {
    static constexpr NumberFormat format = NumberFormat::f32;
    static constexpr const char* name = "f32";
};
/// bfloat16 (numeric/bf16.hpp): f32's exponent range, 8 bits of precision; products accumulated in f32.
struct BF16 {
    static constexpr NumberFormat format = NumberFormat::bf16;
    static constexpr const char* name = "bf16";
};

template <class F>
concept number_format = requires {
    { F::format } -> std::convertible_to<NumberFormat>;
};

constexpr const char* format_name(NumberFormat f) { return f == NumberFormat::bf16 ? "bf16" : "f32"; }

/// What a model's precision policy fixes (ModelConfig::precision). Accumulation, master weights, gradients,
/// optimizer state and QK-Clip's maxima are f32 under every policy, so they are not fields.
struct PrecisionConfig {
    NumberFormat compute = NumberFormat::f32;  ///< weights' working copies, activations and GEMM operands
    /// How the matrices the products read are stored (the linear projections, the experts, lm_head): f32 (the
    /// master is the parameter; under bf16 compute a bf16 working copy sits beside it) or bf16 (the parameter is
    /// bf16; an optimizer that steps it keeps its f32 master). The embedding, the norms' gains and the router
    /// stay f32 (they are read in f32: 0.1 % of Kimi K2's parameters besides the embedding).
    NumberFormat weights = NumberFormat::f32;
    constexpr bool operator==(const PrecisionConfig&) const = default;
    /// The compute format the weights' format needs: bf16 weights are only read by bf16 products.
    constexpr bool valid() const { return weights == NumberFormat::f32 || compute == NumberFormat::bf16; }
};

/// How the weights are stored, an argument of Precision<...>: `Precision<BF16, Weights<BF16>>`.
template <class F>
using Weights = Policy<slots::weights, F>;

/// `Precision<F32>` (the default), `Precision<BF16>` or `Precision<BF16, Weights<BF16>>`: a component of
/// `Model<...>`.
template <class Compute = F32, class... Args>
struct Precision {
    static_assert(number_format<Compute>, "Precision<F>: F is a number format, moonmoe::F32 or moonmoe::BF16");
    static_assert((detail::named_argument<Args> && ...) &&
                      detail::only_accepted<detail::slot_list<slots::weights>, Args...>,
                  "Precision<F, ...>: the further argument is Weights<F32 | BF16>");
    static_assert(detail::no_repeats<Args...>, "Precision<F, ...>: Weights<...> given twice");
    using slot = slots::precision;
    using compute = Compute;
    using weights = detail::policy_of<slots::weights, F32, Args...>;
    static_assert(number_format<weights>, "Weights<F>: F is moonmoe::F32 or moonmoe::BF16");
    static constexpr PrecisionConfig value{Compute::format, weights::format};
    static_assert(value.valid(),
                  "Precision<F32, Weights<BF16>>: bf16 weights are read by bf16 products only; "
                  "use Precision<BF16, Weights<BF16>>");
};

/// Muon's Newton-Schulz precision: `Muon<NSPrecision<BF16>>` iterates in bf16 as torch.optim.Muon does (bf16
/// operands and products, f32 accumulation); NSPrecision<F32> (the default) in f32.
template <class F>
using NSPrecision = Policy<slots::ns_precision, F>;

}  // namespace moonmoe
