// One Muon step (momentum, Nesterov, 5 Keller Newton-Schulz iterations with Kimi K2's symmetric products, X X^T and
// A A as SYRKs, decoupled weight decay, MatchAdamWRMS scale) on each real K2 matrix shape (bench/SUITE.md):
// muon/step/... with Newton-Schulz in f32, muon_bf16/step/... in bf16 as torch.optim.Muon's default (compare.py
// sets it beside torch's default).
// FLOPs: the plain Newton-Schulz count (the elementwise momentum and update are memory traffic, a few percent of the
// time at these shapes).
// bench-smoke-filter: rows:256/
#include "support/suite.hpp"

#include <moonmoe/config.hpp>
#include <moonmoe/optim/muon.hpp>

namespace bench {
namespace {

using moonmoe::optim::Products;

/// One step with Newton-Schulz in f32 (NSWorkspace<float>) or in bf16 as torch.optim.Muon by default
/// (NSWorkspaceBF16: bf16 operands and products, f32 accumulation; Muon<NSPrecision<BF16>>).
template <class Workspace>
void muon(benchmark::State& state, index_t rows, index_t cols) {
    const moonmoe::MuonConfig cfg = moonmoe::KimiK2::config.optimizer.muon;
    Mat w({rows, cols}), g({rows, cols}), momentum({rows, cols}), u, o;
    init_uniform_matrix(w.view());
    Ops::fill_normal(g.view(), 0.0f, 1.0f, 2);
    Workspace ws;
    measure(state, {moonmoe::optim::newton_schulz_flops(rows, cols, cfg.ns_steps, Products::general)}, [&] {
        moonmoe::optim::muon_step<moonmoe::KellerQuintic, Backend>(
            cfg, 0.02, w.view(), moonmoe::View<const float, 2, Backend>(g.view()), momentum.view(), ws, u, o);
    });
    if constexpr (std::is_same_v<Workspace, moonmoe::optim::NSWorkspaceBF16<Backend>> &&
                  std::is_same_v<Backend, moonmoe::cpu>)
        state.SetLabel(moonmoe::backend::bf16_gemm_path());
}

void register_benchmarks() {
    const std::pair<index_t, index_t> shapes[] = {
        {2048, 7168},   // expert gate_proj / up_proj (and the shared expert's)
        {7168, 2048},   // expert down_proj
        {1536, 7168},   // q_a_proj
        {12288, 1536},  // q_b_proj
        {576, 7168},    // kv_a_proj_with_mqa
        {16384, 512},   // kv_b_proj
        {7168, 8192},   // o_proj
        {256, 512},     // small
    };
    for (auto [rows, cols] : shapes)
        add("muon/step/" + shape_args({{"rows", rows}, {"cols", cols}}),
            [rows, cols](benchmark::State& s) { muon<moonmoe::optim::NSWorkspace<float, Backend>>(s, rows, cols); });
    for (auto [rows, cols] : shapes)
        add("muon_bf16/step/" + shape_args({{"rows", rows}, {"cols", cols}}),
            [rows, cols](benchmark::State& s) { muon<moonmoe::optim::NSWorkspaceBF16<Backend>>(s, rows, cols); });
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
