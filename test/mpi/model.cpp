// The whole parallel runtime against one process: for every Parallel<PP, EP, DP> layout the world size allows
// (2 ranks: (2,1,1) V=2, (1,2,1), (1,1,2), (2,1,1) with K2's extra warm-up forward; 4 ranks: (4,1,1) V=2 without
// and with it, (2,2,1), (1,2,2), (2,1,2); 8 ranks: (2,2,2), (1,4,2), (2,4,1) V=2), on the tiny Kimi K2 and DeepSeek-V3
// models (with layers raised to PP x V where the model has fewer), three training steps of the pipeline
// (parallel/pipeline.hpp) and ZeRO-1 MuonClip (parallel/zero.hpp) against one process that runs every micro-batch of
// every replica on the whole model and steps optim::Optimizer with the mean gradient. Checked each step: the loss of
// every micro-batch, the gradient of every parameter after the reduce-scatter (each on its owner), and after the last
// step every weight; the bytes each rank sends against parallel/traffic.hpp (the pipeline's exactly without EP; ZeRO's,
// summed over the ranks, exactly flat ZeRO-1's).
//
// Bitwise where the arithmetic is the same: with EP = 1 and at most two replicas every sum runs in the same order
// (a pipeline accumulates a chunk's micro-batches in order; MPI's sum of two blocks is the one-process sum of two
// replicas). Otherwise the tolerance is 1e-5 of each tensor's largest magnitude (losses: relative 1e-5): EP sums
// an expert's rows from all senders in one grouped GEMM where one process has one per micro-batch, and MPI sums
// more than two replicas in its own order; both are float rounding (measured below 2e-6 on the gradients).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/traffic.hpp>
#include <moonmoe/parallel/zero.hpp>

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_model {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::random_ids;
using moonmoe::testing::scaled_error;
using moonmoe::testing::world;

namespace {

using Clipped = moonmoe::Optimizer<Muon<>, QKClip<0.001>>;  // a tau every head exceeds at init: it clips

struct Layout {
    index_t pp, ep, dp, v;
    index_t extra_warmup = 0;  ///< K2's extra warm-up forwards
};

std::vector<Layout> layouts_for(int world_size) {
    switch (world_size) {
    case 1: return {{1, 1, 1, 1}};
    case 2: return {{2, 1, 1, 2}, {1, 2, 1, 1}, {1, 1, 2, 1}, {2, 1, 1, 1, 1}};
    case 4: return {{4, 1, 1, 2}, {2, 2, 1, 1}, {1, 2, 2, 1}, {2, 1, 2, 1}, {4, 1, 1, 2, 1}};
    case 8: return {{2, 2, 2, 1}, {1, 4, 2, 1}, {2, 4, 1, 2}};
    default: return {};
    }
}

ModelConfig configure(ModelConfig c, const Layout& l, index_t micro_batches) {
    c.parallel.pp = l.pp, c.parallel.ep = l.ep, c.parallel.dp = l.dp, c.parallel.virtual_stages = l.v;
    c.parallel.micro_batches = micro_batches;
    c.dims.layers = std::max(c.dims.layers, l.pp * l.v);
    return c;
}

std::vector<index_t> batch_of(index_t vocab, index_t replica, index_t micro_batch, int step) {
    return random_ids(vocab,
                      7000 + std::uint64_t(replica) * 131 + std::uint64_t(micro_batch) * 17 + std::uint64_t(step));
}

/// One process: every micro-batch of every replica on the whole model, the gradients averaged as the runtime
/// defines (each micro-batch's loss gradient / M, then the mean over replicas).
struct Reference {
    nn::Transformer<cpu> model;
    optim::Optimizer<Clipped, cpu> opt;
    std::map<std::string, std::vector<float>> grad;  ///< the mean gradient of the last step
    std::vector<std::vector<float>> losses;          ///< [replica][micro-batch]

    explicit Reference(const ModelConfig& c) : model(c), opt(model) { nn::init_weights(model, {.seed = 5}); }

    void accumulate(const std::vector<std::vector<std::vector<index_t>>>& batches, const nn::TokenLayout& layout) {
        const auto R = batches.size();
        grad.clear();
        losses.assign(R, {});
        for (std::size_t q = 0; q < R; ++q) {
            model.zero_grad();
            const float scale = 1.0f / float(batches[q].size());
            for (const std::vector<index_t>& ids : batches[q]) {
                nn::Transformer<cpu>::Cache cache;
                Tensor<float, 2, cpu> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
                Tensor<float, 2, cpu> dlogits(logits.shape());
                const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
                losses[q].push_back(nn::cross_entropy<cpu>(logits.view(), targets.data(), dlogits.view()));
                for (index_t i = 0; i < dlogits.numel(); ++i) dlogits.data()[i] *= scale;
                model.backward(dlogits.view(), cache);
            }
            model.visit_params([&](const ParamRef& p) {
                if (!p.grad) return;
                auto& g = grad[p.name];
                if (q == 0) g.assign(p.grad, p.grad + p.numel());
                else
                    for (index_t i = 0; i < p.numel(); ++i) g[std::size_t(i)] += p.grad[i];
            });
        }
        const float mean = 1.0f / float(R);
        model.visit_params([&](const ParamRef& p) {
            if (!p.grad) return;
            auto& g = grad[p.name];
            for (index_t i = 0; i < p.numel(); ++i) g[std::size_t(i)] *= mean, p.grad[i] = g[std::size_t(i)];
        });
    }
};

/// Who runs the forwards and backwards: the pipeline executor, or (layouts without pipeline parallelism) the
/// part itself, as a whole model whose MoE layers exchange over the expert group.
enum class Driver { pipeline, transformer };

void check_layout(const std::string& model_name, ModelConfig base, const Layout& l, Driver driver = Driver::pipeline) {
    Communicator& w = world();
    const index_t M = std::max<index_t>(2, l.pp);
    const ModelConfig c = configure(base, l, M);
    const bool bitwise = l.ep == 1 && l.ep * l.dp <= 2;
    const std::string driven = driver == Driver::pipeline ? "Pipeline" : "Transformer";
    INFO(model_name << " Parallel<" << l.pp << ", " << l.ep << ", " << l.dp << "> V=" << l.v << ", extra warm-up "
                    << l.extra_warmup << ", " << M << " micro-batches per replica, run by " << driven << ", rank "
                    << w.rank());
    ProcessGroups g(w, c.parallel);
    nn::Transformer<cpu> part(c, model_part(c, g.at), expert_dispatcher<cpu>(g));
    nn::init_weights(part, {.seed = 5});
    std::optional<Pipeline<cpu>> pipeline;
    if (driver == Driver::pipeline) pipeline.emplace(part, g, M, l.extra_warmup);
    // the part as the whole model: each micro-batch's loss gradient scaled by 1 / M, as the pipeline does
    const auto run_part = [&](const std::vector<std::vector<index_t>>& micro_batches, const nn::TokenLayout& layout) {
        std::vector<float> losses;
        for (const std::vector<index_t>& ids : micro_batches) {
            nn::Transformer<cpu>::Cache cache;
            Tensor<float, 2, cpu> logits = part.forward(ids.data(), layout, cache, nn::Pass::training);
            Tensor<float, 2, cpu> dlogits(logits.shape());
            const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
            losses.push_back(nn::cross_entropy<cpu>(logits.view(), targets.data(), dlogits.view()));
            for (index_t i = 0; i < dlogits.numel(); ++i) dlogits.data()[i] *= 1.0f / float(micro_batches.size());
            part.backward(dlogits.view(), cache);
        }
        return losses;
    };
    DistributedOptimizer<Clipped, cpu> opt(part, g);
    Reference ref(c);
    const auto layout = nn::TokenLayout::sequences(2, 8);

    double worst_loss = 0, worst_grad = 0;
    index_t clipped = 0;
    for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<std::vector<index_t>>> batches(std::size_t(g.replicas()));
        for (index_t q = 0; q < g.replicas(); ++q)
            for (index_t m = 0; m < M; ++m) batches[std::size_t(q)].push_back(batch_of(c.dims.vocab, q, m, step));
        const StepTraffic predicted = step_traffic(c, g.at, layout.tokens());
        std::vector<float> losses;
        if (pipeline) {
            const auto result = pipeline->run(batches[std::size_t(g.replica())], layout);
            if (l.ep == 1) CHECK(double(result.timing.bytes_sent) == predicted.pipeline);  // exact without EP
            losses = result.losses;
        } else {
            if (step == 1) {  // inference between two steps (collective over the expert group) changes nothing
                const std::vector<index_t> prompt = batch_of(c.dims.vocab, g.replica() + 50, 0, step);
                auto state = part.start_decoding(24);
                part.decode(prompt.data(), 8, state);
                for (index_t t = 8; t < 12; ++t) part.decode(prompt.data() + t, 1, state);
                nn::Transformer<cpu>::Cache cache;
                part.forward(prompt.data(), layout, cache);
            }
            losses = run_part(batches[std::size_t(g.replica())], layout);
        }
        ref.accumulate(batches, layout);
        for (index_t m = 0; m < M; ++m) {
            const float expected = ref.losses[std::size_t(g.replica())][std::size_t(m)];
            const float got = losses[std::size_t(m)];
            worst_loss = std::max(worst_loss, std::abs(double(got) - expected) / std::abs(double(expected)));
            if (bitwise) CHECK(got == expected);
            else
                CHECK(got == doctest::Approx(expected).epsilon(1e-5));
        }
        const Traffic before = g.traffic();
        REQUIRE_FALSE(opt.reduce_gradients());
        const std::vector<int>& owners = opt.owners();
        std::size_t i = 0;
        part.visit_params([&](const ParamRef& p) {
            const int owner = owners[i++];
            if (!p.grad || owner < 0) return;
            const bool expert = p.kind == ParamKind::expert_matrix;
            const Communicator& group = expert ? *g.expert_dp : *g.dense_dp;
            if (owner != group.rank()) return;
            INFO(p.name << " step " << step);
            const std::vector<float>& want = ref.grad.at(p.name);
            const double e = scaled_error(p.grad, want.data(), p.numel());
            worst_grad = std::max(worst_grad, e);
            if (bitwise) CHECK(std::equal(p.grad, p.grad + p.numel(), want.begin()));
            else
                CHECK(e <= 1e-5);
        });
        const optim::StepReport a = opt.update(), b = ref.opt.step();
        // ZeRO-1's traffic summed over the world: flat ZeRO-1's (whole-parameter shares move the same bytes in all)
        std::vector<double> zero = {double(g.traffic().bytes - before.bytes), predicted.zero};
        w.all_reduce(std::span<double>(zero), ReduceOp::sum);
        CHECK(zero[0] == doctest::Approx(zero[1]).epsilon(1e-9));
        CHECK(a.clip.total() <= b.clip.total());  // a part clips the heads of its own layers
        clipped += b.clip.total();
    }
    CHECK(clipped > 0);
    std::map<std::string, const float*> want;
    ref.model.visit_params([&](const ParamRef& p) { want[p.name] = p.value; });
    double worst_weight = 0;
    part.visit_params([&](const ParamRef& p) {
        INFO(p.name);
        const double e = scaled_error(p.value, want.at(p.name), p.numel());
        worst_weight = std::max(worst_weight, e);
        if (bitwise) CHECK(e == 0.0);
        else
            CHECK(e <= 1e-5);
    });
    std::vector<double> worst = {worst_loss, worst_grad, worst_weight};
    w.all_reduce(std::span<double>(worst), ReduceOp::max);
    if (w.rank() == 0)
        MESSAGE(model_name << " Parallel<" << l.pp << ", " << l.ep << ", " << l.dp << "> V=" << l.v << " by " << driven
                           << std::string(l.extra_warmup ? " + extra warm-up" : "")
                           << std::string(bitwise ? " (bitwise expected)" : "")
                           << ": worst over ranks and 3 steps: loss " << worst[0] << ", gradient " << worst[1]
                           << ", weight " << worst[2]);
}

}  // namespace

