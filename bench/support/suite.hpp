// bench/support/suite.hpp: what every benchmark of the suite shares (bench/SUITE.md).
//
// - The backend: the CPU (bench_<family>, g++), or the CUDA backend when MOONMOE_BENCH_CUDA is defined (every family
//   compiled by nvcc into one binary, moonmoe_cuda_bench; bench/support/cuda_main.cpp). The benchmark code is the same
//   for both: tensors are Tensor<., ., Backend>, modules Module<Backend>. On the GPU every timed call ends with a
//   synchronisation of the stream (wait_for_device), so wall time is the GPU's time, not the launch time.
// - The thread count: MOONMOE_BENCH_THREADS, or the library's default (moonmoe::default_threads(): the CPUs this
//   process may use, after its affinity mask and cgroup quota); set once, before anything runs, and written into
//   the JSON context (with where it came from) so the PyTorch side can use the same.
// - This machine's SGEMM rate, measured by the same binary at start-up (our GEMM, 2048^3 float, best of 3), the
//   denominator of every `of_sgemm` counter (recorded in the JSON context as sgemm_GFLOP/s).
// - measure(): times the benchmark loop itself and sets the counters FLOP/s, bytes/s, of_sgemm and peak_MiB (the
//   most CPU tensor memory alive at once during the loop, weights included, from Memory<cpu>::stats()), of_copy,
//   of_read (host), of_bf16_gemm (CPU) / of_bf16_cublas (GPU) against the yardsticks of cublas_bf16.hpp, and
//   first_call_ms (the untimed first call, apart from the loop).
// - Names are registered as written in bench/SUITE.md, e.g. "mla/forward/k2/seq:1024" (Google Benchmark appends
//   "/real_time"), by each file's register_benchmarks(), which MOONMOE_BENCH_MAIN() calls.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <span>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config/model_config.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/nn/param.hpp>
#if defined(MOONMOE_BENCH_CUDA)
#include <moonmoe/backend/cuda.hpp>
#endif

namespace bench {

using moonmoe::index_t;
#if defined(MOONMOE_BENCH_CUDA)
using Backend = moonmoe::cuda;
#else
using Backend = moonmoe::cpu;
#endif
using Mat = moonmoe::Tensor<float, 2, Backend>;
using Ops = moonmoe::backend::Ops<Backend>;
using Clock = std::chrono::steady_clock;

/// Waits until the work queued so far has finished: a no-op on the CPU (and on the emulated CUDA backend, which runs
/// in order on the host), a stream synchronisation on the GPU.
inline void wait_for_device() {
#if defined(MOONMOE_BENCH_CUDA) && !MOONMOE_CUDA_EMULATED
    MOONMOE_CUDA_CHECK(cudaStreamSynchronize(moonmoe::backend::current_stream()));
#endif
}

inline int threads() {
    static const int n = [] {
        if (const char* s = std::getenv("MOONMOE_BENCH_THREADS"); s && *s) {
            char* end = nullptr;
            const long v = std::strtol(s, &end, 10);
            if (*end != '\0' || v < 1) {
                std::fprintf(stderr, "MOONMOE_BENCH_THREADS must be a positive integer, got '%s'\n", s);
                std::exit(2);
            }
            return int(v);
        }
        return moonmoe::default_threads().count;
    }();
    return n;
}

/// Where threads() came from, for the JSON context.
inline std::string threads_source() {
    if (const char* s = std::getenv("MOONMOE_BENCH_THREADS"); s && *s) return "MOONMOE_BENCH_THREADS";
    return moonmoe::default_threads().describe();
}

inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// The shortest of `reps` timed calls of `call` after one untimed warm-up, each ended with wait_for_device(): how
/// the start-up yardsticks (sgemm_rate here, those of cublas_bf16.hpp on the host) time themselves.
template <class Call>
double best_seconds(int reps, Call&& call) {
    double best = 1e30;
    for (int rep = 0; rep <= reps; ++rep) {
        const auto t = Clock::now();
        call();
        wait_for_device();
        if (rep > 0) best = std::min(best, seconds_since(t));
    }
    return best;
}

/// FLOP/s of C = A B, 2048^3 (MOONMOE_BENCH_SGEMM_SIZE to change; CI's smoke runs use 256), float, with
/// threads(): the best of ten after one warm-up (with the best of three, the binaries of one suite run on this VM
/// measured between 181 and 316 GFLOP/s). On the GPU: cuBLAS in FP32 without TF32 (BlasOps<cuda>'s pedantic compute
/// type), the same call every f32 product of the library makes.
inline double sgemm_rate() {
    static const double rate = [] {
        const char* size = std::getenv("MOONMOE_BENCH_SGEMM_SIZE");
        const index_t n = size && *size ? std::max(16L, std::atol(size)) : 2048;
        Mat a({n, n}), b({n, n}), c({n, n});
        Ops::fill_normal(a.view(), 0.0f, 1.0f, 1);
        Ops::fill_normal(b.view(), 0.0f, 1.0f, 2);
        const double best = best_seconds(10, [&] {
            Ops::gemm(moonmoe::backend::Trans::no, moonmoe::backend::Trans::no, 1.0f, a.view(), b.view(), 0.0f,
                      c.view());
        });
        return 2.0 * double(n) * n * n / best;
    }();
    return rate;
}

}  // namespace bench

