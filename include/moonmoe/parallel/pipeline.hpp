// moonmoe/parallel/pipeline.hpp: the pipeline executor: runs one rank's interleaved 1F1B schedule
// (parallel/schedule.hpp) over its part of the model (parallel/groups.hpp), forward and backward of every
// micro-batch of a step, accumulating the parameter gradients; DistributedOptimizer (parallel/zero.hpp) then steps.
//
//   ProcessGroups g(world, config.parallel);
//   nn::Transformer<B> part(config, model_part(config, g.at), expert_dispatcher<B>(g));
//   Pipeline<B> pipeline(part, g, micro_batches);
//   DistributedOptimizer<Opt, B> opt(part, g);
//   loop: pipeline.run(batches_of_my_replica, layout); opt.step();
//
// Virtual stage s (chunk s / PP of pipeline rank s % PP) receives its input from stage s - 1 (stage 0 embeds the
// ids) and sends its output to stage s + 1; the last stage applies the final norm, lm_head and the cross-entropy of
// the causal targets, and starts backward from the loss's gradient. Backward mirrors it: stage s receives the
// gradient of its output from s + 1 and sends the gradient of its input to s - 1 (stage 0 ends in the embedding).
// Sends are non-blocking and waited at the end of the step; a receive blocks when its step needs the data (the
// schedules of all ranks together cannot deadlock: tested by simulating them in test/unit/parallel_schedule.cpp).
// A send whose rank's next step starts with a receive is posted together with that receive, in one group
// (Communicator::group_start / group_end), as Megatron pairs send-forward with receive-backward: over NCCL, where
// a send blocks the stream until its receiver posts, a lone send there could wait on a peer that waits on us.
// Activations travel on the pipeline group's communicator, gradients on a second one (pipeline_backward). MPI
// matches by tag, (micro-batch, virtual stage, direction); NCCL matches by order, per communicator and pair of
// ranks: on each channel a rank sends in its schedule's order and its neighbour receives in its own, which is the
// same order of (micro-batch, chunk) (every rank walks the virtual micro-batches in the same sequence), so they
// agree, interleaved stages included (with one channel, two ranks of an interleaved schedule exchange activations
// and gradients in orders that differ). MoE layers of an EP > 1 run exchange their rows over the
// expert group (their dispatcher, parallel/expert_parallel.hpp); every EP rank of a stage runs the same schedule,
// so they issue the same sequence of exchanges.
//
// Activations<Offload<true>> (CUDA backend; Kimi K2 technical report, §2.4.3, nn/offload.hpp): a (micro-batch,
// chunk) whose backward does not come next leaves for pinned host memory after its forward, every kept matrix of
// its layers (their MoE caches included) and of the head, while the next step computes; before a step
// whose successor is a backward, that backward's matrices are queued back, so they copy while the step computes.
// The device holds the micro-batch computing and the one prefetched; the statistics and plans stay (under 10 %).
//
// Loss and gradient: each micro-batch's loss is the mean over its targets; the step's loss is the mean over the
// micro-batches, so the last stage scales each loss gradient by 1 / M; the optimizer then averages over the
// replicas. Together: the gradient of the mean loss of every micro-batch of every replica, as one process
// accumulating them gets. That is run(micro_batches, layout); run(micro_batches, layouts, loss) takes a layout per
// micro-batch and the caller's loss at the last stage (a Loss: the logits in, the loss and the logits' gradient
// out), and evaluate(micro_batches, layouts, loss) runs the forwards alone (the RL objective's two passes,
// rl/pipeline.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <type_traits>
#include <variant>
#include <vector>

#include "../nn/cross_entropy.hpp"
#include "../nn/offload.hpp"
#include "../nn/transformer.hpp"
#include "groups.hpp"
#include "schedule.hpp"

namespace moonmoe::parallel {

template <class B = cpu>
class Pipeline {
public:
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    /// Where one rank's step went: seconds computing, in communication that is not waiting on the pipeline
    /// (the experts' all-to-all, the last sends, the losses' all-reduce), idle waiting for a pipeline neighbour
    /// (the bubble, with its share of transfer time), and the bytes it sent to other ranks.
    struct Timing {
        double total = 0, compute = 0, communication = 0, bubble = 0;
        std::uint64_t bytes_sent = 0;