TEST_CASE("Pipeline, expert and ZeRO-1 parallelism equal one process: tiny K2 and V3, every layout of this world") {
    const std::vector<Layout> layouts = layouts_for(world().size());
    if (layouts.empty()) {
        MESSAGE("no layout listed for " << world().size() << " ranks");
        return;
    }
    for (const Layout& l : layouts) {
        check_layout("TinyK2", TinyK2::config, l);
        check_layout("TinyV3", TinyV3::config, l);
    }
}

TEST_CASE(
    "Expert parallelism without a pipeline: the part runs as the whole model (EP and EP x DP layouts), and "
    "decoding between two steps changes nothing") {
    int ran = 0;
    for (const Layout& l : layouts_for(world().size())) {
        if (l.pp != 1 || l.ep == 1) continue;
        check_layout("TinyK2", TinyK2::config, l, Driver::transformer);
        check_layout("TinyV3", TinyV3::config, l, Driver::transformer);
        ++ran;
    }
    if (ran == 0) MESSAGE("no layout without a pipeline and with EP > 1 for " << world().size() << " ranks");
}

TEST_CASE("A part of the model refuses the whole model's forward, naming the fix") {
    ModelConfig c = TinyK2::config;
    nn::ModelPart p = nn::ModelPart::whole(c);
    p.head = false;
    nn::Transformer<cpu> part(c, p);
    nn::Transformer<cpu>::Cache cache;
    const std::vector<index_t> ids(4, 1);
    CHECK_THROWS_WITH_AS(part.forward(ids.data(), nn::TokenLayout::sequences(1, 4), cache),
                         doctest::Contains("parallel::Pipeline"), std::logic_error);
    // every layer, half the experts and no expert group to reach the others: refused too
    nn::ModelPart half = nn::ModelPart::whole(c);
    half.expert_count = c.moe.experts / 2;
    nn::Transformer<cpu> experts_only(c, half);
    CHECK_THROWS_WITH_AS(experts_only.forward(ids.data(), nn::TokenLayout::sequences(1, 4), cache),
                         doctest::Contains("parallel::expert_dispatcher"), std::logic_error);
}

