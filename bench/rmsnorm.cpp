// RMSNorm forward, and forward + backward, over K2's hidden width. Memory-bound: bytes are one read of x and one
// write of y forward; backward also reads x, dy (and rstd) and writes dx. FLOPs: 4 per element forward (square,
// sum, scale, gain), 10 per element for both.
// bench-smoke-filter: dim:512/
#include "support/suite.hpp"

#include <moonmoe/nn/rmsnorm.hpp>

namespace bench {
namespace {

void rmsnorm(benchmark::State& state, index_t tokens, index_t dim, bool backward) {
    moonmoe::nn::RMSNorm<Backend> norm(dim, 1e-6);
    Mat x({tokens, dim}), y({tokens, dim}), dy({tokens, dim}), dx({tokens, dim});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 1);
    Ops::fill_normal(dy.view(), 0.0f, 1.0f, 2);
    moonmoe::Tensor<float, 1, Backend> rstd({tokens});
    const double n = double(tokens) * dim;
    Work work{backward ? 10.0 * n : 4.0 * n, backward ? 4.0 * 5 * n : 4.0 * 2 * n};
    measure(state, work, [&] {
        norm.forward(x.view(), y.view(), rstd.view());
        if (backward) norm.backward(x.view(), rstd.view(), dy.view(), dx.view());
    });
}

void register_benchmarks() {
    for (auto [tokens, dim] : {std::pair<index_t, index_t>{4096, 7168}, {64, 512}})
        for (bool backward : {false, true})
            add(std::string("rmsnorm/") + (backward ? "forward_backward/" : "forward/") +
                    shape_args({{"tokens", tokens}, {"dim", dim}}),
                [=](benchmark::State& s) { rmsnorm(s, tokens, dim, backward); });
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
