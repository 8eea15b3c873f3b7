// moonmoe/parallel/expert_parallel.hpp: expert parallelism's dispatch and combine over a Communicator, on the
// backend's routing primitives (backend/routing.hpp).
//
// The EP ranks of an expert group hold contiguous ranges of the experts (rank d: experts [d L, (d + 1) L), L = E /
// EP). A rank's dispatch plan over all E experts (RoutingOps::dispatch_plan with first 0) sorts its (token, expert)
// pairs stably by expert; since the ranks hold contiguous ranges, that order is also by destination rank, so a rank
// boundary is just another segment boundary of the plan, and gather_pairs fills the send buffer in the order
// all-to-all-v wants. Then:
//   dispatch  1. counts: every rank tells every other how many rows it sends each of its L experts (an all-to-all
//                of L counts per pair of ranks: the same collectives whatever the routing, empty blocks included)
//             2. the rows: all-to-all-v; they arrive as [source rank][local expert]
//             3. reorder to [local expert][source rank] (one gather): the segments of the grouped GEMMs, each
//                expert's rows by source rank, then token order
//   return    the reverse: back to [source rank][local expert], all-to-all-v back, so each rank holds the expert
//             outputs of its own pairs in its plan's row order; RoutingOps::combine then takes each token's weighted
//             sum in ascending expert order (no atomics, the same sums as one process).
// The backward is the mirror: dispatch the output gradients, return the input gradients. Rows that hold bf16 values
// (under the bf16 policy: the experts' inputs and outputs and the gradients of both; nn/moe.hpp says which) cross as
// bf16, half the bytes and exact; the routing weights and the dots (f32 sums) stay f32.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../backend/backend.hpp"
#include "../config/precision.hpp"
#include "../nn/dispatch.hpp"
#include "../tensor/transfer.hpp"
#include "comm.hpp"

namespace moonmoe::parallel {

/// One forward's exchange of one MoE layer on one rank: the plain record nn's dispatcher contract defines.
using nn::ExpertExchange;

/// The exchange of a rank whose dispatch plan over all E experts has segment offsets `plan_offsets` (E + 1, host).
/// Collective over `group` (every rank calls it, in the same order).
template <class B>
ExpertExchange<B> plan_exchange(Communicator& group, std::span<const index_t> plan_offsets) {
    const index_t ranks = group.size(), experts = index_t(plan_offsets.size()) - 1;
    if (experts < ranks || experts % ranks != 0)
        throw comm_error(group.where("plan_exchange") + ": " + std::to_string(experts) +
                         " experts do not split "
                         "evenly over " +
                         std::to_string(ranks) + " expert-parallel ranks");
    const index_t L = experts / ranks;
    ExpertExchange<B> ex;
    // what this rank sends each rank, per expert there: the plan's segments
    std::vector<index_t> per_expert(static_cast<std::size_t>(experts)), blocks(static_cast<std::size_t>(ranks), L);
    for (index_t e = 0; e < experts; ++e)
        per_expert[std::size_t(e)] = plan_offsets[std::size_t(e + 1)] - plan_offsets[std::size_t(e)];
    std::vector<index_t> incoming(static_cast<std::size_t>(experts));  // [source rank][local expert]
    group.host_all_to_all_v(std::span<const index_t>(per_expert), blocks, std::span<index_t>(incoming), blocks);
    ex.send_rows.assign(std::size_t(ranks), 0);
    ex.recv_rows.assign(std::size_t(ranks), 0);
    for (index_t d = 0; d < ranks; ++d)
        for (index_t e = 0; e < L; ++e) {
            ex.send_rows[std::size_t(d)] += per_expert[std::size_t(d * L + e)];
            ex.recv_rows[std::size_t(d)] += incoming[std::size_t(d * L + e)];
        }
    // received rows are [source][expert]; the grouped GEMMs want [expert][source]
    std::vector<index_t> source_start(static_cast<std::size_t>(ranks + 1), 0);
    for (index_t s = 0; s < ranks; ++s)
        source_start[std::size_t(s + 1)] = source_start[std::size_t(s)] + ex.recv_rows[std::size_t(s)];
    std::vector<index_t> to_expert, to_source(static_cast<std::size_t>(source_start.back()));
    ex.expert_offsets.assign(1, 0);
    for (index_t e = 0; e < L; ++e) {
        for (index_t s = 0; s < ranks; ++s) {
            index_t first = source_start[std::size_t(s)];
            for (index_t f = 0; f < e; ++f) first += incoming[std::size_t(s * L + f)];
            for (index_t i = 0; i < incoming[std::size_t(s * L + e)]; ++i) {
                to_source[std::size_t(first + i)] = index_t(to_expert.size());
                to_expert.push_back(first + i);
            }
        }
        ex.expert_offsets.push_back(index_t(to_expert.size()));
    }
    ex.to_expert_major = to_device<B>(std::span<const index_t>(to_expert));
    ex.to_source_major = to_device<B>(std::span<const index_t>(to_source));
    return ex;
}

namespace ep_detail {

/// Element counts of row blocks of `width` values.
inline std::vector<index_t> times(const std::vector<index_t>& rows, index_t width) {
    std::vector<index_t> out(rows);
    for (index_t& r : out) r *= width;
    return out;
}

}  // namespace ep_detail

/// The staging buffers of dispatch / return, kept between calls: a layer that exchanges every step reuses them
/// instead of allocating (and zeroing, and faulting in) a fresh block of rows x hidden floats each time. The bf16
/// pair carries rows whose values are bf16 (the bf16 policy's activations) over the wire at half the bytes.
template <class B>
struct ExchangeBuffers {
    Tensor<float, 1, B> staging;
    Tensor<bf16, 1, B> sent16, received16;
    /// A [rows, width] view of the staging buffer, grown when too small.
    View<float, 2, B> rows(index_t rows, index_t width) { return grown(staging, rows, width); }

