// moonmoe/nn/moe.hpp: the Mixture-of-Experts block: router, routed SwiGLU experts computed grouped by expert,
// and the shared expert.
//
// Forward, per expert e in order: gather the rows of the tokens routed to e, one GEMM each for gate and up, SwiGLU,
// one GEMM for down, then a weighted scatter-add into the output; the shared expert sees every token and is added
// last (HF: routed sum, then + shared_experts(u)). Backward keeps the router cache and, per expert, the token
// list with gate(x) and up(x); x is re-gathered from the router's copy of u. The routing weight's gradient is
// dy.y_e = (dy W_down) . a, so expert outputs need not be kept.
//
// An instance may hold a contiguous range of the experts (one expert-parallel rank); tokens routed elsewhere
// contribute nothing here and are counted in `skipped_assignments`.
#pragma once

#include <chrono>
#include <vector>

#include "router.hpp"
#include "swiglu.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct MoE {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    MoEConfig cfg{};
    index_t hidden = 0;
    index_t first_expert = 0;  ///< experts [first_expert, first_expert + experts.size()) live here
    Router<B> gate;
    std::vector<SwiGLU<B>> experts;
    SwiGLU<B> shared_experts;
    index_t skipped_assignments = 0;  ///< (token, expert) pairs of the last forward whose expert lives elsewhere

    /// Wall-clock seconds spent in each part, summed over forward and backward calls (for reports). `dispatch` is
    /// the part of `experts` spent moving rows: sorting pairs by expert, gathering inputs, scattering outputs.
    struct Times {
        double router = 0, experts = 0, shared = 0, dispatch = 0;
    } times;

    struct ExpertCache {
        std::vector<index_t> tokens;  ///< rows routed to this expert, ascending
        std::vector<index_t> slots;   ///< t * K + j of each row, to find its routing weight
        Mat g, u;
    };
    struct Cache {
        typename Router<B>::Cache router;
        std::vector<ExpertCache> experts;
        typename SwiGLU<B>::Cache shared;
    };

    static double seconds(std::chrono::steady_clock::time_point since) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    }

    MoE() = default;
    MoE(const MoEConfig& c, index_t hidden_, index_t first = 0, index_t count = -1)
        : cfg(c), hidden(hidden_), first_expert(first), gate(c, hidden_) {
        const index_t n = count < 0 ? c.experts - first : count;
        experts.reserve(static_cast<std::size_t>(n));
        for (index_t e = 0; e < n; ++e) experts.emplace_back(hidden_, c.expert_hidden, ParamKind::expert_matrix);
        if (c.shared > 0) shared_experts = SwiGLU<B>(hidden_, c.shared * c.expert_hidden);
    }

    /// y = moe(u); keeps what backward needs.
    void forward(View<const float, 2, B> u, View<float, 2, B> y, Cache& c) {
        using clock = std::chrono::steady_clock;
        const index_t T = u.shape[0], K = cfg.top_k;
        const auto t0 = clock::now();
        gate.forward(u, c.router);
        times.router += seconds(t0);
        const auto t1 = clock::now();
        const Routing& r = c.router.routing;
        const index_t local = index_t(experts.size());
        c.experts.clear();
        c.experts.resize(static_cast<std::size_t>(local));
        skipped_assignments = 0;
        for (index_t t = 0; t < T; ++t)
            for (index_t j = 0; j < K; ++j) {
                const index_t e = r.idx[t * K + j] - first_expert;
                if (e < 0 || e >= local) { ++skipped_assignments; continue; }
                c.experts[e].tokens.push_back(t);
                c.experts[e].slots.push_back(t * K + j);
            }
        Ops::for_each(T, [&, y](index_t t) { for (index_t j = 0; j < hidden; ++j) y(t, j) = 0.0f; });
        times.dispatch += seconds(t1);  // sorting the pairs by expert
        for (index_t e = 0; e < local; ++e) {
            ExpertCache& ec = c.experts[e];
            const index_t n = index_t(ec.tokens.size());
            if (n == 0) continue;
            const auto gather_start = clock::now();
            Mat x({n, hidden}), a({n, cfg.expert_hidden}), out({n, hidden});
            Ops::gather_rows(c.router.u.view(), ec.tokens.data(), x.view());
            times.dispatch += seconds(gather_start);
            ec.g = Mat({n, cfg.expert_hidden});
            ec.u = Mat({n, cfg.expert_hidden});
            experts[e].gate_proj.forward(x.view(), ec.g.view());
            experts[e].up_proj.forward(x.view(), ec.u.view());
            SwiGLU<B>::activate(ec.g.view(), ec.u.view(), a.view());
            experts[e].down_proj.forward(a.view(), out.view());
            const auto scatter_start = clock::now();
            std::vector<float> w(static_cast<std::size_t>(n));
            for (index_t i = 0; i < n; ++i) w[i] = r.weight[ec.slots[i]];
            Ops::scatter_add_rows(out.view(), ec.tokens.data(), w.data(), y);
            times.dispatch += seconds(scatter_start);
        }
        times.experts += seconds(t1);
        const auto t2 = clock::now();
        if (cfg.shared > 0) shared_experts.forward(u, y, c.shared, true);
        times.shared += seconds(t2);
    }

    /// Accumulates parameter gradients (experts, shared expert, router); writes du (or adds when accumulate_du).
    void backward(View<const float, 2, B> dy, Cache& c, View<float, 2, B> du, bool accumulate_du = false) {
        using backend::Trans;
        using clock = std::chrono::steady_clock;
        const index_t T = dy.shape[0], I = cfg.expert_hidden;
        if (!accumulate_du) Ops::for_each(T, [&, du](index_t t) { for (index_t j = 0; j < hidden; ++j) du(t, j) = 0.0f; });
        const auto t0 = clock::now();
        if (cfg.shared > 0) shared_experts.backward(dy, c.shared, du, true);
        times.shared += seconds(t0);
        const auto t1 = clock::now();
        const Routing& r = c.router.routing;
        std::vector<float> dweight(r.weight.size(), 0.0f);
        for (index_t e = 0; e < index_t(experts.size()); ++e) {
            ExpertCache& ec = c.experts[e];
            const index_t n = index_t(ec.tokens.size());
            if (n == 0) continue;
            SwiGLU<B>& ex = experts[e];
            const auto gather_start = clock::now();
            Mat x({n, hidden}), dye({n, hidden}), t({n, I}), a({n, I}), dx({n, hidden});
            Ops::gather_rows(c.router.u.view(), ec.tokens.data(), x.view());
            Ops::gather_rows(dy, ec.tokens.data(), dye.view());
            times.dispatch += seconds(gather_start);
            SwiGLU<B>::activate(ec.g.view(), ec.u.view(), a.view());
            Ops::gemm(Trans::no, Trans::no, 1.0f, dye.view(), ex.down_proj.weight.value.view(), 0.0f, t.view());
            Ops::for_each(n, [&](index_t i) {
                const float w = r.weight[ec.slots[i]];
                double dot = 0.0;
                for (index_t j = 0; j < I; ++j) {
                    dot += double(t(i, j)) * a(i, j);
                    const float da = w * t(i, j), g = ec.g(i, j), u = ec.u(i, j);
                    ec.g(i, j) = da * u * fn::silu_grad(g);  // dg
                    ec.u(i, j) = da * fn::silu(g);           // du
                }
                dweight[ec.slots[i]] = float(dot);
                for (index_t j = 0; j < hidden; ++j) dye(i, j) *= w;
            });
            Ops::gemm(Trans::yes, Trans::no, 1.0f, dye.view(), a.view(), 1.0f, ex.down_proj.weight.grad.view());
            ex.gate_proj.backward(x.view(), ec.g.view(), dx.view());
            ex.up_proj.backward(x.view(), ec.u.view(), dx.view(), true);
            const auto scatter_start = clock::now();
            Ops::scatter_add_rows(dx.view(), ec.tokens.data(), nullptr, du);
            times.dispatch += seconds(scatter_start);
        }
        times.experts += seconds(t1);
        const auto t2 = clock::now();
        gate.backward(dweight, c.router, du);
        times.router += seconds(t2);
        c = Cache{};
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        gate.visit_params(name + ".gate", f);
        for (index_t e = 0; e < index_t(experts.size()); ++e)
            experts[e].visit_params(name + ".experts." + std::to_string(first_expert + e), f);
        if (cfg.shared > 0) shared_experts.visit_params(name + ".shared_experts", f);
    }
};

}  // namespace moonmoe::nn
