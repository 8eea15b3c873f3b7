// The checkpoint engine's refresh (parallel/weight_refresh.hpp) between RL iterations: every parameter of the whole
// model from its owner to every rank, each rank's decoding model (the whole model) keeping all of them. Run under
// mpirun; rank 0 reports.
//
//   mpirun -np 2 build/bench/bench_weight_refresh [--benchmark_filter=...]
//
// Sets: tiny_k2 (the TinyK2 preset), k2_layer (one Kimi K2 MoE layer at full width, hidden 7168 with MLA's K2 ranks
// and experts of 2048, with 8 routed experts and the shared one, and a vocabulary of 4096 so that the embedding and
// lm_head do not dwarf the layer: 2.2 GB of f32 parameters). The training layout is Parallel<1, N, 1> (the experts
// split over the N ranks, everything else on every rank, as ZeRO-1 leaves a step). Each row reports the slowest rank's
// seconds per refresh and, per rank, the MB it sent (max over ranks), received and kept, and the received bytes' rate
// (GB/s); one refresh is checked before timing (every kept value equal to its owner's).
//
// bench-mpi: 2
// bench-smoke-filter: /set:0/
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>
#include <moonmoe/parallel/groups.hpp>
#include <moonmoe/parallel/weight_refresh.hpp>

#include "support/mpi_bench.hpp"

namespace {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::bench::slowest;

MpiCommunicator* world_ptr = nullptr;

using K2Layer =
    KimiK2::with<Dims<Layers<1>, DenseLayers<0>, Vocab<4096>>, MoE<Experts<8>, TopK<8>, Shared<1>>, Parallel<1, 1, 1>>;

ModelConfig config_of(int set, int ranks, bool training) {
    ModelConfig c = set == 0 ? TinyK2::config : K2Layer::config;
    c.parallel.pp = 1, c.parallel.dp = 1, c.parallel.virtual_stages = 1;
    c.parallel.ep = training ? ranks : 1;
    return c;
}
const char* const set_names[] = {"tiny_k2", "k2_layer"};

void weight_refresh(benchmark::State& state) {
    MpiCommunicator& w = *world_ptr;
    const int set = int(state.range(0));
    const ModelConfig training_config = config_of(set, w.size(), true);
    ProcessGroups g(w, training_config.parallel);
    nn::Transformer<cpu> part(training_config, model_part(training_config, g.at), expert_dispatcher<cpu>(g));
    nn::init_weights(part, {.seed = 11});
    nn::Transformer<cpu> decoding(config_of(set, w.size(), false));
    WeightRefresh<cpu> refresh(part, w);
    RefreshReport r = refresh.into(decoding);
    // checked once: every value this rank holds in training is the one its decoding model kept
    std::map<std::string, const float*> kept;
    decoding.visit_params([&](const ParamRef& p) { kept[p.name] = p.value; });
    double diff = 0;
    part.visit_params([&](const ParamRef& p) {
        const float* k = kept.at(p.name);
        for (index_t i = 0; i < p.numel(); ++i) diff = std::max(diff, double(std::abs(p.value[i] - k[i])));
    });
    double seconds = 0;
    index_t refreshes = 0;
    for (auto _ : state) {
        const double t = slowest(w, [&] { r = refresh.into(decoding); });
        state.SetIterationTime(t);
        seconds += t, ++refreshes;
    }
    std::vector<double> sent = {double(r.bytes_sent), diff};
    w.all_reduce(std::span<double>(sent), ReduceOp::max);
    state.SetLabel(set_names[set]);
    state.counters["ranks"] = double(w.size());
    state.counters["tensors"] = double(r.parameters);
    state.counters["MB_sent_max_rank"] = sent[0] / 1e6;
    state.counters["MB_received"] = double(r.bytes_received) / 1e6;  // rank 0's
    state.counters["MB_kept"] = double(r.bytes_kept) / 1e6;
    state.counters["received_GB/s"] = double(r.bytes_received) * double(refreshes) / seconds / 1e9;
    state.counters["max_abs_diff"] = sent[1];
}
BENCHMARK(weight_refresh)
    ->ArgName("set")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
    return moonmoe::bench::mpi_benchmark_main(argc, argv, [](MpiCommunicator& world) {
        world_ptr = &world;
        return "weight refresh (the checkpoint engine): " + std::to_string(world.size()) + " ranks";
    });
}
