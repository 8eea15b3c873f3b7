// The K1.5 objective (rl/objective.hpp) in a parallel layout: Trainer::rl_step at the world's layouts, with and
// without a pipeline (rl/pipeline.hpp: two passes; 2 ranks: (1,2,1), (1,1,2), (2,1,1) and (2,1,1) interleaved with 2
// chunks per rank; 4: (1,2,2), (2,2,1), (2,1,2) with 4 micro-batches; 8: (1,4,2), (2,2,2)) against the one-process
// Trainer on the same prompt groups, split over the layout's token streams (each stream the same number of prompts,
// so the mean of the streams' objectives is the objective of all of them). Checked: the objective's gradient after
// ZeRO-1's reduce-scatter on each parameter's owner within the parallel tolerance (relative 1e-5: expert rows and
// replicas sum in other orders, test/mpi/model.cpp); then two Trainer::rl_step iterations with the PTX loss: the
// objective and the per-sample log-probabilities within 1e-5, every weight the parallel run holds within 5e-5 (Muon
// orthogonalises a policy gradient of low rank, whose many near-zero singular directions turn the layouts' rounding
// into update differences: 1.04e-5 measured at (1,2,1), 7.9e-6 at (1,4,2)). The PyTorch oracle of test/unit/rl.cpp
// at (1,2,1), (1,1,2) and (2,1,1): every gradient on its ZeRO-1 owner against transformers' (the PTX loss through
// the pipeline too). WeightRefresh after a step at (2,1,1), (1,2,1), (2,2,1), (2,2,2). A stream with fewer samples
// than the pipeline's micro-batches is refused with the reason.
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
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/checkpoint.hpp>
#include <moonmoe/parallel/weight_refresh.hpp>
#include <moonmoe/parallel/zero.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/trainer.hpp>

#include "mpi_support.hpp"
#include "support/reference.hpp"
#include "support/rl_oracle.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_rl {

using namespace moonmoe;
using moonmoe::testing::random_ids;
using moonmoe::testing::scaled_error;
using moonmoe::testing::world;

