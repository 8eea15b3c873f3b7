// moonmoe/parallel/moe.hpp: an MoE layer whose routed experts are spread over an expert group (expert
// parallelism), forward and backward, on nn::MoE's parts and parallel/expert_parallel.hpp's exchange.
//
// Each rank of the group holds the same router and shared expert (replicated, their gradients summed by data
// parallelism later) and the experts [rank L, (rank + 1) L) (nn::MoE built with that range). For its own tokens a
// rank routes, plans over all E experts, and sends each (token, expert) pair's row to the expert's rank; the
// experts run their grouped GEMMs on what they received; the outputs come back and combine into each token's
// weighted sum in ascending expert order, as on one process. Backward mirrors it: the output gradient of each pair
// goes to its expert with the pair's routing weight; the expert rank returns the input gradient of each row and the
// row's dot product dy . y_e (the routing weight's gradient), so the router's backward runs where the token lives.
// Every rank issues the same collectives whatever the routing (two exchanges forward: counts, rows; four backward).
// The activation policy is nn::MoE's (set_activations): the received rows, gate(x) and up(x) are kept as MLP inputs
// (f32, bf16 or FP8 tiles), and the router's and shared expert's input u is handed to backward when recomputed.
#pragma once

#include <numeric>

#include "../nn/moe.hpp"
#include "expert_parallel.hpp"

namespace moonmoe::parallel {

template <class B>
struct ExpertParallelMoE {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    struct Cache {
        typename nn::Router<B>::Cache router;
        Tensor<index_t, 1, B> row_slot;  ///< the all-expert plan of this rank's pairs
        Tensor<index_t, 2, B> slot_row;
        ExpertExchange<B> exchange;
        nn::KeptMatrix<B> x, g, u;  ///< at the experts: the received rows, gate(x), up(x)
        typename nn::SwiGLU<B>::Cache shared;
        std::size_t bytes() const {
            return router.bytes() + row_slot.bytes() + slot_row.bytes() + exchange.to_expert_major.bytes() +
                   exchange.to_source_major.bytes() + x.bytes() + g.bytes() + u.bytes() + shared.bytes();
        }
        /// Calls f(KeptMatrix<B>&) on every kept matrix (what activation offload moves).
        template <class F>
        void for_each_kept(F&& f) {
            f(router.u), f(x), f(g), f(u);
            shared.for_each_kept(f);
        }
    };

    /// `moe` holds the experts of `group.rank()`: first_expert = rank * E / ranks, E / ranks of them.
    static void check(const nn::MoE<B>& moe, const Communicator& group) {
        const index_t L = moe.cfg.experts / group.size();
        if (moe.cfg.experts % group.size() != 0 || moe.experts.size() != L || moe.first_expert != group.rank() * L)
            throw std::invalid_argument(group.where("ExpertParallelMoE") + ": the layer holds experts [" +
                                        std::to_string(moe.first_expert) + ", " +
                                        std::to_string(moe.first_expert + moe.experts.size()) + ") of " +
                                        std::to_string(moe.cfg.experts) + ", this rank's share is [" +
                                        std::to_string(group.rank() * L) + ", " + std::to_string((group.rank() + 1) * L) +
                                        ")");
    }

    static void forward(nn::MoE<B>& moe, Communicator& group, View<const float, 2, B> u, View<float, 2, B> y, Cache& c) {
        using backend::Trans;
        check(moe, group);
        const index_t T = u.shape[0], K = moe.cfg.top_k, E = moe.cfg.experts, I = moe.cfg.expert_hidden;
        moe.gate.forward(u, c.router);
        Tensor<index_t, 1, B> offsets({E + 1});
        c.row_slot = Tensor<index_t, 1, B>({T * K});
        c.slot_row = Tensor<index_t, 2, B>({T, K});
        Ops::dispatch_plan(c.router.routing.idx.view(), 0, offsets.view(), c.row_slot.view(), c.slot_row.view());
        // Host sync: the segment sizes decide what every rank sends and receives.
        c.exchange = plan_exchange<B>(group, to_host(offsets));
        Mat send({T * K, moe.hidden});
        if (T > 0) Ops::gather_pairs(u, c.row_slot.view(), K, send.view());
        Mat x = dispatch_rows(group, c.exchange, send.view());
        send = Mat{};
        const index_t R = c.exchange.received();
        const std::span<const index_t> seg(c.exchange.expert_offsets);
        Mat g({R, I}), up({R, I});
        Mat a({R, I}), out({R, moe.hidden});
        moe.expert_product(Trans::yes, x.view(), moe.experts.gate_proj, g.view(), seg);
        moe.expert_product(Trans::yes, x.view(), moe.experts.up_proj, up.view(), seg);
        nn::SwiGLU<B>::activate(g.view(), up.view(), a.view(), moe.compute);
        c.x = nn::KeptMatrix<B>(std::move(x), moe.kept.mlp_input);
        c.g = nn::KeptMatrix<B>(std::move(g), moe.kept.mlp_input);
        c.u = nn::KeptMatrix<B>(std::move(up), moe.kept.mlp_input);
        moe.expert_product(Trans::yes, a.view(), moe.experts.down_proj, out.view(), seg);
        const Mat back = return_rows(group, c.exchange, out.view());
        Ops::fill(y, 0.0f);
        Ops::combine(back.view(), c.slot_row.view(), c.router.routing.weight.view(), y);
        nn::round_to(moe.compute, y);
        if (moe.cfg.shared > 0) moe.shared_experts.forward(u, y, c.shared, true);
    }

