// moonmoe/config/model.hpp: `Model<Dims<...>, Attention<...>, RoPE<...>, MoE<...>, Optimizer<...>, Parallel<...>,
// Backend<...>, Precision<...>, Activations<...>, RL<...>>`, a whole model as a type.
//
// Components come in any order and each is optional: a missing one is Kimi K2's (and Parallel<1, 1, 1>,
// Backend<cpu>, Precision<F32>, Activations<>, RL<>: config/rl.hpp, the post-training settings, which the model's
// ModelConfig does not carry: Model::rl::value). The type checks its configuration when it is used (any member access),
// and answers the accounting questions at compile time when every size is static:
//
//   using K2 = moonmoe::KimiK2;
//   static_assert(K2::parameter_count() == 1'026'408'232'448);
#pragma once

#include "accounting.hpp"
#include "model_config.hpp"
#include "rl.hpp"

namespace moonmoe {

template <class... Components>
struct Model {
    using accepted =
        detail::slot_list<slots::dims, slots::attention, slots::rope, slots::moe, slots::optimizer, slots::parallel,
                          slots::backend, slots::precision, slots::activations, slots::rl>;
    MOONMOE_CHECK_ARGUMENTS("Model<...>", accepted, Components);

    using dims = detail::pick_t<slots::dims, Dims<>, Components...>;
    using attention = detail::pick_t<slots::attention, Attention<>, Components...>;
    using rope = detail::pick_t<slots::rope, RoPE<>, Components...>;
    using moe = detail::pick_t<slots::moe, MoE<>, Components...>;
    using optimizer = detail::pick_t<slots::optimizer, Optimizer<>, Components...>;
    using parallel = detail::pick_t<slots::parallel, Parallel<>, Components...>;
    using backend = typename detail::pick_t<slots::backend, Backend<>, Components...>::type;
    /// The CUDA kernels the type asks for (config/backend.hpp); moonmoe::Trainer applies them.
    static constexpr KernelChoice kernels = detail::pick_t<slots::backend, Backend<>, Components...>::kernels;
    using precision = detail::pick_t<slots::precision, Precision<>, Components...>;
    using activations = detail::pick_t<slots::activations, Activations<>, Components...>;
    using rl = detail::pick_t<slots::rl, RL<>, Components...>;

    static constexpr ModelConfig config{dims::value,   attention::value, rope::value,
                                        moe::value,    optimizer::value, parallel::value,
                                        backend::kind, precision::value, activations::value};
    static_assert(config.activations.valid(config.precision),
                  "Activations<Storage<BF16>> keeps the bf16 values of Precision<BF16>: use Precision<BF16>");

    static_assert(config.attention.kind != AttentionKind::mla || !optimizer::qk_clip::alpha_given,
                  "QKClip<tau, ClipAlpha<a>>: ClipAlpha splits an MHA head's rescaling between q and k; MLA's split "
                  "is fixed (q_nope and k_nope by sqrt(gamma), q_pe by gamma, the shared k_pe untouched: Kimi K2 "
                  "report, section 2.1), so a model with Attention<MLA<...>> takes no ClipAlpha");

#define MOONMOE_STATIC_RULE(name, message, ...) static_assert(rules::name(config), message);
    MOONMOE_CONFIG_RULES(MOONMOE_STATIC_RULE)
#undef MOONMOE_STATIC_RULE

    static constexpr bool is_static = config.is_static();

    /// The same model with some components replaced, e.g. `KimiK2::with<Parallel<1, 1, 1>>`.
    template <class... New>
    using with = typename detail::replacing<Model, New...>::template apply<Components...>;

    /// Parameter counts per component and in total.
    static constexpr ParameterCounts parameters()
        requires is_static
    {
        return count_parameters(config);
    }
    static constexpr index_t parameter_count()
        requires is_static
    {
        return parameters().total;
    }
    static constexpr index_t activated_parameter_count()
        requires is_static
    {
        return parameters().active;
    }

    /// Forward FLOPs per token at sequence length `seq_len` (causal), per component.
    static constexpr FlopCounts flops_per_token(index_t seq_len)
        requires is_static
    {
        return count_flops(config, seq_len);
    }

    /// Bytes one layer keeps for its backward from `tokens` tokens under the type's Activations<...>: what its
    /// caches hold.
    static constexpr index_t layer_activation_bytes(bool dense, index_t tokens)
        requires is_static
    {
        return layer_activations(config, dense, tokens).bytes(config.activations);
    }

    static constexpr bool dp_is_static = config.parallel.dp != Dynamic;

    /// Bytes held by the most loaded rank of the Parallel<> layout, at the DP size of the type...
    static constexpr RankMemory memory_per_rank()
        requires(is_static && dp_is_static)
    {
        return most_loaded_rank(config, config.parallel.dp);
    }
    /// ...or at data-parallel size `dp` (for a type whose DP is Dynamic, or to ask "what if").
    static constexpr RankMemory memory_per_rank(index_t dp)
        requires is_static
    {
        ModelConfig c = config;
        c.parallel.dp = dp;
        return most_loaded_rank(c, dp);
    }
};

}  // namespace moonmoe
