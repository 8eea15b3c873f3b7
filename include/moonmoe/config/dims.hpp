// moonmoe/config/dims.hpp: the model's outer sizes, `Dims<Hidden<7168>, Layers<61>, DenseLayers<1>, ...>`.
//
// Defaults are Kimi K2's (its released config.json). Any size may be `Dynamic`.
#pragma once

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct dims;
struct hidden;
struct layers;
struct dense_layers;
struct vocab;
struct dense_hidden;
struct norm_eps;
}  // namespace slots

template <index_t N>
using Hidden = Value<slots::hidden, N>;  ///< hidden_size
template <index_t N>
using Layers = Value<slots::layers, N>;  ///< num_hidden_layers
template <index_t N>
using DenseLayers = Value<slots::dense_layers, N>;  ///< first_k_dense_replace
template <index_t N>
using Vocab = Value<slots::vocab, N>;  ///< vocab_size
template <index_t N>
using DenseHidden = Value<slots::dense_hidden, N>;  ///< intermediate_size of the dense MLPs
template <auto E>
using NormEps = Value<slots::norm_eps, double(E)>;  ///< rms_norm_eps

struct DimsConfig {
    index_t hidden;
    index_t layers;
    index_t dense_layers;  ///< the first `dense_layers` layers have a dense SwiGLU MLP instead of MoE
    index_t vocab;
    index_t dense_hidden;
    double norm_eps;  ///< of the layer norms and the final norm (Dynamic: -1.0); q_a / kv_a norms always use 1e-6 (HF)
};

template <class... Args>
struct Dims {
    using slot = slots::dims;
    using accepted = detail::slot_list<slots::hidden, slots::layers, slots::dense_layers, slots::vocab,
                                       slots::dense_hidden, slots::norm_eps>;
    MOONMOE_CHECK_ARGUMENTS("Dims<...>", accepted, Args);
    static constexpr DimsConfig value{
        .hidden = detail::value_of<slots::hidden, index_t{7168}, Args...>,
        .layers = detail::value_of<slots::layers, index_t{61}, Args...>,
        .dense_layers = detail::value_of<slots::dense_layers, index_t{1}, Args...>,
        .vocab = detail::value_of<slots::vocab, index_t{163840}, Args...>,
        .dense_hidden = detail::value_of<slots::dense_hidden, index_t{18432}, Args...>,
        .norm_eps = detail::value_of<slots::norm_eps, 1e-6, Args...>,
    };
    template <class... New>
    using with = typename detail::replacing<Dims, New...>::template apply<Args...>;
};

}  // namespace moonmoe
