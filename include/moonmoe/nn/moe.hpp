// moonmoe/nn/moe.hpp: the Mixture-of-Experts block: router, routed SwiGLU experts computed as grouped GEMMs over
// the pairs sorted by expert, and the shared expert.
//
// Forward: permute -> grouped GEMM -> combine. A dispatch plan sorts the (token, expert) pairs stably by expert
// (RoutingOps::dispatch_plan); each pair's token row is gathered once into one buffer [pairs, hidden]; gate and up
// run as grouped GEMMs over the experts' segments of that buffer, SwiGLU as a map, down as a grouped GEMM; combine
// sums each token's expert outputs, weighted by its routing weights, in ascending expert order (no atomics: the
// same sums on every thread count). The shared expert sees every token and is added last (HF: routed sum, then +
// shared_experts(u)). Backward mirrors it and keeps the router cache, the plan and the pairs' gate(x) and up(x)
// (as the activation policy says, nn/kept.hpp: f32, bf16 or FP8 tiles); x is re-gathered from the router's copy of
// u, or from the u the caller recomputed and hands to backward (keep_input false). The down-projections' outputs
// are never kept. The routing weight's gradient is dy . y_e = (dy W_down) . a per
// pair, so expert outputs need not be kept.
//
// The experts' weights are stacked, [experts here, I, H] for gate and up and [experts here, H, I] for down;
// visit_params hands out one matrix per expert with its HF name, so io and the optimizers see HF's layout.
// An instance may hold a contiguous range of the experts (one expert-parallel rank): the plan then has one segment
// per local expert, and tokens routed elsewhere contribute nothing here and are counted in `skipped_assignments`.
//
// Under bf16 compute (nn/precision.hpp) the grouped GEMMs read the stacks' bf16 values (value16) and bf16 copies
// of the dispatched rows (f32 accumulation), and round gate(x), up(x), the SwiGLU product, the expert outputs and
// the combined sum to bf16; the router stays f32 on the bf16 input (as transformers' DeepseekV3TopkRouter).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "../tensor/transfer.hpp"
#include "router.hpp"
#include "swiglu.hpp"

namespace moonmoe::nn {

/// The routed experts of one rank, stacked: expert e's SwiGLU is down_proj[e] (silu(gate_proj[e] x) * up_proj[e] x),
/// gate_proj and up_proj [count, inner, hidden], down_proj [count, hidden, inner].
template <class B = cpu>
struct StackedExperts {
    Param<3, B> gate_proj, up_proj, down_proj;

    StackedExperts() = default;
    StackedExperts(index_t count, index_t hidden, index_t inner, PrecisionConfig p = {})
        : gate_proj({count, inner, hidden}, ParamKind::expert_matrix, p.weights),
          up_proj({count, inner, hidden}, ParamKind::expert_matrix, p.weights),
          down_proj({count, hidden, inner}, ParamKind::expert_matrix, p.weights) {
        set_precision(p);
    }

    index_t size() const { return gate_proj.size(0); }

    void set_precision(const PrecisionConfig& p) {
        for (Param<3, B>* w : {&gate_proj, &up_proj, &down_proj}) w->set_precision(p);
    }
    void refresh_working() {
        for (Param<3, B>* w : {&gate_proj, &up_proj, &down_proj}) w->refresh();
    }