    template <class T>
    static View<T, 2, B> grown(Tensor<T, 1, B>& t, index_t rows, index_t width) {
        if (t.numel() < rows * width) t = Tensor<T, 1, B>({rows * width});
        return View<T, 2, B>(t.data(), {rows, width});
    }
};

namespace ep_detail {

/// The all-to-all-v of contiguous rows of `width` floats, counted in rows: as f32, or, for rows holding bf16 values
/// (values == bf16), as bf16 (exact: each value is one already) through the buffers' bf16 pair.
template <class B>
void exchange_rows(Communicator& group, View<const float, 2, B> send, const std::vector<index_t>& send_rows,
                   View<float, 2, B> recv, const std::vector<index_t>& recv_rows, NumberFormat values,
                   ExchangeBuffers<B>& buffers) {
    const index_t W = send.shape[1];
    if (values == NumberFormat::f32) {
        group.all_to_all_v(std::span<const float>(send.data, std::size_t(send.numel())), times(send_rows, W),
                           std::span<float>(recv.data, std::size_t(recv.numel())), times(recv_rows, W));
        return;
    }
    const View<bf16, 2, B> s16 = ExchangeBuffers<B>::grown(buffers.sent16, send.shape[0], W);
    const View<bf16, 2, B> r16 = ExchangeBuffers<B>::grown(buffers.received16, recv.shape[0], W);
    if (send.numel() > 0) backend::Ops<B>::template cast<bf16, float>(send, s16);
    group.all_to_all_v(std::span<const bf16>(s16.data, std::size_t(s16.numel())), times(send_rows, W),
                       std::span<bf16>(r16.data, std::size_t(r16.numel())), times(recv_rows, W));
    if (recv.numel() > 0) backend::Ops<B>::template cast<float, bf16>(View<const bf16, 2, B>(r16), recv);
}

}  // namespace ep_detail

/// The rows this rank sends (its plan's order, [sent(), H]) -> into `out` ([received(), H]), the rows its experts
/// compute on, expert-major (local expert e's rows at expert_offsets[e] ...). Collective over `group`.
template <class B>
void dispatch_rows(Communicator& group, const ExpertExchange<B>& ex, View<const float, 2, std::type_identity_t<B>> rows,
                   View<float, 2, std::type_identity_t<B>> out, ExchangeBuffers<B>& buffers,
                   NumberFormat values = NumberFormat::f32) {
    const index_t H = rows.shape[1];
    if (rows.shape[0] != ex.sent() || !rows.contiguous())
        throw shape_error(group.where("dispatch_rows") + ": " + shape_string(rows.shape) +
                          " rows to send, the plan has " + std::to_string(ex.sent()) + " (contiguous)");
    if (out.shape[0] != ex.received() || out.shape[1] != H)
        throw shape_error(group.where("dispatch_rows") + ": the output is " + shape_string(out.shape) + ", [" +
                          std::to_string(ex.received()) + ", " + std::to_string(H) + "] expected");
    const View<float, 2, B> received = buffers.rows(ex.received(), H);
    ep_detail::exchange_rows<B>(group, rows, ex.send_rows, received, ex.recv_rows, values, buffers);
    if (ex.received() > 0)
        backend::Ops<B>::gather_pairs(View<const float, 2, B>(received), ex.to_expert_major.view(), 1, out);
}

/// The reverse of dispatch_rows: expert-major rows [received(), W] (the experts' outputs, or the gradients of
/// their inputs) -> into `out`, this rank's pairs in its plan's order [sent(), W]. Collective over `group`.
template <class B>
void return_rows(Communicator& group, const ExpertExchange<B>& ex, View<const float, 2, std::type_identity_t<B>> rows,
                 View<float, 2, std::type_identity_t<B>> out, ExchangeBuffers<B>& buffers,
                 NumberFormat values = NumberFormat::f32) {
    const index_t W = rows.shape[1];
    if (rows.shape[0] != ex.received())
        throw shape_error(group.where("return_rows") + ": " + shape_string(rows.shape) + " rows to return, " +
                          std::to_string(ex.received()) + " were received");
    if (out.shape[0] != ex.sent() || out.shape[1] != W || !out.contiguous())
        throw shape_error(group.where("return_rows") + ": the output is " + shape_string(out.shape) + ", [" +
                          std::to_string(ex.sent()) + ", " + std::to_string(W) + "] expected (contiguous)");
    const View<float, 2, B> source_major = buffers.rows(ex.received(), W);
    if (ex.received() > 0) backend::Ops<B>::gather_pairs(rows, ex.to_source_major.view(), 1, source_major);
    ep_detail::exchange_rows<B>(group, source_major, ex.recv_rows, out, ex.send_rows, values, buffers);
}

/// dispatch_rows into a new tensor (a buffer of its own for the staging).
template <class B>
Tensor<float, 2, B> dispatch_rows(Communicator& group, const ExpertExchange<B>& ex,
                                  View<const float, 2, std::type_identity_t<B>> rows,
                                  NumberFormat values = NumberFormat::f32) {
    Tensor<float, 2, B> out({ex.received(), rows.shape[1]});
    ExchangeBuffers<B> buffers;
    dispatch_rows(group, ex, rows, out.view(), buffers, values);
    return out;
}

/// return_rows into a new tensor.
template <class B>
Tensor<float, 2, B> return_rows(Communicator& group, const ExpertExchange<B>& ex,
                                View<const float, 2, std::type_identity_t<B>> rows,
                                NumberFormat values = NumberFormat::f32) {
    Tensor<float, 2, B> out({ex.sent(), rows.shape[1]});
    ExchangeBuffers<B> buffers;
    return_rows(group, ex, rows, out.view(), buffers, values);
    return out;
}

/// The dispatcher of an MoE layer whose experts are spread over an expert group (nn/dispatch.hpp): each rank
/// holds experts [rank L, (rank + 1) L), L = E / ranks, and the same router and shared expert (replicated; data
/// parallelism sums their gradients). A rank plans its own tokens' pairs over all E experts, sends each pair's
/// row to its expert's rank and gets the outputs back; the layer's backward sends the output gradients (and the
/// routing weights) the same way, so the router's backward runs where the token lives. Every rank issues the same
/// collectives whatever the routing: per forward the counts and the rows, per backward four row exchanges.
template <class B>
class ExpertParallelDispatcher final : public nn::Dispatcher<B> {
public:
    using Mat = Tensor<float, 2, B>;
    explicit ExpertParallelDispatcher(Communicator& group) : group_(group) {
        check_moves<B>(group, "ExpertParallelDispatcher");
    }

