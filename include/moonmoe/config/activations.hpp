// moonmoe/config/activations.hpp: what a training forward keeps for its backward, as a policy of the model type,
// `Model<..., Activations<...>>` (docs/activation_memory.md). The Kimi K2 technical report's §2.4.3 "Activation
// Reduction", one choice at a time:
//
//   Activations<>                          keep every backward input in f32 containers (the default)
//   Recompute<NormOutputs, UpProjections>  recompute RMSNorm outputs and MLA's q_b_proj / kv_b_proj outputs in
//                                          backward (Recompute<KimiK2Selection>: both, K2's choice)
//   Storage<BF16>                          keep the bf16 values of Precision<BF16> in 2 bytes (exact)
//   MlpInputs<FP8>                         keep the MoE up-projections' and SwiGLU's inputs in FP8-E4M3, 1 x 128
//                                          tiles with f32 scales (lossy: the backward reads the approximation)
//   Offload<true>                          move every kept matrix to pinned host memory after its layer's forward
//                                          and back before its backward, on a copy stream (CUDA backend only; the
//                                          CPU backend's activations are in host memory already: refused there)
//
// K2's activations are `KimiK2Activations`. Every choice but FP8 leaves the results bitwise unchanged.
#pragma once

#include <cstddef>
#include <iterator>
#include <type_traits>

#include "named.hpp"
#include "precision.hpp"

