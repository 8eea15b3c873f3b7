// moonmoe/trainer.hpp: `moonmoe::Trainer<Model>`, a training run made from the model type alone.
//
//   using Tiny = moonmoe::TinyK2::with<moonmoe::Optimizer<...>, moonmoe::Parallel<2, 2, 2, MicroBatches<4>>>;
//   moonmoe::Trainer<Tiny> run(world, {.seed = 7});       // or Trainer<Tiny> run({.seed = 7}) in one process
//   for (...) float loss = run.step(my_micro_batches, layout);
//   run.save("out");                                      // one Hugging Face checkpoint of the whole model
//   run.save_optimizer_state("out/optimizer");            // resumable in any other layout
//
// What each component of the type becomes:
//   Dims, Attention, RoPE, MoE, Precision, Activations   the model (the rank's part of it), nn::Transformer<backend>
//   Backend<Tag, Kernels>                                the backend the model and the optimizer live on, and the
//                                                        CUDA kernels it runs (backend/kernels.hpp): the
//                                                        environment variable MOONMOE_CUDA_FAST_KERNELS overrides
//                                                        the type, and kernels() says what the run uses and why
//   Optimizer<Muon, AdamW, QKClip, WSD, BiasUpdateRate>  the optimizer: optim::Optimizer in one process, ZeRO-1's
//                                                        parallel::DistributedOptimizer otherwise
//   Parallel<PP, EP, DP, VirtualStages, Split,           the process layout (DP Dynamic: the world's size over PP x
//            MicroBatches>                               EP), the split of the layers, the interleaved-1F1B pipeline;
//                                                        MicroBatches<M> is the count step() takes from each token
//                                                        stream (Dynamic: whatever count it is given, at least PP)
//
// A type of Parallel<1, 1, 1> trains in one process without a communicator (Trainer(options)); it runs each
// micro-batch forward and backward with its gradient scaled by 1 / M, then the optimizer, which is what the pipeline
// and ZeRO-1 compute over many ranks (the MPI tests hold the two equal). Any other layout takes the world
// communicator (parallel/mpi.hpp or parallel/nccl.hpp) and every rank builds its Trainer and calls every method in
// the same order (they are collective). step() takes the micro-batches of this rank's token stream (replica() of
// replicas(): the EP x DP ranks of a pipeline stage are data-parallel for everything but the experts) and returns the
// step's loss, the mean over every micro-batch of every stream, on every rank.
//
// Weights come from `TrainerOptions::checkpoint` when it names a Hugging Face checkpoint (saved by any layout, or
// by transformers; each rank reads only its part's tensors), else from nn::init_weights with the seed (each
// parameter's values depend on the seed and its name alone, so every layout starts from the same model). A type
// with Dynamic sizes takes them from the checkpoint's config.json and needs one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/kernels.hpp"
#include "config.hpp"
#include "io/model_io.hpp"
#include "io/optimizer_state.hpp"
#include "nn/init.hpp"
#include "nn/transformer.hpp"
#include "optim/optimizer.hpp"
#include "parallel/checkpoint.hpp"
#include "parallel/groups.hpp"
#include "parallel/optimizer_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/zero.hpp"
#include "rl/objective.hpp"
#include "rl/pipeline.hpp"

namespace moonmoe {

/// Where a Trainer's weights come from.
struct TrainerOptions {
    /// A Hugging Face checkpoint directory to start from; empty: nn::init_weights with `seed`.
    std::filesystem::path checkpoint{};
    std::uint64_t seed = 0;
    /// nn::init_weights' standard deviation (transformers' DeepseekV3 default).
    double initializer_range = 0.02;
    LoadOptions load{};
};

template <class Model>
class Trainer {
public:
    using backend = typename Model::backend;
    using OptimizerConfig = typename Model::optimizer;
    using Part = nn::Transformer<backend>;
    using Optimizer = optim::Optimizer<OptimizerConfig, backend>;

    /// The type's layout is one process: it needs no communicator.
    static constexpr bool one_process =
        Model::config.parallel.pp == 1 && Model::config.parallel.ep == 1 && Model::config.parallel.dp == 1;

    /// One process (Parallel<1, 1, 1>).
    explicit Trainer(const TrainerOptions& options = {})
        requires one_process
        : config_(resolve_config(options, 1)) {
        kernels_ = moonmoe::backend::KernelOps<backend>::use(Model::kernels);
        if (options.checkpoint.empty()) part_ = std::make_unique<Part>(config_);
        else
            part_ = std::make_unique<Part>(load_transformer<Model, backend>(options.checkpoint, options.load));
        initialise(options);
        optimizer_ = std::make_unique<Optimizer>(*part_);
    }

    /// Every rank of `world`, which has PP x EP x DP processes (DP Dynamic: any multiple of PP x EP).
    explicit Trainer(parallel::Communicator& world, const TrainerOptions& options = {})
        : config_(resolve_config(options, world.size())) {
        kernels_ = moonmoe::backend::KernelOps<backend>::use(Model::kernels);
        groups_ = std::make_unique<parallel::ProcessGroups>(world, config_.parallel);
        part_ = std::make_unique<Part>(config_, parallel::model_part(config_, groups_->at),
                                       parallel::expert_dispatcher<backend>(*groups_));
        initialise(options);
        distributed_ = std::make_unique<parallel::DistributedOptimizer<OptimizerConfig, backend>>(*part_, *groups_);
    }

