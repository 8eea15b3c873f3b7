// RoPE (YaRN, HF's interleaved pairing) on the rope part of every head of q [T, heads * (nope + rope)], in place,
// as MLA applies it after q_b_proj. Memory-bound: the rope columns are read and written once (bytes = 8 per value);
// FLOPs: 6 per rotated pair (4 multiplies, 2 adds).
// bench-smoke-filter: tokens:64/
#include "support/configs.hpp"
#include "support/suite.hpp"

#include <moonmoe/nn/rope.hpp>

namespace bench {
namespace {

void rope(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t tokens) {
    const index_t H = cfg.attention.heads, nope = cfg.attention.nope_dim, R = cfg.attention.rope_dim;
    moonmoe::nn::RotaryEmbedding<Backend> emb(cfg.rope, R);
    Mat q({tokens, H * (nope + R)});
    Ops::fill_normal(q.view(), 0.0f, 1.0f, 1);
    std::vector<index_t> host_positions(static_cast<std::size_t>(tokens));
    for (index_t t = 0; t < tokens; ++t) host_positions[t] = t;
    const auto positions = moonmoe::to_device<Backend>(host_positions);
    moonmoe::View<float, 3, Backend> part(q.data() + nope, {tokens, H, R}, {H * (nope + R), nope + R, 1});
    const double values = double(tokens) * H * R;
    measure(state, {3.0 * values, 8.0 * values}, [&] { emb.apply(part, positions.view()); });
}

void register_benchmarks() {
    for (auto [cfg, tokens] : {std::pair{&k2, index_t(4096)}, {&small, index_t(64)}}) {
        const moonmoe::ModelConfig& c = *cfg;
        add("rope/forward/" +
                shape_args({{"tokens", tokens}, {"heads", c.attention.heads}, {"dim", c.attention.rope_dim}}),
            [&c, tokens](benchmark::State& s) { rope(s, c, tokens); });
    }
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
