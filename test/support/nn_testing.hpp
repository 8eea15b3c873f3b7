// Test helpers for the nn layer: random parameters and inputs, and a gradient check of a whole module.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/nn.hpp>

namespace moonmoe::testing {

using Mat = Tensor<float, 2>;

/// Calls f on every parameter of a module, whether it names itself (Transformer) or takes a prefix.
template <class Module>
void for_params(Module& m, const ParamVisitor& f) {
    if constexpr (requires { m.visit_params(f); }) m.visit_params(f);
    else m.visit_params("module", f);
}

inline Mat random_matrix(index_t rows, index_t cols, std::uint64_t seed, float stddev = 1.0f) {
    Mat m({rows, cols});
    backend::Ops<cpu>::fill_normal(m.view(), 0.0f, stddev, seed);
    return m;
}

/// Fills every parameter with N(0, stddev^2) (norm gains: 1 + N(0, 0.1^2); router bias: N(0, 0.05^2)).
template <class Module>
void randomize(Module& m, std::uint64_t seed, float stddev = 0.2f) {
    for_params(m, [&](const ParamRef& p) {
        View<float, 2> v(p.value, {1, p.numel()});
        if (p.kind == ParamKind::vector) {
            backend::Ops<cpu>::fill_normal(v, 1.0f, 0.1f, seed++);
        } else if (p.kind == ParamKind::router_bias) {
            backend::Ops<cpu>::fill_normal(v, 0.0f, 0.05f, seed++);
        } else {
            backend::Ops<cpu>::fill_normal(v, 0.0f, stddev, seed++);
        }
    });
}

inline double dot(const Mat& a, const Mat& b) {
    double s = 0.0;
    for (index_t i = 0; i < a.numel(); ++i) s += double(a.data()[i]) * b.data()[i];
    return s;
}

/// Checks every parameter gradient and the input gradient of a module whose loss is <y, r>.
/// loss(): runs forward on the current x and parameters and returns <y, r>.
/// The analytic gradients must already be in the parameters' grad and in dx.
template <class Module>
void check_module_gradients(Module& m, float* x, const float* dx, index_t x_numel, const std::function<double()>& loss,
                            double tolerance = 1e-2, double eps = 1e-2) {
    std::uint64_t seed = 100;
    if (x) {
        const nn::GradCheck r = nn::check_gradient("input", x, dx, x_numel, loss, eps, seed++);
        CAPTURE(r.what);
        CAPTURE(r.analytic);
        CAPTURE(r.numeric);
        CHECK(r.relative_error < tolerance);
    }
    for_params(m, [&](const ParamRef& p) {
        if (!p.grad) return;
        const nn::GradCheck r = nn::check_gradient(p.name, p.value, p.grad, p.numel(), loss, eps, seed++);
        CAPTURE(r.what);
        CAPTURE(r.analytic);
        CAPTURE(r.numeric);
        CHECK(r.relative_error < tolerance);
    });
}

}  // namespace moonmoe::testing
