// moonmoe/nn/linear.hpp: y = x W^T with W stored [out, in] as in HF checkpoints (no bias: DeepSeek-V3 has none).
//
// Stateless about activations: the caller keeps the input x for backward (composite modules own the caches).
// Under bf16 compute (nn/precision.hpp) the products read W's bf16 values (weight.value16: the working copy of the
// f32 master, or the bf16 parameter itself under Weights<BF16>) and bf16 copies of x and dy, accumulate in f32
// (dW into the f32 gradient), and round y and dx to bf16.
#pragma once

#include "../backend/backend.hpp"
#include "flags.hpp"
#include "param.hpp"
#include "precision.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct Linear {
    using Ops = backend::Ops<B>;
    Param<2, B> weight;
    NumberFormat compute = NumberFormat::f32;

    Linear() = default;
    Linear(index_t in, index_t out, ParamKind kind = ParamKind::matrix, PrecisionConfig p = {})
        : weight({out, in}, kind, p.weights) {
        set_precision(p);
    }

    index_t in_features() const { return weight.size(1); }
    index_t out_features() const { return weight.size(0); }

    /// Sets the compute format and the weight's storage (Param::set_precision).
    void set_precision(const PrecisionConfig& p) {
        compute = p.compute;
        weight.set_precision(p);
    }
    /// Re-rounds the bf16 working copy from the f32 master (after the master changed).
    void refresh_working() { weight.refresh(); }

    /// y = x W^T, x [rows, in] -> y [rows, out]; y += x W^T under Accumulate::yes.
    void forward(View<const float, 2, B> x, View<float, 2, B> y, Accumulate accumulate = Accumulate::no) const {
        using backend::Trans;
        if (compute == NumberFormat::f32) return Ops::linear(x, weight.value.view(), y, accumulate == Accumulate::yes);
        product_bf16(bf16_copy(x).view(), Trans::yes, weight.value16.view(), y, accumulate);
    }

    /// dW += dy^T x; dx = dy W (or += under Accumulate::yes). dx may be empty (no data) to skip it.
    void backward(View<const float, 2, B> x, View<const float, 2, B> dy, View<float, 2, B> dx,
                  Accumulate accumulate_dx = Accumulate::no) {
        using backend::Trans;
        if (compute == NumberFormat::f32) {
            Ops::gemm(Trans::yes, Trans::no, 1.0f, dy, x, 1.0f, weight.grad.view());
            if (dx.data)
                Ops::gemm(Trans::no, Trans::no, 1.0f, dy, weight.value.view(),
                          accumulate_dx == Accumulate::yes ? 1.0f : 0.0f, dx);
            return;
        }
        const Tensor<bf16, 2, B> dy16 = bf16_copy(dy);
        Ops::template gemm_bf16<float>(Trans::yes, Trans::no, 1.0f, dy16.view(), bf16_copy(x).view(), 1.0f,
                                       weight.grad.view());
        if (dx.data) product_bf16(dy16.view(), Trans::no, weight.value16.view(), dx, accumulate_dx);
    }

    /// y = round(a op(W16)) (or y = round(y + round(a op(W16))) under Accumulate::yes): a bf16 product into bf16
    /// values.
    static void product_bf16(View<const bf16, 2, B> a, backend::Trans tw, View<const bf16, 2, B> w16,
                             View<float, 2, B> y, Accumulate accumulate) {
        using backend::Trans;
        if (accumulate == Accumulate::no) {
            Ops::template gemm_bf16<float>(Trans::no, tw, 1.0f, a, w16, 0.0f, y);
            round_to(NumberFormat::bf16, y);
            return;
        }
        Tensor<float, 2, B> t(y.shape);
        Ops::template gemm_bf16<float>(Trans::no, tw, 1.0f, a, w16, 0.0f, t.view());
        round_to(NumberFormat::bf16, t.view());
        accumulate_rounded(NumberFormat::bf16, y, View<const float, 2, B>(t.view()));
    }

    void visit_params(const std::string& name, const ParamVisitor& f) { visit(name + ".weight", weight, f); }
};

}  // namespace moonmoe::nn
