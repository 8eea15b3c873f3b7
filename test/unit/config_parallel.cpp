// Pipeline split, bubble fraction and per-rank memory of a Parallel<PP, EP, DP> layout.
#include <doctest/doctest.h>

#include <moonmoe/config.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_config_parallel {

using namespace moonmoe;

namespace {
ParallelConfig layout(index_t pp, index_t vp, SplitKind split = SplitKind::balanced, index_t first = 0,
                      index_t last = 0) {
    return {.pp = pp,
            .ep = 1,
            .dp = 1,
            .virtual_stages = vp,
            .split = split,
            .split_first = first,
            .split_last = last,
            .micro_batches = Dynamic};
}
}  // namespace

TEST_CASE("balanced split: every layer once, chunk sizes differ by at most one, ends lighter") {
    for (index_t layers : {1, 3, 16, 31, 32, 33, 61, 64, 95}) {
        for (index_t pp : {1, 2, 4, 16}) {
            for (index_t vp : {1, 2, 3}) {
                const ParallelConfig p = layout(pp, vp);
                if (layers < p.chunks()) continue;
                CAPTURE(layers);
                CAPTURE(pp);
                CAPTURE(vp);
                index_t sum = 0, lo = layers, hi = 0;
                for (index_t c = 0; c < p.chunks(); ++c) {
                    const index_t n = layers_in_chunk(p, layers, c);
                    CHECK(first_layer_of_chunk(p, layers, c) == sum);
                    sum += n;
                    lo = n < lo ? n : lo;
                    hi = n > hi ? n : hi;
                }
                CHECK(sum == layers);
                CHECK(hi - lo <= 1);
                if (hi > lo) CHECK(layers_in_chunk(p, layers, 0) == lo);
            }
        }
    }
}

TEST_CASE("Kimi K2 over PP 16 x 2 virtual stages: 29 chunks of 2 layers, 3 of 1") {
    const ParallelConfig& p = KimiK2::config.parallel;
    index_t twos = 0;
    for (index_t c = 0; c < p.chunks(); ++c) twos += layers_in_chunk(p, 61, c) == 2;
    CHECK(twos == 29);
    CHECK(layers_in_chunk(p, 61, 0) == 1);
    CHECK(layers_in_chunk(p, 61, 31) == 1);
}

TEST_CASE("uneven and even splits") {
    const ParallelConfig u = layout(4, 1, SplitKind::uneven, 1, 2);
    CHECK(layers_in_chunk(u, 13, 0) == 1);
    CHECK(layers_in_chunk(u, 13, 1) == 5);
    CHECK(layers_in_chunk(u, 13, 2) == 5);
    CHECK(layers_in_chunk(u, 13, 3) == 2);
    const ParallelConfig e = layout(4, 2, SplitKind::even);
    for (index_t c = 0; c < 8; ++c) CHECK(layers_in_chunk(e, 64, c) == 8);
}

TEST_CASE("interleaved 1F1B bubble (p-1)/(v m): K2's 16 stages, 2 virtual, 64 micro-batches give 11.7%") {
    CHECK(bubble_fraction(KimiK2::config.parallel, 64) == doctest::Approx(15.0 / 128.0));
    CHECK(bubble_fraction(layout(16, 1), 64) == doctest::Approx(15.0 / 64.0));
}

TEST_CASE("per-rank memory: all ranks together hold the model exactly once per replica") {
    for (index_t ep : {1, 2, 4}) {
        using M = TinyV3::with<Parallel<2, 1, 1, VirtualStages<2>>>;
        ModelConfig c = M::config;
        c.parallel.ep = ep;
        const ParameterCounts p = count_parameters(c);
        index_t expert = 0, replicated = 0;
        for (index_t rank = 0; rank < c.parallel.pp; ++rank) {
            const RankMemory r = rank_memory(c, rank, 1);
            expert += r.expert_params * ep;  // EP ranks split the routed experts
            replicated += r.replicated_params;
        }
        CHECK(expert == p.routed_experts);
        CHECK(expert + replicated == p.total);
    }
}

TEST_CASE("bytes per parameter follow Megatron's distributed-optimizer rule") {
    // One rank holds everything (PP = EP = 1): BF16 weight + FP32 grad = 6 B, plus the optimizer state over DP,
    // 12 B for AdamW (Megatron: 6 + 12/d), 8 B for Muon's master copy and momentum (6 + 8/d).
    using Adam = TinyK2::with<Optimizer<NoMuon>, Parallel<1, 1, 4>>;
    const RankMemory a = Adam::memory_per_rank();
    const index_t n = Adam::parameter_count() - a.bias_params;
    CHECK(a.params() == Adam::parameter_count());
    CHECK(a.weight_bytes + a.gradient_bytes == 6 * n + 4 * a.bias_params);
    CHECK(a.optimizer_bytes == 12 * n / 4);
    using WithMuon = TinyK2::with<Parallel<1, 1, 4>>;
    const RankMemory m = WithMuon::memory_per_rank();
    CHECK(m.optimizer_bytes == (8 * m.muon_params + 12 * m.adamw_params) / 4);
    CHECK(m.muon_params + m.adamw_params == n);
}

TEST_CASE("Kimi K2 on Parallel<16, 16, DP>: about 30 GB per GPU once optimizer state is spread") {
    const RankMemory r = KimiK2::memory_per_rank(1024);
    CHECK(r.moe_layers == 4);
    CHECK(r.pipeline_rank != 0);  // rank 0 carries the embedding but fewer layers
    const double weights_and_grads = double(r.weight_bytes + r.gradient_bytes);
    CHECK(weights_and_grads / 1e9 == doctest::Approx(30.0).epsilon(0.1));
    CHECK(double(r.optimizer_bytes) < 0.01 * weights_and_grads);
    // 6 B per parameter over the model-parallel group: "approximately 6 TB ... over 256 GPUs"
    CHECK(6.0 * double(KimiK2::parameter_count()) / 1e12 == doctest::Approx(6.0).epsilon(0.05));
}

}  // namespace unit_config_parallel
