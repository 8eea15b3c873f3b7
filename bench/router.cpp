// The router at K2's width: logits over 384 experts, sigmoid, correction bias, top-8, normalised weights
// (bench/SUITE.md). FLOPs: the gate GEMM, 2 T E hidden.
// bench-smoke-filter: /small/
#include "support/configs.hpp"
#include "support/flops.hpp"
#include "support/suite.hpp"

#include <moonmoe/nn/router.hpp>

namespace bench {
namespace {

void router(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t tokens) {
    moonmoe::nn::Router<Backend> gate(cfg.moe, cfg.dims.hidden);
    init_params(gate);
    Mat x({tokens, cfg.dims.hidden});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 3);
    moonmoe::nn::Router<Backend>::Cache cache;
    measure(state, {flops::router_forward(cfg, tokens)}, [&] { gate.forward(x.view(), cache); });
}

void register_benchmarks() {
    for (auto [cfg, name, tokens] : {std::tuple{&k2, "k2", index_t(4096)}, {&small, "small", index_t(256)}})
        add(std::string("router/forward/") + name + "/" + shape_args({{"tokens", tokens}}),
            [cfg, tokens](benchmark::State& s) { router(s, *cfg, tokens); });
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