    /// One ParamRef per expert and matrix, pointing into the stacks, named prefix.<first + e>.gate_proj.weight etc.
    void visit_params(const std::string& prefix, index_t first, const ParamVisitor& f) {
        for (index_t e = 0; e < size(); ++e) {
            const std::string name = prefix + "." + std::to_string(first + e);
            visit_matrix(name + ".gate_proj.weight", gate_proj, e, f);
            visit_matrix(name + ".up_proj.weight", up_proj, e, f);
            visit_matrix(name + ".down_proj.weight", down_proj, e, f);
        }
    }

private:
    static void visit_matrix(const std::string& name, Param<3, B>& p, index_t e, const ParamVisitor& f) {
        const index_t rows = p.size(1), cols = p.size(2);
        visit_slice(name, p, {rows, cols}, e * rows * cols, f);
    }
};

template <class B = cpu>
struct MoE {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    MoEConfig cfg{};
    index_t hidden = 0;
    index_t first_expert = 0;  ///< experts [first_expert, first_expert + experts.size()) live here
    Router<B> gate;
    StackedExperts<B> experts;
    SwiGLU<B> shared_experts;
    index_t skipped_assignments = 0;  ///< (token, expert) pairs of the last forward whose expert lives elsewhere
    NumberFormat compute = NumberFormat::f32;
    KeptFormats kept;        ///< g and u of the pairs as MLP inputs
    bool keep_input = true;  ///< false: backward is handed u (a recomputed norm output)

    /// Wall-clock seconds spent in each part, summed over forward and backward calls (for reports). `dispatch` is
    /// the part of `experts` spent moving rows: the dispatch plan, gathering inputs, combining outputs.
    struct Times {
        double router = 0, experts = 0, shared = 0, dispatch = 0;
    } times;

    /// The pairs of this rank's experts sorted by expert (RoutingOps::dispatch_plan).
    struct Plan {
        std::vector<index_t> offsets;   ///< on the host: expert e's rows are [offsets[e], offsets[e + 1])
        Tensor<index_t, 1, B> row_slot;  ///< [T * K]: the pair (t * K + j) of each row; rows from pairs() on unused
        Tensor<index_t, 2, B> slot_row;  ///< [T, K]: the row of each pair, -1 when its expert lives elsewhere
        index_t pairs() const { return offsets.empty() ? 0 : offsets.back(); }
    };
    struct Cache {
        typename Router<B>::Cache router;
        Plan plan;
        KeptMatrix<B> g, u;  ///< gate(x) and up(x) of every row [pairs, expert_hidden]
        typename SwiGLU<B>::Cache shared;
        std::size_t bytes() const {
            return router.bytes() + plan.row_slot.bytes() + plan.slot_row.bytes() + g.bytes() + u.bytes() +
                   shared.bytes();
        }
        template <class F>
        void for_each_kept(F&& f) {
            f(router.u), f(g), f(u);
            shared.for_each_kept(f);
        }
    };

    static double seconds(std::chrono::steady_clock::time_point since) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    }

    MoE() = default;
    MoE(const MoEConfig& c, index_t hidden_, index_t first = 0, index_t count = -1, PrecisionConfig p = {})
        : cfg(c), hidden(hidden_), first_expert(first), gate(c, hidden_),
          experts(count < 0 ? c.experts - first : count, hidden_, c.expert_hidden, p), compute(p.compute) {
        if (c.shared > 0) shared_experts = SwiGLU<B>(hidden_, c.shared * c.expert_hidden, ParamKind::matrix, p);
    }

    void set_precision(const PrecisionConfig& p) {
        compute = p.compute;
        experts.set_precision(p);
        if (cfg.shared > 0) shared_experts.set_precision(p);
    }
    /// How g and u are kept, and whether u is (false: the caller recomputes it and hands it to backward).
    void set_activations(const ActivationConfig& a, bool keep_input_ = true) {
        kept = KeptFormats(a);
        keep_input = gate.keep_input = keep_input_;
        gate.kept_input = kept.value;
        shared_experts.set_activations(a, keep_input_);
    }
    void refresh_working() {
        experts.refresh_working();
        if (cfg.shared > 0) shared_experts.refresh_working();
    }

