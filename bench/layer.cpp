// One Kimi K2 MoE decoder layer at full width (RMSNorm, MLA, residual, RMSNorm, MoE, residual), forward and
// forward + backward on one sequence; the routed experts are those of expert-parallel rank 0 of 16, as in
// bench/moe.cpp (bench/SUITE.md). FLOPs: MLA + MoE of bench/support/flops.hpp (norms and residuals not counted).
// layer_bf16/...: the same layer under Kimi K2's training precision, Precision<BF16, Weights<BF16>> (compare.py
// sets it beside PyTorch's layer under bfloat16 autocast); its k2_recompute and k2_fp8 (small_fp8) rows add K2's
// activation policies (peak_MiB shows what they keep).
// bench-smoke-filter: /small/
#include "support/configs.hpp"
#include "support/flops.hpp"
#include "support/suite.hpp"

#include <moonmoe/nn/decoder_layer.hpp>

namespace bench {
namespace {

using DecoderLayer = moonmoe::nn::DecoderLayer<Backend>;

void layer(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t tokens, bool backward) {
    DecoderLayer& l = fixture<DecoderLayer>(cfg, [&] {  // layer dense_layers: the first MoE layer
        return std::make_unique<DecoderLayer>(cfg, cfg.dims.dense_layers, 0, local_experts(cfg));
    });
    const index_t H = cfg.dims.hidden;
    Mat h({tokens, H}), out({tokens, H}), dout({tokens, H}), dh({tokens, H});
    Ops::fill_normal(h.view(), 0.0f, 1.0f, 3);
    Ops::fill_normal(dout.view(), 0.0f, 1.0f, 4);
    const auto layout = moonmoe::nn::TokenLayout::sequences(1, tokens);
    DecoderLayer::Cache cache;
    l.forward(h.view(), layout, out.view(), cache);  // the pair count for the FLOPs, the bytes kept for backward
    const index_t pairs = l.moe.expert_rows;
    const double kept_mib = double(cache.bytes()) / (1024.0 * 1024.0);
    const double f = flops::mla_forward(cfg, tokens) + flops::moe_forward(cfg, tokens, pairs);
    measure(state, {backward ? 3.0 * f : f}, [&] {
        l.forward(h.view(), layout, out.view(), cache);
        if (backward) l.backward(dout.view(), cache, dh.view());
    });
    state.counters["pairs"] = double(pairs);
    state.counters["kept_MiB"] = kept_mib;
}

void register_benchmarks() {
    for (auto [cfg, family, name, tokens] : {std::tuple{&k2, "layer", "k2", index_t(256)},
                                             {&small, "layer", "small", index_t(128)},
                                             {&k2_bf16, "layer_bf16", "k2", index_t(256)},
                                             {&small_bf16, "layer_bf16", "small", index_t(128)},
                                             {&k2_recompute, "layer_bf16", "k2_recompute", index_t(256)},
                                             {&k2_fp8, "layer_bf16", "k2_fp8", index_t(256)},
                                             {&small_fp8, "layer_bf16", "small_fp8", index_t(128)}})
        for (bool backward : {false, true})
            add(std::string(family) + (backward ? "/forward_backward/" : "/forward/") + name + "/" +
                    shape_args({{"tokens", tokens}}),
                [cfg, tokens, backward](benchmark::State& s) { layer(s, *cfg, tokens, backward); });
    // Issue 26's layer target: K2's training precision at 4096 tokens, on the GPU only (a CPU run takes minutes)
#if defined(MOONMOE_BENCH_CUDA)
    add("layer_bf16/forward_backward/k2/" + shape_args({{"tokens", 4096}}),
        [](benchmark::State& s) { layer(s, k2_bf16, 4096, true); });
#endif
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
