// A parallel run saved in one layout resumes in another (parallel/checkpoint.hpp, parallel/optimizer_state.hpp):
// the tiny Kimi K2 trains two ZeRO-1 MuonClip steps at layout A, saves its weights and its optimizer state, trains two
// more steps; a second run at layout B loads both and trains the same two steps. The global batch is the same in both
// layouts (the same micro-batches, split over their EP x DP token streams), so the resumed run's losses equal the
// uninterrupted run's, within the parallel tolerance (relative 1e-5: the layouts sum expert rows and replicas in
// other orders, test/mpi/model.cpp). Layouts: 2 ranks (2,1,1) -> (1,2,1) and (1,1,2) -> (2,1,1); 4 ranks (2,2,1) ->
// (1,2,2); 8 ranks (2,2,2) -> (1,4,2). The state the new layout loaded, saved again, is the old layout's bit for
// bit (each parameter's state on its new owner). Also: a state directory with a file missing, or saved by another
// model, is refused naming what is wrong.
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

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_resume {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::world;
namespace fs = std::filesystem;

namespace {

// Rates that move the tiny model each step (K2's schedule would still be warming up), the clip acting at tau 5.
using Clipped = moonmoe::Optimizer<Muon<LearningRate<0.02>>, AdamW<LearningRate<0.003>>, QKClip<5>,
                                   WSD<Warmup<1>, Stable<1000>, Decay<0>>>;

struct Layout {
    index_t pp, ep, dp;
};

constexpr index_t global_micro_batches = 8;  ///< per step, split over a layout's token streams

std::vector<index_t> micro_batch(index_t vocab, index_t m, int step) {
    std::mt19937_64 gen(9100 + std::uint64_t(m) * 31 + std::uint64_t(step) * 1009);
    std::vector<index_t> ids(16);
    for (index_t& t : ids) t = index_t(gen() % std::uint64_t(vocab));
    return ids;
}

/// One layout's run of the tiny K2: its part, pipeline and ZeRO-1 optimizer.
struct Run {
    ModelConfig c;
    ProcessGroups g;
    nn::Transformer<cpu> part;
    Pipeline<cpu> pipeline;
    DistributedOptimizer<Clipped, cpu> opt;

    static ModelConfig configure(const Layout& l) {
        ModelConfig c = TinyK2::config;
        c.parallel.pp = l.pp, c.parallel.ep = l.ep, c.parallel.dp = l.dp, c.parallel.virtual_stages = 1;
        c.parallel.micro_batches = global_micro_batches / (l.ep * l.dp);
        return c;
    }
    explicit Run(const Layout& l) : Run(configure(l)) {}
    explicit Run(const ModelConfig& config)
        : c(config), g(world(), c.parallel), part(c, model_part(c, g.at), expert_dispatcher<cpu>(g)),
          pipeline(part, g, c.parallel.micro_batches), opt(part, g) {}

    /// One step on the global batch of `step`; returns the mean loss over all its micro-batches (on every rank).
    double step(int step) {
        const index_t M = c.parallel.micro_batches;
        std::vector<std::vector<index_t>> mine;
        for (index_t m = 0; m < M; ++m) mine.push_back(micro_batch(c.dims.vocab, g.replica() * M + m, step));
        const auto result = pipeline.run(mine, nn::TokenLayout::sequences(2, 8));
        REQUIRE(opt.step().skipped_nonfinite == 0);
        // each stream's losses are on every rank of its pipeline: count them once, from its first stage
        std::vector<double> sum = {g.at.pp == 0 ? double(result.loss) * double(M) : 0.0};
        world().all_reduce(std::span<double>(sum), ReduceOp::sum);
        return sum[0] / double(global_micro_batches);
    }
};

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
    return fs::path(MOONMOE_TEST_BINARY_DIR) / "mpi_scratch" / ("resume_np" + std::to_string(world().size()) + "_" + name);
}

void check_resume(const Layout& a, const Layout& b) {
    INFO("trained at (" << a.pp << ", " << a.ep << ", " << a.dp << "), resumed at (" << b.pp << ", " << b.ep << ", "
                        << b.dp << "), rank " << world().rank());
    const fs::path weights = scratch("weights"), state = scratch("optimizer");
    std::vector<double> uninterrupted;
    {
        Run first(a);
        nn::init_weights(first.part, {.seed = 5});
        for (int s = 0; s < 2; ++s) first.step(s);
        save_checkpoint(weights, first.part, first.g);
        save_optimizer_state(state, first.opt, first.g);
        for (int s = 2; s < 4; ++s) uninterrupted.push_back(first.step(s));
    }
    Run resumed(b);
    load_checkpoint(weights, resumed.part);
    load_optimizer_state(state, resumed.opt);
    CHECK(resumed.opt.inner().steps() == 2);
    // the state as the new layout holds it, saved again: every tensor bit for bit the old layout's, none missing
    const fs::path again = scratch("optimizer_again");
    save_optimizer_state(again, resumed.opt, resumed.g);
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
        const double loss = resumed.step(s);
        CHECK(loss == doctest::Approx(uninterrupted[std::size_t(s - 2)]).epsilon(1e-5));
        if (world().rank() == 0)
            MESSAGE("step " << s << ": uninterrupted " << uninterrupted[std::size_t(s - 2)] << ", resumed " << loss);
    }
    world().barrier();
}

}  // namespace

