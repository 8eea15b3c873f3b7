// Newton-Schulz orthogonalisation (5 iterations) at Muon's matrix shapes, for each coefficient policy, with plain
// GEMM products and with symmetric ones (SYRK for X X^T and A A). FLOPs: newton_schulz_flops() of
// optim/newton_schulz.hpp for the plain algorithm, for both variants, so FLOP/s and of_sgemm compare wall time
// (the symmetric variant can exceed 1.0 of the SGEMM rate: it skips half of two products).
// bench-smoke-filter: rows:256/
#include "support/suite.hpp"

#include <moonmoe/optim/newton_schulz.hpp>

namespace bench {
namespace {

using moonmoe::optim::Products;

template <class Policy>
void newton_schulz(benchmark::State& state, index_t rows, index_t cols, Products products) {
    Mat g({rows, cols}), out({rows, cols});
    Ops::fill_normal(g.view(), 0.0f, 1.0f, 1);
    moonmoe::optim::NSWorkspace<float, Backend> ws;
    measure(state, {moonmoe::optim::newton_schulz_flops(rows, cols, 5, Products::general)},
            [&] { moonmoe::optim::newton_schulz<Policy, float, Backend>(g.view(), out.view(), 5, ws, products); });
}

template <class Policy>
void add_policy(const char* name) {
    for (auto [rows, cols] : {std::pair<index_t, index_t>{2048, 7168}, {256, 512}})
        for (Products p : {Products::general, Products::symmetric})
            add(std::string("ns/") + name + (p == Products::general ? "/general/" : "/symmetric/") +
                    shape_args({{"rows", rows}, {"cols", cols}}),
                [rows, cols, p](benchmark::State& s) { newton_schulz<Policy>(s, rows, cols, p); });
}

void register_benchmarks() {
    add_policy<moonmoe::KellerQuintic>("keller");
    add_policy<moonmoe::PolarExpress>("polar_express");
    add_policy<moonmoe::YouQuintic>("you");
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
