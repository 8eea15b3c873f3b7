// moonmoe/nn/swiglu.hpp: the SwiGLU MLP, down(silu(gate(x)) * up(x)): the dense MLP of the first layers, each
// routed expert and the shared expert.
//
// Backward keeps x, gate(x) and up(x); the product a = silu(g) * u is recomputed (one pass, no GEMM). Under the
// bf16 policy (nn/precision.hpp) silu(g) and the product are each rounded to bf16, as torch's bf16 ops round them.
#pragma once

#include "../backend/functors.hpp"
#include "linear.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct SwiGLU {
    using Ops = backend::Ops<B>;
    Linear<B> gate_proj, up_proj, down_proj;

    struct Cache {
        Tensor<float, 2, B> x, g, u;
    };

    SwiGLU() = default;
    SwiGLU(index_t hidden, index_t inner, ParamKind kind = ParamKind::matrix, PrecisionConfig p = {})
        : gate_proj(hidden, inner, kind, p), up_proj(hidden, inner, kind, p), down_proj(inner, hidden, kind, p) {}

    index_t inner() const { return gate_proj.out_features(); }

    void set_precision(const PrecisionConfig& p) {
        for (Linear<B>* l : {&gate_proj, &up_proj, &down_proj}) l->set_precision(p);
    }
    void refresh_working() {
        for (Linear<B>* l : {&gate_proj, &up_proj, &down_proj}) l->refresh_working();
    }
    NumberFormat compute() const { return down_proj.compute; }

    /// a = silu(g) * u into a (same shape as g), rounded as the compute format rounds.
    static void activate(View<const float, 2, B> g, View<const float, 2, B> u, View<float, 2, B> a,
                         NumberFormat f = NumberFormat::f32) {
        if (f == NumberFormat::bf16) Ops::map(fn::SwiGLUForwardBF16{}, a, g, u);
        else Ops::map(fn::SwiGLUForward{}, a, g, u);
    }

    /// y = mlp(x) (y += mlp(x) when accumulate).
    void forward(View<const float, 2, B> x, View<float, 2, B> y, Cache& cache, bool accumulate = false) const {
        const index_t rows = x.shape[0];
        cache = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        cache.x = Tensor<float, 2, B>({rows, x.shape[1]});
        Ops::copy(x, cache.x.view());
        cache.g = Tensor<float, 2, B>({rows, inner()});
        cache.u = Tensor<float, 2, B>({rows, inner()});
        gate_proj.forward(x, cache.g.view());
        up_proj.forward(x, cache.u.view());
        Tensor<float, 2, B> a({rows, inner()});
        activate(cache.g.view(), cache.u.view(), a.view(), compute());
        down_proj.forward(a.view(), y, accumulate);
    }

    /// Given dy, accumulates weight gradients and writes (or adds) dx.
    void backward(View<const float, 2, B> dy, Cache& cache, View<float, 2, B> dx, bool accumulate_dx = false) {
        const index_t rows = dy.shape[0], n = inner();
        Tensor<float, 2, B> a({rows, n}), da({rows, n});
        activate(cache.g.view(), cache.u.view(), a.view(), compute());
        down_proj.backward(a.view(), dy, da.view());
        // da -> dg = da * u * silu'(g) (into g), du = da * silu(g) (into u): the cache is spent here.
        Ops::map(fn::SwiGLUBackward{}, cache.g.view(), cache.u.view(), View<const float, 2, B>(da.view()));
        round_to(compute(), cache.g.view());
        round_to(compute(), cache.u.view());
        gate_proj.backward(cache.x.view(), cache.g.view(), dx, accumulate_dx);
        up_proj.backward(cache.x.view(), cache.u.view(), dx, true);
        cache = Cache{};
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        gate_proj.visit_params(name + ".gate_proj", f);
        up_proj.visit_params(name + ".up_proj", f);
        down_proj.visit_params(name + ".down_proj", f);
    }
};

}  // namespace moonmoe::nn