namespace moonmoe {
namespace slots {
struct activations;
struct recompute;
struct activation_storage;
struct mlp_inputs;
struct offload;
}  // namespace slots

/// How one kept matrix is stored: f32, bf16 (2 bytes, exact for the values bf16 compute rounded), or FP8-E4M3 in
/// 1 x 128 tiles with f32 scales (tensor/fp8_tiles.hpp; lossy).
enum class KeptFormat { f32, bf16, fp8 };

/// The run-time form of Activations<...> (ModelConfig::activations): the one description of what a training
/// forward keeps for its backward. The modules read it at construction (nn/kept.hpp stores what it says) and the
/// accounting counts by it (config/accounting.hpp, layer_activations(...).bytes(activations)).
struct ActivationsConfig {
    bool recompute_norms = false;              ///< RMSNorm outputs: recomputed from the kept input and 1/rms
    bool recompute_up_projections = false;     ///< MLA's q_b_proj (with RoPE) and kv_b_proj outputs
    NumberFormat storage = NumberFormat::f32;  ///< kept values: f32, or bf16 (under bf16 compute only)
    bool fp8_mlp_inputs = false;               ///< MoE up-projection and SwiGLU inputs in FP8-E4M3 tiles
    bool offload = false;                      ///< kept matrices in host memory between forward and backward (CUDA)
    constexpr bool operator==(const ActivationsConfig&) const = default;
    /// How the values the compute policy rounds are kept, and the bytes of one.
    constexpr KeptFormat value_format() const {
        return storage == NumberFormat::bf16 ? KeptFormat::bf16 : KeptFormat::f32;
    }
    constexpr index_t value_bytes() const { return storage == NumberFormat::bf16 ? 2 : 4; }
    /// How the MoE up-projections' and SwiGLU's inputs are kept.
    constexpr KeptFormat mlp_input_format() const { return fp8_mlp_inputs ? KeptFormat::fp8 : value_format(); }
    /// bf16 storage holds values bf16 compute has rounded; under f32 compute it would round them.
    constexpr bool valid(const PrecisionConfig& p) const {
        return storage == NumberFormat::f32 || p.compute == NumberFormat::bf16;
    }
};

/// What Recompute<...> lists.
struct NormOutputs {};      ///< every RMSNorm's output (input_layernorm, post_attention_layernorm, q_a / kv_a norms)
struct UpProjections {};    ///< MLA's q_b_proj and kv_b_proj outputs
struct KimiK2Selection {};  ///< both: "LayerNorm, SwiGLU, and MLA up-projections" (SwiGLU and MoE down are always)

/// FP8-E4M3, a storage format only (tensor/fp8_tiles.hpp).
struct FP8 {};

template <class... What>
struct Recompute {
    template <class W>
    static constexpr bool lists = (std::is_same_v<What, W> || ...) || (std::is_same_v<What, KimiK2Selection> || ...);
    static_assert(((std::is_same_v<What, NormOutputs> || std::is_same_v<What, UpProjections> ||
                    std::is_same_v<What, KimiK2Selection>) &&
                   ...),
                  "Recompute<...>: takes NormOutputs, UpProjections or KimiK2Selection");
    using slot = slots::recompute;
    static constexpr bool norms = lists<NormOutputs>, up_projections = lists<UpProjections>;
};

/// How the kept values are stored: Storage<F32> (default) or Storage<BF16>.
template <class F>
using Storage = Policy<slots::activation_storage, F>;
/// How the MLP inputs are stored: MlpInputs<FP8>, or as the other values (MlpInputs<F32>, the default).
template <class F>
using MlpInputs = Policy<slots::mlp_inputs, F>;

/// Offload<true>: the kept matrices wait in pinned host memory between their layer's forward and backward.
template <bool On>
using Offload = Value<slots::offload, On>;

/// `Activations<Recompute<...>, Storage<...>, MlpInputs<...>, Offload<...>>`, arguments in any order: a component
/// of Model<...>.
template <class... Args>
struct Activations {
    static_assert(
        (detail::named_argument<Args> && ...) &&
            detail::only_accepted<
                detail::slot_list<slots::recompute, slots::activation_storage, slots::mlp_inputs, slots::offload>,
                Args...>,
        "Activations<...>: takes Recompute<...>, Storage<F32 | BF16>, MlpInputs<F32 | FP8> and Offload<bool>");
    static_assert(detail::no_repeats<Args...>, "Activations<...>: the same argument is given twice");
    using slot = slots::activations;
    using recompute = detail::pick_t<slots::recompute, Recompute<>, Args...>;
    using storage = detail::policy_of<slots::activation_storage, F32, Args...>;
    using mlp_inputs = detail::policy_of<slots::mlp_inputs, F32, Args...>;
    static_assert(std::is_same_v<storage, F32> || std::is_same_v<storage, BF16>, "Storage<F>: F is F32 or BF16");
    static_assert(std::is_same_v<mlp_inputs, F32> || std::is_same_v<mlp_inputs, FP8>,
                  "MlpInputs<F>: F is FP8, or F32 to store them as the other values");
    static constexpr bool offload = detail::value_of<slots::offload, false, Args...>;
    static constexpr ActivationsConfig value{recompute::norms, recompute::up_projections, storage::format,
                                             std::is_same_v<mlp_inputs, FP8>, offload};
};

/// Kimi K2's activations (report §2.4.3), offload aside: selective recomputation, bf16 values, FP8 MLP inputs.
/// Needs Precision<BF16>. With the offload too (a model on the CUDA backend): KimiK2ActivationsOffloaded.
using KimiK2Activations = Activations<Recompute<KimiK2Selection>, Storage<BF16>, MlpInputs<FP8>>;
using KimiK2ActivationsOffloaded =
    Activations<Recompute<KimiK2Selection>, Storage<BF16>, MlpInputs<FP8>, Offload<true>>;

/// The Kimi K2 technical report's §2.4.3 "Activation Reduction" taken one step at a time, (a) to (e), as the
/// accounting's tables list them (examples/kimi_k2_1t.cpp, docs/activation_memory.md).
namespace activation_steps {
/// (a) What the modules keep by default (Activations<>): f32 tensors.
inline constexpr ActivationsConfig keep_f32 = Activations<>::value;
/// (b) The values Precision<BF16> rounds to bf16 stored in 2 bytes; statistics, router and loss gradient stay f32.
inline constexpr ActivationsConfig keep_bf16 = Activations<Storage<BF16>>::value;
/// (c) (b) + recomputed in backward: RMSNorm outputs, the MLA up-projections' outputs (q_b_proj, kv_b_proj). The
/// SwiGLU outputs and the MoE down-projections' outputs, recomputed by K2 too, are kept by no policy here: the
/// modules already recompute the SwiGLU product and need no expert output (the routing weight's gradient is
/// (dy W_down) . a, nn/moe.hpp).
inline constexpr ActivationsConfig recompute = Activations<Storage<BF16>, Recompute<KimiK2Selection>>::value;
/// (d) (c) + FP8-E4M3 storage of the MoE up-projections' inputs (the dispatched rows) and of SwiGLU's inputs
/// (gate and up outputs): 1 byte per element and an f32 scale per 1 x 128 tile. Kimi K2's.
inline constexpr ActivationsConfig fp8 = KimiK2Activations::value;
/// (e) (d) + offload of the activations in flight to host memory (activation_resident_units stay on the GPU).
inline constexpr ActivationsConfig offload = KimiK2ActivationsOffloaded::value;
inline constexpr ActivationsConfig all[] = {keep_f32, keep_bf16, recompute, fp8, offload};
inline constexpr const char* names[] = {"(a) f32 (the modules)", "(b) bf16", "(c) + recompute", "(d) + fp8 MLP inputs",
                                        "(e) + offload"};
}  // namespace activation_steps

/// The step's name ("(c) + recompute") when `a` is one of activation_steps, else "Activations<...>".
constexpr const char* activation_step_name(const ActivationsConfig& a) {
    for (std::size_t i = 0; i < std::size(activation_steps::all); ++i)
        if (activation_steps::all[i] == a) return activation_steps::names[i];
    return "Activations<...>";
}

}  // namespace moonmoe
