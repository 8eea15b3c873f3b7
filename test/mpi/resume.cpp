// A parallel run saved in one layout resumes in another (parallel/checkpoint.hpp, parallel/optimizer_state.hpp):
// the tiny Kimi K2 trains two ZeRO-1 MuonClip steps at layout A, saves its weights and its optimizer state, trains two
// more steps; a second run at layout B loads both and trains the same two steps. The global batch is the same in both
// layouts (the same micro-batches, split over their EP x DP token streams), so the resumed run's losses equal the
// uninterrupted run's, within the parallel tolerance (relative 1e-5: the layouts sum expert rows and replicas in
// other orders, test/mpi/model.cpp). Layouts: 2 ranks (2,1,1) -> (1,2,1) and (1,1,2) -> (2,1,1); 4 ranks (2,2,1) ->
// (1,2,2); 8 ranks (2,2,2) -> (1,4,2). The state the new layout loaded, saved again, is the old layout's bit for
// bit (each parameter's state on its new owner). Also: a state directory with a file missing, or saved by another
// model, is refused naming what is wrong; and the run at the world's layout trains as one process does. Every run is
// a moonmoe::Trainer of a model type that names its layout.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/checkpoint.hpp>
#include <moonmoe/parallel/optimizer_state.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/zero.hpp>
#include <moonmoe/trainer.hpp>

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_resume {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::random_ids;
using moonmoe::testing::world;
namespace fs = std::filesystem;

namespace {

// Rates that move the tiny model each step (K2's schedule would still be warming up), the clip acting at tau 5.
using Clipped = moonmoe::Optimizer<Muon<LearningRate<0.02>>, AdamW<LearningRate<0.003>>, QKClip<5>,
                                   WSD<Warmup<1>, Stable<1000>, Decay<0>>>;

constexpr index_t global_micro_batches = 8;  ///< per step, split over a layout's token streams

std::vector<index_t> micro_batch(index_t vocab, index_t m, int step) {
    return random_ids(vocab, 9100 + std::uint64_t(m) * 31 + std::uint64_t(step) * 1009);
}

/// The tiny K2 with the clipped optimizer, at layout (PP, EP, DP): everything the run is, in one type.
template <index_t PP, index_t EP, index_t DP>
using Tiny = TinyK2::with<Clipped, Parallel<PP, EP, DP>>;

/// One step of `run` on the global batch of `step`, split over its token streams; returns the mean loss over all
/// its micro-batches (on every rank).
template <class Model>
double step(Trainer<Model>& run, int step) {
    const index_t M = global_micro_batches / run.replicas();
    std::vector<std::vector<index_t>> mine;
    for (index_t m = 0; m < M; ++m) mine.push_back(micro_batch(run.config().dims.vocab, run.replica() * M + m, step));
    const double loss = run.step(mine, nn::TokenLayout::sequences(2, 8));
    REQUIRE(run.last_report().skipped_nonfinite == 0);
    return loss;
}

/// Every tensor of an optimizer state directory, by name (each must appear once).
std::map<std::string, std::vector<float>> state_tensors(const fs::path& dir) {
    std::map<std::string, std::vector<float>> out;
    for (const auto& entry : fs::directory_iterator(dir)) {
        SafetensorsFile f(entry.path());
        for (const std::string& name : f.names()) {
            INFO(entry.path().string() << ": " << name);
            CHECK(out.count(name) == 0);
            out[name] = to_f32(f.at(name));
        }
    }
    return out;
}

fs::path scratch(const std::string& name) {
    return fs::path(MOONMOE_TEST_BINARY_DIR) / "mpi_scratch" /
           ("resume_np" + std::to_string(world().size()) + "_" + name);
}

template <class A, class B>
void check_resume() {
    constexpr ParallelConfig a = A::config.parallel, b = B::config.parallel;
    INFO("trained at (" << a.pp << ", " << a.ep << ", " << a.dp << "), resumed at (" << b.pp << ", " << b.ep << ", "
                        << b.dp << "), rank " << world().rank());
    const fs::path weights = scratch("weights"), state = scratch("optimizer");
    std::vector<double> uninterrupted;
    {
        Trainer<A> first(world(), {.seed = 5});
        for (int s = 0; s < 2; ++s) step(first, s);
        first.save(weights);
        first.save_optimizer_state(state);
        for (int s = 2; s < 4; ++s) uninterrupted.push_back(step(first, s));
    }
    Trainer<B> resumed(world(), {.checkpoint = weights});
    resumed.load_optimizer_state(state);
    CHECK(resumed.optimizer().steps() == 2);
    // the state as the new layout holds it, saved again: every tensor bit for bit the old layout's, none missing
    const fs::path again = scratch("optimizer_again");
    resumed.save_optimizer_state(again);
    if (world().rank() == 0) {
        const std::map<std::string, std::vector<float>> before = state_tensors(state), after = state_tensors(again);
        CHECK(before.size() == after.size());
        CHECK(!before.empty());
        for (const auto& [name, values] : before) {
            INFO(name);
            REQUIRE(after.count(name) == 1);
            CHECK(std::memcmp(values.data(), after.at(name).data(), values.size() * sizeof(float)) == 0);
        }
    }
    for (int s = 2; s < 4; ++s) {
        const double loss = step(resumed, s);
        CHECK(loss == doctest::Approx(uninterrupted[std::size_t(s - 2)]).epsilon(1e-5));
        if (world().rank() == 0)
            MESSAGE("step " << s << ": uninterrupted " << uninterrupted[std::size_t(s - 2)] << ", resumed " << loss);
    }
    world().barrier();
}

}  // namespace

/// The run at layout `Model` and the one-process Trainer (no communicator: micro-batches through train_step with
/// their gradients scaled by 1 / M, then optim::Optimizer) on the same global batches: the same losses.
template <class Model>
void check_against_one_process() {
    INFO("layout (" << Model::config.parallel.pp << ", " << Model::config.parallel.ep << ", "
                    << Model::config.parallel.dp << "), rank " << world().rank());
    Trainer<Model> parallel(world(), {.seed = 5});
    Trainer<Tiny<1, 1, 1>> one({.seed = 5});
    for (int s = 0; s < 3; ++s) {
        const double p = step(parallel, s), o = step(one, s);
        CHECK(p == doctest::Approx(o).epsilon(1e-5));
    }
}

TEST_CASE("Trainer<Model> in the world's layout trains as the one-process Trainer") {
    switch (world().size()) {
    case 1: check_against_one_process<Tiny<1, 1, 1>>(); break;
    case 2: check_against_one_process<Tiny<1, 2, 1>>(); break;
    case 4: check_against_one_process<Tiny<2, 1, 2>>(); break;
    case 8: check_against_one_process<Tiny<2, 2, 2>>(); break;
    default: MESSAGE("no layout for " << world().size() << " ranks");
    }
}

TEST_CASE(
    "A run saved in one layout (weights and ZeRO-1 optimizer state) resumes in another with the losses of the "
    "uninterrupted run") {
    switch (world().size()) {
    case 2:
        check_resume<Tiny<2, 1, 1>, Tiny<1, 2, 1>>();
        check_resume<Tiny<1, 1, 2>, Tiny<2, 1, 1>>();
        break;
    case 4: check_resume<Tiny<2, 2, 1>, Tiny<1, 2, 2>>(); break;
    case 8: check_resume<Tiny<2, 2, 2>, Tiny<1, 4, 2>>(); break;
    default: MESSAGE("no resume layouts for " << world().size() << " ranks");
    }
}

TEST_CASE("parallel::load_optimizer_state names what is wrong: a missing file, the state of another model") {
    using Data = Tiny<1, 1, Dynamic>;  // as many data-parallel replicas as the world has ranks
    const fs::path state = scratch("refused");
    {
        Trainer<Data> run(world(), {.seed = 5});
        CHECK(run.config().parallel.dp == world().size());
        step(run, 0);
        run.save_optimizer_state(state);
    }
    CHECK_FALSE(fs::exists(state.parent_path() / ("." + state.filename().string() + ".tmp-optimizer")));
    {
        Trainer<Data> again(world());
        again.load_optimizer_state(state);
        CHECK(again.optimizer().steps() == 1);
    }
    {
        using Wider = Data::with<MoE<Experts<8>, TopK<2>, Shared<1>, ExpertHidden<32>>>;  // other expert shapes
        static_assert(Wider::config.moe.expert_hidden == 2 * TinyK2::config.moe.expert_hidden);
        Trainer<Wider> other(world());
        CHECK_THROWS_WITH_AS(other.load_optimizer_state(state), doctest::Contains("expected F32 ["), io_error);
    }
    const std::string n = std::string(5 - std::to_string(world().size()).size(), '0') + std::to_string(world().size());
    const std::string last = "optimizer-" + n + "-of-" + n + ".safetensors";
    CHECK(fs::exists(state / last));
    world().barrier();  // every rank has looked before rank 0 moves the file away
    if (world().rank() == 0) fs::rename(state / last, state / ("moved-" + last));
    world().barrier();
    {
        Trainer<Data> again(world());
        const std::string expected =
            world().size() == 1 ? "no optimizer-<rank>-of-<ranks>.safetensors file" : last + " is missing";
        CHECK_THROWS_WITH_AS(again.load_optimizer_state(state), doctest::Contains(expected.c_str()), io_error);
    }
    world().barrier();
    if (world().rank() == 0) fs::remove_all(state);
    world().barrier();
}

}  // namespace mpi_resume
