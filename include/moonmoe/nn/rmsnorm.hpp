// moonmoe/nn/rmsnorm.hpp: y = w * x / sqrt(mean(x^2) + eps), per row, as HF DeepseekV3RMSNorm computes it in f32.
//
// Backward keeps x and the per-row 1/rms. With r = (mean(x^2) + eps)^-1/2 and g = w * dy:
//   dx = r g - x r^3 mean(g x),   dw += sum over rows of dy * x * r.
#pragma once

#include <cmath>

#include "../backend/backend.hpp"
#include "param.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct RMSNorm {
    using Ops = backend::Ops<B>;
    Param<1, B> weight;
    float eps = 1e-6f;

    RMSNorm() = default;
    RMSNorm(index_t dim, double eps_) : weight({dim}, ParamKind::vector), eps(float(eps_)) {
        float* w = weight.value.data();
        for (index_t i = 0; i < dim; ++i) w[i] = 1.0f;
    }

    /// y = norm(x); rstd[row] = 1 / rms (kept for backward).
    void forward(View<const float, 2, B> x, View<float, 2, B> y, float* rstd) const {
        const index_t n = x.shape[1];
        if (y.shape != x.shape || n != weight.value.size(0)) throw_shape_mismatch("RMSNorm.forward", x.shape, y.shape);
        const float* w = weight.value.data();
        Ops::for_each(x.shape[0], [&, x, y](index_t r) {
            const float* xr = x.data + r * x.strides[0];
            float* yr = y.data + r * y.strides[0];
            double ss = 0.0;
            for (index_t j = 0; j < n; ++j) ss += double(xr[j]) * double(xr[j]);
            const float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
            rstd[r] = inv;
            for (index_t j = 0; j < n; ++j) yr[j] = w[j] * (xr[j] * inv);
        });
    }

    /// dx = d norm / dx applied to dy (+= when accumulate); dw += sum_rows dy * x * rstd.
    void backward(View<const float, 2, B> x, const float* rstd, View<const float, 2, B> dy, View<float, 2, B> dx,
                  bool accumulate = false) {
        const index_t n = x.shape[1], rows = x.shape[0];
        const float* w = weight.value.data();
        Ops::for_each(rows, [&, x, dy, dx](index_t r) {
            const float* xr = x.data + r * x.strides[0];
            const float* gr = dy.data + r * dy.strides[0];
            float* dr = dx.data + r * dx.strides[0];
            double dot = 0.0;
            for (index_t j = 0; j < n; ++j) dot += double(w[j] * gr[j]) * double(xr[j]);
            const float inv = rstd[r];
            const float c = float(dot / double(n)) * inv * inv * inv;
            for (index_t j = 0; j < n; ++j) {
                const float v = inv * w[j] * gr[j] - c * xr[j];
                dr[j] = accumulate ? dr[j] + v : v;
            }
        });
        float* dw = weight.grad.data();
        Ops::for_each(n, [&, x, dy](index_t j) {  // column sums, each by one thread, rows in order: repeatable
            double s = 0.0;
            for (index_t r = 0; r < rows; ++r) s += double(dy.data[r * dy.strides[0] + j]) * x.data[r * x.strides[0] + j] * rstd[r];
            dw[j] += float(s);
        });
    }

    void visit_params(const std::string& name, const ParamVisitor& f) { visit(name + ".weight", weight, f); }
};

}  // namespace moonmoe::nn
