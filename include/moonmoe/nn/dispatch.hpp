// moonmoe/nn/dispatch.hpp: the MoE's token dispatcher, the seam between routing and the experts (nn/moe.hpp):
//
//   router -> plan -> dispatch -> experts (grouped GEMMs) -> combine -> weighted sum per token
//
// The MoE sorts its (token, expert) pairs by expert into a plan (RoutingOps::dispatch_plan) over the experts the
// dispatcher names (planned()), gathers each pair's token row in plan order, and hands the rows to dispatch(); the
// experts compute on what comes back, segment by segment; combine() returns their outputs to the plan's order,
// where the MoE sums each token's in ascending expert order. Backward runs the same two moves on the gradients.
//
// Two dispatchers:
//   LocalDispatcher            this process computes every planned pair: the plan covers the experts it holds and
//                              dispatch / combine hand the rows through untouched (no copy)
//   parallel::ExpertParallelDispatcher
//                              (parallel/expert_parallel.hpp) the experts are spread over an expert group: the
//                              plan covers all of them, and dispatch / combine are the group's all-to-alls
// One forward's exchange, what the backward reuses, is an ExpertExchange: plain data, so nn needs no
// communication layer (the parallel layer fills it). Megatron-Core's MoETokenDispatcher and torchtitan's
// ExpertParallel have the same shape.
#pragma once

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../config/precision.hpp"
#include "../backend/backend.hpp"

namespace moonmoe::nn {

/// One forward's exchange of rows between a rank's pairs (in its plan's order) and the experts it holds.
template <class B>
struct ExpertExchange {
    std::vector<index_t> send_rows;         ///< rows this rank sends each rank of its group (one entry: local)
    std::vector<index_t> recv_rows;         ///< rows each rank sends this one
    std::vector<index_t> expert_offsets;    ///< [local experts + 1]: local expert e's rows, expert-major
    Tensor<index_t, 1, B> to_expert_major;  ///< expert-major row i = received row to_expert_major[i] (exchanges)
    Tensor<index_t, 1, B> to_source_major;  ///< received row i = expert-major row to_source_major[i] (exchanges)

    index_t received() const { return expert_offsets.empty() ? 0 : expert_offsets.back(); }
    index_t sent() const {
        index_t n = 0;
        for (index_t r : send_rows) n += r;
        return n;
    }
    std::size_t bytes() const { return to_expert_major.bytes() + to_source_major.bytes(); }
};

/// The experts a dispatch plan sorts pairs over: [first, first + count) of the layer's.
struct PlannedExperts {
    index_t first = 0, count = 0;
};

template <class B>
class Dispatcher {
public:
    using Mat = Tensor<float, 2, B>;
    virtual ~Dispatcher() = default;

    /// Refuses a layer whose experts [first, first + count) of `experts` this dispatcher cannot serve.
    virtual void check(index_t experts, index_t first, index_t count) const = 0;
    /// The experts the plan covers, for a layer holding [first, first + count) of `experts`.
    virtual PlannedExperts planned(index_t experts, index_t first, index_t count) const = 0;
    /// The exchange of a plan with these segment offsets (host, planned().count + 1). Collective over an expert
    /// group: every rank calls it once per MoE forward, in the same order.
    virtual ExpertExchange<B> exchange(std::span<const index_t> plan_offsets) = 0;
    /// Rows in plan order [sent, W] -> the rows the local experts compute on, expert-major [received, W]. `values`
    /// is NumberFormat::bf16 when every row holds bf16 values (the bf16 policy's rounded activations): a dispatcher
    /// that moves rows may then send them as bf16, half the bytes, and the rows arrive exactly.
    virtual Mat dispatch(const ExpertExchange<B>& ex, Mat&& rows, NumberFormat values) = 0;
    /// The reverse: expert-major rows [received, W] -> this rank's pairs in plan order [sent, W].
    virtual Mat combine(const ExpertExchange<B>& ex, Mat&& rows, NumberFormat values) = 0;
    /// Whether rows leave this process: the experts' input rows are then kept for backward (sending the tokens
    /// again would cost an all-to-all), not re-gathered from the layer's input.
    virtual bool exchanges() const = 0;
    /// "<what> on <group, rank>": error messages.
    virtual std::string where(const std::string& what) const = 0;
};

/// Every planned pair is computed here, by the experts this layer holds.
template <class B>
class LocalDispatcher final : public Dispatcher<B> {
public:
    using Mat = Tensor<float, 2, B>;
    void check(index_t experts, index_t first, index_t count) const override {
        if (first < 0 || count < 0 || first + count > experts)
            throw std::invalid_argument("MoE: experts [" + std::to_string(first) + ", " +
                                        std::to_string(first + count) + ") of " + std::to_string(experts));
    }
    PlannedExperts planned(index_t, index_t first, index_t count) const override { return {first, count}; }
    ExpertExchange<B> exchange(std::span<const index_t> plan_offsets) override {
        ExpertExchange<B> ex;
        ex.expert_offsets.assign(plan_offsets.begin(), plan_offsets.end());
        ex.send_rows = ex.recv_rows = {ex.received()};
        return ex;
    }
    Mat dispatch(const ExpertExchange<B>&, Mat&& rows, NumberFormat) override { return std::move(rows); }
    Mat combine(const ExpertExchange<B>&, Mat&& rows, NumberFormat) override { return std::move(rows); }
    bool exchanges() const override { return false; }
    std::string where(const std::string& what) const override { return what; }
};

template <class B>
std::shared_ptr<Dispatcher<B>> local_dispatcher() {
    return std::make_shared<LocalDispatcher<B>>();
}

}  // namespace moonmoe::nn