    Trainer(const Trainer&) = delete;  // the optimizer and the pipeline hold the model's parameters by address
    Trainer& operator=(const Trainer&) = delete;

    /// One optimizer step over this rank's micro-batches (each `layout.tokens()` ids): forward and backward of each
    /// (through the pipeline when there is one), then the optimizer (ZeRO-1 over the replicas). Returns the mean
    /// loss over every micro-batch of every token stream, on every rank.
    float step(std::span<const std::vector<index_t>> micro_batches, const nn::TokenLayout& layout) {
        const index_t m = index_t(micro_batches.size());
        if (config_.parallel.micro_batches != Dynamic && m != config_.parallel.micro_batches)
            throw std::invalid_argument(where() + "step: " + std::to_string(m) +
                                        " micro-batches, the model type's MicroBatches<" +
                                        std::to_string(config_.parallel.micro_batches) + "> takes that many per step");
        if (m < 1) throw std::invalid_argument(where() + "step: no micro-batch");
        for (std::size_t i = 0; i < micro_batches.size(); ++i)
            if (index_t(micro_batches[i].size()) != layout.tokens())
                throw std::invalid_argument(where() + "step: micro-batch " + std::to_string(i) + " has " +
                                            std::to_string(micro_batches[i].size()) + " ids, the layout " +
                                            std::to_string(layout.tokens()));
        float loss = 0;
        if (!groups_) {
            for (const auto& ids : micro_batches) loss += part_->train_step(ids.data(), layout, 1.0f / float(m));
            loss /= float(m);
            report_ = optimizer_->step();
            return loss;
        }
        if (!pipeline_ || pipeline_micro_batches_ != m) {
            pipeline_ = std::make_unique<parallel::Pipeline<backend>>(*part_, *groups_, m);
            pipeline_micro_batches_ = m;
        }
        const auto r = pipeline_->run(micro_batches, layout);
        timing_ = r.timing;
        report_ = distributed_->step();
        std::vector<float> sum = {r.loss};  // the replica's loss, on every rank of its pipeline
        groups_->dense_dp->all_reduce(std::span<float>(sum), parallel::ReduceOp::sum);
        return sum[0] / float(groups_->replicas());
    }
    /// One micro-batch per step.
    float step(const std::vector<index_t>& ids, const nn::TokenLayout& layout) {
        return step(std::span<const std::vector<index_t>>(&ids, 1), layout);
    }

    /// One RL iteration's optimizer step (rl/objective.hpp): the K1.5 objective of this rank's token stream's
    /// prompt groups, with the model type's RL<...> settings (budget penalty, and the PTX loss on `ptx` when its
    /// weight is set), then the optimizer as step() runs it (ZeRO-1 over the replicas, which averages their
    /// gradients: give every stream the same number of prompts and the objective is the mean over all of them).
    /// Layouts without pipeline parallelism run the part as a whole model (one forward and backward); with PP > 1
    /// the objective takes two passes through the pipeline (rl/pipeline.hpp) over M micro-batches of whole samples,
    /// M the type's MicroBatches<M> (Dynamic: PP), so each stream needs at least M samples. Returns the objective
    /// (loss and per-sample log-probabilities of this stream; the loss averaged over the streams on every rank).
    rl::ObjectiveValue rl_step(std::span<const rl::Group> groups, const rl::PtxBatch* ptx = nullptr) {
        const rl::Objective objective = rl::Objective::of(Model::rl::value);
        rl::ObjectiveValue v;
        if (config_.parallel.pp > 1) {
            const index_t m =
                config_.parallel.micro_batches != Dynamic ? config_.parallel.micro_batches : config_.parallel.pp;
            if (!pipeline_ || pipeline_micro_batches_ != m) {
                pipeline_ = std::make_unique<parallel::Pipeline<backend>>(*part_, *groups_, m);
                pipeline_micro_batches_ = m;
            }
            v = rl::k15_train_step(*pipeline_, *groups_, groups, objective, ptx, &timing_);
        } else {
            v = rl::k15_train_step(*part_, groups, objective, ptx);
            timing_ = {};  // no pipeline ran: not an earlier step's time
        }
        ++rl_iterations_;
        if (!groups_) {
            report_ = optimizer_->step();
            return v;
        }
        report_ = distributed_->step();
        std::vector<double> sum = {v.loss};
        groups_->dense_dp->all_reduce(std::span<double>(sum), parallel::ReduceOp::sum);
        v.loss = sum[0] / double(groups_->replicas());
        return v;
    }
    /// The sampling temperature of the next RL iteration: the model type's TemperatureDecay at rl_iterations().
    double sampling_temperature() const { return Model::rl::value.temperature.at(rl_iterations_); }
    /// RL iterations (rl_step calls) so far.
    long long rl_iterations() const { return rl_iterations_; }

