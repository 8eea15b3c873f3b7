// The pipeline bubble, measured next to interleaved 1F1B's formula (PP - 1) / (V M): the world is one pipeline
// (PP = the number of processes, EP = DP = 1), running a Kimi K2-shaped model (MLA, a dense first layer, MoE with a
// shared expert) of hidden 256 and 8 layers, one forward + backward step of M micro-batches of 256 tokens, for
// V = 1, 2 and M = PP, 2 PP, 4 PP.
//
//   mpirun -np 2 build/bench/bench_pipeline_bubble     (one process per core: the formula assumes each stage runs
//                                                        on its own hardware)
//
// Counters: bubble_measured = the time ranks idled in a step (the step lasts as long as its slowest rank; a rank
// works for its compute time: not its waits for a pipeline neighbour, nor the end of the step's losses
// all-reduce, where it waits for the last stage) over the time they worked, summed over the ranks; bubble_formula = (PP
// - 1) / (V M), the same ratio in the ideal pipeline. The formula assumes equal chunks, free communication and no other
// work; the measurement has the embedding on the first stage and the head and loss on the last, real transfer latency,
// and (V > 1) more messages. Time: the slowest rank's step.
//
// bench-mpi: 2
// bench-smoke-filter: ^PipelineStep/v:1/m:2/
#include <random>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/pipeline.hpp>

#include "support/mpi_bench.hpp"

namespace {

using namespace moonmoe;
using namespace moonmoe::parallel;

using Shape = Model<Dims<Hidden<256>, Layers<8>, DenseLayers<1>, Vocab<512>, DenseHidden<512>>,
                    Attention<MLA<Heads<8>, QRank<128>, KVRank<64>, NopeDim<32>, RopeDim<16>, VDim<32>>>,
                    RoPE<MaxPositions<4096>, YaRN<OriginalMaxPositions<512>>>,
                    MoE<Experts<8>, TopK<2>, Shared<1>, ExpertHidden<128>>, Parallel<1, 1, 1>>;

MpiCommunicator* world_ptr = nullptr;

void PipelineStep(benchmark::State& state, index_t v, index_t m) {
    Communicator& w = *world_ptr;
    const index_t pp = w.size();
    ModelConfig c = Shape::config;
    c.parallel.pp = pp, c.parallel.virtual_stages = v, c.parallel.micro_batches = m;
    ProcessGroups g(w, c.parallel);
    nn::Transformer<cpu> part(c, model_part(c, g.at), expert_dispatcher<cpu>(g));
    nn::init_weights(part, {.seed = 1});
    Pipeline<cpu> pipeline(part, g, m);
    const auto layout = nn::TokenLayout::sequences(2, 128);
    std::mt19937_64 gen(5);
    std::vector<std::vector<index_t>> batches(static_cast<std::size_t>(m));
    for (auto& b : batches)
        for (index_t t = 0; t < layout.tokens(); ++t) b.push_back(index_t(gen() % std::uint64_t(c.dims.vocab)));
    pipeline.run(batches, layout);  // untimed: first touch of the buffers
    double bubble = 0, busy = 0;
    for (auto _ : state) {
        part.zero_grad();
        w.barrier();
        const auto r = pipeline.run(batches, layout);
        // the step ends when the slowest rank ends; each rank idles the rest (its receive waits, and the wait
        // for the flush after its last backward), as the formula counts it
        std::vector<double> step = {r.timing.total};
        w.all_reduce(std::span<double>(step), ReduceOp::max);
        std::vector<double> worked = {r.timing.compute};
        w.all_reduce(std::span<double>(worked), ReduceOp::sum);
        state.SetIterationTime(step[0]);
        bubble += double(pp) * step[0] - worked[0], busy += worked[0];
    }
    state.counters["bubble_measured"] = bubble / busy;
    state.counters["bubble_formula"] = predicted_bubble(pipeline.shape());
    state.counters["pp"] = double(pp);
}

}  // namespace

int main(int argc, char** argv) {
    return moonmoe::bench::mpi_benchmark_main(argc, argv, [](MpiCommunicator& world) {
        world_ptr = &world;
        moonmoe::set_threads(1);
        // M = PP, 2 PP, 4 PP for V = 1, 2; fixed iterations (every rank must run the same steps)
        for (index_t v : {1, 2})
            for (index_t k : {1, 2, 4}) {
                const index_t m = k * world.size();
                benchmark::RegisterBenchmark(
                    ("PipelineStep/v:" + std::to_string(v) + "/m:" + std::to_string(m)).c_str(), PipelineStep, v, m)
                    ->UseManualTime()
                    ->Unit(benchmark::kMillisecond)
                    ->Iterations(3);
            }
        return "pipeline: " + std::to_string(world.size()) + " ranks (PP " + std::to_string(world.size()) +
               "), a K2-shaped model of hidden 256, 8 layers, micro-batches of 256 tokens";
    });
}
