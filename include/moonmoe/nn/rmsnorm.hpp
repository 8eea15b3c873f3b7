// moonmoe/nn/rmsnorm.hpp: y = w * x / sqrt(mean(x^2) + eps), per row, as HF DeepseekV3RMSNorm computes it in f32.
//
// Backward keeps x and the per-row 1/rms; y is kept by the module that reads it, or recomputed (recompute: the same
// operations on the same x, so the same bits). With r = (mean(x^2) + eps)^-1/2 and g = w * dy:
//   dx = r g - x r^3 mean(g x),   dw += sum over rows of dy * x * r.
// The statistics are f32 under every policy; under the bf16 policy y and dx are rounded to bf16 (nn/precision.hpp).
#pragma once

#include <string>

#include "../backend/backend.hpp"
#include "flags.hpp"
#include "param.hpp"
#include "precision.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct RMSNorm {
    using Ops = backend::Ops<B>;
    Param<1, B> weight;
    float eps = 1e-6f;
    NumberFormat compute = NumberFormat::f32;

    RMSNorm() = default;
    RMSNorm(index_t dim, double eps_) : weight({dim}, ParamKind::vector), eps(float(eps_)) {
        Ops::fill(weight.value.template reshape<2>({1, dim}), 1.0f);
    }

    void set_precision(const PrecisionConfig& p) { compute = p.compute; }

    /// y = norm(x); rstd [rows] = 1 / rms per row (kept for backward).
    void forward(View<const float, 2, B> x, View<float, 2, B> y, View<float, 1, B> rstd) const {
        Ops::rmsnorm_forward(x, weight.value.view(), eps, y, rstd);
        round_to(compute, y);
    }

    /// norm(x) again, for a backward that did not keep it: the forward's bits (the 1/rms it recomputes is dropped).
    Tensor<float, 2, B> recompute(View<const float, 2, B> x) const {
        Tensor<float, 2, B> y(x.shape);
        Tensor<float, 1, B> rstd({x.shape[0]});
        forward(x, y.view(), rstd.view());
        return y;
    }

    /// dx = d norm / dx applied to dy (+= under Accumulate::yes); dw += sum_rows dy * x * rstd.
    void backward(View<const float, 2, B> x, View<const float, 1, B> rstd, View<const float, 2, B> dy,
                  View<float, 2, B> dx, Accumulate accumulate = Accumulate::no) {
        Ops::rmsnorm_backward(x, weight.value.view(), rstd, dy, dx, weight.grad.view(), accumulate == Accumulate::yes);
        round_to(compute, dx);
    }

    void visit_params(const std::string& name, const ParamVisitor& f) { visit(name + ".weight", weight, f); }
};

}  // namespace moonmoe::nn
