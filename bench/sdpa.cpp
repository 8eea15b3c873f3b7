// The attention core of MLA alone under the bf16 policy (AttentionOps with values = bf16: on the GPU the fused
// engine, cuDNN's SDPA, when the binary links it; backend/cuda/sdpa.hpp), at K2's heads and head sizes (64 heads,
// q/k 128 + 64 rope with the rope key shared by the heads, v 128) over one causal sequence: forward, forward with
// QK-Clip's exact per-head maxima (their cost is the difference of the two rows), and forward + backward.
// bench/torch_suite.py times torch.nn.functional.scaled_dot_product_attention on the same shapes (issue 26's
// target: ours at >= 0.8x its speed). FLOPs: the causal half of the score and value products, backward 2.5x the
// forward (FlashAttention-2's count). The K2 rows are registered in the CUDA build only (a CPU run of 4096 tokens
// at 64 heads takes minutes).
// bench-smoke-filter: /small/
#include "support/configs.hpp"
#include "support/suite.hpp"

#include <cmath>
#include <string>
#include <vector>

#include <moonmoe/backend/backend.hpp>

namespace bench {
namespace {

struct Shape {
    index_t heads, nope, rope, v;
};

void sdpa(benchmark::State& state, Shape s, index_t tokens, bool maxima, bool backward) {
    using moonmoe::View;
    using A = moonmoe::backend::AttentionOps<Backend>;
    const index_t T = tokens, H = s.heads, dq = s.nope + s.rope;
    Mat q({T, H * dq}), kv({T, H * (s.nope + s.v)}), kpe({T, s.rope}), o({T, H * s.v}), dO({T, H * s.v});
    Mat dq_m({T, H * dq}), dkv({T, H * (s.nope + s.v)}), dkpe({T, H * s.rope});
    Ops::fill_normal(q.view(), 0.0f, 1.0f, 1);
    Ops::fill_normal(kv.view(), 0.0f, 1.0f, 2);
    Ops::fill_normal(kpe.view(), 0.0f, 1.0f, 3);
    Ops::fill_normal(dO.view(), 0.0f, 1.0f, 4);
    const auto heads = [](Mat& m, index_t col0, index_t h, index_t stride, index_t dim) {
        return View<float, 3, Backend>(m.data() + col0, {m.size(0), h, dim}, {m.size(1), stride, 1});
    };
    moonmoe::backend::AttentionQueries<Backend> queries{
        2, {heads(q, 0, H, dq, s.nope), heads(q, s.nope, H, dq, s.rope)}, moonmoe::NumberFormat::bf16};
    moonmoe::backend::AttentionKeys<Backend> keys{{heads(kv, 0, H, s.nope + s.v, s.nope), heads(kpe, 0, H, 0, s.rope)},
                                                  heads(kv, s.nope, H, s.nope + s.v, s.v)};
    moonmoe::backend::AttentionGrads<Backend> grads{
        {heads(dq_m, 0, H, dq, s.nope), heads(dq_m, s.nope, H, dq, s.rope)},
        {heads(dkv, 0, H, s.nope + s.v, s.nope), heads(dkpe, 0, H, s.rope, s.rope)},
        heads(dkv, s.nope, H, s.nope + s.v, s.v)};
    moonmoe::Tensor<float, 1, Backend> lse({T * H}), max_logit({H});
    const std::vector<index_t> offsets{0, T};
    const float scale = 1.0f / std::sqrt(float(dq));
    const double forward_flops = 2.0 * double(H) * double(T) * double(T) / 2.0 * double(dq + s.v);
    measure(state, {backward ? 3.5 * forward_flops : forward_flops}, [&] {
        A::attention_forward(queries, keys, offsets, scale, heads(o, 0, H, s.v, s.v), lse.view(),
                             maxima ? max_logit.view() : View<float, 1, Backend>{});
        if (backward)
            A::attention_backward(queries, keys, offsets, scale, heads(o, 0, H, s.v, s.v), lse.view(),
                                  heads(dO, 0, H, s.v, s.v), grads);
    });
#if defined(MOONMOE_BENCH_CUDA)
    state.SetLabel("bf16");
    state.counters["cudnn"] = std::string(moonmoe::backend::cuda_attention_engine()) == "cuDNN" ? 1 : 0;
#endif
}

void register_benchmarks() {
    struct Case {
        Shape shape;
        const char* name;
        index_t tokens;
        bool gpu_only;
    };
    for (Case c : {Case{{64, 128, 64, 128}, "k2", 4096, true}, Case{{8, 64, 32, 64}, "small", 256, false}}) {
#if !defined(MOONMOE_BENCH_CUDA)
        if (c.gpu_only) continue;
#endif
        const std::string tag = std::string("/") + c.name + "/" + shape_args({{"tokens", c.tokens}});
        add("sdpa/forward" + tag, [c](benchmark::State& s) { sdpa(s, c.shape, c.tokens, false, false); });
        add("sdpa/forward_max" + tag, [c](benchmark::State& s) { sdpa(s, c.shape, c.tokens, true, false); });
        add("sdpa/forward_backward" + tag, [c](benchmark::State& s) { sdpa(s, c.shape, c.tokens, false, true); });
    }
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