    /// y = moe(u); keeps what backward needs.
    void forward(View<const float, 2, B> u, View<float, 2, B> y, Cache& c) {
        using backend::Trans;
        using clock = std::chrono::steady_clock;
        const index_t K = cfg.top_k, I = cfg.expert_hidden;
        const auto t0 = clock::now();
        gate.forward(u, c.router);
        times.router += seconds(t0);
        const auto t1 = clock::now();
        c.plan = make_plan(c.router.routing);
        const Plan& p = c.plan;
        const index_t P = p.pairs();
        Mat x({P, hidden});
        Ops::gather_pairs(u, p.row_slot.view(), K, x.view());
        times.dispatch += seconds(t1);  // the plan and the gather
        Mat g({P, I}), up({P, I});
        expert_product(Trans::yes, x.view(), experts.gate_proj, g.view(), p.offsets);
        expert_product(Trans::yes, x.view(), experts.up_proj, up.view(), p.offsets);
        x = Mat{};
        Mat a({P, I}), out({P, hidden});
        SwiGLU<B>::activate(g.view(), up.view(), a.view(), compute);
        c.g = KeptMatrix<B>(std::move(g), kept.mlp_input);
        c.u = KeptMatrix<B>(std::move(up), kept.mlp_input);
        expert_product(Trans::yes, a.view(), experts.down_proj, out.view(), p.offsets);
        const auto combine_start = clock::now();
        Ops::fill(y, 0.0f);
        Ops::combine(out.view(), p.slot_row.view(), c.router.routing.weight.view(), y);
        round_to(compute, y);
        times.dispatch += seconds(combine_start);
        times.experts += seconds(t1);
        const auto t2 = clock::now();
        if (cfg.shared > 0) shared_experts.forward(u, y, c.shared, true);
        times.shared += seconds(t2);
    }

    /// Accumulates parameter gradients (experts, shared expert, router); writes du (or adds when accumulate_du).
    /// `u` is the forward's input, required when keep_input is false (ignored otherwise).
    void backward(View<const float, 2, B> dy, Cache& c, View<float, 2, B> du, bool accumulate_du = false,
                  View<const float, 2, B> u = {}) {
        using clock = std::chrono::steady_clock;
        Mat kept_u;
        u = input_for_backward(c.router.u, kept_u, u, dy.shape[0], "MoE");
        if (!accumulate_du) Ops::fill(du, 0.0f);
        const auto t0 = clock::now();
        if (cfg.shared > 0) shared_experts.backward(dy, c.shared, du, true, u);
        times.shared += seconds(t0);
        const auto t1 = clock::now();
        const Routing<B>& r = c.router.routing;
        Mat dweight({r.tokens, r.k});  // pairs routed elsewhere get their gradient on their own rank
        if (c.plan.pairs() > 0) experts_backward(dy, u, c, dweight.view(), du);
        times.experts += seconds(t1);
        const auto t2 = clock::now();
        gate.backward(dweight.view(), c.router, du, u);
        times.router += seconds(t2);
        c = Cache{};
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        gate.visit_params(name + ".gate", f);
        experts.visit_params(name + ".experts", first_expert, f);
        if (cfg.shared > 0) shared_experts.visit_params(name + ".shared_experts", f);
    }

    // ---- the expert computation over given segments (also what expert parallelism runs, parallel/moe.hpp) ----

    /// y[seg e] = a[seg e] op(W_e) over the plan's segments (+= when accumulate): f32, or bf16 operands (the bf16
    /// copy, a bf16 copy of a) with the result rounded to bf16 as a bf16 product's.
    void expert_product(backend::Trans tw, View<const float, 2, B> a, const Param<3, B>& w, View<float, 2, B> y,
                        std::span<const index_t> offsets, bool accumulate = false) const {
        if (compute == NumberFormat::f32)
            return Ops::gemm_grouped(tw, 1.0f, a, w.value.view(), accumulate ? 1.0f : 0.0f, y, offsets);
        const Tensor<bf16, 2, B> a16 = bf16_copy(a);
        Mat t;
        if (accumulate) t = Mat(y.shape);
        const View<float, 2, B> out = accumulate ? t.view() : y;
        Ops::template gemm_grouped<bf16>(tw, 1.0f, a16.view(), w.value16.view(), 0.0f, out, offsets);
        round_to(compute, out);
        if (accumulate) accumulate_rounded(compute, y, View<const float, 2, B>(out));
    }

