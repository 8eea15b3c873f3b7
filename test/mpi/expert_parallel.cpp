// Expert parallelism's dispatch and combine (parallel/expert_parallel.hpp) under mpirun, with the oracles of
// Megatron's and DeepEP's dispatcher tests: identity experts with weights 1/k give back the input exactly; each
// sender's rows arrive intact, at the right expert, in (source rank, token) order; and the routings that hang real
// systems (a rank with no tokens, every token on one expert, fewer tokens than ranks) take the same collectives.
#include <doctest/doctest.h>

#include <random>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_expert_parallel {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::world;
using Ops = backend::Ops<cpu>;

namespace {

/// One rank's routing: tokens, top-k experts of each (distinct), the plan over all experts, and its tokens.
struct Routed {
    index_t tokens, k, experts;
    std::vector<index_t> idx;
    Tensor<float, 2> x;
    std::vector<index_t> offsets;
    Tensor<index_t, 1> row_slot;
    Tensor<index_t, 2> slot_row;
};

enum class Routing { random, one_expert };

Routed route(index_t tokens, index_t k, index_t experts, Routing how, std::uint64_t seed) {
    Routed r{tokens,
             k,
             experts,
             {},
             Tensor<float, 2>({tokens, 8}),
             {},
             Tensor<index_t, 1>({tokens * k}),
             Tensor<index_t, 2>({tokens, k})};
    std::mt19937_64 gen(seed);
    for (index_t t = 0; t < tokens; ++t) {
        std::vector<index_t> all(static_cast<std::size_t>(experts));
        for (index_t e = 0; e < experts; ++e) all[std::size_t(e)] = e;
        if (how == Routing::random) std::shuffle(all.begin(), all.end(), gen);
        for (index_t j = 0; j < k; ++j) r.idx.push_back(all[std::size_t(j)]);  // one_expert: 0, 1, ..., k-1 always
        for (index_t c = 0; c < 8; ++c) r.x(t, c) = float(std::uniform_real_distribution<double>(-1, 1)(gen));
    }
    Tensor<index_t, 2> idx({tokens, k});
    std::copy(r.idx.begin(), r.idx.end(), idx.data());
    Tensor<index_t, 1> offsets({experts + 1});
    Ops::dispatch_plan(idx.view(), 0, offsets.view(), r.row_slot.view(), r.slot_row.view());
    r.offsets.assign(offsets.data(), offsets.data() + experts + 1);
    return r;
}

/// Dispatch, identity experts, return, combine with weights 1/k: must give x back exactly (k a power of two).
void identity_round_trip(const Routed& r) {
    Communicator& w = world();
    const ExpertExchange<cpu> ex = plan_exchange<cpu>(w, r.offsets);
    Tensor<float, 2> send({r.tokens * r.k, 8});
    Ops::gather_pairs(r.x.view(), r.row_slot.view(), r.k, send.view());
    const Tensor<float, 2> at_experts = dispatch_rows(w, ex, send.view());
    const Tensor<float, 2> back = return_rows(w, ex, at_experts.view());
    Tensor<float, 2> weight({r.tokens, r.k}), y({r.tokens, 8});
    Ops::fill(weight.view(), 1.0f / float(r.k));
    Ops::combine(back.view(), r.slot_row.view(), weight.view(), y.view());
    for (index_t t = 0; t < r.tokens; ++t)
        for (index_t c = 0; c < 8; ++c) REQUIRE(y(t, c) == r.x(t, c));
}

}  // namespace

TEST_CASE("expert parallelism: identity experts with weights 1/k return the input exactly") {
    Communicator& w = world();
    const int n = w.size();
    for (index_t k : {1, 2, 4})
        for (index_t per_rank : {1, 2, 3}) {
            const index_t experts = per_rank * n;
            if (k > experts) continue;
            INFO("k ", k, ", experts ", experts, ", rank ", w.rank());
            identity_round_trip(route(5 + 3 * w.rank(), k, experts, Routing::random, 17 + std::uint64_t(w.rank())));
        }
}

