// Newton-Schulz (5 quintic iterations) with symmetric products (SYRK for X X^T and A A) against plain GEMMs,
// at Muon matrix shapes. Counters: GFLOP/s by the formulas of optim/newton_schulz.hpp (each variant counted by
// the FLOPs it performs, and also by the plain algorithm's FLOPs, "equiv_GFLOPs", which compares wall time).
// bench-smoke-filter: rows:256/cols:512/
#include <benchmark/benchmark.h>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/optim/newton_schulz.hpp>

namespace {

using moonmoe::index_t;
using moonmoe::optim::Products;

void newton_schulz(benchmark::State& state, Products products) {
    const index_t rows = state.range(0), cols = state.range(1);
    const int threads = int(state.range(2));
    moonmoe::set_threads(threads);
    moonmoe::Tensor<float, 2> g({rows, cols}), out({rows, cols});
    moonmoe::backend::Ops<moonmoe::cpu>::fill_normal(g.view(), 0.0f, 1.0f, 1);
    moonmoe::optim::NSWorkspace<float> ws;
    for (auto _ : state) {
        moonmoe::optim::newton_schulz<moonmoe::KellerQuintic, float>(g.view(), out.view(), 5, ws, products);
        benchmark::DoNotOptimize(out.data());
    }
    const double performed = moonmoe::optim::newton_schulz_flops(rows, cols, 5, products);
    const double plain = moonmoe::optim::newton_schulz_flops(rows, cols, 5, Products::general);
    state.counters["GFLOPs"] = benchmark::Counter(performed * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
    state.counters["equiv_GFLOPs"] = benchmark::Counter(plain * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
    for (int threads : {1, 2})
        for (auto [r, c] : {std::pair{256, 512}, {1024, 1024}, {1024, 3584}, {2048, 7168}}) b->Args({r, c, threads});
    b->ArgNames({"rows", "cols", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_CAPTURE(newton_schulz, symmetric, Products::symmetric)->Apply(shapes);
BENCHMARK_CAPTURE(newton_schulz, general, Products::general)->Apply(shapes);