TEST_CASE("A run saved in one layout (weights and ZeRO-1 optimizer state) resumes in another with the losses of the "
          "uninterrupted run") {
    switch (world().size()) {
    case 2:
        check_resume({2, 1, 1}, {1, 2, 1});
        check_resume({1, 1, 2}, {2, 1, 1});
        break;
    case 4: check_resume({2, 2, 1}, {1, 2, 2}); break;
    case 8: check_resume({2, 2, 2}, {1, 4, 2}); break;
    default: MESSAGE("no resume layouts for " << world().size() << " ranks");
    }
}

TEST_CASE("parallel::load_optimizer_state names what is wrong: a missing file, the state of another model") {
    const Layout l{1, 1, world().size()};
    const fs::path state = scratch("refused");
    {
        Run run(Run::configure(l));
        nn::init_weights(run.part, {.seed = 5});
        run.step(0);
        save_optimizer_state(state, run.opt, run.g);
    }
    CHECK_FALSE(fs::exists(state.parent_path() / ("." + state.filename().string() + ".tmp-optimizer")));
    {
        Run again(Run::configure(l));
        load_optimizer_state(state, again.opt);
        CHECK(again.opt.inner().steps() == 1);
    }
    {
        ModelConfig wider = Run::configure(l);
        wider.moe.expert_hidden *= 2;  // the experts' state has other shapes
        Run other(wider);
        CHECK_THROWS_WITH_AS(load_optimizer_state(state, other.opt), doctest::Contains("expected F32 ["), io_error);
    }
    const std::string n = std::string(5 - std::to_string(world().size()).size(), '0') + std::to_string(world().size());
    const std::string last = "optimizer-" + n + "-of-" + n + ".safetensors";
    CHECK(fs::exists(state / last));
    world().barrier();  // every rank has looked before rank 0 moves the file away
    if (world().rank() == 0) fs::rename(state / last, state / ("moved-" + last));
    world().barrier();
    {
        Run again(Run::configure(l));
        const std::string expected = world().size() == 1 ? "no optimizer-<rank>-of-<ranks>.safetensors file"
                                                         : last + " is missing";
        CHECK_THROWS_WITH_AS(load_optimizer_state(state, again.opt), doctest::Contains(expected.c_str()), io_error);
    }
    world().barrier();
    if (world().rank() == 0) fs::remove_all(state);
    world().barrier();
}

}  // namespace mpi_resume
