// The NCCL communicator (parallel/nccl.hpp) and the parallel runtime on it, on one GPU: a program of its own that
// tools/gpu_check.sh builds and runs (CI compiles it only: nvcc.nccl_run). One process, one rank
// (ncclCommInitRank with a unique id of its own, no MPI): every collective on device buffers against its
// one-rank meaning, split, and Parallel<1, 1, 1> training on the CUDA backend through ProcessGroups, Pipeline and
// DistributedOptimizer over NCCL against nn::Transformer's own training step and optim::Optimizer, three MuonClip
// steps. (Point-to-point needs two ranks: NCCL's send and receive to oneself only complete in one group, which the
// pipeline's one-rank schedule with V = 1 never issues.) Exit status: the number of failed checks.
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include <moonmoe/config.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/nccl.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/zero.hpp>

using namespace moonmoe;
using namespace moonmoe::parallel;
using Dev = moonmoe::cuda;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
    failures += ok ? 0 : 1;
}

Tensor<float, 1, Dev> device(const std::vector<float>& v) { return to_device<Dev>(std::span<const float>(v)); }

void collectives(Communicator& c) {
    const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
    Tensor<float, 1, Dev> a = device(values), b({4});
    const std::vector<index_t> four = {4};
    c.all_to_all_v(std::span<const float>(a.data(), 4), four, std::span<float>(b.data(), 4), four);
    expect(to_host(b) == values, "all_to_all_v on one rank copies the block");
    c.all_reduce(std::span<float>(a.data(), 4), ReduceOp::sum);
    expect(to_host(a) == values, "all_reduce sum on one rank leaves the data");
    c.all_reduce(std::span<float>(a.data(), 4), ReduceOp::max);
    expect(to_host(a) == values, "all_reduce max on one rank leaves the data");
    Tensor<float, 1, Dev> out({4});
    c.reduce_scatter(std::span<const float>(a.data(), 4), std::span<float>(out.data(), 4));
    expect(to_host(out) == values, "reduce_scatter on one rank is the block");
    c.all_gather(std::span<const float>(a.data(), 4), std::span<float>(out.data(), 4));
    expect(to_host(out) == values, "all_gather on one rank is the block");
    const std::vector<index_t> counts = {7};
    expect(c.exchange_counts(counts) == counts, "exchange_counts on one rank returns the counts");
    c.barrier();
    const auto sub = c.split(0, 0, "sub");
    expect(sub->size() == 1 && sub->rank() == 0, "split gives a one-rank group");
    expect(c.traffic().bytes == 0, "one rank sends no bytes to others");
}

std::vector<index_t> batch_of(index_t m, int step) {
    std::mt19937_64 gen(100 + std::uint64_t(m) * 7 + std::uint64_t(step));
    std::vector<index_t> ids(16);
    for (index_t& t : ids) t = index_t(gen() % std::uint64_t(TinyK2::config.dims.vocab));
    return ids;
}

void runtime(Communicator& world) {
    using Clipped = moonmoe::Optimizer<Muon<>, QKClip<0.001>>;
    const index_t M = 2;
    ModelConfig c = TinyK2::config;
    c.parallel.micro_batches = M;
    ProcessGroups g(world, c.parallel);
    nn::Transformer<Dev> part(c, model_part(c, g.at)), whole(c);
    nn::init_weights(part, {.seed = 9});
    nn::init_weights(whole, {.seed = 9});
    Pipeline<Dev> pipeline(part, g, M);
    DistributedOptimizer<Clipped, Dev> opt(part, g);
    optim::Optimizer<Clipped, Dev> one(whole);
    const auto layout = nn::TokenLayout::sequences(2, 8);
    double worst_loss = 0;
    for (int step = 0; step < 3; ++step) {
        std::vector<std::vector<index_t>> batches;
        for (index_t m = 0; m < M; ++m) batches.push_back(batch_of(m, step));
        const auto r = pipeline.run(batches, layout);
        for (index_t m = 0; m < M; ++m) {  // the one-process step: each micro-batch's loss gradient / M
            typename nn::Transformer<Dev>::Cache cache;
            Tensor<float, 2, Dev> logits = whole.forward(batches[std::size_t(m)].data(), layout, cache);
            Tensor<float, 2, Dev> dlogits(logits.shape());
            const std::vector<index_t> targets = nn::causal_targets(batches[std::size_t(m)].data(), layout);
            const float loss = nn::cross_entropy<Dev>(logits.view(), targets.data(), dlogits.view());
            backend::Ops<Dev>::map(fn::ScaleBy<float>{1.0f / float(M)}, dlogits.view());
            whole.backward(dlogits.view(), cache);
            worst_loss = std::max(worst_loss, std::abs(double(loss) - r.losses[std::size_t(m)]));
        }
        opt.step();
        one.step();
    }
    expect(worst_loss == 0.0, "Pipeline over NCCL: every micro-batch's loss equals the one-process model's");
    std::map<std::string, std::vector<float>> want;
    whole.visit_params([&](const ParamRef& p) {
        want[p.name] = to_host(View<const float, 1, Dev>(p.value, {p.numel()}));
    });
    double worst = 0;
    part.visit_params([&](const ParamRef& p) {
        const std::vector<float> got = to_host(View<const float, 1, Dev>(p.value, {p.numel()}));
        const std::vector<float>& w = want.at(p.name);
        double diff = 0, scale = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
            diff = std::max(diff, std::abs(double(got[i]) - w[i])), scale = std::max(scale, std::abs(double(w[i])));
        worst = std::max(worst, scale > 0 ? diff / scale : diff);
    });
    std::printf("     weights after 3 MuonClip steps: largest difference %.3g of the tensor's largest magnitude\n", worst);
    expect(worst <= 1e-5, "ZeRO-1 over NCCL: the weights after three MuonClip steps equal the one-process run's");
}

}  // namespace

int main() {
    MOONMOE_CUDA_CHECK(cudaSetDevice(0));
    ncclUniqueId id{};
    ncclComm_t comm = nullptr;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
        std::printf("FAIL NCCL: cannot create a one-rank communicator\n");
        return 1;
    }
    NcclCommunicator world(comm, "world");
    try {
        collectives(world);
        runtime(world);
    } catch (const std::exception& e) {
        std::printf("FAIL %s\n", e.what());
        ++failures;
    }
    std::printf("%d failed\n", failures);
    return failures;
}
