// moonmoe/parallel/zero.hpp: ZeRO-1 data parallelism with distributed Muon: the optimizer of the model replicas of
// a data-parallel run, each rank holding and updating the state of its share of the parameters only.
//
// Muon needs whole matrices, so the parameters are shared out whole (not as flat slices): each one is owned by one
// rank of its data-parallel group, assigned greedily (largest cost first, to the least loaded rank) by its update's
// cost: Newton-Schulz's max(m, n) min(m, n)^2 for a Muon matrix, its element count for AdamW. In a
// Parallel<PP, EP, DP> run (parallel/groups.hpp) the routed experts' group is the DP ranks holding the same experts
// and every other parameter's is the EP x DP ranks holding the same layers; with one group, every parameter's is it.
// A step:
//   1. reduce-scatter of the gradients, per group: every rank packs each parameter's gradient into its owner's
//      block of one buffer (block r holds rank r's share) and reduce_scatter_v sums the blocks over the group;
//      each owner unpacks its share, divided by the number of token streams (replicas: EP x DP), the mean over
//      them that one process averaging the same micro-batches gets (the experts' gradients already hold the
//      EP streams' contributions, which reached them through the all-to-all)
//   2. the statistics the step reads, made global: QK-Clip's per-head maxima (all-reduce max) and the router loads
//      of the balancing update (all-reduce sum) over the replicas; whether any owned gradient is non-finite, or
//      any owned parameter's update would leave a non-finite weight or state (optim::Optimizer's pre-check), as
//      an all-reduce max over the world, so that every rank skips the same steps
//   3. every rank runs optim::Optimizer on the parameters it owns (the others are routed to none: no state), then
//      QK-Clip and the bias update, which are the same on every rank holding the layer since their inputs are
//   4. all-gather of the updated parameters, per group: each owner's block to every rank.
// Under Precision<BF16, Weights<BF16>> the f32 masters are optimizer state, so each rank holds those of its own
// parameters only; the all-gather sends the owners' f32 masters and the other ranks round them into their bf16
// weights (the same values the owner's weights take).
// Communication per step: the gradients once (reduce-scatter) and the parameters once (all-gather), (size - 1) /
// size of the group's floats each on average over the ranks: the same as ZeRO-1 with AdamW, whose reduce-scatter
// and all-gather move the same two buffers (only its shards are flat slices, equal on every rank). The other way,
// flat slices with each matrix gathered to one rank for Newton-Schulz and scattered back, sends 25-53 % more for
// the same work (bench/distributed_muon.cpp; docs/parallel.md, "ZeRO-1 and distributed Muon").
#pragma once

#include <algorithm>
#include <numeric>
#include <utility>

#include "../optim/optimizer.hpp"
#include "comm.hpp"
#include "groups.hpp"

namespace moonmoe::parallel {

/// The cost by which whole matrices are shared out for Muon: Newton-Schulz's max(m, n) min(m, n)^2.
inline double newton_schulz_cost(index_t rows, index_t cols) {
    const double a = double(std::max(rows, cols)), b = double(std::min(rows, cols));
    return a * b * b;
}

/// Items shared out whole over `ranks`: owner[i] for each item, and each rank's summed cost.
struct Assignment {
    std::vector<int> owner;
    std::vector<double> load;
};

/// Greedy longest-processing-time: the costliest item first (ties in item order), each to the least loaded rank
/// (ties to the lowest rank). Deterministic, so every rank of a group computes the same assignment.
inline Assignment assign_by_cost(const std::vector<double>& cost, int ranks) {
    Assignment a{std::vector<int>(cost.size(), 0), std::vector<double>(std::size_t(ranks), 0.0)};
    std::vector<std::size_t> order(cost.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t x, std::size_t y) { return cost[x] != cost[y] ? cost[x] > cost[y] : x < y; });
    for (std::size_t i : order) {
        const auto least = std::size_t(std::min_element(a.load.begin(), a.load.end()) - a.load.begin());
        a.owner[i] = int(least);
        a.load[least] += cost[i];
    }
    return a;
}

template <class Config = moonmoe::Optimizer<>, class B = cpu>
class DistributedOptimizer {
public:
    using Ops = backend::Ops<B>;

    /// Every parameter's data-parallel group is `group` (one replica per rank).
    DistributedOptimizer(nn::Transformer<B>& model, Communicator& group)
        : DistributedOptimizer(model, group, group, group, group.size()) {}
    /// The groups of a Parallel<PP, EP, DP> run; `model` is the rank's part (parallel/groups.hpp).
    DistributedOptimizer(nn::Transformer<B>& model, ProcessGroups& g)
        : DistributedOptimizer(model, g.world, *g.dense_dp, *g.expert_dp, g.replicas()) {}

