// The NCCL communicator (parallel/nccl.hpp) and the parallel runtime on it, on one GPU: a program of its own that
// tools/gpu_check.sh builds and runs (CI compiles it only: nvcc.nccl_run). One process, one rank, no MPI
// (NcclCommunicator::from over a host world of one, test/support/self_world.hpp): every collective on device
// buffers against its one-rank meaning, split, and Parallel<1, 1, 1> training on the CUDA backend through
// ProcessGroups, Pipeline and DistributedOptimizer over NCCL against nn::Transformer's own training step and
// optim::Optimizer, three MuonClip steps. Then the requests' streams: sends and receives to this rank itself (which
// complete only in one group) behind a kernel that is still writing their data when they are posted, waited on
// under another StreamGuard and from another thread, and read back on streams nothing orders after the posting one,
// so a wait() that waited for the wrong work reads stale data. Last, initialisation with a deadline: a 2-rank
// communicator whose second rank never joins must throw comm_error once its 2 s timeout has passed, not hang.
// Exit status: the number of failed checks.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <thread>

#include <moonmoe/config.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/nccl.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/zero.hpp>

#include "../support/self_world.hpp"
#include "../support/expect.hpp"

using namespace moonmoe;
using namespace moonmoe::parallel;
using Dev = moonmoe::cuda;

namespace {

using test_support::expect;
using test_support::failures;

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
    nn::Transformer<Dev> part(c, model_part(c, g.at), expert_dispatcher<Dev>(g)), whole(c);
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
            Tensor<float, 2, Dev> logits =
                whole.forward(batches[std::size_t(m)].data(), layout, cache, nn::Pass::training);
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
    whole.visit_params(
        [&](const ParamRef& p) { want[p.name] = to_host(View<const float, 1, Dev>(p.value, {p.numel()})); });
    double worst = 0;
    part.visit_params([&](const ParamRef& p) {
        const std::vector<float> got = to_host(View<const float, 1, Dev>(p.value, {p.numel()}));
        const std::vector<float>& w = want.at(p.name);
        double diff = 0, scale = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
            diff = std::max(diff, std::abs(double(got[i]) - w[i])), scale = std::max(scale, std::abs(double(w[i])));
        worst = std::max(worst, scale > 0 ? diff / scale : diff);
    });
    std::printf("     weights after 3 MuonClip steps: largest difference %.3g of the tensor's largest magnitude\n",
                worst);
    expect(worst <= 1e-5, "ZeRO-1 over NCCL: the weights after three MuonClip steps equal the one-process run's");
}

// The GPU's nanosecond clock.
__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/// Waits `delay_ns`, then writes `value` everywhere: work still running when the host posts what follows it.
__global__ void late_fill(float* data, int n, float value, unsigned long long delay_ns) {
    const unsigned long long start = now_ns();
    while (now_ns() - start < delay_ns) {}
    for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) data[i] = value;
}

constexpr int n_values = 1 << 16;

void fill_late(Tensor<float, 1, Dev>& t, float value, std::chrono::milliseconds delay) {
    late_fill<<<1, 256, 0, backend::current_stream()>>>(t.data(), int(t.numel()), value,
                                                        (unsigned long long)(delay.count()) * 1000000ull);
    MOONMOE_CUDA_CHECK(cudaGetLastError());
}

bool all_equal(const std::vector<float>& v, float value) {
    for (float x : v)
        if (x != value) return false;
    return true;
}

/// A send and a receive to this rank itself, posted as one group on the current stream after a late fill of the
/// sent data.
struct Exchange {
    Tensor<float, 1, Dev> sent{{n_values}}, received{{n_values}};
    std::unique_ptr<Request> send, recv;

    void post(Communicator& c, float value, std::chrono::milliseconds delay) {
        fill_late(sent, value, delay);
        c.group_start();
        send = c.isend(std::span<const float>(sent.data(), n_values), 0, 0);
        recv = c.irecv(std::span<float>(received.data(), n_values), 0, 0);
        c.group_end();
    }
    void wait() {
        recv->wait();
        send->wait();
    }
};