namespace {

// AdamW's eps raised from 1e-8 to 1: a policy gradient leaves many lm_head and embedding entries small, where AdamW's
// first steps move by +-lr whatever their size (m / sqrt(v) = sign(g) for |g| >> eps), so the layouts' float rounding
// of a gradient entry near zero became whole steps of difference (1.1e-5 of lm_head's scale with eps 1e-8, 1.5e-5 of
// the embedding's with 1e-4). With eps 1 AdamW moves them by about lr g, continuous in g, and rounding stays rounding.
using Clipped = moonmoe::Optimizer<Muon<LearningRate<0.02>>, AdamW<LearningRate<0.003>, Eps<1.0>>, QKClip<5>,
                                   WSD<Warmup<1>, Stable<1000>, Decay<0>>>;
using Settings = RL<Regularization<0.5>, BudgetPenalty<0.2>, PTXWeight<0.3>>;
template <index_t PP, index_t EP, index_t DP, class... More>
using Tiny = TinyK2::with<Clipped, Parallel<PP, EP, DP, More...>, Settings>;
/// Four layers (two chunks of one layer on each of two pipeline ranks).
template <index_t PP, index_t EP, index_t DP, class... More>
using Tiny4 = TinyV3::with<Clipped, Parallel<PP, EP, DP, More...>, Settings>;
/// The one-process model of a layout's type.
template <class Model>
using One = typename Model::template with<Parallel<1, 1, 1>>;

/// The objective's forward and backward of this replica's groups on its part: through a pipeline of the type's
/// micro-batches (Dynamic: PP) when the layout has one, else on the part as a whole model.
template <class Model>
rl::ObjectiveValue objective_step(nn::Transformer<cpu>& part, parallel::ProcessGroups& g,
                                  std::span<const rl::Group> groups, const rl::Objective& o,
                                  const rl::PtxBatch* ptx = nullptr) {
    const ModelConfig& c = Model::config;
    if (c.parallel.pp == 1) return rl::k15_train_step(part, groups, o, ptx);
    parallel::Pipeline<cpu> pipeline(part, g,
                                     c.parallel.micro_batches != Dynamic ? c.parallel.micro_batches : c.parallel.pp);
    return rl::k15_train_step(pipeline, g, groups, o, ptx);
}

constexpr index_t global_groups = 8;  ///< prompts per iteration, split over a layout's token streams

/// Prompt group g of iteration `it`: a prompt and K = 2 + g % 2 responses of different lengths, rewards, old
/// log-probabilities and one truncated response in every other group; the same on every rank.
rl::Group group_of(index_t vocab, index_t g, int it) {
    std::mt19937_64 gen(std::uint64_t(500 + 37 * g + 1000 * it));
    const auto ids = [&](std::size_t n) {
        std::vector<index_t> v(n);
        for (index_t& t : v) t = index_t(gen() % std::uint64_t(vocab));
        return v;
    };
    rl::Group group;
    const std::vector<index_t> prompt = ids(3 + std::size_t(g % 3));
    for (index_t k = 0; k < 2 + g % 2; ++k)
        group.samples.push_back({prompt, ids(1 + std::size_t((g + k) % 4)), double((g + k) % 3) * 0.5, -8.0 - double(k),
                                 g % 2 == 1 && k == 0});
    return group;
}

rl::PtxBatch ptx_of(index_t vocab, index_t stream, int it) {
    return {random_ids(vocab, 7700 + std::uint64_t(stream) * 13 + std::uint64_t(it)), nn::TokenLayout::sequences(2, 8)};
}

/// The objective's mean gradient over the layout's streams, reduce-scattered by ZeRO-1 onto each parameter's owner,
/// against the one-process gradient of all the groups: float rounding only (the sums run in other orders).
template <class Model>
void check_gradient(const std::vector<rl::Group>& all, index_t per) {
    parallel::Communicator& w = world();
    const ModelConfig c = Model::config;
    parallel::ProcessGroups g(w, c.parallel);
    nn::Transformer<cpu> part(c, parallel::model_part(c, g.at), parallel::expert_dispatcher<cpu>(g));
    nn::init_weights(part, {.seed = 5});
    parallel::DistributedOptimizer<Clipped, cpu> opt(part, g);
    rl::Objective o = rl::Objective::of(Model::rl::value);
    o.ptx_weight = 0.0;  // the RL objective's gradient alone (the PTX loss is train_step's, tested with the pipeline)
    const std::vector<rl::Group> mine(all.begin() + std::ptrdiff_t(g.replica() * per),
                                      all.begin() + std::ptrdiff_t((g.replica() + 1) * per));
    objective_step<Model>(part, g, std::span<const rl::Group>(mine), o);
    REQUIRE_FALSE(opt.reduce_gradients());
    nn::Transformer<cpu> whole(One<Model>::config);
    nn::init_weights(whole, {.seed = 5});
    rl::k15_train_step(whole, std::span<const rl::Group>(all), o);
    std::map<std::string, const float*> want;
    whole.visit_params([&](const ParamRef& p) { want[p.name] = p.grad; });
    const std::vector<int>& owners = opt.owners();
    std::size_t i = 0;
    double worst = 0;
    part.visit_params([&](const ParamRef& p) {
        const int owner = owners[i++];
        if (!p.grad || owner < 0) return;
        const parallel::Communicator& group = p.kind == ParamKind::expert_matrix ? *g.expert_dp : *g.dense_dp;
        if (owner != group.rank()) return;
        INFO(p.name);
        const double e = scaled_error(p.grad, want.at(p.name), p.numel());
        worst = std::max(worst, e);
        CHECK(e <= 1e-5);
    });
    MESSAGE("rank " << w.rank() << ": the objective's gradient on each owner, worst error " << worst);
}

template <class Model>
void check_against_one_process() {
    parallel::Communicator& w = world();
    INFO("layout (" << Model::config.parallel.pp << ", " << Model::config.parallel.ep << ", "
                    << Model::config.parallel.dp << ") with " << Model::config.parallel.virtual_stages
                    << " chunks per rank, rank " << w.rank());
    Trainer<Model> parallel(w, {.seed = 5});
    Trainer<One<Model>> one({.seed = 5});
    const index_t R = parallel.replicas(), vocab = parallel.config().dims.vocab, per = global_groups / R;
    REQUIRE(global_groups % R == 0);
    {
        std::vector<rl::Group> all;
        for (index_t g = 0; g < global_groups; ++g) all.push_back(group_of(vocab, g, 0));
        check_gradient<Model>(all, per);
    }
    for (int it = 0; it < 2; ++it) {
        std::vector<rl::Group> all, mine;
        for (index_t g = 0; g < global_groups; ++g) {
            all.push_back(group_of(vocab, g, it));
            if (g / per == parallel.replica()) mine.push_back(all.back());
        }
        // one process: the streams' PTX batches as one (equal sizes, so its mean loss is the mean of theirs)
        std::vector<index_t> ptx_ids;
        std::vector<index_t> lengths;
        for (index_t q = 0; q < R; ++q) {
            const rl::PtxBatch b = ptx_of(vocab, q, it);
            ptx_ids.insert(ptx_ids.end(), b.ids.begin(), b.ids.end());
            lengths.push_back(8), lengths.push_back(8);
        }
        const rl::PtxBatch mine_ptx = ptx_of(vocab, parallel.replica(), it);
        const rl::PtxBatch all_ptx{ptx_ids, nn::TokenLayout::packed(lengths)};
        const rl::ObjectiveValue p = parallel.rl_step(mine, &mine_ptx);
        const rl::ObjectiveValue o = one.rl_step(all, &all_ptx);
        CHECK(p.loss == doctest::Approx(o.loss).epsilon(1e-5));
        std::size_t before = 0;  // this stream's samples come after those of the streams before it
        for (index_t g = 0; g < parallel.replica() * per; ++g) before += all[std::size_t(g)].samples.size();
        REQUIRE(p.logp.size() + before <= o.logp.size());
        for (std::size_t i = 0; i < p.logp.size(); ++i)
            CHECK(p.logp[i] == doctest::Approx(o.logp[before + i]).epsilon(1e-5));
    }
    CHECK(parallel.rl_iterations() == 2);
    std::map<std::string, std::vector<float>> want;
    one.model().visit_params([&](const ParamRef& p) { want[p.name].assign(p.value, p.value + p.numel()); });
    double worst = 0;
    std::string worst_name;
    parallel.model().visit_params([&](const ParamRef& p) {
        INFO(p.name);
        const double e = scaled_error(p.value, want.at(p.name).data(), p.numel());
        if (e > worst) worst = e, worst_name = p.name;
        CHECK(e < 5e-5);
    });
    MESSAGE("rank " << w.rank() << ": two RL iterations, worst weight error " << worst << " (" << worst_name << ")");
}

}  // namespace