    /// `u` is the forward's input, required when the layer does not keep it (nn::MoE::keep_input false).
    static void backward(nn::MoE<B>& moe, Communicator& group, View<const float, 2, B> dy, Cache& c, View<float, 2, B> du,
                         View<const float, 2, B> u = {}) {
        using backend::Trans;
        const index_t T = dy.shape[0], K = moe.cfg.top_k, R = c.exchange.received(), I = moe.cfg.expert_hidden;
        const std::span<const index_t> seg(c.exchange.expert_offsets);
        Mat kept_u;
        u = nn::input_for_backward(c.router.u, kept_u, u, T, group.where("ExpertParallelMoE"));
        Ops::fill(du, 0.0f);
        if (moe.cfg.shared > 0) moe.shared_experts.backward(dy, c.shared, du, true, u);
        // to the experts: each pair's output gradient, and its routing weight (one column)
        Mat send({T * K, moe.hidden}), send_w({T * K, 1});
        if (T > 0) {
            Ops::gather_pairs(dy, c.row_slot.view(), K, send.view());
            Ops::gather_pairs(c.router.routing.weight.template reshape<2>({T * K, 1}), c.row_slot.view(), 1,
                              send_w.view());
        }
        Mat dye = dispatch_rows(group, c.exchange, send.view());
        const Mat w = dispatch_rows(group, c.exchange, send_w.view());
        const Tensor<index_t, 1, B> rows = iota(R);
        const Mat x = c.x.take("the experts' received rows");
        Mat g = c.g.take("the experts' gate(x)"), up = c.u.take("the experts' up(x)");
        Mat a({R, I}), da({R, I}), dots({R, 1});
        nn::SwiGLU<B>::activate(g.view(), up.view(), a.view(), moe.compute);
        moe.expert_product(Trans::no, dye.view(), moe.experts.down_proj, da.view(), seg);
        if (R > 0) Ops::pair_dot(da.view(), a.view(), rows.view(), dots.view());
        const fn::ScaleByPairWeight by_weight{w.data(), rows.data()};
        Ops::map_indexed(by_weight, da.view());
        Ops::map(fn::SwiGLUBackward{}, g.view(), up.view(), View<const float, 2, B>(da.view()));  // -> dg, du
        Ops::map_indexed(by_weight, dye.view());
        moe.expert_weight_grad(dye.view(), a.view(), moe.experts.down_proj, seg);
        Mat dx({R, moe.hidden});
        moe.expert_weight_grad(g.view(), x.view(), moe.experts.gate_proj, seg);
        moe.expert_product(Trans::no, g.view(), moe.experts.gate_proj, dx.view(), seg);
        moe.expert_weight_grad(up.view(), x.view(), moe.experts.up_proj, seg);
        moe.expert_product(Trans::no, up.view(), moe.experts.up_proj, dx.view(), seg, true);
        // back to the tokens: the input gradients and the routing weights' gradients
        const Mat dx_back = return_rows(group, c.exchange, dx.view());
        const Mat dots_back = return_rows(group, c.exchange, dots.view());
        Mat dweight({T, K});
        if (T > 0) {
            Ops::combine(dx_back.view(), c.slot_row.view(), View<const float, 2, B>{}, du);
            // dweight[pair] = the dot of the pair's row: scatter by the plan (every pair has a row here)
            Ops::gather_pairs(dots_back.view(), c.slot_row.template reshape<1>({T * K}), 1,
                              dweight.template reshape<2>({T * K, 1}));
        }
        moe.gate.backward(dweight.view(), c.router, du, u);
        c = Cache{};
    }

private:
    static Tensor<index_t, 1, B> iota(index_t n) {
        std::vector<index_t> v(static_cast<std::size_t>(n));
        std::iota(v.begin(), v.end(), index_t(0));
        return to_device<B>(std::span<const index_t>(v));
    }
};

}  // namespace moonmoe::parallel
