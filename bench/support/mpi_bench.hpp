// The main of the MPI benchmarks (bench/<stem>.cpp marked `// bench-mpi: <N>`): Google Benchmark on every rank
// of an MPI world, rank 0 reporting. Every rank must run the same benchmarks with the same iteration counts (they
// issue collectives), so the files register fixed Iterations(n); the time of an iteration is the slowest rank's
// (slowest()).
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <moonmoe/parallel/mpi.hpp>

namespace moonmoe::bench {

/// The seconds of `f` on the slowest rank of `w` (every rank runs it, after a barrier).
template <class F>
double slowest(parallel::Communicator& w, F&& f) {
    w.barrier();
    const auto start = std::chrono::steady_clock::now();
    f();
    std::vector<double> s = {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
    w.all_reduce(std::span<double>(s), parallel::ReduceOp::max);
    return s[0];
}

/// MPI, the world communicator for `setup` (register the benchmarks there, say what runs on rank 0: its return
/// value is printed there before the table), then the benchmarks on every rank, reported by rank 0 only.
inline int mpi_benchmark_main(int argc, char** argv,
                              const std::function<std::string(parallel::MpiCommunicator& world)>& setup) {
    parallel::MpiSession mpi(&argc, &argv);
    parallel::MpiCommunicator world(MPI_COMM_WORLD, "world");
    world.set_timeout(std::chrono::minutes(10));
    const std::string header = setup(world);
    benchmark::Initialize(&argc, argv);
    if (world.rank() == 0) {
        std::printf("%s\n", header.c_str());
        benchmark::RunSpecifiedBenchmarks();
    } else {
        struct Silent : benchmark::BenchmarkReporter {
            bool ReportContext(const Context&) override { return true; }
            void ReportRuns(const std::vector<Run>&) override {}
        } silent;
        benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
    return 0;
}

}  // namespace moonmoe::bench