        friend Timing operator+(Timing a, const Timing& b) {
            a.total += b.total, a.compute += b.compute, a.communication += b.communication, a.bubble += b.bubble;
            a.bytes_sent += b.bytes_sent;
            return a;
        }
    };
    struct StepResult {
        std::vector<float> losses;  ///< each micro-batch's mean loss (on every rank of the pipeline group)
        float loss = 0;             ///< their mean
        Timing timing;
    };

    Pipeline(nn::Transformer<B>& part, ProcessGroups& groups, index_t micro_batches, index_t extra_warmup = 0)
        : part_(part),
          groups_(groups),
          shape_{part.config.parallel.pp, part.config.parallel.virtual_stages, micro_batches, extra_warmup} {
        check_shape(shape_);
        check_moves<B>(*groups.pipeline, "Pipeline");
        nn::check_offload<B>(part.config.activations.offload);
        if constexpr (backend::offloads<B>)
            if (part.config.activations.offload) offloader_ = std::make_unique<nn::KeptOffload<B>>();
        schedule_ = interleaved_1f1b(shape_, groups_.at.pp);
        index_t position = 0;
        for (index_t v = 0; v < shape_.v; ++v) {
            const auto [first, last] = chunk_layers(part.config, groups_.at.pp, v);
            chunk_begin_.push_back(position);
            position += last - first;
        }
        chunk_begin_.push_back(position);
        if (position != index_t(part.layers.size()) || part.part.embedding != (groups_.at.pp == 0))
            throw std::invalid_argument(groups_.pipeline->where("Pipeline") +
                                        ": the model part does not hold this rank's layers (build it with "
                                        "model_part(config, groups.at))");
        for (const auto& layer : part.layers)
            if (!layer.dense && layer.moe.dispatcher->exchanges() != (groups_.layout.ep > 1))
                throw std::invalid_argument(groups_.pipeline->where("Pipeline") +
                                            ": the part's MoE layers move their "
                                            "pairs " +
                                            (groups_.layout.ep > 1
                                                 ? "locally, the layout has EP = " + std::to_string(groups_.layout.ep)
                                                 : std::string("over an expert group, "
                                                               "the layout has EP = 1")) +
                                            " (build the part with "
                                            "expert_dispatcher<B>(groups))");
    }

    const std::vector<Step>& schedule() const { return schedule_; }

    /// Activations<Offload<true>>: the host copies of the waiting micro-batches' kept matrices; null otherwise.
    const nn::KeptOffload<B>* offload() const
        requires backend::offloads<B>
    {
        return offloader_.get();
    }
    const PipelineShape& shape() const { return shape_; }
    /// The model part the pipeline runs.
    const nn::Transformer<B>& model() const { return part_; }

    /// What the last stage makes of micro-batch m's logits [tokens, vocab]: returns the micro-batch's loss (what
    /// the step reports) and, in a training pass, writes into dlogits the gradient of what the step minimises with
    /// respect to those logits (empty in a forward-only pass). Runs on the last pipeline rank only.
    using Loss = std::function<float(index_t micro_batch, View<const float, 2, B> logits, View<float, 2, B> dlogits)>;

    /// Forward and backward of the M micro-batches of this rank's replica (each ids of layout.tokens() tokens;
    /// every rank of the pipeline group passes the same ones), accumulating (+=) the gradients of its part: the
    /// causal-LM loss of each, its gradient scaled by 1 / M.
    StepResult run(std::span<const std::vector<index_t>> micro_batches, const nn::TokenLayout& layout) {
        const std::vector<nn::TokenLayout> layouts(micro_batches.size(), layout);
        const float scale = 1.0f / float(shape_.micro_batches);
        return run(micro_batches, layouts, [&](index_t m, View<const float, 2, B> logits, View<float, 2, B> dlogits) {
            return nn::causal_lm_loss<B>(logits, micro_batches[std::size_t(m)].data(), layouts[std::size_t(m)], dlogits,
                                         scale);
        });
    }