TEST_CASE("expert parallelism: rows of bf16 values cross as bf16, half the bytes, and come back exactly") {
    // The bf16 policy's activations: every value already a bf16 one, so the wire format loses nothing.
    Communicator& w = world();
    const int n = w.size(), me = w.rank();
    Routed r = route(6 + me, 2, 2 * n, Routing::random, 40 + std::uint64_t(me));
    for (index_t i = 0; i < r.x.numel(); ++i) r.x.data()[i] = bf16::from_float(r.x.data()[i] * 3.7f).to_float();
    const ExpertExchange<cpu> ex = plan_exchange<cpu>(w, r.offsets);
    Tensor<float, 2> send({r.tokens * r.k, 8});
    Ops::gather_pairs(r.x.view(), r.row_slot.view(), r.k, send.view());
    std::uint64_t bytes[2] = {0, 0};
    Tensor<float, 2> at_experts[2], back[2];
    for (int f = 0; f < 2; ++f) {
        const NumberFormat values = f == 0 ? NumberFormat::f32 : NumberFormat::bf16;
        w.reset_traffic();
        at_experts[f] = dispatch_rows(w, ex, send.view(), values);
        back[f] = return_rows(w, ex, at_experts[f].view(), values);
        bytes[f] = w.traffic().bytes;
    }
    CHECK(bytes[1] * 2 == bytes[0]);  // every row's 8 values at 2 bytes instead of 4, both ways
    for (index_t i = 0; i < at_experts[0].numel(); ++i) REQUIRE(at_experts[1].data()[i] == at_experts[0].data()[i]);
    for (index_t i = 0; i < send.numel(); ++i) REQUIRE(back[1].data()[i] == send.data()[i]);
}

TEST_CASE("expert parallelism: the cases that hang real systems take the same collectives and stay exact") {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    const index_t experts = 2 * n;
    SUBCASE("rank 0 has no tokens") { identity_round_trip(route(r == 0 ? 0 : 6, 2, experts, Routing::random, 5 + r)); }
    SUBCASE("every token routed to the same experts (the first rank's)") {
        identity_round_trip(route(7, 2, experts, Routing::one_expert, 9));
    }
    SUBCASE("fewer tokens than ranks, in all") {
        identity_round_trip(route(r == n - 1 ? 1 : 0, 1, experts, Routing::random, 3));
    }
    SUBCASE("no tokens anywhere") { identity_round_trip(route(0, 2, experts, Routing::random, 1)); }
}

TEST_CASE("expert parallelism: each sender's rows arrive intact at the right expert, by source rank then token") {
    Communicator& w = world();
    const int n = w.size(), me = w.rank();
    const index_t experts = 3 * n, k = 2;
    Routed r = route(4 + me, k, experts, Routing::random, 100 + std::uint64_t(me));
    // each row says who sent it, for which token and which expert
    Tensor<float, 2> send({r.tokens * k, 3});
    for (index_t row = 0; row < r.tokens * k; ++row) {
        const index_t slot = r.row_slot(row);
        send(row, 0) = float(me), send(row, 1) = float(slot / k), send(row, 2) = float(r.idx[std::size_t(slot)]);
    }
    const ExpertExchange<cpu> ex = plan_exchange<cpu>(w, r.offsets);
    const Tensor<float, 2> got = dispatch_rows(w, ex, send.view());
    // what every rank routed (each rank can recompute the others' routing from their seeds)
    index_t expected_rows = 0;
    for (index_t e = 0; e < 3; ++e) {
        const index_t expert = me * 3 + e;
        std::vector<std::pair<index_t, index_t>> expected;  // (source, token), in order
        for (int s = 0; s < n; ++s) {
            const Routed other = route(4 + s, k, experts, Routing::random, 100 + std::uint64_t(s));
            for (index_t t = 0; t < other.tokens; ++t)
                for (index_t j = 0; j < k; ++j)
                    if (other.idx[std::size_t(t * k + j)] == expert) expected.push_back({s, t});
        }
        REQUIRE(ex.expert_offsets[std::size_t(e + 1)] - ex.expert_offsets[std::size_t(e)] == index_t(expected.size()));
        for (std::size_t i = 0; i < expected.size(); ++i) {
            const index_t row = ex.expert_offsets[std::size_t(e)] + index_t(i);
            CHECK(got(row, 0) == float(expected[i].first));
            CHECK(got(row, 1) == float(expected[i].second));
            CHECK(got(row, 2) == float(expert));
        }
        expected_rows += index_t(expected.size());
    }
    CHECK(ex.received() == expected_rows);
    // and an expert count that does not split over the ranks is refused on every rank, named
    if (n > 1) {
        const Routed odd = route(2, 1, n + 1, Routing::random, 1);
        CHECK_THROWS_WITH_AS(plan_exchange<cpu>(w, odd.offsets), doctest::Contains("do not split evenly"), comm_error);
    }
}

}  // namespace mpi_expert_parallel