    /// dW_e += dY[seg e]^T X[seg e] into the f32 gradient; bf16 operands under the bf16 policy.
    void expert_weight_grad(View<const float, 2, B> dY, View<const float, 2, B> X, Param<3, B>& w,
                            std::span<const index_t> offsets) const {
        if (compute == NumberFormat::f32) return Ops::gemm_grouped_weight_grad(1.0f, dY, X, 1.0f, w.grad.view(), offsets);
        Ops::template gemm_grouped_weight_grad<bf16>(1.0f, bf16_copy(dY).view(), bf16_copy(X).view(), 1.0f,
                                                     w.grad.view(), offsets);
    }

private:
    /// The dispatch plan of this rank's experts; sets skipped_assignments.
    Plan make_plan(const Routing<B>& r) {
        Plan p;
        Tensor<index_t, 1, B> offsets({experts.size() + 1});
        p.row_slot = Tensor<index_t, 1, B>({r.tokens * r.k});
        p.slot_row = Tensor<index_t, 2, B>({r.tokens, r.k});
        Ops::dispatch_plan(r.idx.view(), first_expert, offsets.view(), p.row_slot.view(), p.slot_row.view());
        // The segment offsets on the host: the grouped GEMMs run one GEMM per expert of its row count, and the
        // pair count sizes the dispatch buffers.
        p.offsets = to_host(offsets);
        skipped_assignments = r.tokens * r.k - p.pairs();
        return p;
    }

    /// The routed experts' backward over the plan's rows: weight gradients, dweight [T, K] of this rank's pairs,
    /// du += each token's dx summed in ascending expert order.
    void experts_backward(View<const float, 2, B> dy, View<const float, 2, B> u, Cache& c, View<float, 2, B> dweight,
                          View<float, 2, B> du) {
        using backend::Trans;
        using clock = std::chrono::steady_clock;
        const Plan& p = c.plan;
        const index_t P = p.pairs(), K = cfg.top_k, I = cfg.expert_hidden;
        const auto gather_start = clock::now();
        Mat x({P, hidden}), dye({P, hidden});
        Ops::gather_pairs(u, p.row_slot.view(), K, x.view());
        Ops::gather_pairs(dy, p.row_slot.view(), K, dye.view());
        times.dispatch += seconds(gather_start);
        Mat g = c.g.take("the experts' gate(x)"), up = c.u.take("the experts' up(x)");
        Mat a({P, I}), da({P, I});
        SwiGLU<B>::activate(g.view(), up.view(), a.view(), compute);
        // da = w (dy W_down); the unweighted product dotted with a is the routing weight's gradient dy . y_e
        expert_product(Trans::no, dye.view(), experts.down_proj, da.view(), p.offsets);
        Ops::pair_dot(da.view(), a.view(), p.row_slot.view(), dweight);
        const fn::ScaleByPairWeight by_weight{c.router.routing.weight.data(), p.row_slot.data()};
        Ops::map_indexed(by_weight, da.view());
        Ops::map(fn::SwiGLUBackward{}, g.view(), up.view(), View<const float, 2, B>(da.view()));  // -> dg, du
        Ops::map_indexed(by_weight, dye.view());
        expert_weight_grad(dye.view(), a.view(), experts.down_proj, p.offsets);
        Mat dx({P, hidden});
        expert_weight_grad(g.view(), x.view(), experts.gate_proj, p.offsets);
        expert_product(Trans::no, g.view(), experts.gate_proj, dx.view(), p.offsets);
        expert_weight_grad(up.view(), x.view(), experts.up_proj, p.offsets);
        expert_product(Trans::no, up.view(), experts.up_proj, dx.view(), p.offsets, true);
        const auto scatter_start = clock::now();
        Ops::combine(dx.view(), p.slot_row.view(), View<const float, 2, B>{}, du);
        times.dispatch += seconds(scatter_start);
    }
};

}  // namespace moonmoe::nn