    /// The owning rank (in its group) of every parameter, in visit order (-1 for the router biases), and each
    /// rank's share of the cost, per group (dense, then experts when they have their own group).
    const std::vector<int>& owners() const { return owner_; }
    const std::vector<double>& loads() const { return shards_[0].load; }
    /// The floats of the reduce-scatters' and the all-gathers' buffers per step (each the group's whole part).
    index_t floats_per_step() const {
        index_t n = 0;
        for (const Shard& s : shards_) n += 2 * s.total();
        return n;
    }
    optim::Optimizer<Config, B>& inner() { return inner_; }

    /// 1. + 2. of the header comment: afterwards each owned parameter's gradient is the mean over the replicas,
    /// the statistics are global; returns whether any gradient holds a NaN or an infinity, or any update would
    /// leave one (on every rank alike: the step must be skipped).
    bool reduce_gradients() {
        const std::vector<ParamRef> params = parameters();
        for (Shard& s : shards_) {
            Tensor<float, 1, B> send({s.total()});
            const index_t mine = s.counts[std::size_t(s.group->rank())];
            s.mine = Tensor<float, 1, B>({mine});
            for (std::size_t i : s.members)
                copy(params[i].grad, send.data() + s.start(owner_[i]) + offset_[i], params[i].numel());
            s.group->reduce_scatter_v(std::span<const float>(send.data(), std::size_t(send.numel())),
                                      std::span<float>(s.mine.data(), std::size_t(mine)), s.counts);
            Ops::map(fn::ScaleBy<float>{1.0f / float(replicas_)}, s.mine.template reshape<2>({1, mine}));
            for (std::size_t i : s.members)
                if (owner_[i] == s.group->rank()) copy(s.mine.data() + offset_[i], params[i].grad, params[i].numel());
        }
        for (auto& layer : model_.layers) {
            Tensor<float, 1, B>& maxima = layer.max_logits();
            dense_.all_reduce(std::span(maxima.data(), std::size_t(maxima.numel())), ReduceOp::max);
            if (nn::Router<B>* router = layer.router())
                dense_.all_reduce(std::span(router->load.data(), std::size_t(router->load.numel())), ReduceOp::sum);
        }
        checked_ = !any_nonfinite(params);
        return !checked_;
    }

    /// 3. + 4.: the owned parameters' update, then every rank's copy of every parameter of its part. After a
    /// reduce_gradients that found everything finite, the inner optimizer does not check the same gradients and
    /// updates again (without one, it does, and skips a non-finite step on this rank alone).
    optim::StepReport update() {
        const std::vector<ParamRef> params = parameters();
        const optim::StepReport r =
            inner_.step({}, optim::Optimizer<Config, B>::clip_rounds,
                        std::exchange(checked_, false) ? optim::Checks::done : optim::Checks::run);
        for (Shard& s : shards_) {
            const int me = s.group->rank();
            for (std::size_t i : s.members)
                if (owner_[i] == me)  // the updated f32 values: the parameter's, or (Weights<BF16>) its master's
                    copy(inner_.slots()[i].param.value, s.mine.data() + offset_[i], params[i].numel());
            Tensor<float, 1, B> all({s.total()});
            s.group->all_gather_v(std::span<const float>(s.mine.data(), std::size_t(s.mine.numel())),
                                  std::span<float>(all.data(), std::size_t(all.numel())), s.counts);
            for (std::size_t i : s.members)
                if (owner_[i] != me) store(all.data() + s.start(owner_[i]) + offset_[i], params[i]);
        }
        model_.refresh_working_weights();
        model_.zero_grad();
        return r;
    }

    /// One ZeRO-1 step: reduce_gradients, then update, or (a non-finite gradient anywhere) a skip on every rank.
    optim::StepReport step() {
        if (reduce_gradients()) {  // every rank skips, as one process would
            optim::StepReport r;
            r.step = inner_.steps();
            r.skipped_nonfinite = 1;
            r.nonfinite_update = nonfinite_update_;
            r.nonfinite_param = nonfinite_param_;
            inner_.reset_max_logits();
            for (auto& layer : model_.layers)
                if (nn::Router<B>* router = layer.router()) router->reset_load();
            model_.zero_grad();
            return r;
        }
        return update();
    }

private:
    /// The parameters of one data-parallel group: their owners' blocks, and this rank's block of the last step.
    struct Shard {
        Communicator* group = nullptr;
        std::vector<std::size_t> members;  ///< indices into the visit order
        std::vector<double> load;
        std::vector<index_t> counts;  ///< floats each rank owns
        Tensor<float, 1, B> mine;

        index_t total() const {
            index_t n = 0;
            for (index_t c : counts) n += c;
            return n;
        }
        /// Where rank r's block starts in the packed buffers.
        index_t start(int r) const {
            index_t n = 0;
            for (int q = 0; q < r; ++q) n += counts[std::size_t(q)];
            return n;
        }
    };

    DistributedOptimizer(nn::Transformer<B>& model, Communicator& world, Communicator& dense, Communicator& experts,
                         index_t replicas)
        : model_(model),
          world_(world),
          dense_(dense),
          replicas_(replicas),
          inner_(model, [this, &experts](const ParamRef& p) { return route(p, experts); }) {
        check_moves<B>(dense, "DistributedOptimizer");
        check_moves<B>(experts, "DistributedOptimizer");
    }