    /// The resolved configuration (Dynamic sizes from the checkpoint, DP from the world).
    const ModelConfig& config() const { return config_; }
    /// The model, or this rank's part of it.
    Part& model() { return *part_; }
    /// The optimizer this rank steps (under ZeRO-1: the state of the parameters it owns).
    Optimizer& optimizer() { return groups_ ? distributed_->inner() : *optimizer_; }
    /// The optimizer's report of the last step (learning rates, QK-Clip, a skipped step).
    const optim::StepReport& last_report() const { return report_; }
    /// Where the last step's time went on this rank (parallel runs; zeros in one process).
    const typename parallel::Pipeline<backend>::Timing& timing() const { return timing_; }
    /// This rank's process groups (null in one process).
    parallel::ProcessGroups* groups() { return groups_.get(); }
    /// This rank's token stream, of replicas(): which micro-batches step() takes here.
    index_t replica() const { return groups_ ? groups_->replica() : 0; }
    index_t replicas() const { return groups_ ? groups_->replicas() : 1; }
    /// The kernels the run uses and what chose them (the type's Backend<>, or MOONMOE_CUDA_FAST_KERNELS).
    const std::string& kernels() const { return kernels_; }

    /// One Hugging Face checkpoint of the whole model in `dir` (collective in a parallel run; io/model_io.hpp and
    /// parallel/checkpoint.hpp: atomic, transformers loads it).
    void save(const std::filesystem::path& dir, const parallel::SaveOptions& options = {}) {
        if (groups_) parallel::save_checkpoint(dir, *part_, *groups_, options);
        else
            save_transformer(dir, *part_, options);
    }

    /// The optimizer state in `dir` as optimizer-<r>-of-<N>.safetensors files, which any layout resumes
    /// (load_optimizer_state); one process writes one file, atomically as a parallel run writes its N.
    void save_optimizer_state(const std::filesystem::path& dir) {
        if (groups_) return parallel::save_optimizer_state(dir, *distributed_, *groups_);
        namespace fs = std::filesystem;
        const fs::path target = fs::absolute(dir).lexically_normal();
        if (fs::exists(target) && !fs::is_directory(target))
            throw io_error(target.string() + " exists and is not a directory (an optimizer state directory)");
        const fs::path temp = target.parent_path() / ("." + target.filename().string() + ".tmp-optimizer");
        fs::remove_all(temp);
        fs::create_directories(temp);
        try {
            moonmoe::save_optimizer_state(temp / parallel::detail::optimizer_file_name(0, 1), *optimizer_);
        } catch (...) {
            fs::remove_all(temp);
            throw;
        }
        fs::remove_all(target);
        fs::rename(temp, target);
    }
    /// The state save_optimizer_state wrote, in this layout or any other.
    void load_optimizer_state(const std::filesystem::path& dir) { parallel::load_optimizer_state(dir, optimizer()); }

private:
    static ModelConfig resolve_config(const TrainerOptions& options, int world_size) {
        ModelConfig c = Model::config;
        if (!options.checkpoint.empty()) c = resolve(Model::config, Checkpoint(options.checkpoint).config());
        else if (!c.is_static())
            throw std::invalid_argument(
                "moonmoe::Trainer: the model type leaves sizes Dynamic; give a checkpoint "
                "(TrainerOptions::checkpoint) to read them from");
        if (c.parallel.dp == Dynamic) {
            const index_t per_replica = c.parallel.pp * c.parallel.ep;
            if (world_size % per_replica != 0)
                throw std::invalid_argument("moonmoe::Trainer: Parallel<" + std::to_string(c.parallel.pp) + ", " +
                                            std::to_string(c.parallel.ep) + ", Dynamic> needs a multiple of " +
                                            std::to_string(per_replica) + " processes, this run has " +
                                            std::to_string(world_size));
            c.parallel.dp = world_size / per_replica;
        }
        return c;
    }

    void initialise(const TrainerOptions& options) {
        if (options.checkpoint.empty()) {
            nn::init_weights(*part_, {.seed = options.seed, .initializer_range = options.initializer_range});
            return;
        }
        if (groups_) parallel::load_checkpoint(options.checkpoint, *part_, options.load);  // one process: loaded
    }

    std::string where() const {
        return groups_ ? "moonmoe::Trainer (rank " + std::to_string(groups_->world.rank()) + "): "
                       : std::string("moonmoe::Trainer: ");
    }

    ModelConfig config_;
    std::string kernels_;
    std::unique_ptr<parallel::ProcessGroups> groups_;
    std::unique_ptr<Part> part_;
    std::unique_ptr<Optimizer> optimizer_;                                                   // one process
    std::unique_ptr<parallel::DistributedOptimizer<OptimizerConfig, backend>> distributed_;  // parallel
    std::unique_ptr<parallel::Pipeline<backend>> pipeline_;
    index_t pipeline_micro_batches_ = 0;
    long long rl_iterations_ = 0;
    optim::StepReport report_{};
    typename parallel::Pipeline<backend>::Timing timing_{};
};

}  // namespace moonmoe
