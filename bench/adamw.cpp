// One AdamW step (K2's betas 0.9 / 0.95, eps 1e-8, weight decay 0.1) on a slice of the embedding and on a small
// tensor (bench/SUITE.md). Memory-bound: bytes = 7 float streams (read w, g, m, v; write w, m, v); FLOPs: 14 per
// element (counted from the update formula in optim/adamw.hpp, the square root as one).
// bench-smoke-filter: numel:131072/
#include "support/suite.hpp"

#include <moonmoe/config.hpp>
#include <moonmoe/optim/adamw.hpp>

namespace bench {
namespace {

void adamw(benchmark::State& state, index_t rows, index_t cols) {
    const moonmoe::AdamWConfig cfg = moonmoe::KimiK2::config.optimizer.adamw;
    Mat w({rows, cols}), g({rows, cols}), m({rows, cols}), v({rows, cols});
    Ops::fill_normal(w.view(), 0.0f, 0.02f, 1);
    Ops::fill_normal(g.view(), 0.0f, 1.0f, 2);
    const double n = double(rows) * cols;
    long long t = 0;
    measure(state, {14.0 * n, 28.0 * n}, [&] {
        moonmoe::optim::adamw_step<Backend>(cfg, 1e-3, ++t, w.data(), g.data(), m.data(), v.data(), rows * cols);
    });
}

void register_benchmarks() {
    for (auto [rows, cols] : {std::pair<index_t, index_t>{16384, 7168}, {256, 512}})
        add("adamw/step/" + shape_args({{"numel", rows * cols}}),
            [rows, cols](benchmark::State& s) { adamw(s, rows, cols); });
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
