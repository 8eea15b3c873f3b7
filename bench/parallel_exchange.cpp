// Expert parallelism's dispatch + combine at Kimi K2's width (hidden 7168, top-8 of 384 experts), over every rank
// of the world as one expert group (mpirun -np 2 / 4 / 8: EP 2 / 4 / 8), next to a plain MPI_Alltoallv moving the
// same bytes in the same run. Run under mpirun; rank 0 reports.
//
//   mpirun -np 4 build/bench/bench_parallel_exchange [--benchmark_filter=...]
//
// EP_DispatchCombine: one MoE layer's forward exchange without the experts' GEMMs: the dispatch plan of the
// tokens' routing (random, uniform over the experts), the counts exchange, the rows to the experts' ranks
// (all-to-all-v) reordered expert-major, back again (identity experts), and the weighted combine per token.
// MPI_Alltoallv: two MPI_Alltoallv calls with the same counts (there and back), nothing else. Both report
// bytes_per_second: the bytes this rank sends to other ranks (rows x 7168 x 4 bytes, both directions) over the
// slowest rank's time per iteration, so the ratio of the two rows is the overhead of the plan, the reorders and the
// combine around MPI's all-to-all. Buffers are allocated once, as a layer keeps them between steps
// (ExchangeBuffers). Fixed iteration counts (every rank must run the same collectives).
//
// bench-mpi: 2
// bench-smoke-filter: /tokens:16/
#include <random>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>

#include "support/mpi_bench.hpp"

namespace {

using namespace moonmoe;
using namespace moonmoe::parallel;
using Ops = backend::Ops<cpu>;
using moonmoe::bench::slowest;

constexpr index_t hidden = 7168, top_k = 8, experts = 384;

MpiCommunicator* world_ptr = nullptr;

/// One rank's tokens and their routing (top-8 distinct experts per token, uniformly at random).
struct Routed {
    Tensor<float, 2> x;
    Tensor<index_t, 2> idx;
    Tensor<float, 2> weight;
    std::vector<index_t> offsets;
    Tensor<index_t, 1> row_slot;
    Tensor<index_t, 2> slot_row;

