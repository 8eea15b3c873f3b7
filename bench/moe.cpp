// The MoE block at K2's width: the router over 384 experts, the routed experts of one expert-parallel rank
// (24 of 384, as under Parallel<16, 16, DP>; pairs routed elsewhere are skipped), and the shared expert; forward,
// and forward + backward (bench/SUITE.md). Counters besides the suite's: `pairs`, the (token, expert) pairs
// computed here, and `overhead`, the share of the time spent routing and moving rows (router, sorting pairs,
// gathering inputs, scattering outputs) rather than in expert arithmetic. FLOPs: bench/support/flops.hpp, for the
// pairs actually computed. `moe/experts` times the routed experts' grouped GEMMs alone (issue 11's MoE target).
// bench-smoke-filter: /small/
#include "support/configs.hpp"
#include "support/flops.hpp"
#include "support/suite.hpp"

#include <moonmoe/nn/moe.hpp>

namespace bench {
namespace {

using MoE = moonmoe::nn::MoE<Backend>;

void moe(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t tokens, bool backward) {
    MoE& block =
        fixture<MoE>(cfg, [&] { return std::make_unique<MoE>(cfg.moe, cfg.dims.hidden, 0, local_experts(cfg)); });
    const index_t H = cfg.dims.hidden;
    Mat x({tokens, H}), y({tokens, H}), dy({tokens, H}), dx({tokens, H});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 3);
    Ops::fill_normal(dy.view(), 0.0f, 1.0f, 4);
    MoE::Cache cache;
    // The routing depends only on x, so one forward tells the pair count of every iteration.
    block.forward(x.view(), y.view(), cache);
    const index_t pairs = block.expert_rows;
    block.times = {};
    double total = 0;
    const double f = flops::moe_forward(cfg, tokens, pairs);
    measure(state, {backward ? 3.0 * f : f}, [&] {
        const auto t = Clock::now();
        block.forward(x.view(), y.view(), cache);
        if (backward) block.backward(dy.view(), cache, dx.view());
        total += seconds_since(t);
    });
    state.counters["pairs"] = double(pairs);
    // MoE's part timers read the host clock without waiting for the device: meaningful on the CPU only.
    if constexpr (moonmoe::backend::host_visible<Backend>)
        state.counters["overhead"] = (block.times.router + block.times.dispatch) / total;
}

MoE& experts_fixture(const moonmoe::ModelConfig& cfg) {
    return fixture<MoE>(cfg, [&] { return std::make_unique<MoE>(cfg.moe, cfg.dims.hidden, 0, local_experts(cfg)); });
}

/// The experts' segment offsets of the routing of `tokens` random tokens (local: the plan's segments; the last
/// offset is the pair count).
std::vector<index_t> routed_segments(MoE& block, const moonmoe::ModelConfig& cfg, index_t tokens) {
    Mat u({tokens, cfg.dims.hidden}), y({tokens, cfg.dims.hidden});
    Ops::fill_normal(u.view(), 0.0f, 1.0f, 3);
    MoE::Cache cache;
    block.forward(u.view(), y.view(), cache);
    return cache.plan.exchange.expert_offsets;
}

/// The routed experts' grouped GEMMs alone (gate, up, down over the segments of the routing of `tokens` random
/// tokens; SwiGLU, gather and combine left out): the rate issue 11 compares with a dense GEMM of the same run
/// (of_sgemm, and of_bf16_cublas on the GPU).
void experts(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t tokens) {
    using moonmoe::backend::Trans;
    MoE& block = experts_fixture(cfg);
    const index_t H = cfg.dims.hidden, I = cfg.moe.expert_hidden;
    const std::vector<index_t> offsets = routed_segments(block, cfg, tokens);
    const index_t pairs = offsets.back();
    Mat x({pairs, H}), g({pairs, I}), up({pairs, I}), out({pairs, H});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 5);
    measure(state, {flops::expert_forward(cfg, pairs, I)}, [&] {
        Ops::gemm_grouped(Trans::yes, 1.0f, x.view(), block.experts.gate_proj.value.view(), 0.0f, g.view(), offsets);
        Ops::gemm_grouped(Trans::yes, 1.0f, x.view(), block.experts.up_proj.value.view(), 0.0f, up.view(), offsets);
        Ops::gemm_grouped(Trans::yes, 1.0f, g.view(), block.experts.down_proj.value.view(), 0.0f, out.view(), offsets);
    });
    state.counters["pairs"] = double(pairs);
    state.counters["experts"] = double(index_t(offsets.size()) - 1);
}