    /// The same with a layout per micro-batch and the caller's loss (the RL objective's, rl/pipeline.hpp).
    StepResult run(std::span<const std::vector<index_t>> micro_batches, std::span<const nn::TokenLayout> layouts,
                   const Loss& loss) {
        return execute(micro_batches, layouts, loss, schedule_, nn::Pass::training);
    }

    /// Forward only, an inference pass (no router load, no QK-Clip maxima; nothing kept): micro-batch by
    /// micro-batch, each rank its chunks in order, the last stage calling `loss` with empty dlogits. Deadlock-free
    /// as the 1F1B schedule is: a rank's forwards run in the order of (micro-batch, virtual stage) and each waits
    /// only on the one before it. Returns the losses on every rank of the pipeline group.
    StepResult evaluate(std::span<const std::vector<index_t>> micro_batches, std::span<const nn::TokenLayout> layouts,
                        const Loss& loss) {
        std::vector<Step> order;
        for (index_t m = 0; m < shape_.micro_batches; ++m)
            for (index_t v = 0; v < shape_.v; ++v) order.push_back({Pass::forward, m, v});
        return execute(micro_batches, layouts, loss, order, nn::Pass::inference);
    }

private:
    /// Runs `steps` (the 1F1B schedule, or evaluate's forwards) over the micro-batches: the body of run and
    /// evaluate. `pass` is the forwards' (Pass::training keeps what the backwards need).
    StepResult execute(std::span<const std::vector<index_t>> micro_batches, std::span<const nn::TokenLayout> layouts,
                       const Loss& loss, const std::vector<Step>& steps, nn::Pass pass) {
        using clock = std::chrono::steady_clock;
        const std::string where =
            groups_.pipeline->where(pass == nn::Pass::training ? "Pipeline::run" : "Pipeline::evaluate");
        if (index_t(micro_batches.size()) != shape_.micro_batches || layouts.size() != micro_batches.size())
            throw std::invalid_argument(where + ": " + std::to_string(micro_batches.size()) + " micro-batches and " +
                                        std::to_string(layouts.size()) + " layouts, the schedule has " +
                                        std::to_string(shape_.micro_batches) + " micro-batches");
        for (std::size_t m = 0; m < micro_batches.size(); ++m)
            if (index_t(micro_batches[m].size()) != layouts[m].tokens())
                throw std::invalid_argument(where + ": micro-batch " + std::to_string(m) + " has " +
                                            std::to_string(micro_batches[m].size()) + " ids, its layout " +
                                            std::to_string(layouts[m].tokens()) + " tokens");
        const auto start = clock::now();
        const Traffic before = groups_.traffic();
        batches_ = micro_batches;
        layouts_ = layouts;
        loss_ = &loss;
        pass_ = pass;
        if constexpr (backend::offloads<B>)
            if (offloader_) offloader_->drop_all();  // a step that threw may have left some in host memory
        slots_.clear();
        slots_.resize(std::size_t(shape_.micro_batches * shape_.v));
        losses_.assign(std::size_t(shape_.micro_batches), 0.0f);
        bubble_ = 0;
        for (std::size_t i = 0; i < steps.size(); ++i) {
            const Step& s = steps[i];
            const Step* next = i + 1 < steps.size() ? &steps[i + 1] : nullptr;
            offload_before(s, next);
            if (s.pass == Pass::forward) forward(s.micro_batch, s.chunk);
            else
                backward(s.micro_batch, s.chunk);
            offload_after(s, next);
            // a send waits to be grouped with the next step's receive, if it has one (the header comment)
            if (i + 1 == steps.size() || !receives(steps[i + 1])) post_sends();
        }
        const auto sends = clock::now();
        for (Pending& p : pending_) p.request->wait();
        pending_.clear();
        const double send_wait = std::chrono::duration<double>(clock::now() - sends).count();
        // every rank of the pipeline group learns the losses (only the last stage computed them)
        groups_.pipeline->all_reduce(std::span<float>(losses_), ReduceOp::sum);
        StepResult r;
        r.losses = losses_;
        for (float l : losses_) r.loss += l / float(losses_.size());
        const Traffic after = groups_.traffic();
        r.timing.total = std::chrono::duration<double>(clock::now() - start).count();
        r.timing.bubble = bubble_;
        r.timing.communication = (after.seconds - before.seconds) + send_wait;
        r.timing.compute = std::max(0.0, r.timing.total - r.timing.bubble - r.timing.communication);
        r.timing.bytes_sent = after.bytes - before.bytes;
        slots_.clear();
        batches_ = {};
        layouts_ = {};
        loss_ = nullptr;
        return r;
    }