TEST_CASE("Trainer::rl_step in the world's layouts (pipeline, expert and data parallelism) steps as one process") {
    switch (world().size()) {
    case 2:
        check_against_one_process<Tiny<1, 2, 1>>();
        check_against_one_process<Tiny<1, 1, 2>>();
        check_against_one_process<Tiny<2, 1, 1>>();
        check_against_one_process<Tiny4<2, 1, 1, VirtualStages<2>>>();
        break;
    case 4:
        check_against_one_process<Tiny<1, 2, 2>>();
        check_against_one_process<Tiny<2, 2, 1>>();
        check_against_one_process<Tiny<2, 1, 2, MicroBatches<4>>>();
        break;
    case 8:
        check_against_one_process<Tiny<1, 4, 2>>();
        check_against_one_process<Tiny<2, 2, 2>>();
        break;
    default: MESSAGE("no RL layout for " << world().size() << " ranks");
    }
}

/// After a training step at layout `Model`, the refresh gives every rank's whole decoding model the weights the run
/// saves, bit for bit; the bytes add up; rollouts then decode on each rank alone and agree across ranks.
template <class Model>
void check_refresh() {
    parallel::Communicator& w = world();
    INFO("layout (" << Model::config.parallel.pp << ", " << Model::config.parallel.ep << ", "
                    << Model::config.parallel.dp << "), rank " << w.rank());
    Trainer<Model> run(w, {.seed = 5});
    const auto layout = nn::TokenLayout::sequences(2, 8);
    std::vector<std::vector<index_t>> batches;
    for (index_t m = 0; m < std::max<index_t>(2, Model::config.parallel.pp); ++m)
        batches.push_back(random_ids(run.config().dims.vocab, 8800 + std::uint64_t(m + 7 * run.replica())));
    run.step(batches, layout);

    ModelConfig decoding_config = run.config();
    decoding_config.parallel = Tiny<1, 1, 1>::config.parallel;
    nn::Transformer<cpu> decoding(decoding_config);
    parallel::WeightRefresh<cpu> refresh(run.model(), w);
    const parallel::RefreshReport r = refresh.into(decoding);

    const std::filesystem::path dir =
        std::filesystem::path(MOONMOE_TEST_BINARY_DIR) / ("mpi_rl_refresh_" + std::to_string(w.size()));
    run.save(dir);
    const nn::Transformer<cpu> saved = load_transformer<Tiny<1, 1, 1>, cpu>(dir.string());
    std::map<std::string, std::vector<float>> want;
    const_cast<nn::Transformer<cpu>&>(saved).visit_params(
        [&](const ParamRef& p) { want[p.name].assign(p.value, p.value + p.numel()); });
    std::uint64_t bytes = 0, owned = 0;
    decoding.visit_params([&](const ParamRef& p) {
        INFO(p.name);
        CHECK(std::equal(p.value, p.value + p.numel(), want.at(p.name).begin()));
        bytes += std::uint64_t(p.numel()) * sizeof(float);
    });
    for (const auto& e : refresh.entries())
        if (e.owner == w.rank()) owned += std::uint64_t(e.numel) * sizeof(float);
    CHECK(r.parameters == index_t(want.size()));
    CHECK(r.bytes_kept == bytes);
    CHECK(r.bytes_received == bytes - owned);
    CHECK(r.bytes_sent == owned * std::uint64_t(w.size() - 1));
    std::vector<index_t> sent = {index_t(r.bytes_sent)};
    w.all_reduce(std::span<index_t>(sent), parallel::ReduceOp::sum);
    CHECK(std::uint64_t(sent[0]) ==
          bytes * std::uint64_t(w.size() - 1));  // every parameter from one owner to every other rank
    MESSAGE("rank " << w.rank() << ": refreshed " << r.parameters << " tensors, sent " << r.bytes_sent
                    << " B, received " << r.bytes_received << " B, kept " << r.bytes_kept << " B in " << r.seconds
                    << " s");

    if (w.size() == 2) {  // one rank's decoding model does not fit: both ranks refuse, neither is left waiting
        ModelConfig other = decoding_config;
        if (w.rank() == 1) other.dims.vocab += 1;
        nn::Transformer<cpu> wrong(other);
        CHECK_THROWS_WITH_AS(refresh.into(wrong),
                             doctest::Contains(w.rank() == 1 ? "the decoding model's 'lm_head.weight' has"
                                                             : "rank 1's decoding model does not fit"),
                             std::invalid_argument);
    }

    const std::vector<rl::RolloutRequest> requests = {{{3, 1, 4}, 9, 5, {1.0, 0, 1.0}},
                                                      {{2, 7, 1}, 10, 4, {0.8, 4, 0.9}}};
    const std::vector<rl::Rollout> out = rl::rollout(decoding, std::span(requests));
    std::vector<index_t> sum = {0, 0};
    for (const rl::Rollout& o : out)
        for (index_t t : o.response) sum[0] += t, sum[1] -= t;
    w.all_reduce(std::span<index_t>(sum), parallel::ReduceOp::max);  // max of the sums, minus the min
    CHECK(sum[0] == -sum[1]);
}