/// The same under the bf16 policy on the routed experts' K2 shapes (issue 26's MoE target): bf16 operands, f32
/// accumulation, bf16 outputs (gemm_grouped<bf16, bf16>: on the GPU one grouped cuBLAS call per projection).
void experts_bf16(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t tokens) {
    using moonmoe::bf16;
    using moonmoe::backend::Trans;
    MoE& block = experts_fixture(cfg);
    const index_t H = cfg.dims.hidden, I = cfg.moe.expert_hidden;
    const std::vector<index_t> offsets = routed_segments(block, cfg, tokens);
    const index_t pairs = offsets.back();
    const auto narrow = [](const auto& w) {
        const auto& shape = w.shape();
        moonmoe::Tensor<bf16, 3, Backend> out(shape);
        Ops::template cast<bf16, float>(w.view().template reshape<2>({shape[0] * shape[1], shape[2]}),
                                        out.view().template reshape<2>({shape[0] * shape[1], shape[2]}));
        return out;
    };
    const auto gate = narrow(block.experts.gate_proj.value), up_w = narrow(block.experts.up_proj.value),
               down = narrow(block.experts.down_proj.value);
    Mat x32({pairs, H});
    Ops::fill_normal(x32.view(), 0.0f, 1.0f, 5);
    moonmoe::Tensor<bf16, 2, Backend> x({pairs, H}), g({pairs, I}), up({pairs, I}), out({pairs, H});
    Ops::template cast<bf16, float>(x32.view(), x.view());
    measure(state, {flops::expert_forward(cfg, pairs, I)}, [&] {
        Ops::template gemm_grouped<bf16, bf16>(Trans::yes, 1.0f, x.view(), gate.view(), 0.0f, g.view(), offsets);
        Ops::template gemm_grouped<bf16, bf16>(Trans::yes, 1.0f, x.view(), up_w.view(), 0.0f, up.view(), offsets);
        Ops::template gemm_grouped<bf16, bf16>(Trans::yes, 1.0f, g.view(), down.view(), 0.0f, out.view(), offsets);
    });
    state.counters["pairs"] = double(pairs);
    state.counters["experts"] = double(index_t(offsets.size()) - 1);
#if defined(MOONMOE_BENCH_CUDA)
    state.SetLabel("bf16");
#endif
}

void register_benchmarks() {
    for (auto [cfg, name, tokens] : {std::tuple{&k2, "k2", index_t(1024)}, {&small, "small", index_t(256)}}) {
        for (bool backward : {false, true})
            add(std::string("moe/") + (backward ? "forward_backward/" : "forward/") + name + "/" +
                    shape_args({{"tokens", tokens}}),
                [cfg, tokens, backward](benchmark::State& s) { moe(s, *cfg, tokens, backward); });
        add(std::string("moe/experts/") + name + "/" + shape_args({{"tokens", tokens}}),
            [cfg, tokens](benchmark::State& s) { experts(s, *cfg, tokens); });
    }
    // bf16 at 4096 tokens on K2's rank of 24 experts: the GPU build only (the CPU's rows are the f32 ones above)
#if defined(MOONMOE_BENCH_CUDA)
    add("moe/experts_bf16/k2/" + shape_args({{"tokens", 4096}}),
        [](benchmark::State& s) { experts_bf16(s, k2, 4096); });
#endif
    add("moe/experts_bf16/small/" + shape_args({{"tokens", 256}}),
        [](benchmark::State& s) { experts_bf16(s, small, 256); });
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
