// moonmoe/config/precision.hpp: precision as a policy of the model type, `Model<..., Precision<BF16>>`, and the
// number formats a policy names (F32, BF16), which Muon's Newton-Schulz takes too (`Muon<NSPrecision<BF16>>`,
// config/optimizer.hpp). docs/precision.md says what each policy means and which parts are in place.
//
//   Precision<F32>   the reference: everything in f32, GEMMs in f32 with TF32 off (the default)
//   Precision<BF16>  as Kimi K2 trained: weights' working copies, activations and GEMM operands in bf16 on the
//                    tensor cores, f32 accumulation; f32 master weights, gradients and optimizer state; QK-Clip's
//                    maxima and the per-row statistics (RMSNorm's 1/rms, the log-sum-exp) in f32
// Whatever the policy, the master weights, gradients and optimizer state are f32; issue 13 adds the storage of
// parameters in bf16 as a further argument of Precision<...>.
#pragma once

#include <concepts>

#include "named.hpp"

namespace moonmoe {
namespace slots { struct precision; struct ns_precision; }

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
    constexpr bool operator==(const PrecisionConfig&) const = default;
};

/// `Precision<F32>` (the default) or `Precision<BF16>`: a component of `Model<...>`.
template <class Compute = F32>
struct Precision {
    static_assert(number_format<Compute>, "Precision<F>: F is a number format, moonmoe::F32 or moonmoe::BF16");
    using slot = slots::precision;
    using compute = Compute;
    static constexpr PrecisionConfig value{Compute::format};
};

/// Muon's Newton-Schulz precision: `Muon<NSPrecision<BF16>>` iterates in bf16 as torch.optim.Muon does (bf16
/// operands and products, f32 accumulation); NSPrecision<F32> (the default) in f32.
template <class F>
using NSPrecision = Policy<slots::ns_precision, F>;

}  // namespace moonmoe
