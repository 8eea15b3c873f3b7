// moonmoe/nn/precision.hpp: what a module does differently under the bf16 compute policy (Precision<BF16>,
// config/precision.hpp; docs/precision.md says what each policy means).
//
// Under NumberFormat::bf16 a module rounds what it hands on to bf16, as torch's bf16 operations round their
// results: a projection's output, a norm's output, a residual sum, the gradients it passes back. The buffers
// between operations stay f32 containers holding bf16 values, so the element-wise and row primitives run unchanged
// on them. Matrix products read bf16 operands: the weights' bf16 values (Param::value16: a working copy of the f32
// master, or the parameter itself under Weights<BF16>) and bf16 copies of the activations (exact, since the
// activations already hold bf16 values), with f32 accumulation (BlasOps::gemm_bf16). Master weights, gradients,
// the optimizer state, the router, the per-row statistics and the loss stay f32.
#pragma once

#include <string>

#include "../backend/backend.hpp"
#include "../backend/functors.hpp"
#include "../config/model_config.hpp"
#include "../config/precision.hpp"
#include "../tensor/tensor.hpp"

namespace moonmoe::nn {

/// Rounds `y`'s values to bf16 under the bf16 policy (nothing under f32).
template <class B>
void round_to(NumberFormat f, View<float, 2, B> y) {
    if (f == NumberFormat::bf16 && y.numel() > 0) backend::Ops<B>::map(fn::RoundToBF16{}, y);
}

/// out = a + b, rounded to bf16 under the bf16 policy: a residual add.
template <class B>
void add_rounded(NumberFormat f, View<const float, 2, B> a, View<const float, 2, B> b, View<float, 2, B> out) {
    if (f == NumberFormat::bf16) backend::Ops<B>::map(fn::SumBF16{}, out, a, b);
    else
        backend::Ops<B>::map(fn::Sum{}, out, a, b);
}

/// y += x, rounded to bf16 under the bf16 policy: a bf16 result added into a bf16 accumulator.
template <class B>
void accumulate_rounded(NumberFormat f, View<float, 2, B> y, View<const float, 2, B> x) {
    if (f == NumberFormat::bf16) backend::Ops<B>::map(fn::AddToBF16{}, y, x);
    else
        backend::Ops<B>::map(fn::AddTo<float>{}, y, x);
}

/// A contiguous bf16 copy of a matrix (each value rounded to nearest even; exact for bf16 values).
template <class B>
Tensor<bf16, 2, B> bf16_copy(View<const float, 2, B> x) {
    auto out = Tensor<bf16, 2, B>::for_overwrite(x.shape);
    backend::Ops<B>::template cast<bf16, float>(x, out.view());
    return out;
}

/// Refuses a precision no module can run: weights stored in bf16 under f32 compute.
inline void check_precision(const PrecisionConfig& p) {
    if (!p.valid())
        throw config_error(std::string("precision: weights stored in ") + format_name(p.weights) +
                           " are read by bf16 products only, and the compute format is " + format_name(p.compute) +
                           " (Precision<BF16, Weights<BF16>> stores them in bf16)");
}

/// Refuses an activation policy the precision cannot run: bf16 storage of values f32 compute has not rounded.
inline void check_activations(const ActivationsConfig& a, const PrecisionConfig& p) {
    if (!a.valid(p))
        throw config_error(std::string("activations: Storage<BF16> keeps the bf16 values of Precision<BF16>, and the "
                                       "compute format is ") +
                           format_name(p.compute) + " (storing its values in bf16 would round them)");
}

}  // namespace moonmoe::nn
