// moonmoe/nn/linear.hpp: y = x W^T with W stored [out, in] as in HF checkpoints (no bias: DeepSeek-V3 has none).
//
// Stateless about activations: the caller keeps the input x for backward (composite modules own the caches).
#pragma once

#include "../backend/backend.hpp"
#include "param.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct Linear {
    using Ops = backend::Ops<B>;
    Param<2, B> weight;

    Linear() = default;
    Linear(index_t in, index_t out, ParamKind kind = ParamKind::matrix) : weight({out, in}, kind) {}

    index_t in_features() const { return weight.value.size(1); }
    index_t out_features() const { return weight.value.size(0); }

    /// y = x W^T, x [rows, in] -> y [rows, out]
    void forward(View<const float, 2, B> x, View<float, 2, B> y) const { Ops::linear(x, weight.value.view(), y); }

    /// dW += dy^T x; dx = dy W (or += when accumulate_dx). dx may be empty (no data) to skip it.
    void backward(View<const float, 2, B> x, View<const float, 2, B> dy, View<float, 2, B> dx,
                  bool accumulate_dx = false) {
        using backend::Trans;
        Ops::gemm(Trans::yes, Trans::no, 1.0f, dy, x, 1.0f, weight.grad.view());
        if (dx.data) Ops::gemm(Trans::no, Trans::no, 1.0f, dy, weight.value.view(), accumulate_dx ? 1.0f : 0.0f, dx);
    }

    void visit_params(const std::string& name, const ParamVisitor& f) { visit(name + ".weight", weight, f); }
};

}  // namespace moonmoe::nn
