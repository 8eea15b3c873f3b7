// Test helpers for the nn layer: random parameters and inputs, and a gradient check of a whole module, on any
// backend (the module's own: nn::Linear<B>, nn::Transformer<B>, ...; Backend<cpu> by default).
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/tensor/transfer.hpp>

namespace moonmoe::testing {

using Mat = Tensor<float, 2>;

/// The backend a module runs on: B of nn::RMSNorm<B>, nn::MoE<B>, nn::Transformer<B>, ...
template <class Module>
struct module_backend;
template <template <class> class M, class B>
struct module_backend<M<B>> {
    using type = B;
};
template <class Module>
using module_backend_t = typename module_backend<std::remove_cv_t<Module>>::type;

/// Calls f on every parameter of a module, whether it names itself (Transformer) or takes a prefix.
template <class Module>
void for_params(Module& m, const ParamVisitor& f) {
    if constexpr (requires { m.visit_params(f); }) m.visit_params(f);
    else
        m.visit_params("module", f);
}

/// [rows, cols] of N(0, stddev^2) on backend B; the same values on every backend (RandomOps is counter-based).
template <class B = cpu>
Tensor<float, 2, B> random_matrix(index_t rows, index_t cols, std::uint64_t seed, float stddev = 1.0f) {
    Tensor<float, 2, B> m({rows, cols});
    backend::Ops<B>::fill_normal(m.view(), 0.0f, stddev, seed);
    return m;
}

/// Fills every parameter with N(0, stddev^2) (norm gains: 1 + N(0, 0.1^2); router bias: N(0, 0.05^2)), in the
/// module's backend memory; the same values on every backend.
template <class Module>
void randomize(Module& m, std::uint64_t seed, float stddev = 0.2f) {
    using B = module_backend_t<Module>;
    for_params(m, [&](const ParamRef& p) {
        View<float, 2, B> v(p.value, {1, p.numel()});
        if (p.kind == ParamKind::vector) {
            backend::Ops<B>::fill_normal(v, 1.0f, 0.1f, seed++);
        } else if (p.kind == ParamKind::router_bias) {
            backend::Ops<B>::fill_normal(v, 0.0f, 0.05f, seed++);
        } else {
            backend::Ops<B>::fill_normal(v, 0.0f, stddev, seed++);
        }
    });
}

/// ||a - b|| / ||b|| (||a - b|| where b is 0), in double.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0.0, n = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        n += double(b[i]) * b[i];
    }
    return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
}

/// <a, b> in double, on the host.
template <class B>
double dot(const Tensor<float, 2, B>& a, const Tensor<float, 2, B>& b) {
    const std::vector<float> x = to_host(a), y = to_host(b);
    double s = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) s += double(x[i]) * y[i];
    return s;
}

/// Checks every parameter gradient and the input gradient of a module whose loss is <y, r>.
/// loss(): runs forward on the current x and parameters and returns <y, r>.
/// The analytic gradients must already be in the parameters' grad and in dx. x and dx point into the module's
/// backend memory.
template <class Module>
void check_module_gradients(Module& m, float* x, const float* dx, index_t x_numel, const std::function<double()>& loss,
                            double tolerance = 1e-2, double eps = 1e-2) {
    using B = module_backend_t<Module>;
    std::uint64_t seed = 100;
    if (x) {
        const nn::GradCheck r = nn::check_gradient<B>("input", x, dx, x_numel, loss, eps, seed++);
        CAPTURE(r.what);
        CAPTURE(r.analytic);
        CAPTURE(r.numeric);
        CHECK(r.relative_error < tolerance);
    }
    for_params(m, [&](const ParamRef& p) {
        if (!p.grad) return;
        const nn::GradCheck r = nn::check_gradient<B>(p.name, p.value, p.grad, p.numel(), loss, eps, seed++);
        CAPTURE(r.what);
        CAPTURE(r.analytic);
        CAPTURE(r.numeric);
        CHECK(r.relative_error < tolerance);
    });
}

}  // namespace moonmoe::testing
