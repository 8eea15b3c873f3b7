// moonmoe/parallel/zero.hpp: ZeRO-1 data parallelism with distributed Muon: the optimizer of one model replica
// per rank of a data-parallel group, each rank holding and updating the state of its share of the parameters only.
//
// Muon needs whole matrices, so the parameters are shared out whole (not as flat slices): each one is owned by one
// rank, assigned greedily (largest cost first, to the least loaded rank) by its update's cost: Newton-Schulz's
// max(m, n) min(m, n)^2 for a Muon matrix, its element count for AdamW. A step then:
//   1. reduce-scatter of the gradients: every rank packs each parameter's gradient into its owner's block of one
//      buffer (blocks padded to the largest share) and reduce_scatter sums the blocks over the group; each owner
//      unpacks its share, divided by the group size (the mean over replicas, as one process averaging the same
//      micro-batches gets)
//   2. the statistics the step reads, made global: QK-Clip's per-head maxima (all-reduce max) and the router loads
//      of the balancing update (all-reduce sum); whether any owned gradient is non-finite (all-reduce max), so that
//      every rank skips the same steps
//   3. every rank runs optim::Optimizer on the parameters it owns (the others are routed to none: no state), then
//      QK-Clip and the bias update, which are the same on every rank since their inputs are
//   4. all-gather of the updated parameters: each owner's block to every rank.
// Communication per step, per rank: the gradients once (reduce-scatter) and the parameters once (all-gather), each
// about (size - 1) / size of the model's floats (plus the padding of uneven shares), the same as ZeRO-1 with AdamW.
#pragma once

#include <algorithm>
#include <numeric>

#include "../optim/optimizer.hpp"
#include "comm.hpp"

namespace moonmoe::parallel {

template <class Config = moonmoe::Optimizer<>, class B = cpu>
class DistributedOptimizer {
public:
    using Ops = backend::Ops<B>;

    DistributedOptimizer(nn::Transformer<B>& model, Communicator& group)
        : model_(model), group_(group), inner_(model, [this](const ParamRef& p) { return route(p); }) {}

    /// The owning rank of every parameter, in visit order (-1 for the router biases), and each rank's share of the
    /// cost.
    const std::vector<int>& owners() const { return owner_; }
    const std::vector<double>& loads() const { return load_; }
    /// Floats each rank sends per step: the reduce-scatter's and the all-gather's (padded) buffers.
    index_t floats_per_step() const { return 2 * block_ * index_t(group_.size()); }
    optim::Optimizer<Config, B>& inner() { return inner_; }

    optim::StepReport step() {
        const int n = group_.size(), me = group_.rank();
        std::vector<ParamRef> params;
        model_.visit_params([&](const ParamRef& p) { params.push_back(p); });
        // 1. gradients: each parameter's into its owner's block, summed over the group, my block back, / n
        Tensor<float, 1, B> send({block_ * n}), mine({block_});
        for (std::size_t i = 0; i < params.size(); ++i)
            if (owner_[i] >= 0) copy(params[i].grad, send.data() + owner_[i] * block_ + offset_[i], params[i].numel());
        group_.reduce_scatter(std::span<const float>(send.data(), std::size_t(send.numel())),
                              std::span<float>(mine.data(), std::size_t(mine.numel())));
        Ops::map(fn::ScaleBy<float>{1.0f / float(n)}, mine.template reshape<2>({1, block_}));
        for (std::size_t i = 0; i < params.size(); ++i)
            if (owner_[i] == me) copy(mine.data() + offset_[i], params[i].grad, params[i].numel());
        // 2. the step's statistics over the group
        for (auto& layer : model_.layers) {
            auto& maxima = layer.latent ? layer.self_attn.max_logit_per_head : layer.mha.max_logit_per_head;
            all_reduce_backend(maxima.data(), maxima.numel(), ReduceOp::max);
            if (!layer.dense) all_reduce_backend(layer.moe.gate.load.data(), layer.moe.gate.load.numel(), ReduceOp::sum);
        }
        optim::StepReport r;
        if (any_nonfinite(params)) {  // every rank skips, as one process would
            r.step = inner_.steps();
            r.skipped_nonfinite = 1;
            inner_.reset_max_logits();
            for (auto& layer : model_.layers)
                if (!layer.dense) layer.moe.gate.reset_load();
            model_.zero_grad();
            return r;
        }
        // 3. my share
        r = inner_.step();
        // 4. every share to every rank
        Tensor<float, 1, B> all({block_ * n});
        for (std::size_t i = 0; i < params.size(); ++i)
            if (owner_[i] == me) copy(params[i].value, mine.data() + offset_[i], params[i].numel());
        group_.all_gather(std::span<const float>(mine.data(), std::size_t(block_)),
                          std::span<float>(all.data(), std::size_t(all.numel())));
        for (std::size_t i = 0; i < params.size(); ++i)
            if (owner_[i] >= 0 && owner_[i] != me)
                copy(all.data() + owner_[i] * block_ + offset_[i], params[i].value, params[i].numel());
        model_.refresh_working_weights();
        model_.zero_grad();
        return r;
    }

private:
    /// Assigns the parameter to a rank on first sight (visit order is the same on every rank) and routes it.
    optim::Route route(const ParamRef& p) {
        const optim::Route r = optim::route_by_kind(p, Config::value.muon.enabled);
        if (load_.empty()) assign();
        const std::size_t i = route_index_++;
        return owner_[i] == group_.rank() ? r : optim::Route::none;
    }

