// moonmoe/nn/rmsnorm.hpp: y = w * x / sqrt(mean(x^2) + eps), per row, as HF DeepseekV3RMSNorm computes it in f32.
//
// Backward keeps x and the per-row 1/rms. With r = (mean(x^2) + eps)^-1/2 and g = w * dy:
//   dx = r g - x r^3 mean(g x),   dw += sum over rows of dy * x * r.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

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
        // dw: partial column sums over fixed row chunks (contiguous rows, so memory is read in order), then the
        // chunks summed in order. The chunking does not depend on the thread count: results are repeatable.
        constexpr index_t chunk_rows = 64;
        const index_t chunks = (rows + chunk_rows - 1) / chunk_rows;
        std::vector<double> partial(static_cast<std::size_t>(chunks * n), 0.0);
        Ops::for_each(chunks, [&, x, dy](index_t k) {
            double* p = partial.data() + k * n;
            for (index_t r = k * chunk_rows; r < std::min(rows, (k + 1) * chunk_rows); ++r) {
                const float* xr = x.data + r * x.strides[0];
                const float* gr = dy.data + r * dy.strides[0];
                const double inv = rstd[r];
                for (index_t j = 0; j < n; ++j) p[j] += double(gr[j]) * xr[j] * inv;
            }
        });
        float* dw = weight.grad.data();
        Ops::for_each(n, [&](index_t j) {
            double s = 0.0;
            for (index_t k = 0; k < chunks; ++k) s += partial[k * n + j];
            dw[j] += float(s);
        });
    }

    void visit_params(const std::string& name, const ParamVisitor& f) { visit(name + ".weight", weight, f); }
};

}  // namespace moonmoe::nn