    std::vector<ParamRef> parameters() {
        std::vector<ParamRef> params;
        model_.visit_params([&](const ParamRef& p) { params.push_back(p); });
        return params;
    }

    /// Assigns the parameters to ranks on the first call (visit order is the same on every rank of a group) and
    /// routes each: its own route where this rank owns it, none elsewhere.
    optim::Route route(const ParamRef& p, Communicator& experts) {
        if (shards_.empty()) assign(experts);
        const std::size_t i = route_index_++;
        const Shard* s = shard_of(i);
        return s && owner_[i] == s->group->rank() ? optim::route_by_kind(p, Config::value.muon.enabled)
                                                  : optim::Route::none;
    }

    const Shard* shard_of(std::size_t i) const {
        for (const Shard& s : shards_)
            if (std::binary_search(s.members.begin(), s.members.end(), i)) return &s;
        return nullptr;
    }

    void assign(Communicator& experts) {
        const std::vector<ParamRef> params = parameters();
        owner_.assign(params.size(), -1);  // -1: the router biases, owned by nobody (no gradient, the same everywhere)
        offset_.assign(params.size(), 0);
        const bool one_group = &experts == &dense_;
        shards_.resize(one_group ? 1 : 2);
        shards_[0].group = &dense_;
        if (!one_group) shards_[1].group = &experts;
        for (std::size_t i = 0; i < params.size(); ++i) {
            if (params[i].kind == ParamKind::router_bias) continue;  // no gradient; moved by the balancing rule
            const bool expert = params[i].kind == ParamKind::expert_matrix;
            shards_[!one_group && expert ? 1 : 0].members.push_back(i);
        }
        for (Shard& s : shards_) share_out(params, s);
    }

    void share_out(const std::vector<ParamRef>& params, Shard& s) {
        const int n = s.group->size();
        std::vector<double> cost;
        for (std::size_t i : s.members) {
            const ParamRef& p = params[i];
            const bool muon = optim::route_by_kind(p, Config::value.muon.enabled) == optim::Route::muon;
            cost.push_back(muon ? newton_schulz_cost(p.shape[0], p.shape[1]) : double(p.numel()));
        }
        const Assignment a = assign_by_cost(cost, n);
        for (std::size_t k = 0; k < s.members.size(); ++k) owner_[s.members[k]] = a.owner[k];
        s.load = a.load;
        s.counts.assign(std::size_t(n), 0);
        for (std::size_t i : s.members) {
            offset_[i] = s.counts[std::size_t(owner_[i])];
            s.counts[std::size_t(owner_[i])] += params[i].numel();
        }
    }

    static void copy(const float* from, float* to, index_t n) {
        Ops::copy(View<const float, 2, B>(from, {1, n}), View<float, 2, B>(to, {1, n}));
    }
    /// The owner's new values into `p`: its f32 values, or (Weights<BF16>, no master here) its bf16 ones.
    static void store(const float* from, const ParamRef& p) {
        const index_t n = p.numel();
        if (p.value) return copy(from, p.value, n);
        backend::cast_flat<bf16, float, B>(from, p.value16, n);
    }

    bool any_nonfinite(const std::vector<ParamRef>& params) {
        std::vector<View<const float, 1, B>> grads;
        for (const Shard& s : shards_)
            for (std::size_t i : s.members)
                if (owner_[i] == s.group->rank())
                    grads.push_back(View<const float, 1, B>(params[i].grad, {params[i].numel()}));
        Tensor<index_t, 1, B> first({1});
        backend::Ops<B>::first_nonfinite(grads, first.view());
        const bool gradient = element_to_host(first.view(), 0) < index_t(grads.size());
        const ParamRef* update = gradient ? nullptr : inner_.first_unsafe_update();
        nonfinite_param_ = update ? update->name : "";  // named where it is owned; the other ranks leave it empty
        // One value, as before the update check (a step's traffic is unchanged): 2 a gradient, 1 an update only;
        // the maximum over the world says which, a gradient anywhere taking precedence.
        std::vector<index_t> bad = {gradient ? 2 : update ? 1 : 0};
        world_.all_reduce(std::span<index_t>(bad), ReduceOp::max);
        nonfinite_update_ = bad[0] == 1;
        return bad[0] != 0;
    }

    nn::Transformer<B>& model_;
    Communicator& world_;
    Communicator& dense_;
    index_t replicas_;
    std::vector<int> owner_;
    std::vector<index_t> offset_;
    std::vector<Shard> shards_;
    std::size_t route_index_ = 0;
    bool checked_ = false;           ///< reduce_gradients found every owned gradient and update finite
    bool nonfinite_update_ = false;  ///< the last skip was for an update, no gradient being non-finite
    std::string nonfinite_param_;    ///< the owned parameter whose update failed the pre-check, if this rank owns it
    optim::Optimizer<Config, B> inner_;  ///< last: its constructor calls route(), which needs the members above
};

}  // namespace moonmoe::parallel