    void assign() {
        const int n = group_.size();
        std::vector<ParamRef> params;
        model_.visit_params([&](const ParamRef& p) { params.push_back(p); });
        std::vector<double> cost(params.size());
        for (std::size_t i = 0; i < params.size(); ++i) {
            const ParamRef& p = params[i];
            const optim::Route r = optim::route_by_kind(p, Config::value.muon.enabled);
            if (r == optim::Route::muon) {
                const double a = double(std::max(p.shape[0], p.shape[1])), b = double(std::min(p.shape[0], p.shape[1]));
                cost[i] = a * b * b;
            } else {
                cost[i] = double(p.numel());
            }
        }
        std::vector<std::size_t> order(params.size());
        std::iota(order.begin(), order.end(), std::size_t(0));
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
        owner_.assign(params.size(), -1);  // -1: the router biases, owned by nobody (no gradient, the same everywhere)
        load_.assign(std::size_t(n), 0.0);
        for (std::size_t i : order) {
            if (params[i].kind == ParamKind::router_bias) continue;  // no gradient; moved by the balancing rule
            const auto least = std::size_t(std::min_element(load_.begin(), load_.end()) - load_.begin());
            owner_[i] = int(least);
            load_[least] += cost[i];
        }
        std::vector<index_t> used(std::size_t(n), 0);
        offset_.assign(params.size(), 0);
        for (std::size_t i = 0; i < params.size(); ++i) {
            if (owner_[i] < 0) continue;
            offset_[i] = used[std::size_t(owner_[i])];
            used[std::size_t(owner_[i])] += params[i].numel();
        }
        block_ = *std::max_element(used.begin(), used.end());
    }

    static void copy(const float* from, float* to, index_t n) {
        Ops::copy(View<const float, 2, B>(from, {1, n}), View<float, 2, B>(to, {1, n}));
    }

    template <class T>
    void all_reduce_backend(T* data, index_t n, ReduceOp op) {
        group_.all_reduce(std::span<T>(data, std::size_t(n)), op);
    }

    bool any_nonfinite(const std::vector<ParamRef>& params) {
        std::vector<View<const float, 1, B>> grads;
        for (std::size_t i = 0; i < params.size(); ++i)
            if (owner_[i] == group_.rank()) grads.push_back(View<const float, 1, B>(params[i].grad, {params[i].numel()}));
        Tensor<index_t, 1, B> first({1});
        backend::Ops<B>::first_nonfinite(grads, first.view());
        std::vector<index_t> bad = {element_to_host(first.view(), 0) < index_t(grads.size()) ? 1 : 0};
        group_.all_reduce(std::span<index_t>(bad), ReduceOp::max);
        return bad[0] != 0;
    }

    nn::Transformer<B>& model_;
    Communicator& group_;
    std::vector<int> owner_;
    std::vector<index_t> offset_;
    std::vector<double> load_;
    index_t block_ = 0;
    std::size_t route_index_ = 0;
    optim::Optimizer<Config, B> inner_;  ///< last: its constructor calls route(), which needs the members above
};

}  // namespace moonmoe::parallel