void streams(Communicator& c) {
    backend::Stream s1, s2;
    using std::chrono::milliseconds;

    {  // a request waited on under another StreamGuard waits for the work of the stream it was posted on
        Exchange x;
        MOONMOE_CUDA_CHECK(cudaDeviceSynchronize());  // the tensors' zeroing, on this thread's stream
        {
            backend::StreamGuard on(s1.get());
            x.post(c, 7.0f, milliseconds(300));
        }
        backend::StreamGuard on(s2.get());  // nothing orders s2 after s1: only wait() can make the read right
        x.wait();
        expect(all_equal(to_host(x.received), 7.0f),
               "a request waited on under another StreamGuard waits for the work it was posted behind");
    }

    {  // two outstanding requests from two streams, waited on from two threads: each waits for its own work
        Exchange x1, x2;
        MOONMOE_CUDA_CHECK(cudaDeviceSynchronize());
        {
            backend::StreamGuard on(s1.get());
            x1.post(c, 1.0f, milliseconds(400));
        }
        {
            backend::StreamGuard on(s2.get());
            x2.post(c, 2.0f, milliseconds(100));
        }
        std::vector<float> got1;
        std::string thread_error;
        std::thread other([&] {  // on this thread's own per-thread default stream
            try {
                x1.wait();
                got1 = to_host(x1.received);
            } catch (const std::exception& e) {
                thread_error = e.what();
            }
        });
        std::vector<float> got2;
        {
            backend::StreamGuard on(s1.get());  // the other request's stream
            x2.wait();
            got2 = to_host(x2.received);
        }
        other.join();
        if (!thread_error.empty()) std::printf("     the other thread: %s\n", thread_error.c_str());
        expect(thread_error.empty() && all_equal(got1, 1.0f),
               "two outstanding requests: the one waited on from another thread waits for its own work");
        expect(all_equal(got2, 2.0f),
               "two outstanding requests: the one waited on under the other's stream waits for its own work");
    }

    {  // a collective issued under a StreamGuard runs after that stream's work and is complete when it returns
        Tensor<float, 1, Dev> a({n_values}), out({n_values});
        MOONMOE_CUDA_CHECK(cudaDeviceSynchronize());
        {
            backend::StreamGuard on(s1.get());
            fill_late(a, 3.0f, milliseconds(300));
            c.all_gather(std::span<const float>(a.data(), n_values), std::span<float>(out.data(), n_values));
        }
        backend::StreamGuard on(s2.get());
        expect(all_equal(to_host(out), 3.0f),
               "all_gather under a StreamGuard gathers what that stream wrote before it");
    }

    {  // waiting inside the request's own group can never complete: refused at once
        Exchange x;
        MOONMOE_CUDA_CHECK(cudaDeviceSynchronize());
        c.group_start();
        x.send = c.isend(std::span<const float>(x.sent.data(), n_values), 0, 0);
        std::string message;
        try {
            x.send->wait();
        } catch (const comm_error& e) {
            message = e.what();
        }
        x.recv = c.irecv(std::span<float>(x.received.data(), n_values), 0, 0);
        c.group_end();
        x.wait();
        expect(message.find("call group_end() first") != std::string::npos,
               "a request waited on inside its own group is refused (" + message + ")");
    }
}

/// Rank 0 of a 2-rank communicator whose rank 1 never joins: comm_error naming the rank, the operation and the
/// timeout once 2 s have passed, the communicator aborted.
void initialisation_deadline() {
    ncclUniqueId id{};
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        expect(false, "ncclGetUniqueId for the 2-rank communicator");
        return;
    }
    std::printf("     initialising a 2-rank communicator alone (must give up after 2 s)\n");
    std::fflush(stdout);
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
        NcclCommunicator::init(id, 2, 0, "pair", std::chrono::seconds(2));
    } catch (const comm_error& e) {
        message = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("     gave up after %.1f s: %s\n", seconds, message.c_str());
    expect(message.find("ncclCommInitRankConfig on pair (rank 0 of 2): not complete after 2000 ms") == 0 &&
               message.find("aborted") != std::string::npos,
           "initialisation with a rank missing throws comm_error naming the rank, the operation and the timeout");
    // Not a timing assertion: a bound on "does not hang" (the abort itself may take a few seconds).
    expect(seconds >= 2.0 && seconds < 60.0, "initialisation with a rank missing gives up after its timeout");
}

}  // namespace

int main() {
    try {
        testing::SelfWorld host;
        // One rank: initialisation completes well within the deadline.
        const auto world = NcclCommunicator::from(host, 0, "world", std::chrono::seconds(60));
        expect(world->size() == 1 && world->rank() == 0, "from() with a deadline makes a one-rank communicator");
        collectives(*world);
        streams(*world);
        runtime(*world);
    } catch (const std::exception& e) {
        std::printf("FAIL %s\n", e.what());
        ++failures;
    }
    try {
        initialisation_deadline();  // last: NCCL's bootstrap thread for the missing rank stays behind
    } catch (const std::exception& e) {
        std::printf("FAIL %s\n", e.what());
        ++failures;
    }
    std::printf("%d failed\n", failures);
    return failures;
}