    /// What the backward of one (micro-batch, chunk) needs from its forward.
    struct Slot {
        std::vector<typename nn::DecoderLayer<B>::Cache> layers;
        typename nn::Transformer<B>::HeadCache head;  ///< last stage: the final norm and lm_head
        nn::KeptMatrix<B> dlogits;                    ///< last stage: the loss's gradient (f32)
        /// Calls f(KeptMatrix<B>&) on every kept matrix (what activation offload moves).
        template <class F>
        void for_each_kept(F&& f) {
            for (auto& l : layers) l.for_each_kept(f);
            head.for_each_kept(f);
            f(dlogits);
        }
    };
    struct Pending {
        Mat buffer;
        std::unique_ptr<Request> request;  ///< null while waiting to be posted
        int peer = 0, tag = 0;
        Pass pass = Pass::forward;  ///< its channel
    };

    /// Activations<Offload<true>> around step s (the header comment): before it, the next backward's matrices are
    /// queued back (they copy while s computes) and s's own taken back if s is a backward; after a forward, its
    /// matrices leave for host memory unless its backward comes next.
    void offload_before(const Step& s, const Step* next) {
        if constexpr (backend::offloads<B>) {
            if (!offloader_ || pass_ != nn::Pass::training) return;  // a forward-only pass keeps nothing
            if (next && next->pass == Pass::backward) offloader_->prefetch(slot(next->micro_batch, next->chunk));
            if (s.pass == Pass::backward) offloader_->restore(slot(s.micro_batch, s.chunk));
        }
    }
    void offload_after(const Step& s, const Step* next) {
        if constexpr (backend::offloads<B>) {
            const bool own_backward_next =
                next && next->pass == Pass::backward && next->micro_batch == s.micro_batch && next->chunk == s.chunk;
            if (offloader_ && pass_ == nn::Pass::training && s.pass == Pass::forward && !own_backward_next)
                offloader_->offload(slot(s.micro_batch, s.chunk));
        }
    }

    index_t stages() const { return shape_.virtual_stages(); }
    int rank_of_stage(index_t s) const { return int(s % shape_.pp); }
    /// Tags: forward activations leaving stage s, backward gradients leaving stage s.
    int tag(index_t micro_batch, index_t stage, Pass pass) const {
        return int((micro_batch * stages() + stage) * 2 + (pass == Pass::forward ? 0 : 1));
    }
    Slot& slot(index_t micro_batch, index_t chunk) { return slots_[std::size_t(micro_batch * shape_.v + chunk)]; }

