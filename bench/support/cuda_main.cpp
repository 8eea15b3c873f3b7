// bench/support/cuda_main.cpp: main() of moonmoe_cuda_bench, every family of the suite on the CUDA backend in one
// binary (bench/SUITE.md, "On the GPU"). Each bench/<family>.cpp is compiled by nvcc with MOONMOE_BENCH_CUDA and
// MOONMOE_BENCH_COMBINED, so its MOONMOE_BENCH_MAIN() registers the family instead of defining a main(); run one
// family with --benchmark_filter='^mla/' (tools/gpu_check.sh bench does, one process per family).
#include "suite.hpp"

int main(int argc, char** argv) { return bench::main(argc, argv); }
