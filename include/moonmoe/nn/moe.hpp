// moonmoe/nn/moe.hpp: the Mixture-of-Experts block: router -> dispatcher -> routed SwiGLU experts as grouped GEMMs
// -> combine, plus the shared expert. One implementation for one process and for expert parallelism: the
// dispatcher (nn/dispatch.hpp), chosen when the layer is built, decides where each pair's row is computed.
//
// Forward: the router picks each token's experts; a dispatch plan sorts the (token, expert) pairs stably by expert
// over the experts the dispatcher plans (RoutingOps::dispatch_plan); each pair's token row is gathered once in plan
// order and dispatched (locally: handed through; expert-parallel: an all-to-all to the experts' ranks); gate and up
// run as grouped GEMMs over the local experts' segments, SwiGLU as a map, down as a grouped GEMM; the outputs go back
// to the plan's order (combine: the reverse exchange) and each token's are summed, weighted by its routing weights,
// in ascending expert order (no atomics: the same sums on every thread count and every layout). The shared expert
// sees every token and is added last (HF: routed sum, then + shared_experts(u)).
// Backward mirrors it: each pair's output gradient and routing weight go to its expert, which computes the weight
// gradients, the row's input gradient and its routing weight's gradient dy . y_e = (dy W_down) . a (so expert
// outputs need not be kept); both come back and land where the token lives, where the router's backward runs.
// Kept for backward (as the activation policy says, nn/kept.hpp: f32, bf16 or FP8 tiles): the router cache, the
// plan and the rows' gate(x) and up(x); the experts' input rows x are re-gathered from the router's copy of u (or
// from the u the caller recomputed and hands to backward, KeepInput::no) when the dispatch is local, and kept
// when it crossed ranks. The down-projections' outputs are never kept.
//
// The experts' weights are stacked, [experts here, I, H] for gate and up and [experts here, H, I] for down;
// visit_params hands out one matrix per expert with its HF name, so io and the optimizers see HF's layout.
// A layer may hold a contiguous range of the experts: with a local dispatcher, tokens routed elsewhere then
// contribute nothing here (expert_rows counts the rows computed); with an expert group's, they are sent there.
//
// Under bf16 compute (nn/precision.hpp) the grouped GEMMs read the stacks' bf16 values (value16) and bf16 copies
// of the dispatched rows (f32 accumulation), and round gate(x), up(x), the SwiGLU product, the expert outputs and
// the combined sum to bf16; the router stays f32 on the bf16 input (as transformers' DeepseekV3TopkRouter).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../tensor/transfer.hpp"
#include "dispatch.hpp"
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
    /// Moves the pairs' rows to the experts and back (nn/dispatch.hpp): local, or over an expert group.
    std::shared_ptr<Dispatcher<B>> dispatcher = local_dispatcher<B>();
    index_t expert_rows = 0;  ///< rows the experts held here computed in the last forward (pairs routed to them)
    NumberFormat compute = NumberFormat::f32;
    ActivationsConfig kept{};  ///< g and u of the pairs (and x, when the dispatcher exchanges) as MLP inputs
    bool keep_input = true;    ///< false: backward is handed u (a recomputed norm output)

    /// Wall-clock seconds spent in each part, summed over forward and backward calls (for reports). `dispatch` is
    /// the part of `experts` spent moving rows: the dispatch plan, gathering inputs, the exchange, combining.
    struct Times {
        double router = 0, experts = 0, shared = 0, dispatch = 0;
    } times;

    /// This rank's pairs sorted by expert over the dispatcher's planned experts (RoutingOps::dispatch_plan), and
    /// the exchange that takes their rows to the experts.
    struct Plan {
        Tensor<index_t, 1, B> row_slot;  ///< [T * K]: the pair (t * K + j) of each row; rows from sent() on unused
        Tensor<index_t, 2, B> slot_row;  ///< [T, K]: the row of each pair, -1 when its expert is not planned here
        ExpertExchange<B> exchange;
    };
    struct Cache {
        typename Router<B>::Cache router;
        Plan plan;
        KeptMatrix<B> x;     ///< at the experts: their input rows, when the dispatcher exchanges (else re-gathered)
        KeptMatrix<B> g, u;  ///< at the experts: gate(x) and up(x) of every row [rows, expert_hidden]
        typename SwiGLU<B>::Cache shared;
        std::size_t bytes() const {
            return router.bytes() + plan.row_slot.bytes() + plan.slot_row.bytes() + plan.exchange.bytes() + x.bytes() +
                   g.bytes() + u.bytes() + shared.bytes();
        }
        template <class F>
        void for_each_kept(F&& f) {
            f(router.u), f(x), f(g), f(u);
            shared.for_each_kept(f);
        }
    };

    static double seconds(std::chrono::steady_clock::time_point since) {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    }

    MoE() = default;
    /// The layer holding experts [first, first + count) (count -1: the rest), their pairs moved by `d` (null:
    /// local).
    MoE(const MoEConfig& c, index_t hidden_, index_t first = 0, index_t count = -1, PrecisionConfig p = {},
        std::shared_ptr<Dispatcher<B>> d = {})
        : cfg(c),
          hidden(hidden_),
          first_expert(first),
          gate(c, hidden_),
          experts(count < 0 ? c.experts - first : count, hidden_, c.expert_hidden, p),
          compute(p.compute) {
        if (c.shared > 0) shared_experts = SwiGLU<B>(hidden_, c.shared * c.expert_hidden, ParamKind::matrix, p);
        set_dispatcher(d ? std::move(d) : local_dispatcher<B>());
    }

    /// Moves the pairs with `d` from the next forward on; refused when `d` cannot serve the experts held here.
    void set_dispatcher(std::shared_ptr<Dispatcher<B>> d) {
        d->check(cfg.experts, first_expert, experts.size());
        dispatcher = std::move(d);
    }
    /// Whether the forward computes every token's output: all experts held here, or the rest over an exchange.
    bool covers_all_experts() const {
        return dispatcher->exchanges() || (first_expert == 0 && experts.size() == cfg.experts);
    }

    void set_precision(const PrecisionConfig& p) {
        compute = p.compute;
        experts.set_precision(p);
        if (cfg.shared > 0) shared_experts.set_precision(p);
    }
    /// How g and u are kept, and whether u is (KeepInput::no: the caller recomputes it and hands it to backward).
    void set_activations(const ActivationsConfig& a, KeepInput keep = KeepInput::yes) {
        kept = a;
        keep_input = gate.keep_input = keep == KeepInput::yes;
        gate.kept_input = kept.value_format();
        shared_experts.set_activations(a, keep);
    }
    void refresh_working() {
        experts.refresh_working();
        if (cfg.shared > 0) shared_experts.refresh_working();
    }

    /// y = moe(u); keeps what backward needs; a training forward counts the routers' load (nn/pass.hpp).
    /// Collective over the expert group when the dispatcher exchanges.
    void forward(View<const float, 2, B> u, View<float, 2, B> y, Cache& c, Pass pass = Pass::training) {
        using backend::Trans;
        using clock = std::chrono::steady_clock;
        const index_t T = u.shape[0], K = cfg.top_k, I = cfg.expert_hidden;
        const auto t0 = clock::now();
        gate.forward(u, c.router, pass);
        times.router += seconds(t0);
        const auto t1 = clock::now();
        c.plan = make_plan(c.router.routing);
        const ExpertExchange<B>& ex = c.plan.exchange;
        Mat send({ex.sent(), hidden});
        if (ex.sent() > 0) Ops::gather_pairs(u, c.plan.row_slot.view(), K, send.view());
        Mat x = dispatcher->dispatch(ex, std::move(send), compute);  // normed rows: bf16 values under bf16
        times.dispatch += seconds(t1);                               // the plan, the gather and the exchange
        const index_t R = ex.received();
        const std::span<const index_t> seg(ex.expert_offsets);
        expert_rows = R;
        Mat g({R, I}), up({R, I});
        expert_product(Trans::yes, x.view(), experts.gate_proj, g.view(), seg);
        expert_product(Trans::yes, x.view(), experts.up_proj, up.view(), seg);
        if (dispatcher->exchanges()) c.x = KeptMatrix<B>(std::move(x), kept.mlp_input_format());
        x = Mat{};
        Mat a({R, I}), out({R, hidden});
        SwiGLU<B>::activate(g.view(), up.view(), a.view(), compute);
        c.g = KeptMatrix<B>(std::move(g), kept.mlp_input_format());
        c.u = KeptMatrix<B>(std::move(up), kept.mlp_input_format());
        expert_product(Trans::yes, a.view(), experts.down_proj, out.view(), seg);
        const auto combine_start = clock::now();
        const Mat back = dispatcher->combine(ex, std::move(out), compute);  // rounded expert outputs
        Ops::fill(y, 0.0f);
        if (T > 0) Ops::combine(back.view(), c.plan.slot_row.view(), c.router.routing.weight.view(), y);
        round_to(compute, y);
        times.dispatch += seconds(combine_start);
        times.experts += seconds(t1);
        const auto t2 = clock::now();
        if (cfg.shared > 0) shared_experts.forward(u, y, c.shared, Accumulate::yes);
        times.shared += seconds(t2);
    }

    /// Accumulates parameter gradients (experts, shared expert, router); writes du (or adds to it under
    /// Accumulate::yes). `u` is the forward's input, required when the input is not kept (KeepInput::no; ignored
    /// otherwise). Collective over the expert group when the dispatcher exchanges.
    void backward(View<const float, 2, B> dy, Cache& c, View<float, 2, B> du, Accumulate accumulate_du = Accumulate::no,
                  View<const float, 2, B> u = {}) {
        using clock = std::chrono::steady_clock;
        Mat kept_u;
        u = input_for_backward(c.router.u, kept_u, u, dy.shape[0], dispatcher->where("MoE"));
        if (accumulate_du == Accumulate::no) Ops::fill(du, 0.0f);
        const auto t0 = clock::now();
        if (cfg.shared > 0) shared_experts.backward(dy, c.shared, du, Accumulate::yes, u);
        times.shared += seconds(t0);
        const auto t1 = clock::now();
        const Routing<B>& r = c.router.routing;
        Mat dweight({r.tokens, r.k});  // pairs computed on other ranks' experts get their gradient from there
        experts_backward(dy, u, c, dweight.view(), du);
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

private:
    /// y[seg e] = a[seg e] op(W_e) over the segments (+= under Accumulate::yes): f32, or bf16 operands (the bf16
    /// copy, a bf16 copy of a) with the result rounded to bf16 as a bf16 product's.
    void expert_product(backend::Trans tw, View<const float, 2, B> a, const Param<3, B>& w, View<float, 2, B> y,
                        std::span<const index_t> offsets, Accumulate accumulate = Accumulate::no) const {
        const bool adds = accumulate == Accumulate::yes;
        if (compute == NumberFormat::f32)
            return Ops::gemm_grouped(tw, 1.0f, a, w.value.view(), adds ? 1.0f : 0.0f, y, offsets);
        // bf16 outputs, rounded as they are written (on a GPU one grouped tensor-core call for all the experts),
        // widened into y exactly, or added to it rounded
        const Tensor<bf16, 2, B> a16 = bf16_copy(a);
        Tensor<bf16, 2, B> out(y.shape);
        Ops::template gemm_grouped<bf16, bf16>(tw, 1.0f, a16.view(), w.value16.view(), 0.0f, out.view(), offsets);
        if (!adds) return Ops::template cast<float, bf16>(out.view(), y);
        Mat wide(y.shape);
        Ops::template cast<float, bf16>(out.view(), wide.view());
        accumulate_rounded(compute, y, View<const float, 2, B>(wide.view()));
    }

    /// dW_e += dY[seg e]^T X[seg e] into the f32 gradient; bf16 operands under the bf16 policy.
    void expert_weight_grad(View<const float, 2, B> dY, View<const float, 2, B> X, Param<3, B>& w,
                            std::span<const index_t> offsets) const {
        if (compute == NumberFormat::f32)
            return Ops::gemm_grouped_weight_grad(1.0f, dY, X, 1.0f, w.grad.view(), offsets);
        Ops::template gemm_grouped_weight_grad<bf16>(1.0f, bf16_copy(dY).view(), bf16_copy(X).view(), 1.0f,
                                                     w.grad.view(), offsets);
    }

    /// The plan over the dispatcher's experts and its exchange (collective when the dispatcher exchanges).
    Plan make_plan(const Routing<B>& r) {
        Plan p;
        const PlannedExperts planned = dispatcher->planned(cfg.experts, first_expert, experts.size());
        Tensor<index_t, 1, B> offsets({planned.count + 1});
        p.row_slot = Tensor<index_t, 1, B>({r.tokens * r.k});
        p.slot_row = Tensor<index_t, 2, B>({r.tokens, r.k});
        Ops::dispatch_plan(r.idx.view(), planned.first, offsets.view(), p.row_slot.view(), p.slot_row.view());
        // The segment offsets on the host: the grouped GEMMs run one GEMM per expert of its row count, and the
        // row counts size the buffers and the exchange.
        p.exchange = dispatcher->exchange(to_host(offsets));
        return p;
    }

    /// The routed experts' backward: each pair's output gradient and routing weight go to its expert; there the
    /// weight gradients, each row's input gradient and its dot dy . y_e (the routing weight's gradient) are
    /// computed and come back; du += each token's input gradients summed in ascending expert order, dweight [T, K]
    /// of the pairs planned here.
    void experts_backward(View<const float, 2, B> dy, View<const float, 2, B> u, Cache& c, View<float, 2, B> dweight,
                          View<float, 2, B> du) {
        using backend::Trans;
        using clock = std::chrono::steady_clock;
        const Plan& p = c.plan;
        const ExpertExchange<B>& ex = p.exchange;
        const index_t T = dy.shape[0], K = cfg.top_k, S = ex.sent(), R = ex.received(), I = cfg.expert_hidden;
        const std::span<const index_t> seg(ex.expert_offsets);
        const auto dispatch_start = clock::now();
        Mat send({S, hidden}), send_w({S, 1});
        if (S > 0) {
            Ops::gather_pairs(dy, p.row_slot.view(), K, send.view());
            Ops::gather_pairs(c.router.routing.weight.template reshape<2>({T * K, 1}), p.row_slot.view(), 1,
                              send_w.view());
        }
        Mat dye = dispatcher->dispatch(ex, std::move(send), compute);  // a gradient passed back: rounded
        const Mat w = dispatcher->dispatch(ex, std::move(send_w), NumberFormat::f32);  // routing weights
        Mat x;
        if (dispatcher->exchanges()) {
            x = c.x.take("the experts' input rows");
        } else {
            x = Mat({R, hidden});
            if (R > 0) Ops::gather_pairs(u, p.row_slot.view(), K, x.view());
        }
        const Tensor<index_t, 1, B> rows = iota(R);
        times.dispatch += seconds(dispatch_start);
        Mat g = c.g.take("the experts' gate(x)"), up = c.u.take("the experts' up(x)");
        Mat a({R, I}), da({R, I}), dots({R, 1});
        SwiGLU<B>::activate(g.view(), up.view(), a.view(), compute);
        // da = w (dy W_down); the unweighted product dotted with a is the routing weight's gradient dy . y_e
        expert_product(Trans::no, dye.view(), experts.down_proj, da.view(), seg);
        if (R > 0) Ops::pair_dot(da.view(), a.view(), rows.view(), dots.view());
        const fn::ScaleByPairWeight by_weight{w.data(), rows.data()};
        Ops::map_indexed(by_weight, da.view());
        Ops::map(fn::SwiGLUBackward{}, g.view(), up.view(), View<const float, 2, B>(da.view()));  // -> dg, du
        Ops::map_indexed(by_weight, dye.view());
        expert_weight_grad(dye.view(), a.view(), experts.down_proj, seg);
        Mat dx({R, hidden});
        expert_weight_grad(g.view(), x.view(), experts.gate_proj, seg);
        expert_product(Trans::no, g.view(), experts.gate_proj, dx.view(), seg);
        expert_weight_grad(up.view(), x.view(), experts.up_proj, seg);
        expert_product(Trans::no, up.view(), experts.up_proj, dx.view(), seg, Accumulate::yes);
        const auto combine_start = clock::now();
        const Mat dx_back = dispatcher->combine(ex, std::move(dx), compute);  // rounded input gradients
        const Mat dots_back = dispatcher->combine(ex, std::move(dots), NumberFormat::f32);
        if (T > 0) {
            Ops::combine(dx_back.view(), p.slot_row.view(), View<const float, 2, B>{}, du);
            // dweight[pair] = the dot of the pair's row, pairs not planned here left at 0 (a scatter by the plan)
            Ops::combine(dots_back.view(), p.slot_row.template reshape<2>({T * K, 1}), View<const float, 2, B>{},
                         dweight.template reshape<2>({T * K, 1}));
        }
        times.dispatch += seconds(combine_start);
    }

    static Tensor<index_t, 1, B> iota(index_t n) {
        std::vector<index_t> v(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) v[std::size_t(i)] = i;
        return to_device<B>(std::span<const index_t>(v));
    }
};

}  // namespace moonmoe::nn