TEST_CASE("Every rank loads its part of a Hugging Face checkpoint and trains on it as the whole model does") {
    // tiny_k2: the transformers-written checkpoint of the tiny K2 model (tools/make_hf_reference.py); 3 layers, so
    // the layouts of this world that need no more
    Communicator& w = world();
    const std::filesystem::path dir = std::filesystem::path(MOONMOE_TEST_SOURCE_DIR) / "data" / "tiny_k2";
    const auto layout = nn::TokenLayout::sequences(2, 8);
    for (const Layout& l : layouts_for(w.size())) {
        Checkpoint ck(dir);
        const ModelConfig loaded = resolve(TinyK2::config, ck.config());
        const index_t M = std::max<index_t>(2, l.pp);
        const ModelConfig c = configure(loaded, l, M);
        if (c.dims.layers != loaded.dims.layers) continue;
        INFO("Parallel<" << l.pp << ", " << l.ep << ", " << l.dp << "> V=" << l.v << ", rank " << w.rank());
        ProcessGroups g(w, c.parallel);
        nn::Transformer<cpu> part(c, model_part(c, g.at), expert_dispatcher<cpu>(g));
        load_weights(part, ck);  // the other parts' tensors stay in the file, not an error
        nn::Transformer<cpu> whole = load_transformer<TinyK2>(dir);
        std::map<std::string, const float*> want;
        whole.visit_params([&](const ParamRef& p) { want[p.name] = p.value; });
        part.visit_params([&](const ParamRef& p) {
            INFO(p.name);
            CHECK(std::equal(p.value, p.value + p.numel(), want.at(p.name)));
        });
        // one step's losses: the pipeline over the loaded parts against the loaded whole model
        Pipeline<cpu> pipeline(part, g, M);
        std::vector<std::vector<index_t>> mine;
        for (index_t m = 0; m < M; ++m) mine.push_back(batch_of(c.dims.vocab, g.replica(), m, 0));
        const auto r = pipeline.run(mine, layout);
        for (index_t m = 0; m < M; ++m) {
            nn::Transformer<cpu>::Cache cache;
            const Tensor<float, 2, cpu> logits = whole.forward(mine[std::size_t(m)].data(), layout, cache);
            const std::vector<index_t> targets = nn::causal_targets(mine[std::size_t(m)].data(), layout);
            const float expected = nn::cross_entropy<cpu>(logits.view(), targets.data());
            if (l.ep == 1) CHECK(r.losses[std::size_t(m)] == expected);
            else
                CHECK(r.losses[std::size_t(m)] == doctest::Approx(expected).epsilon(1e-5));
        }
    }
}