    /// Whether step `s` starts by receiving (its input from the previous stage, or its output's gradient).
    bool receives(const Step& s) const {
        const index_t stage = shape_.virtual_stage(groups_.at.pp, s.chunk);
        return s.pass == Pass::forward ? stage > 0 : stage + 1 < stages();
    }
    /// The waiting sends (in the order they were made), then `then` (a receive), as one group.
    template <class Then>
    void post_sends(Then&& then) {
        groups_.pipeline->group_start();
        groups_.pipeline_backward->group_start();
        for (Pending& p : waiting_) {
            p.request = channel(p.pass).isend(std::span<const float>(p.buffer.data(), std::size_t(p.buffer.numel())),
                                              p.peer, p.tag);
            pending_.push_back(std::move(p));
        }
        waiting_.clear();
        then();
        groups_.pipeline_backward->group_end();
        groups_.pipeline->group_end();
    }
    /// Activations on the pipeline group, gradients on its second channel.
    Communicator& channel(Pass p) { return p == Pass::forward ? *groups_.pipeline : *groups_.pipeline_backward; }
    void post_sends() {
        if (!waiting_.empty()) post_sends([] {});
    }
    void receive(Mat& into, index_t from_stage, Pass pass, int t) {
        std::unique_ptr<Request> r;
        post_sends([&] {
            r = channel(pass).irecv(std::span<float>(into.data(), std::size_t(into.numel())), rank_of_stage(from_stage),
                                    t);
        });
        const auto start = std::chrono::steady_clock::now();
        r->wait();
        bubble_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    void send(Mat&& from, index_t to_stage, Pass pass, int t) {
        waiting_.push_back({std::move(from), nullptr, rank_of_stage(to_stage), t, pass});
    }

    void forward(index_t mb, index_t chunk) {
        const nn::TokenLayout& layout = layouts_[std::size_t(mb)];
        const index_t s = shape_.virtual_stage(groups_.at.pp, chunk), T = layout.tokens(), H = part_.config.dims.hidden;
        const std::vector<index_t>& ids = batches_[std::size_t(mb)];
        Slot& c = slot(mb, chunk);
        Mat h({T, H});
        if (s == 0) part_.embed(ids.data(), h.view());
        else
            receive(h, s - 1, Pass::forward, tag(mb, s - 1, Pass::forward));
        const index_t first = chunk_begin_[std::size_t(chunk)], last = chunk_begin_[std::size_t(chunk) + 1];
        c.layers.resize(std::size_t(last - first));
        part_.forward_layers(std::size_t(first), std::size_t(last), h, layout, c.layers, pass_);
        const bool training = pass_ == nn::Pass::training;
        if (!training) c.layers.clear();  // a forward-only pass keeps nothing
        if (s + 1 < stages()) {
            send(std::move(h), s + 1, Pass::forward, tag(mb, s, Pass::forward));
            return;
        }
        // the last stage: the head, then the caller's loss (and, training, its gradient)
        const Mat logits = part_.head_forward(std::move(h), c.head);
        if (!training) {
            losses_[std::size_t(mb)] = (*loss_)(mb, logits.view(), {});
            c = Slot{};
            return;
        }
        Mat dlogits(logits.shape());
        losses_[std::size_t(mb)] = (*loss_)(mb, logits.view(), dlogits.view());
        c.dlogits = nn::KeptMatrix<B>(std::move(dlogits), nn::KeptFormat::f32);
    }

    void backward(index_t mb, index_t chunk) {
        const index_t s = shape_.virtual_stage(groups_.at.pp, chunk), T = layouts_[std::size_t(mb)].tokens(),
                      H = part_.config.dims.hidden;
        Slot& c = slot(mb, chunk);
        Mat dh({T, H});
        if (s + 1 == stages()) part_.head_backward(c.dlogits.take("the loss's gradient").view(), c.head, dh.view());
        else
            receive(dh, s + 1, Pass::backward, tag(mb, s + 1, Pass::backward));
        const index_t first = chunk_begin_[std::size_t(chunk)], last = chunk_begin_[std::size_t(chunk) + 1];
        part_.backward_layers(std::size_t(first), std::size_t(last), dh, c.layers);
        if (s == 0) part_.embed_backward(batches_[std::size_t(mb)].data(), dh.view());
        else
            send(std::move(dh), s - 1, Pass::backward, tag(mb, s, Pass::backward));
        c = Slot{};
    }

    nn::Transformer<B>& part_;
    ProcessGroups& groups_;
    PipelineShape shape_;
    std::vector<Step> schedule_;
    std::vector<index_t> chunk_begin_;  ///< chunk v's layers are part_.layers[chunk_begin_[v], chunk_begin_[v + 1])
    std::span<const std::vector<index_t>> batches_;
    std::span<const nn::TokenLayout> layouts_;
    const Loss* loss_ = nullptr;
    nn::Pass pass_ = nn::Pass::training;
    std::vector<Slot> slots_;
    std::vector<float> losses_;
    std::vector<Pending> waiting_;  ///< sends not yet posted
    std::vector<Pending> pending_;  ///< sends posted, waited at the end of the step
    double bubble_ = 0;
    std::conditional_t<backend::offloads<B>, std::unique_ptr<nn::KeptOffload<B>>, std::monostate> offloader_{};
};

}  // namespace moonmoe::parallel
