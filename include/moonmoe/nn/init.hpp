// moonmoe/nn/init.hpp: a model's first weights from a seed, as transformers initialises DeepseekV3ForCausalLM.
//
// DeepseekV3PreTrainedModel._init_weights (transformers 5.23, models/deepseek_v3/modeling_deepseek_v3.py, and
// PreTrainedModel._init_weights for the Linear / Embedding / RMSNorm modules): every linear weight (attention and
// MLP projections, lm_head), the embedding, the router's weight and the experts' matrices ~ N(0,
// initializer_range^2); RMSNorm gains 1; the router's e_score_correction_bias 0. (HF also zeroes the embedding row
// of pad_token_id when a config sets one; the configurations moonmoe writes set none.)
//
// Each parameter is drawn from the backend's counter-based generator (Ops::fill_normal) under a seed made from
// the caller's seed and the parameter's Hugging Face name: its values depend on (seed, name, shape) only, not on
// the thread count, the order of visiting, or the other parameters (a model with one more layer keeps the values
// of the layers both have). Same seed, same weights, bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "param.hpp"
#include "transformer.hpp"

namespace moonmoe::nn {

struct InitOptions {
    std::uint64_t seed = 0;
    /// Standard deviation of the weight matrices and the embedding (transformers' DeepseekV3Config default, and
    /// the initializer_range of the Kimi K2 and DeepSeek-V3 config.json files).
    double initializer_range = 0.02;
};

namespace detail {

/// The generator seed of the parameter `name` under `seed`: FNV-1a of the name, mixed with the seed by the
/// splitmix64 finaliser so that nearby seeds and nearby names give unrelated streams.
constexpr std::uint64_t parameter_seed(std::uint64_t seed, std::string_view name) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (char ch : name) h = (h ^ std::uint64_t(static_cast<unsigned char>(ch))) * 0x100000001b3ull;
    std::uint64_t x = h ^ (seed * 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace detail

/// Calls fill(View<float, 2, B>) on the parameter's f32 values as [numel / last extent, last extent]; a parameter
/// stored in bf16 alone (Weights<BF16>) gets them in an f32 staging tensor, rounded into its bf16 values after.
template <class B, class Fill>
void write_values(const ParamRef& p, Fill&& fill) {
    const index_t last = p.shape.empty() ? 1 : std::max<index_t>(p.shape.back(), 1);
    const Shape<2> flat{p.numel() / last, last};
    if (p.value) return fill(View<float, 2, B>(p.value, flat));
    Tensor<float, 2, B> staging(flat);
    fill(staging.view());
    backend::Ops<B>::template cast<bf16, float>(View<const float, 2, B>(staging.view()),
                                                View<bf16, 2, B>(p.value16, flat));
}

/// Sets every parameter of `model` to its initial value (rules at the top of this file); gradients are left as
/// they are (zero on a new model).
template <class B>
void init_weights(Transformer<B>& model, const InitOptions& options = {}) {
    using Ops = backend::Ops<B>;
    // The values as [numel / last extent, last extent]: rows for the threads; element k of the generator is the
    // k-th in row-major order whatever the 2-D shape, so the values are those of the flat tensor.
    model.visit_params([&](const ParamRef& p) {
        write_values<B>(p, [&](View<float, 2, B> all) {
            switch (p.kind) {
            case ParamKind::vector: Ops::fill(all, 1.0f); break;
            case ParamKind::router_bias: Ops::fill(all, 0.0f); break;
            case ParamKind::matrix:
            case ParamKind::expert_matrix:
            case ParamKind::embedding:
            case ParamKind::output_head:
                Ops::fill_normal(all, 0.0f, float(options.initializer_range),
                                 detail::parameter_seed(options.seed, p.name));
                break;
            }
        });
    });
    model.refresh_working_weights();
}

}  // namespace moonmoe::nn