    Routed(index_t tokens, std::uint64_t seed)
        : x({tokens, hidden}),
          idx({tokens, top_k}),
          weight({tokens, top_k}),
          row_slot({tokens * top_k}),
          slot_row({tokens, top_k}) {
        std::mt19937_64 gen(seed);
        std::vector<index_t> all(static_cast<std::size_t>(experts));
        for (index_t t = 0; t < tokens; ++t) {
            for (index_t e = 0; e < experts; ++e) all[std::size_t(e)] = e;
            for (index_t j = 0; j < top_k; ++j) {  // a partial Fisher-Yates: k distinct experts
                const auto pick = std::size_t(j) + std::size_t(gen() % std::uint64_t(experts - j));
                std::swap(all[std::size_t(j)], all[pick]);
                idx(t, j) = all[std::size_t(j)];
                weight(t, j) = 1.0f / float(top_k);
            }
        }
        Ops::fill_normal(x.view(), 0.0f, 1.0f, seed);
        Tensor<index_t, 1> off({experts + 1});
        Ops::dispatch_plan(idx.view(), 0, off.view(), row_slot.view(), slot_row.view());
        offsets.assign(off.data(), off.data() + experts + 1);
    }
};

/// Rows this rank sends to other ranks in one direction, from its plan.
index_t rows_to_others(const ExpertExchange<cpu>& ex, int me) {
    index_t n = 0;
    for (std::size_t r = 0; r < ex.send_rows.size(); ++r)
        if (int(r) != me) n += ex.send_rows[r];
    return n;
}

void EP_DispatchCombine(benchmark::State& state) {
    Communicator& w = *world_ptr;
    const index_t tokens = state.range(0);
    const Routed r(tokens, 11 + std::uint64_t(w.rank()));
    // the buffers a layer keeps between steps (the routing is the same every iteration, so are their sizes)
    const index_t received = plan_exchange<cpu>(w, r.offsets).received();
    Tensor<float, 2> send({tokens * top_k, hidden}), at_experts({received, hidden}), back({tokens * top_k, hidden}),
        y({tokens, hidden});
    ExchangeBuffers<cpu> buffers;
    index_t others = 0;
    const auto layer = [&] {
        const ExpertExchange<cpu> ex = plan_exchange<cpu>(w, r.offsets);
        Ops::gather_pairs(r.x.view(), r.row_slot.view(), top_k, send.view());
        dispatch_rows(w, ex, send.view(), at_experts.view(), buffers);
        return_rows(w, ex, at_experts.view(), back.view(), buffers);
        Ops::fill(y.view(), 0.0f);
        Ops::combine(back.view(), r.slot_row.view(), r.weight.view(), y.view());
        others = rows_to_others(ex, w.rank());
    };
    layer();  // untimed: the first touch of every buffer (page faults), as a training run's first step
    for (auto _ : state) {
        state.SetIterationTime(slowest(w, layer));
        benchmark::DoNotOptimize(y.data());
    }
    state.SetBytesProcessed(state.iterations() * 2 * others * hidden * index_t(sizeof(float)));
    state.counters["ep"] = double(w.size());
    state.counters["MB_sent_per_iter"] = 2.0 * double(others * hidden) * sizeof(float) / 1e6;
}

void MPI_Alltoallv(benchmark::State& state) {
    MpiCommunicator& w = *world_ptr;
    const index_t tokens = state.range(0);
    const Routed r(tokens, 11 + std::uint64_t(w.rank()));
    const ExpertExchange<cpu> ex = plan_exchange<cpu>(w, r.offsets);
    const auto counts = [&](const std::vector<index_t>& rows) {
        std::vector<int> c, d;
        int at = 0;
        for (index_t n : rows) c.push_back(int(n * hidden)), d.push_back(at), at += int(n * hidden);
        return std::pair{c, d};
    };
    const auto [sc, sd] = counts(ex.send_rows);
    const auto [rc, rd] = counts(ex.recv_rows);
    std::vector<float> send(std::size_t(ex.sent() * hidden), 1.0f), recv(std::size_t(ex.received() * hidden));
    const auto there_and_back = [&] {
        MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_FLOAT, recv.data(), rc.data(), rd.data(), MPI_FLOAT,
                      w.handle());
        MPI_Alltoallv(recv.data(), rc.data(), rd.data(), MPI_FLOAT, send.data(), sc.data(), sd.data(), MPI_FLOAT,
                      w.handle());
    };
    there_and_back();  // untimed, as above
    for (auto _ : state) {
        state.SetIterationTime(slowest(w, there_and_back));
        benchmark::DoNotOptimize(send.data());
    }
    const index_t others = rows_to_others(ex, w.rank());
    state.SetBytesProcessed(state.iterations() * 2 * others * hidden * index_t(sizeof(float)));
    state.counters["ep"] = double(w.size());
    state.counters["MB_sent_per_iter"] = 2.0 * double(others * hidden) * sizeof(float) / 1e6;
}

/// Every rank must run the same iterations: fixed counts, no adaptive timing.
void shapes(benchmark::internal::Benchmark* b) {
    b->ArgName("tokens")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(5);
    for (index_t t : {16, 256, 1024}) b->Arg(t);
}
BENCHMARK(EP_DispatchCombine)->Apply(shapes);
BENCHMARK(MPI_Alltoallv)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
    return moonmoe::bench::mpi_benchmark_main(argc, argv, [](MpiCommunicator& world) {
        world_ptr = &world;
        return "expert group: " + std::to_string(world.size()) + " ranks (EP " + std::to_string(world.size()) +
               "), hidden " + std::to_string(hidden) + ", top-" + std::to_string(top_k) + " of " +
               std::to_string(experts) + " experts, f32 rows";
    });
}