    void check(index_t experts, index_t first, index_t count) const override {
        const index_t ranks = group_.size(), L = experts / ranks;
        if (experts % ranks != 0 || count != L || first != group_.rank() * L)
            throw std::invalid_argument(
                group_.where("ExpertParallelDispatcher") + ": the layer holds experts [" + std::to_string(first) +
                ", " + std::to_string(first + count) + ") of " + std::to_string(experts) + "; over " +
                std::to_string(ranks) + " expert-parallel ranks " +
                (experts % ranks != 0 ? std::string("they do not split evenly")
                                      : "this rank's share is [" + std::to_string(group_.rank() * L) + ", " +
                                            std::to_string((group_.rank() + 1) * L) + ")"));
    }
    nn::PlannedExperts planned(index_t experts, index_t, index_t) const override { return {0, experts}; }
    ExpertExchange<B> exchange(std::span<const index_t> plan_offsets) override {
        return plan_exchange<B>(group_, plan_offsets);
    }
    Mat dispatch(const ExpertExchange<B>& ex, Mat&& rows, NumberFormat values) override {
        Mat out({ex.received(), rows.shape()[1]});
        dispatch_rows(group_, ex, View<const float, 2, B>(rows.view()), out.view(), buffers_, values);
        return out;
    }
    Mat combine(const ExpertExchange<B>& ex, Mat&& rows, NumberFormat values) override {
        Mat out({ex.sent(), rows.shape()[1]});
        return_rows(group_, ex, View<const float, 2, B>(rows.view()), out.view(), buffers_, values);
        return out;
    }
    bool exchanges() const override { return true; }
    std::string where(const std::string& what) const override { return group_.where(what); }
    Communicator& group() const { return group_; }

private:
    Communicator& group_;
    ExchangeBuffers<B> buffers_;
};

}  // namespace moonmoe::parallel
