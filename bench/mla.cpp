// Multi-head Latent Attention at K2's full width (64 heads, q latent 1536, kv latent 512 + 64): the training form
// forward, forward + backward on one causal sequence, and the absorbed decode of one token against a latent cache
// of 4k tokens (bench/SUITE.md). FLOPs: bench/support/flops.hpp.
// bench-smoke-filter: /small/
#include "support/configs.hpp"
#include "support/flops.hpp"
#include "support/suite.hpp"

#include <moonmoe/nn/mla.hpp>

namespace bench {
namespace {

using MLA = moonmoe::nn::MLA<Backend>;

void forward(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t seq, bool backward) {
    MLA& mla = fixture<MLA>(cfg, [&] { return std::make_unique<MLA>(cfg); });
    const index_t H = cfg.dims.hidden;
    Mat x({seq, H}), out({seq, H}), dout({seq, H}), dx({seq, H});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 3);
    Ops::fill_normal(dout.view(), 0.0f, 1.0f, 4);
    const auto layout = moonmoe::nn::TokenLayout::sequences(1, seq);
    MLA::Cache cache;
    const double f = flops::mla_forward(cfg, seq);
    measure(state, {backward ? 3.0 * f : f}, [&] {
        mla.forward(x.view(), layout, out.view(), cache);
        if (backward) mla.backward(dout.view(), cache, dx.view());
    });
}

void decode(benchmark::State& state, const moonmoe::ModelConfig& cfg, index_t length) {
    MLA& mla = fixture<MLA>(cfg, [&] { return std::make_unique<MLA>(cfg); });
    MLA::LatentCache cache(length, cfg.attention);
    Ops::fill_normal(cache.kv.view(), 0.0f, 1.0f, 5);
    Ops::fill_normal(cache.pe.view(), 0.0f, 1.0f, 6);
    Mat x({1, cfg.dims.hidden}), out({1, cfg.dims.hidden});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 7);
    measure(state, {flops::mla_decode(cfg, length), flops::mla_decode_bytes(cfg, length)}, [&] {
        cache.length = length - 1;  // the new token takes the last slot every time
        mla.forward_absorbed(x.view(), cache, out.view());
    });
}

void register_benchmarks() {
    struct Case {
        const moonmoe::ModelConfig* cfg;
        const char* name;
        index_t seq, cache;
    };
    for (Case c : {Case{&k2, "k2", 1024, 4096}, Case{&small, "small", 128, 256}}) {
        const std::string tag = std::string("/") + c.name + "/";
        add("mla/forward" + tag + shape_args({{"seq", c.seq}}),
            [c](benchmark::State& s) { forward(s, *c.cfg, c.seq, false); });
        add("mla/forward_backward" + tag + shape_args({{"seq", c.seq}}),
            [c](benchmark::State& s) { forward(s, *c.cfg, c.seq, true); });
        add("mla/decode" + tag + shape_args({{"cache", c.cache}}),
            [c](benchmark::State& s) { decode(s, *c.cfg, c.cache); });
    }
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