TEST_CASE(
    "WeightRefresh: after a step in the world's layout, every rank's decoding model holds the saved weights "
    "bit for bit") {
    switch (world().size()) {
    case 2:
        check_refresh<Tiny<2, 1, 1>>();
        check_refresh<Tiny<1, 2, 1>>();
        break;
    case 4: check_refresh<Tiny<2, 2, 1>>(); break;
    case 8: check_refresh<Tiny<2, 2, 2>>(); break;
    default: MESSAGE("no refresh layout for " << world().size() << " ranks");
    }
}

/// The PyTorch oracle (tools/make_rl_reference.py, test/data/rl/) at layout `Model` of 2 ranks: with two token
/// streams each takes one of the oracle's two prompt groups and the whole PTX batch (so the mean over the streams is
/// the oracle's objective), with one (a pipeline) it takes all of them; the tiny K2 checkpoint loaded into each
/// part; ZeRO-1's reduce-scattered gradient on each owner
/// against transformers' within 2e-5 of each tensor's largest value (the oracle test's limit).
template <class Model>
void check_oracle() {
    parallel::Communicator& w = world();
    INFO("layout (" << Model::config.parallel.pp << ", " << Model::config.parallel.ep << ", "
                    << Model::config.parallel.dp << "), rank " << w.rank());
    const ModelConfig c = Model::config;
    parallel::ProcessGroups g(w, c.parallel);
    REQUIRE((g.replicas() == 2 || g.replicas() == 1));
    nn::Transformer<cpu> part(c, parallel::model_part(c, g.at), parallel::expert_dispatcher<cpu>(g));
    parallel::load_checkpoint(moonmoe::testing::data_dir("tiny_k2"), part);
    parallel::DistributedOptimizer<Clipped, cpu> opt(part, g);

    const moonmoe::testing::RlOracle oracle;
    const std::vector<rl::Group>& groups = oracle.groups;
    REQUIRE(groups.size() == 2);
    const rl::PtxBatch& ptx = oracle.ptx;
    const rl::Objective& o = oracle.objective;
    const moonmoe::testing::Reference& ref = oracle.ref;
    // two streams: one prompt group each, the whole PTX batch each; one stream: all of it
    const std::vector<rl::Group> mine =
        g.replicas() == 2 ? std::vector<rl::Group>{groups[std::size_t(g.replica())]} : groups;
    objective_step<Model>(part, g, std::span<const rl::Group>(mine), o, &ptx);
    REQUIRE_FALSE(opt.reduce_gradients());
    const std::vector<int>& owners = opt.owners();
    std::size_t i = 0;
    double worst = 0;
    int compared = 0;
    part.visit_params([&](const ParamRef& p) {
        const int owner = owners[i++];
        if (!p.grad || owner < 0) return;
        const parallel::Communicator& group = p.kind == ParamKind::expert_matrix ? *g.expert_dp : *g.dense_dp;
        if (owner != group.rank()) return;
        INFO(p.name);
        const double e = scaled_error(p.grad, ref.f32("grad." + p.name));
        worst = std::max(worst, e), ++compared;
        CHECK(e < 2e-5);
    });
    std::vector<index_t> count = {compared};
    w.all_reduce(std::span<index_t>(count), parallel::ReduceOp::sum);
    CHECK(count[0] > 20);  // the owners together compared every parameter with a gradient
    MESSAGE("rank " << w.rank() << ": " << compared << " gradients against PyTorch, worst error " << worst);
}