#include "cublas_bf16.hpp"

namespace bench {

/// Work per iteration, for the counters.
struct Work {
    double flops = 0;  ///< floating-point operations (a multiply-add counts 2)
    double bytes = 0;  ///< bytes that must cross memory at least once, where that is the limit
};

/// Runs `body` once untimed (first touches of fresh memory, lazily built state: PyTorch's side warms up the same
/// way), then once per iteration, and sets the suite's counters. `setup`, when given, runs before each call with
/// the timer paused (for work that must be redone, such as refilling a cache).
inline void measure(benchmark::State& state, Work work, const std::function<void()>& body,
                    const std::function<void()>& setup = {}) {
    auto& mem = moonmoe::backend::Memory<Backend>::stats();
    mem.reset_peak();
    if (setup) setup();
    const auto first = Clock::now();
    body();
    wait_for_device();
    const double first_call = seconds_since(first);
    double elapsed = 0;
    for (auto _ : state) {
        if (setup) {
            state.PauseTiming();
            setup();
            wait_for_device();
            state.ResumeTiming();
        }
        const auto t = Clock::now();
        body();
        wait_for_device();
        elapsed += seconds_since(t);
    }
    const double iters = double(state.iterations());
    using C = benchmark::Counter;
    if (work.flops > 0) {
        state.counters["FLOP/s"] = C(work.flops, C::kIsIterationInvariantRate, C::kIs1000);
        state.counters["of_sgemm"] = C(work.flops * iters / elapsed / sgemm_rate());
        state.counters["sgemm_FLOP/s"] = C(sgemm_rate(), C::kDefaults, C::kIs1000);
        if (const double bf16 = bf16_cublas_rate(); bf16 > 0)
            state.counters["of_bf16_cublas"] = C(work.flops * iters / elapsed / bf16);
        if (const double bf16 = host_bf16_rate(); bf16 > 0)
            state.counters["of_bf16_gemm"] = C(work.flops * iters / elapsed / bf16);
    }
    // the untimed first call apart (primitive creation, first touches, lazily built state), as a step in a
    // training loop does not pay it
    state.counters["first_call_ms"] = C(first_call * 1e3);
#if defined(MOONMOE_BENCH_CUDA)
    state.SetLabel("f32");  // the precision of the row (the PyTorch side has f32 and bf16 rows of each name)
#endif
    if (work.bytes > 0) state.counters["bytes/s"] = C(work.bytes, C::kIsIterationInvariantRate, C::kIs1024);
    if (const double copy = copy_bandwidth(); work.bytes > 0 && copy > 0)
        state.counters["of_copy"] = C(work.bytes * iters / elapsed / copy);
    if (const double read = read_bandwidth(work.bytes); read > 0)
        state.counters["of_read"] = C(work.bytes * iters / elapsed / read);
    state.counters["peak_MiB"] = C(double(mem.peak.load()) / (1024.0 * 1024.0));
}

/// Registers a benchmark under `name`, timed in wall-clock milliseconds.
inline benchmark::internal::Benchmark* add(const std::string& name, std::function<void(benchmark::State&)> fn) {
    return benchmark::RegisterBenchmark(name.c_str(), [fn = std::move(fn)](benchmark::State& s) { fn(s); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
}

/// Fills a weight [out, in] with uniform noise of bound 1/sqrt(in) (fan-in scaled: unit-variance outputs).
inline void init_uniform_matrix(moonmoe::View<float, 2, Backend> w, std::uint64_t seed = 1) {
    const float bound = 1.0f / std::sqrt(float(w.shape[1]));
    Ops::fill_uniform(w, -bound, bound, seed);
}

/// The same for every matrix of a module (anything with visit_params); norm gains stay 1, the router's correction
/// bias 0.
template <class Module>
void init_params(Module& m, std::uint64_t seed = 1) {
    m.visit_params("m", [&](const moonmoe::ParamRef& p) {
        if (p.kind == moonmoe::ParamKind::vector || p.kind == moonmoe::ParamKind::router_bias) return;
        // f32 values, or (Weights<BF16>) drawn in f32 and rounded into the bf16 weight
        moonmoe::nn::write_values<Backend>(p,
                                           [&](moonmoe::View<float, 2, Backend> v) { init_uniform_matrix(v, seed); });
        ++seed;
    });
    if constexpr (requires { m.refresh_working(); }) m.refresh_working();  // Precision<BF16>'s working copies
}

/// The module under test for a configuration, built by `make` (returning a std::unique_ptr<T>) and initialised on
/// first use, then kept while that configuration's benchmarks run: Google Benchmark calls a benchmark several
/// times while it settles the iteration count, and a full-width layer takes seconds to build. A module built for
/// another configuration is freed first, so peak_MiB counts one model.
template <class T, class Make>
T& fixture(const moonmoe::ModelConfig& cfg, Make&& make) {
    static const moonmoe::ModelConfig* built_for = nullptr;
    static std::unique_ptr<T> held;
    if (built_for != &cfg) {
        held.reset();
        held = make();
        init_params(*held);
        built_for = &cfg;
    }
    return *held;
}

inline std::string shape_args(std::initializer_list<std::pair<const char*, index_t>> args) {
    std::string s;
    for (auto& [k, v] : args) s += std::string(s.empty() ? "" : "/") + k + ":" + std::to_string(v);
    return s;
}

/// The families linked into this binary, each registering its benchmarks: one per bench_<family> binary, every family
/// in moonmoe_cuda_bench (MOONMOE_BENCH_MAIN() adds a file's register_benchmarks() here).
using Registrar = void (*)();
inline std::vector<Registrar>& families() {
    static std::vector<Registrar> f;
    return f;
}

/// How this binary was compiled, for the JSON context (Google Benchmark's own `library_build_type` describes the
/// benchmark library, not this code).
inline std::string build_description() {
    std::string s;
#if defined(__CUDACC__)
    s = "nvcc " + std::to_string(__CUDACC_VER_MAJOR__) + "." + std::to_string(__CUDACC_VER_MINOR__) + " with ";
#endif
#if defined(__clang__)
    s += "clang " __clang_version__;
#elif defined(__GNUC__)
    s += "g++ " __VERSION__;
#endif
#if defined(__OPTIMIZE__)
    s += ", optimised";
#else
    s += ", NOT optimised";
#endif
#if defined(__AVX512F__)
    s += ", AVX-512";
#elif defined(__AVX2__)
    s += ", AVX2";
#endif
#if defined(_OPENMP)
    s += ", OpenMP";
#endif
#if defined(EIGEN_USE_BLAS)
    s += ", Eigen on BLAS";
#endif
#if defined(MOONMOE_BENCH_CUDA)
    s += MOONMOE_CUDA_EMULATED ? ", CUDA backend emulated on the host" : ", CUDA backend";
#endif
    return s;
}

/// The GPU this process runs on, for the JSON context ("" on the CPU and the emulated backend).
inline std::string device_description() {
#if defined(MOONMOE_BENCH_CUDA) && !MOONMOE_CUDA_EMULATED
    int device = 0;
    cudaDeviceProp p{};
    MOONMOE_CUDA_CHECK(cudaGetDevice(&device));
    MOONMOE_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
           std::to_string(p.totalGlobalMem >> 20) + " MiB";
#else
    return "";
#endif
}

inline int main(int argc, char** argv) try {
    moonmoe::set_threads(threads());
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    for (Registrar r : families()) r();
    benchmark::AddCustomContext("threads", std::to_string(threads()));
    benchmark::AddCustomContext("threads_source", threads_source());
    benchmark::AddCustomContext("moonmoe_build", build_description());
    char rate[64];
    std::snprintf(rate, sizeof rate, "%.1f", sgemm_rate() * 1e-9);
    benchmark::AddCustomContext("sgemm_GFLOP/s", rate);
    const char* size = std::getenv("MOONMOE_BENCH_SGEMM_SIZE");
    benchmark::AddCustomContext("sgemm_size", size && *size ? size : "2048");
    if (const std::string device = device_description(); !device.empty()) {
        benchmark::AddCustomContext("device", device);
        std::snprintf(rate, sizeof rate, "%.1f", bf16_cublas_rate() * 1e-9);
        benchmark::AddCustomContext("bf16_cublas_GFLOP/s", rate);
        benchmark::AddCustomContext("bf16_cublas_size", std::to_string(bf16_cublas_size));
    }
#if !defined(MOONMOE_BENCH_CUDA)
    benchmark::AddCustomContext("cpu", moonmoe::backend::cpu_detail::cpu_signature());  // gemm_engine.hpp's rules
#endif
    std::snprintf(rate, sizeof rate, "%.1f", copy_bandwidth() * 1e-9);
    benchmark::AddCustomContext("copy_GB/s", rate);
    if (const double bf16 = host_bf16_rate(); bf16 > 0) {
        std::snprintf(rate, sizeof rate, "%.1f", bf16 * 1e-9);
        benchmark::AddCustomContext("bf16_gemm_GFLOP/s", rate);
        benchmark::AddCustomContext("bf16_gemm_size", std::to_string(bf16_cublas_size));
        benchmark::AddCustomContext("bf16_gemm_path", "oneDNN (" + moonmoe::backend::cpu_detail::onednn_isa() + ")");
    }
    const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (ran == 0) {  // a smoke test whose filter matches nothing must not pass silently
        std::fprintf(stderr, "%s: no benchmark matches the filter\n", argv[0]);
        return 1;
    }
    return 0;
} catch (const std::exception& e) {  // e.g. no GPU or driver for moonmoe_cuda_bench: say so instead of terminate()
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
}

}  // namespace bench

// Ends every bench/<family>.cpp, whose register_benchmarks() sits in an unnamed namespace (one per file, so the
// families can share a binary): a main() of its own, or, in moonmoe_cuda_bench (MOONMOE_BENCH_COMBINED), a
// registration that bench/support/cuda_main.cpp's main() runs.
#if defined(MOONMOE_BENCH_COMBINED)
#define MOONMOE_BENCH_MAIN()                                                                                           \
    [[maybe_unused]] static const bool moonmoe_bench_registered =                                                      \
        (bench::families().push_back(&bench::register_benchmarks), true);
#else
#define MOONMOE_BENCH_MAIN()                                                                                           \
    int main(int argc, char** argv) {                                                                                  \
        bench::families().push_back(&bench::register_benchmarks);                                                      \
        return bench::main(argc, argv);                                                                                \
    }
#endif
