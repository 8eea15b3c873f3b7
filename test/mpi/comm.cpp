// parallel/comm.hpp over MPI (parallel/mpi.hpp), on 1 to 4 ranks (ctest mpi.comm.np<N>): each collective against
// what every rank can compute alone, the zero-count cases that hang real systems, sub-groups of the rank layout,
// and the bounded wait.
#include <doctest/doctest.h>

#include <numeric>
#include <thread>

#include <moonmoe/parallel/layout.hpp>

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_comm {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::world;

TEST_CASE("all_reduce: sum and max over the world, f32, f64 and index_t") {
    Communicator& w = world();
    const int r = w.rank(), n = w.size();
    std::vector<float> f = {float(r), 1.0f, -float(r)};
    w.all_reduce(std::span<float>(f), ReduceOp::sum);
    CHECK(f == std::vector<float>{float(n * (n - 1) / 2), float(n), -float(n * (n - 1) / 2)});
    std::vector<double> d = {double(r) * 0.5};
    w.all_reduce(std::span<double>(d), ReduceOp::max);
    CHECK(d[0] == double(n - 1) * 0.5);
    std::vector<index_t> i = {index_t(r) << 40};
    w.all_reduce(std::span<index_t>(i), ReduceOp::sum);
    CHECK(i[0] == (index_t(n * (n - 1) / 2) << 40));
    std::vector<bf16> b(1);
    CHECK_THROWS_WITH_AS(w.all_reduce(std::span<bf16>(b), ReduceOp::sum), doctest::Contains("reductions take f32"),
                         comm_error);
}

TEST_CASE("all_to_all_v: counts exchanged first, every block arrives from the right rank, zero-count blocks included") {
    Communicator& w = world();
    const int r = w.rank(), n = w.size();
    // rank r sends (r + 2 i) % 3 elements to rank i: some blocks are empty; element k of the block from r to i
    // holds 1000 r + 10 i + k
    std::vector<index_t> send_counts(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) send_counts[std::size_t(i)] = (r + 2 * i) % 3;
    std::vector<float> send;
    for (int i = 0; i < n; ++i)
        for (index_t k = 0; k < send_counts[std::size_t(i)]; ++k) send.push_back(float(1000 * r + 10 * i + k));
    const std::vector<index_t> recv_counts = w.exchange_counts(send_counts);
    for (int s = 0; s < n; ++s) CHECK(recv_counts[std::size_t(s)] == (s + 2 * r) % 3);
    std::vector<float> recv(std::size_t(std::accumulate(recv_counts.begin(), recv_counts.end(), index_t(0))), -1.0f);
    w.all_to_all_v(std::span<const float>(send), send_counts, std::span<float>(recv), recv_counts);
    std::size_t at = 0;
    for (int s = 0; s < n; ++s)
        for (index_t k = 0; k < recv_counts[std::size_t(s)]; ++k) CHECK(recv[at++] == float(1000 * s + 10 * r + k));
    // a rank that sends and receives nothing at all still takes part
    std::vector<index_t> none(std::size_t(n), 0);
    CHECK(w.exchange_counts(none) == none);
    std::vector<float> empty;
    w.all_to_all_v(std::span<const float>(empty), none, std::span<float>(empty), none);
    // wrong totals are refused before any communication
    const std::vector<float> one(1);
    CHECK_THROWS_WITH_AS(w.all_to_all_v(std::span<const float>(one), none, std::span<float>(recv), recv_counts),
                         doctest::Contains("counts sum to 0"), comm_error);
}

TEST_CASE("reduce_scatter, all_gather and all_gather_v") {
    Communicator& w = world();
    const int r = w.rank(), n = w.size();
    std::vector<float> in(std::size_t(2 * n));
    for (int i = 0; i < 2 * n; ++i) in[std::size_t(i)] = float(i + r);
    std::vector<float> out(2);
    w.reduce_scatter(std::span<const float>(in), std::span<float>(out));
    const float ranks_sum = float(n * (n - 1) / 2);
    CHECK(out[0] == float(n * 2 * r) + ranks_sum);
    CHECK(out[1] == float(n * (2 * r + 1)) + ranks_sum);

    std::vector<float> mine = {float(r), float(10 * r)}, all(std::size_t(2 * n));
    w.all_gather(std::span<const float>(mine), std::span<float>(all));
    for (int s = 0; s < n; ++s)
        CHECK((all[std::size_t(2 * s)] == float(s) && all[std::size_t(2 * s + 1)] == float(10 * s)));

    // rank s contributes s % 2 elements (rank 0 none)
    std::vector<index_t> counts(static_cast<std::size_t>(n));
    for (int s = 0; s < n; ++s) counts[std::size_t(s)] = s % 2;
    std::vector<double> piece(std::size_t(r % 2), double(r)), gathered(std::size_t(n / 2));
    w.all_gather_v(std::span<const double>(piece), std::span<double>(gathered), counts);
    std::size_t at = 0;
    for (int s = 1; s < n; s += 2) CHECK(gathered[at++] == double(s));
}

TEST_CASE("send / recv around a ring, non-blocking, posted in one order on every rank") {
    Communicator& w = world();
    const int r = w.rank(), n = w.size();
    std::vector<float> out = {float(r), float(r) + 0.5f}, in(2, -1.0f);
    auto rx = w.irecv(std::span<float>(in), (r + n - 1) % n, 7);
    auto tx = w.isend(std::span<const float>(out), (r + 1) % n, 7);
    tx->wait();
    rx->wait();
    CHECK(in[0] == float((r + n - 1) % n));
    CHECK(in[1] == float((r + n - 1) % n) + 0.5f);
}

TEST_CASE("split: the groups of Parallel<PP, EP, DP> as sub-communicators") {
    Communicator& w = world();
    const int n = w.size();
    // every factorisation of the world into PP x EP x DP
    for (index_t pp = 1; pp <= n; ++pp)
        for (index_t ep = 1; pp * ep <= n; ++ep) {
            if (n % (pp * ep) != 0) continue;
            const RankLayout layout(pp, ep, n / (pp * ep));
            layout.check_world(n);
            const Coordinates c = layout.coordinates(w.rank());
            const auto check_group = [&](const std::vector<index_t>& members, int color, const char* what) {
                INFO(what, " of Parallel<", pp, ", ", ep, ", ", n / (pp * ep), ">");
                auto g = w.split(color, w.rank(), what);
                REQUIRE(g->size() == int(members.size()));
                CHECK(members[std::size_t(g->rank())] == w.rank());
                // the sum of the world ranks over the group is the sum of its listed members
                std::vector<index_t> sum = {w.rank()};
                g->all_reduce(std::span<index_t>(sum), ReduceOp::sum);
                CHECK(sum[0] == std::accumulate(members.begin(), members.end(), index_t(0)));
            };
            check_group(layout.pipeline_group(w.rank()), int(c.ep * layout.dp + c.dp), "pipeline group");
            check_group(layout.expert_group(w.rank()), int(c.pp * layout.dp + c.dp), "expert group");
            check_group(layout.dense_dp_group(w.rank()), int(c.pp), "dense data-parallel group");
            check_group(layout.expert_dp_group(w.rank()), int(c.pp * layout.ep + c.ep), "expert data-parallel group");
        }
    CHECK_THROWS_WITH_AS(RankLayout(2, 2, 2).check_world(n == 8 ? 4 : n), doctest::Contains("needs 8 processes"),
                         std::invalid_argument);
}

TEST_CASE("a receive that nothing matches ends in a named error after the timeout, not a hang") {
    Communicator& w = world();
    const auto saved = w.timeout();
    w.set_timeout(std::chrono::milliseconds(200));
    std::vector<float> in(1);
    const auto start = std::chrono::steady_clock::now();
    auto rx = w.irecv(std::span<float>(in), 0, 4242);  // tag 4242 is never sent
    CHECK_THROWS_WITH_AS(rx->wait(), doctest::Contains("receive from rank 0 (tag 4242) on world"), comm_error);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
    w.set_timeout(saved);
    w.barrier();
}

}  // namespace mpi_comm
