// The NCCL communicator (parallel/nccl.hpp) under nvcc: every operation of the interface instantiated on device
// buffers, so each NCCL call is compiled. Compiled only (-c); tools/gpu_check.sh runs NCCL on a GPU.
#include <moonmoe/parallel/nccl.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>

using namespace moonmoe;
using namespace moonmoe::parallel;

void every_operation(Communicator& bootstrap) {
    const auto c = NcclCommunicator::from(bootstrap, 0, "world", std::chrono::seconds(30));
    ncclUniqueId id{};
    const auto one = NcclCommunicator::init(id, 1, 0);
    Tensor<float, 1, moonmoe::cuda> a({8}), b({8});
    const std::vector<index_t> counts(std::size_t(c->size()), 0);
    c->all_to_all_v(std::span<const float>(a.data(), 0), counts, std::span<float>(b.data(), 0), counts);
    c->all_reduce(std::span<float>(a.data(), 8), ReduceOp::max);
    c->reduce_scatter(std::span<const float>(a.data(), 8), std::span<float>(b.data(), std::size_t(8 / c->size())));
    c->all_gather(std::span<const float>(a.data(), 1), std::span<float>(b.data(), std::size_t(c->size())));
    c->exchange_counts(counts);
    c->isend(std::span<const float>(a.data(), 8), 0, 0)->wait();
    c->irecv(std::span<float>(b.data(), 8), 0, 0)->wait();
    c->group_start();
    const auto send = c->isend(std::span<const float>(a.data(), 8), 0, 0);
    const auto recv = c->irecv(std::span<float>(b.data(), 8), 0, 0);
    c->group_end();
    recv->wait();
    send->wait();
    c->barrier();
    const auto sub = c->split(0, c->rank(), "sub");
    const std::vector<index_t> offsets(std::size_t(c->size() + 1), 0);
    const ExpertExchange<moonmoe::cuda> ex = plan_exchange<moonmoe::cuda>(*sub, offsets);
    Tensor<float, 2, moonmoe::cuda> rows({0, 4});
    (void)return_rows(*sub, ex, dispatch_rows(*sub, ex, rows.view()).view());
}
