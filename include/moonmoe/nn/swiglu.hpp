// moonmoe/nn/swiglu.hpp: the SwiGLU MLP, down(silu(gate(x)) * up(x)): the dense MLP of the first layers, each
// routed expert and the shared expert.
//
// Backward keeps x, gate(x) and up(x); the product a = silu(g) * u is recomputed (one pass, no GEMM), and so is
// nothing else of the output side (down's input is a). g and u are kept as the activation policy says (nn/kept.hpp:
// f32, bf16, or FP8 tiles); x is not kept when the caller recomputes it (KeepInput::no: it hands x to
// backward). Under the bf16 policy (nn/precision.hpp) silu(g) and the product are each rounded to bf16, as torch's bf16
// ops round them.
#pragma once

#include "../backend/functors.hpp"
#include "kept.hpp"
#include "linear.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct SwiGLU {
    using Ops = backend::Ops<B>;
    Linear<B> gate_proj, up_proj, down_proj;
    ActivationsConfig kept{};  ///< x as a value, g and u as MLP inputs
    bool keep_input = true;    ///< false: backward is handed x (a recomputed norm output)

    struct Cache {
        KeptMatrix<B> x, g, u;
        std::size_t bytes() const { return x.bytes() + g.bytes() + u.bytes(); }
        template <class F>
        void for_each_kept(F&& f) {
            f(x), f(g), f(u);
        }
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
    /// How x, g and u are kept, and whether x is (KeepInput::no: the caller recomputes it and hands it to backward).
    void set_activations(const ActivationsConfig& a, KeepInput keep = KeepInput::yes) {
        kept = a;
        keep_input = keep == KeepInput::yes;
    }

    /// a = silu(g) * u into a (same shape as g), rounded as the compute format rounds.
    static void activate(View<const float, 2, B> g, View<const float, 2, B> u, View<float, 2, B> a,
                         NumberFormat f = NumberFormat::f32) {
        if (f == NumberFormat::bf16) Ops::map(fn::SwiGLUForwardBF16{}, a, g, u);
        else
            Ops::map(fn::SwiGLUForward{}, a, g, u);
    }

    /// y = mlp(x) (y += mlp(x) under Accumulate::yes).
    void forward(View<const float, 2, B> x, View<float, 2, B> y, Cache& cache,
                 Accumulate accumulate = Accumulate::no) const {
        const index_t rows = x.shape[0];
        cache = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        if (keep_input) cache.x = KeptMatrix<B>::copy(x, kept.value_format());
        Tensor<float, 2, B> g({rows, inner()}), u({rows, inner()});
        gate_proj.forward(x, g.view());
        up_proj.forward(x, u.view());
        Tensor<float, 2, B> a({rows, inner()});
        activate(g.view(), u.view(), a.view(), compute());
        down_proj.forward(a.view(), y, accumulate);
        cache.g = KeptMatrix<B>(std::move(g), kept.mlp_input_format());
        cache.u = KeptMatrix<B>(std::move(u), kept.mlp_input_format());
    }

    /// Given dy, accumulates weight gradients and writes dx (or adds to it under Accumulate::yes). `x` is the
    /// forward's input, required when the input is not kept (KeepInput::no; ignored otherwise).
    void backward(View<const float, 2, B> dy, Cache& cache, View<float, 2, B> dx,
                  Accumulate accumulate_dx = Accumulate::no, View<const float, 2, B> x = {}) {
        const index_t rows = dy.shape[0], n = inner();
        Tensor<float, 2, B> kept_x;
        x = input_for_backward(cache.x, kept_x, x, rows, "SwiGLU");
        Tensor<float, 2, B> g = cache.g.take("SwiGLU's gate(x)"), u = cache.u.take("SwiGLU's up(x)");
        Tensor<float, 2, B> a({rows, n}), da({rows, n});
        activate(g.view(), u.view(), a.view(), compute());
        down_proj.backward(a.view(), dy, da.view());
        // da -> dg = da * u * silu'(g) (into g), du = da * silu(g) (into u)
        Ops::map(fn::SwiGLUBackward{}, g.view(), u.view(), View<const float, 2, B>(da.view()));
        round_to(compute(), g.view());
        round_to(compute(), u.view());
        gate_proj.backward(x, g.view(), dx, accumulate_dx);
        up_proj.backward(x, u.view(), dx, Accumulate::yes);
        cache = Cache{};
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        gate_proj.visit_params(name + ".gate_proj", f);
        up_proj.visit_params(name + ".up_proj", f);
        down_proj.visit_params(name + ".down_proj", f);
    }
};

}  // namespace moonmoe::nn