TEST_CASE("Which checkpoint tensors a part leaves to the other parts, and which stay errors") {
    // load_weights skips only tensors another part of this model holds: a layer beyond the model, an expert it
    // does not have, or an unknown name stay "tensors the model has no parameter for"
    ModelConfig c = TinyK2::config;
    nn::ModelPart p = nn::ModelPart::whole(c);
    p.layers = {0};
    p.head = false;
    CHECK(moonmoe::detail::held_by_another_part(p, c, "model.layers.1.self_attn.o_proj.weight"));
    CHECK(moonmoe::detail::held_by_another_part(p, c, "lm_head.weight"));
    CHECK_FALSE(moonmoe::detail::held_by_another_part(p, c, "model.layers.0.self_attn.o_proj.weight"));
    CHECK_FALSE(
        moonmoe::detail::held_by_another_part(p, c, "model.layers.7.self_attn.o_proj.weight"));  // beyond the model
    CHECK_FALSE(moonmoe::detail::held_by_another_part(p, c, "model.embed_tokens.weight"));       // the part holds it
    CHECK_FALSE(moonmoe::detail::held_by_another_part(p, c, "model.unknown.weight"));
    p.first_expert = 2, p.expert_count = 2;
    CHECK(moonmoe::detail::held_by_another_part(p, c, "model.layers.0.mlp.experts.5.up_proj.weight"));
    CHECK_FALSE(moonmoe::detail::held_by_another_part(p, c, "model.layers.0.mlp.experts.3.up_proj.weight"));
    CHECK_FALSE(
        moonmoe::detail::held_by_another_part(p, c, "model.layers.0.mlp.experts.8.up_proj.weight"));  // no such expert
}

}  // namespace mpi_model
