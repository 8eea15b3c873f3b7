// QK-Clip of one MLA layer with every head over tau (the worst case): per head, the q_nope rows of q_b_proj and the
// k_nope rows of kv_b_proj times sqrt(gamma), the q_pe rows times gamma (bench/SUITE.md). Memory-bound: bytes are
// the rows rescaled, read and written.
// bench-smoke-filter: /small/
#include "support/configs.hpp"
#include "support/suite.hpp"

#include <moonmoe/optim/qk_clip.hpp>

namespace bench {
namespace {

void qk_clip(benchmark::State& state, const moonmoe::ModelConfig& cfg) {
    const auto& a = cfg.attention;
    const index_t H = a.heads, dqk = a.nope_dim + a.rope_dim;
    Mat q_b({H * dqk, a.q_rank}), kv_b({H * (a.nope_dim + a.v_dim), a.kv_rank});
    Ops::fill_normal(q_b.view(), 0.0f, 0.02f, 1);
    Ops::fill_normal(kv_b.view(), 0.0f, 0.02f, 2);
    // Every call rescales, so the weights are restored before each one (untimed); repeated clipping would shrink
    // them into denormals within a hundred calls and time those instead.
    const Mat q_b0 = q_b.clone(), kv_b0 = kv_b.clone();
    const moonmoe::nn::MLAHeadLayout layout{H, a.nope_dim, a.rope_dim, a.v_dim};
    moonmoe::QKClipConfig clip = moonmoe::KimiK2::config.optimizer.qk_clip;
    std::vector<float> maxima(static_cast<std::size_t>(H));
    for (index_t h = 0; h < H; ++h) maxima[h] = float(clip.tau) * (1.5f + float(h) / float(H));
    const double bytes = 8.0 * (double(H) * dqk * a.q_rank + double(H) * a.nope_dim * a.kv_rank);
    measure(
        state, {0, bytes},
        [&] {
            moonmoe::optim::clip_mla_heads<Backend>(q_b.data(), a.q_rank, kv_b.data(), a.kv_rank, layout, maxima, clip);
        },
        [&] { Ops::copy(q_b0.view(), q_b.view()), Ops::copy(kv_b0.view(), kv_b.view()); });
}

void register_benchmarks() {
    for (auto [cfg, name] : {std::pair{&k2, "k2"}, {&small, "small"}})
        add(std::string("qk_clip/mla/") + name + "/" + shape_args({{"heads", cfg->attention.heads}}),
            [cfg](benchmark::State& s) { qk_clip(s, *cfg); });
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
