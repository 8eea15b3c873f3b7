// How ZeRO-1 with distributed Muon shares whole parameters out over a data-parallel group (parallel/zero.hpp):
// the greedy longest-processing-time assignment by Newton-Schulz cost, checked against hand-worked cases and
// against the bound every such assignment meets (no rank above the mean load plus the largest item).
#include <doctest/doctest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include <moonmoe/parallel/zero.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_parallel_zero {

namespace {

using moonmoe::index_t;
using moonmoe::parallel::assign_by_cost;
using moonmoe::parallel::newton_schulz_cost;

TEST_CASE("newton_schulz_cost is max(m, n) min(m, n)^2, whichever side is longer") {
    CHECK(newton_schulz_cost(2048, 7168) == doctest::Approx(7168.0 * 2048.0 * 2048.0));
    CHECK(newton_schulz_cost(7168, 2048) == newton_schulz_cost(2048, 7168));
    CHECK(newton_schulz_cost(16384, 512) == doctest::Approx(16384.0 * 512.0 * 512.0));
}

TEST_CASE("assign_by_cost: the costliest first, each to the least loaded rank, ties to the lower index") {
    // 5 -> r0; 4 -> r1; 3 (item 2) -> r1 (4 < 5); 3 (item 3) -> r0 (5 < 7); 3 (item 4) -> r1 (7 < 8)
    const auto a = assign_by_cost({5, 4, 3, 3, 3}, 2);
    CHECK(a.owner == std::vector<int>{0, 1, 1, 0, 1});
    CHECK(a.load == std::vector<double>{8, 10});
    // equal costs go round the ranks in item order; more ranks than items leaves ranks empty
    CHECK(assign_by_cost({1, 1, 1}, 2).owner == std::vector<int>{0, 1, 0});
    const auto sparse = assign_by_cost({7, 2}, 4);
    CHECK(sparse.owner == std::vector<int>{0, 1});
    CHECK(sparse.load == std::vector<double>{7, 2, 0, 0});
    CHECK(assign_by_cost({}, 3).load == std::vector<double>{0, 0, 0});
}

TEST_CASE("assign_by_cost: every load within the mean plus the largest item, the total kept") {
    std::mt19937_64 gen(5);
    for (int trial = 0; trial < 200; ++trial) {
        const int ranks = 1 + int(gen() % 9);
        std::vector<double> cost(gen() % 40);
        for (double& c : cost) c = newton_schulz_cost(index_t(1 + gen() % 4096), index_t(1 + gen() % 4096));
        const auto a = assign_by_cost(cost, ranks);
        const double total = std::accumulate(cost.begin(), cost.end(), 0.0);
        const double largest = cost.empty() ? 0.0 : *std::max_element(cost.begin(), cost.end());
        CHECK(std::accumulate(a.load.begin(), a.load.end(), 0.0) == doctest::Approx(total));
        for (double l : a.load) CHECK(l <= total / ranks + largest + 1e-6 * total);
        for (int o : a.owner) CHECK((o >= 0 && o < ranks));
    }
}

}  // namespace

}  // namespace unit_parallel_zero
