// ZeRO-1 with distributed Muon (parallel/zero.hpp) against one process: the tiny Kimi K2 model, every rank one
// data-parallel replica with its own micro-batch; the one-process reference (computed on every rank) accumulates all
// replicas' micro-batches, averages the gradients and steps MuonClip. After three steps with QK-Clip clipping, the
// weights agree within 1e-5 of each tensor's largest magnitude, and every replica's loss matches the reference's
// loss of the same micro-batch. Not bitwise in general: the reduce-scatter sums the replicas' gradients in MPI's
// order, the reference in micro-batch order (measured: bitwise on 2 ranks, 7.0e-8 on 3, 1.2e-7 on 4, 7.0e-8 on 8).
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/zero.hpp>

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_zero {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::scaled_error;
using moonmoe::testing::world;

namespace {

using Clipped = moonmoe::Optimizer<Muon<>, QKClip<0.001>>;  // a tau every head exceeds at init: it clips

std::vector<index_t> batch_of(int rank, int step) {
    std::mt19937_64 gen(1000 + std::uint64_t(rank) * 31 + std::uint64_t(step));
    std::vector<index_t> ids(16);
    for (index_t& t : ids) t = index_t(gen() % std::uint64_t(TinyK2::config.dims.vocab));
    return ids;
}

}  // namespace

TEST_CASE("ZeRO-1 with distributed Muon equals one process: three MuonClip steps, losses and weights") {
    Communicator& w = world();
    const int n = w.size(), me = w.rank();
    const auto layout = nn::TokenLayout::sequences(2, 8);
    nn::Transformer<cpu> replica(TinyK2::config), reference(TinyK2::config);
    nn::init_weights(replica, {.seed = 3});
    nn::init_weights(reference, {.seed = 3});
    DistributedOptimizer<Clipped, cpu> dist(replica, w);
    optim::Optimizer<Clipped, cpu> one(reference);
    // every parameter but the router biases has an owner, and the shares are balanced
    double total = 0;
    for (double l : dist.loads()) total += l;
    for (double l : dist.loads()) CHECK(l <= total / n * 1.5 + 1e6);

    int clipped = 0;
    std::uint64_t sent = 0;
    for (int step = 0; step < 3; ++step) {
        const std::vector<index_t> mine = batch_of(me, step);
        const float loss = replica.train_step(mine.data(), layout);
        float expected = 0;
        for (int r = 0; r < n; ++r) {
            const std::vector<index_t> ids = batch_of(r, step);
            const float l = reference.train_step(ids.data(), layout);
            if (r == me) expected = l;
        }
        CHECK(loss == doctest::Approx(expected).epsilon(1e-5));
        reference.visit_params([&](const ParamRef& p) {
            if (p.grad)
                for (index_t i = 0; i < p.numel(); ++i) p.grad[i] /= float(n);
        });
        const Traffic before = w.traffic();
        const optim::StepReport a = dist.step(), b = one.step();
        sent = w.traffic().bytes - before.bytes;
        CHECK(a.clip.total() == b.clip.total());
        clipped += int(b.clip.total());
    }
    CHECK(clipped > 0);
    std::map<std::string, std::vector<float>> ref;
    reference.visit_params([&](const ParamRef& p) { ref[p.name].assign(p.value, p.value + p.numel()); });
    double worst = 0;
    replica.visit_params([&](const ParamRef& p) {
        INFO(p.name);
        const double e = scaled_error(p.value, ref.at(p.name).data(), p.numel());
        worst = std::max(worst, e);
        CHECK(e <= 1e-5);
    });
    index_t model_floats = 0;
    replica.visit_params([&](const ParamRef& p) { model_floats += p.grad ? p.numel() : 0; });
    const double flat = 2.0 * double(model_floats) * 4 * (n - 1) / n;
    std::vector<double> all_sent = {double(sent)};
    w.all_reduce(std::span<double>(all_sent), ReduceOp::sum);
    MESSAGE("rank " << me << " of " << n << ": worst weight error " << worst << "; bytes sent per step " << sent
                    << " (mean over the ranks " << all_sent[0] / n << "; flat ZeRO-1's 2 (n - 1) / n of the model's "
                    << model_floats << " trained floats: " << flat << ")");
}

TEST_CASE("ZeRO-1: a step whose update would leave an infinity is skipped on every rank, nothing changed") {
    // issue 29: one replica's finite but huge gradient element (3e38) reaches its owner as 3e38 / n, whose square
    // overflows Adam's second moment. The owner's pre-check finds it; every rank skips, as one process would.
    Communicator& w = world();
    const int n = w.size(), me = w.rank();
    const auto layout = nn::TokenLayout::sequences(2, 8);
    nn::Transformer<cpu> replica(TinyK2::config);
    nn::init_weights(replica, {.seed = 7});
    DistributedOptimizer<Clipped, cpu> dist(replica, w);
    const std::string bad = "model.norm.weight";  // AdamW-routed
    const auto weights = [&] {
        std::vector<float> all;
        replica.visit_params([&](const ParamRef& p) { all.insert(all.end(), p.value, p.value + p.numel()); });
        return all;
    };
    const std::vector<index_t> mine = batch_of(me, 0);
    replica.train_step(mine.data(), layout);
    if (me == n - 1)
        replica.visit_params([&](const ParamRef& p) {
            if (p.name == bad) p.grad[3] = 3.0e38f;
        });
    const std::vector<float> before = weights();
    const optim::StepReport r = dist.step();
    CHECK(r.skipped_nonfinite == 1);
    CHECK(r.nonfinite_update);
    CHECK(dist.inner().steps() == 0);
    CHECK(weights() == before);
    std::size_t i = 0;
    int owner = -1;
    replica.visit_params([&](const ParamRef& p) {
        if (p.name == bad) owner = dist.owners()[i];
        ++i;
    });
    CHECK(r.nonfinite_param == (owner == me ? bad : std::string()));
    // the next step, from clean gradients, is taken everywhere
    replica.train_step(mine.data(), layout);
    const optim::StepReport next = dist.step();
    CHECK(next.skipped_nonfinite == 0);
    CHECK(dist.inner().steps() == 1);
    CHECK(weights() != before);
}

TEST_CASE(
    "ZeRO-1 under Weights<BF16>: each rank keeps the f32 masters of its own parameters only, the bf16 weights "
    "equal one process's") {
    using Stored16 = TinyK2::with<Precision<BF16, Weights<BF16>>>;
    Communicator& w = world();
    const int n = w.size(), me = w.rank();
    const auto layout = nn::TokenLayout::sequences(2, 8);
    nn::Transformer<cpu> replica(Stored16::config), reference(Stored16::config);
    nn::init_weights(replica, {.seed = 5});
    nn::init_weights(reference, {.seed = 5});
    DistributedOptimizer<Clipped, cpu> dist(replica, w);
    optim::Optimizer<Clipped, cpu> one(reference);

    // the masters: exactly the owned bf16 parameters', so the ranks' masters add up to one model's
    index_t masters = 0, owned = 0, all = 0;
    const auto& slots = dist.inner().slots();
    for (std::size_t i = 0; i < slots.size(); ++i) {
        if (!slots[i].param.stored_bf16) continue;
        all += slots[i].param.numel();
        if (dist.owners()[i] == me) owned += slots[i].param.numel();
        masters += slots[i].master.numel();
    }
    CHECK(masters == owned);
    std::vector<double> sum = {double(masters)};
    w.all_reduce(std::span<double>(sum), ReduceOp::sum);
    CHECK(sum[0] == double(all));

    int clipped = 0;
    for (int step = 0; step < 3; ++step) {
        const std::vector<index_t> mine = batch_of(me, step);
        replica.train_step(mine.data(), layout);
        for (int r = 0; r < n; ++r) {
            const std::vector<index_t> ids = batch_of(r, step);
            reference.train_step(ids.data(), layout);
        }
        reference.visit_params([&](const ParamRef& p) {
            if (p.grad)
                for (index_t i = 0; i < p.numel(); ++i) p.grad[i] /= float(n);
        });
        const optim::StepReport a = dist.step(), b = one.step();
        CHECK(a.clip.total() == b.clip.total());
        clipped += int(b.clip.total());
    }
    CHECK(clipped > 0);
    // the bf16 weights: one bf16 rounding apart at most where the replicas' gradient sum went another way
    std::map<std::string, std::vector<float>> ref;
    const auto widened = [](const ParamRef& p) {
        std::vector<float> v(std::size_t(p.numel()));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = p.stored_bf16 ? p.value16[i].to_float() : p.value[i];
        return v;
    };
    reference.visit_params([&](const ParamRef& p) { ref[p.name] = widened(p); });
    std::size_t differing = 0, elements = 0;
    replica.visit_params([&](const ParamRef& p) {
        INFO(p.name);
        const std::vector<float> v = widened(p), &r = ref.at(p.name);
        for (std::size_t i = 0; i < v.size(); ++i) {
            elements += 1;
            if (v[i] == r[i]) continue;
            ++differing;
            CHECK(std::abs(v[i] - r[i]) <= std::abs(r[i]) * 0x1p-7f);  // one bf16 ulp of r
        }
    });
    MESSAGE("rank " << me << " of " << n << ": masters " << masters << " of " << all << " bf16 weights; " << differing
                    << " of " << elements << " values one bf16 rounding from one process's");
    CHECK(differing <= elements / 1000);
    if (n <= 2) CHECK(differing == 0);  // the reduce-scatter sums two replicas in the reference's order
}

}  // namespace mpi_zero
