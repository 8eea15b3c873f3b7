// moonmoe::Trainer<Model> in one process, on every backend of the build: it is the composition it names (the same
// numbers, bit for bit, as nn::Transformer::train_step and optim::Optimizer driven by hand, micro-batches included);
// the type's MicroBatches<M> and Backend<> are what it runs with, and it refuses what the type does not allow,
// naming it; a save and a resume from the checkpoint and the optimizer state continue the run bit for bit.
// test/mpi/trainer.cpp runs the parallel layouts against it.
#include "support/backends.hpp"
#include "support/io_testing.hpp"
#include "support/nn_testing.hpp"

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include <moonmoe/moonmoe.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_trainer {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

// The README's quick-start optimizer
using QuickStart = moonmoe::Optimizer<Muon<LearningRate<0.02>>, AdamW<LearningRate<0.003>>, QKClip<100>,
                                      WSD<Warmup<2>, Stable<1000>, Decay<0>>>;
template <class B>
using Tiny = TinyK2::with<QuickStart, Backend<B>>;

std::vector<index_t> pattern(index_t sequences, index_t length, index_t offset = 0) {
    std::vector<index_t> ids;
    for (index_t b = 0; b < sequences; ++b)
        for (index_t i = 0; i < length; ++i) ids.push_back((50 * (b + offset) + 7 * i) % 256);
    return ids;
}

template <class B>
std::vector<float> weights(nn::Transformer<B>& model) {
    std::vector<float> all;
    model.visit_params([&](const ParamRef& p) {
        const std::vector<float> v = to_host(View<const float, 1, B>(p.value, {p.numel()}));
        all.insert(all.end(), v.begin(), v.end());
    });
    return all;
}

}  // namespace

TEST_CASE_TEMPLATE("Trainer<Model> is the model and optimizer of its type, driven as by hand, bit for bit", B,
                   MOONMOE_TEST_BACKENDS) {
    static_assert(std::is_same_v<typename Trainer<Tiny<B>>::backend, B>);
    static_assert(Trainer<Tiny<B>>::one_process);
    Trainer<Tiny<B>> run({.seed = 42});
    nn::Transformer<B> model(Tiny<B>::config);
    nn::init_weights(model, {.seed = 42});
    optim::Optimizer<QuickStart, B> opt(model);
    const auto layout = nn::TokenLayout::sequences(2, 16);
    for (int step = 0; step < 4; ++step) {
        CAPTURE(step);
        // two micro-batches per step: each gradient scaled by 1/2, as the pipeline scales them
        const std::vector<std::vector<index_t>> mbs = {pattern(2, 16, step), pattern(2, 16, step + 2)};
        const float got = run.step(mbs, layout);
        const float a = model.train_step(mbs[0].data(), layout, 0.5f),
                    b = model.train_step(mbs[1].data(), layout, 0.5f);
        opt.step();
        CHECK(got == (a + b) / 2.0f);
        CHECK(run.last_report().step == step + 1);
    }
    CHECK(weights(run.model()) == weights(model));
    CHECK(run.kernels().find(std::string(B::name)) == 0);  // the backend it ran on, first
}

TEST_CASE_TEMPLATE("Trainer<Model>: the quick start trains, and a save and resume continue the run bit for bit", B,
                   MOONMOE_TEST_BACKENDS) {
    const auto dir = io_testing::scratch_dir(std::string("trainer_resume_") + B::name);
    const auto layout = nn::TokenLayout::sequences(4, 32);
    const std::vector<index_t> ids = pattern(4, 32);
    Trainer<Tiny<B>> run({.seed = 42});
    std::vector<float> losses;
    for (int step = 0; step < 12; ++step) losses.push_back(run.step(ids, layout));
    CHECK(losses.front() == doctest::Approx(std::log(256.0)).epsilon(0.02));
    for (std::size_t s = 1; s < losses.size(); ++s) CHECK(losses[s] < losses[s - 1]);
    run.save(dir / "checkpoint");
    run.save_optimizer_state(dir / "optimizer");
    run.save_optimizer_state(dir / "optimizer");  // replaces the state it wrote, as a whole
    CHECK(std::filesystem::exists(dir / "optimizer" / "optimizer-00001-of-00001.safetensors"));

    Trainer<Tiny<B>> resumed({.checkpoint = dir / "checkpoint"});
    resumed.load_optimizer_state(dir / "optimizer");
    CHECK(resumed.optimizer().steps() == 12);
    for (int step = 0; step < 3; ++step) CHECK(resumed.step(ids, layout) == run.step(ids, layout));
    CHECK(weights(resumed.model()) == weights(run.model()));
}

TEST_CASE("Trainer<Model> runs what the type says and refuses what it does not allow, naming it") {
    SUBCASE("MicroBatches<M> is the count step() takes") {
        Trainer<TinyK2::with<Parallel<1, 1, 1, MicroBatches<3>>>> run({.seed = 1});
        const auto layout = nn::TokenLayout::sequences(1, 8);
        const std::vector<std::vector<index_t>> two = {pattern(1, 8), pattern(1, 8, 1)};
        io_testing::check_error([&] { run.step(two, layout); }, {"2 micro-batches", "MicroBatches<3>"});
        const std::vector<std::vector<index_t>> three = {pattern(1, 8), pattern(1, 8, 1), pattern(1, 8, 2)};
        CHECK(std::isfinite(run.step(three, layout)));
        const std::vector<std::vector<index_t>> short_one = {pattern(1, 8), pattern(1, 7), pattern(1, 8)};
        io_testing::check_error([&] { run.step(short_one, layout); }, {"micro-batch 1 has 7 ids", "8"});
    }
    SUBCASE("a type with Dynamic sizes needs a checkpoint, and takes its sizes from it") {
        io_testing::check_error([] { Trainer<AnyDeepSeekV3> run({.seed = 1}); }, {"Dynamic", "checkpoint"});
        Trainer<AnyDeepSeekV3> run({.checkpoint = io_testing::test_data("tiny_k2")});
        CHECK(run.config().dims.hidden == TinyK2::config.dims.hidden);
        CHECK(run.config().moe.experts == TinyK2::config.moe.experts);
    }
    SUBCASE("load_transformer<Model> builds the model on the type's backend") {
        static_assert(std::is_same_v<decltype(load_transformer<TinyK2>("")), nn::Transformer<cpu>>);
#if defined(MOONMOE_TEST_CUDA)
        static_assert(std::is_same_v<decltype(load_transformer<TinyK2::with<Backend<moonmoe::cuda>>>("")),
                                     nn::Transformer<moonmoe::cuda>>);
#endif
    }
}

#if defined(MOONMOE_TEST_CUDA)
TEST_CASE("Trainer<Model> says which CUDA kernels the type asked for and which run <cuda>") {
    Trainer<TinyK2::with<Backend<moonmoe::cuda, CudaKernels<true, false, false, true>>>> run({.seed = 1});
    INFO(run.kernels());
    CHECK(run.kernels().find("fast kernels: attention, grouped_gemm") != std::string::npos);
#if MOONMOE_CUDA_EMULATED
    CHECK(run.kernels().find("emulated") != std::string::npos);  // the portable kernels, whatever the type asks
#else
    if (!std::getenv("MOONMOE_CUDA_FAST_KERNELS")) {  // on a GPU: the type's choice is switched on
        CHECK(backend::cuda_fast_kernels().attention);
        CHECK(!backend::cuda_fast_kernels().rmsnorm);
    }
    backend::set_cuda_fast_kernels({});  // the other tests of this binary run the portable path
#endif
}
#endif

}  // namespace unit_trainer