TEST_CASE("the K1.5 objective against PyTorch in a parallel layout: every gradient on its ZeRO-1 owner") {
    if (world().size() != 2) return;
    check_oracle<TinyK2::with<Clipped, Parallel<1, 2, 1>>>();
    check_oracle<TinyK2::with<Clipped, Parallel<1, 1, 2>>>();
    check_oracle<TinyK2::with<Clipped, Parallel<2, 1, 1>>>();
}

TEST_CASE("Trainer::timing after rl_step without a pipeline: zeros, not the time of the step before it") {
    if (world().size() != 2) {
        MESSAGE("two ranks only");
        return;
    }
    Trainer<Tiny<1, 1, 2>> run(world(), {.seed = 5});
    const index_t vocab = run.config().dims.vocab;
    std::vector<index_t> ids;
    for (index_t t = 0; t < 16; ++t) ids.push_back((7 * t + 3 * run.replica()) % vocab);
    run.step(ids, nn::TokenLayout::packed({8, 8}));
    REQUIRE(run.timing().total > 0);  // the step ran through the pipeline of one stage
    const rl::PtxBatch ptx = ptx_of(vocab, run.replica(), 0);
    run.rl_step(std::vector<rl::Group>{group_of(vocab, run.replica(), 0)}, &ptx);
    CHECK(run.timing().total == 0);
    CHECK(run.timing().bytes_sent == 0);
}

TEST_CASE("Trainer::rl_step through a pipeline refuses a stream with fewer samples than micro-batches") {
    if (world().size() != 2) return;
    Trainer<Tiny<2, 1, 1, MicroBatches<4>>> run(world(), {.seed = 5});
    const std::vector<rl::Group> groups = {group_of(run.config().dims.vocab, 0, 0)};  // 2 samples
    const rl::PtxBatch ptx = ptx_of(run.config().dims.vocab, 0, 0);
    CHECK_THROWS_WITH_AS(run.rl_step(groups, &ptx), doctest::Contains("2 samples for 4 pipeline micro-batches"),
                         std::invalid_argument);
}

}  // namespace mpi_rl
