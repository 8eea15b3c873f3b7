// SGEMM on the CPU backend: Eigen's own product vs. a direct OpenBLAS cblas_sgemm,
// at square sizes and at the Kimi K2 shapes, on 1 and 2 threads, as a fraction of
// this machine's FP32 FMA peak measured by the same binary in the same run.
//
// Benchmarks (names are filterable with --benchmark_filter):
//   peak/<isa>_fma/threads:<t>                 FMA microkernel: 12 independent accumulators of
//                                              _mm256_fmadd_ps (avx2) or _mm512_fmadd_ps (avx512).
//                                              Compiled with target attributes, so every build
//                                              measures the same kernel whatever its -m flags.
//   gemm/<backend>/<op>/<shape>/threads:<t>    backend: eigen (C.noalias() = A * B on row-major
//                                              Eigen::Map<float>; with EIGEN_USE_BLAS this is
//                                              OpenBLAS behind Eigen) or blas (cblas_sgemm).
//                                              op: nn = A[m,k] B[k,n]; nt = A[m,k] B[n,k]^T (a
//                                              Linear layer, y = x W^T); syrk = X X^T computing
//                                              only one triangle (counters still use 2mnk, so
//                                              they are "effective" rates).
//   mixed/<backend>/threads:2                  a GEMM followed by an OpenMP `parallel for` row
//                                              kernel, as the library will alternate them; shows
//                                              interference between BLAS and OpenMP threads.
//   repeat/<backend>/nt/<shape>/threads:<t>    bitwise repeatability (counters, not timings).
//
// Timing: wall clock, in batches of calls of >= 0.1 s, so "Time" is per batch (calls_per_iter
// calls); with MOONMOE_BENCH_REDO=N a batch that ran next to another busy process is redone up
// to N times (clean_timed_loop).
// Counters: GFLOP/s = 2mnk / wall time (kIsRate); frac_peak = GFLOP/s / (t x the best 1-core
// FMA rate of the machine: avx512 if the CPU has it, else avx2); frac_avx2_peak the same against
// the AVX2 (ymm) FMA rate; peak_GFLOPs is the 1-core denominator used; other_cpus = CPUs kept
// busy by other processes during the timed loop (see OtherLoad).
//
// Build and compare the CPU build variants: bench/compare_gemm_builds.sh; results and the
// decision they led to: docs/cpu_gemm.md.
//
// bench-smoke-filter: ^(peak/.*/threads:1|gemm/.*/sq512/threads:|repeat/.*/small/)
// bench-uses: blas
#include <benchmark/benchmark.h>

#include <Eigen/Core>

#if defined(__x86_64__) || defined(__i386__)
#define MOONMOE_GEMM_BENCH_X86 1
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__linux__)
#include <fstream>
#include <sys/resource.h>
#include <unistd.h>
#endif

// MOONMOE_BENCH_HAVE_BLAS is set by bench/CMakeLists.txt (the bench-uses marker above) when a
// BLAS was found and linked. The OpenBLAS-only calls are used when the header is OpenBLAS's.
#if defined(MOONMOE_BENCH_HAVE_BLAS) && MOONMOE_BENCH_HAVE_BLAS
#define MOONMOE_GEMM_BENCH_BLAS 1
#include <cblas.h>
#if defined(OPENBLAS_VERSION)
#define MOONMOE_GEMM_BENCH_OPENBLAS 1
#endif
#endif

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

// ---------------------------------------------------------------------------
// Other processes. This is a 2-vCPU machine shared with compiles and tests; a busy
// neighbour halves a 2-thread GEMM (and stalls Eigen's spin-synchronised OpenMP GEMM much
// more). Each GEMM benchmark reports other_cpus: the CPUs other processes kept busy during
// its timed loop, on average (from /proc/stat minus this process's rusage; Linux only).
// Results with other_cpus above ~0.1 are contaminated; compare_gemm_builds.sh reruns them.
// ---------------------------------------------------------------------------
class OtherLoad {
public:
    OtherLoad() { sample(busy0_, self0_, wall0_); }
    double other_cpus() const {
        double busy1 = 0, self1 = 0, wall1 = 0;
        sample(busy1, self1, wall1);
        if (busy0_ < 0 || busy1 < 0 || wall1 <= wall0_) return -1.0;
        return std::max(0.0, (busy1 - busy0_) - (self1 - self0_)) / (wall1 - wall0_);
    }

private:
    // busy: CPU-seconds of all CPUs not idle (user, nice, system, irq, softirq, steal).
    static void sample(double& busy, double& self, double& wall) {
        wall = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
        busy = -1.0;
        self = 0.0;
#if defined(__linux__)
        std::ifstream stat("/proc/stat");
        std::string cpu;
        double user, nice, system, idle, iowait, irq, softirq, steal;
        if (stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu")
            busy = (user + nice + system + irq + softirq + steal) / double(sysconf(_SC_CLK_TCK));
        rusage ru{};
        getrusage(RUSAGE_SELF, &ru);
        self =
            double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
#endif
    }
    double busy0_ = -1, self0_ = 0, wall0_ = 0;
};

// ---------------------------------------------------------------------------
// FP32 FMA peak microkernels. 12 independent accumulators cover FMA latency (4 cycles) x
// 2 FMA pipes with room to spare; the empty asm keeps every accumulator live in a register.
// ---------------------------------------------------------------------------
constexpr long kPeakInner = 1L << 22;  // ms per call: an idle vCPU takes a while to wake up
constexpr int kPeakAccumulators = 12;

enum class Isa { avx2, avx512 };

#if defined(MOONMOE_GEMM_BENCH_X86)
__attribute__((target("avx2,fma"), noinline)) float fma_loop_avx2(long n) {
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
           a10 = a0, a11 = a0;
    const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (long i = 0; i < n; ++i) {
        a0 = _mm256_fmadd_ps(a0, b, c);
        a1 = _mm256_fmadd_ps(a1, b, c);
        a2 = _mm256_fmadd_ps(a2, b, c);
        a3 = _mm256_fmadd_ps(a3, b, c);
        a4 = _mm256_fmadd_ps(a4, b, c);
        a5 = _mm256_fmadd_ps(a5, b, c);
        a6 = _mm256_fmadd_ps(a6, b, c);
        a7 = _mm256_fmadd_ps(a7, b, c);
        a8 = _mm256_fmadd_ps(a8, b, c);
        a9 = _mm256_fmadd_ps(a9, b, c);
        a10 = _mm256_fmadd_ps(a10, b, c);
        a11 = _mm256_fmadd_ps(a11, b, c);
        asm volatile(""
                     : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),
                       "+v"(a9), "+v"(a10), "+v"(a11));
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
                                   _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"), noinline)) float fma_loop_avx512(long n) {
    __m512 a0 = _mm512_set1_ps(1.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
           a10 = a0, a11 = a0;
    const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (long i = 0; i < n; ++i) {
        a0 = _mm512_fmadd_ps(a0, b, c);
        a1 = _mm512_fmadd_ps(a1, b, c);
        a2 = _mm512_fmadd_ps(a2, b, c);
        a3 = _mm512_fmadd_ps(a3, b, c);
        a4 = _mm512_fmadd_ps(a4, b, c);
        a5 = _mm512_fmadd_ps(a5, b, c);
        a6 = _mm512_fmadd_ps(a6, b, c);
        a7 = _mm512_fmadd_ps(a7, b, c);
        a8 = _mm512_fmadd_ps(a8, b, c);
        a9 = _mm512_fmadd_ps(a9, b, c);
        a10 = _mm512_fmadd_ps(a10, b, c);
        a11 = _mm512_fmadd_ps(a11, b, c);
        asm volatile(""
                     : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), "+v"(a8),
                       "+v"(a9), "+v"(a10), "+v"(a11));
    }
    const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                                   _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    alignas(64) float out[16];
    _mm512_store_ps(out, s);
    return out[0];
}

bool cpu_has(Isa isa) {
    return isa == Isa::avx2 ? (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
                            : __builtin_cpu_supports("avx512f");
}

float fma_loop(Isa isa, long n) { return isa == Isa::avx2 ? fma_loop_avx2(n) : fma_loop_avx512(n); }
#else  // not x86: no peak, so no frac_* counters
bool cpu_has(Isa) { return false; }
float fma_loop(Isa, long) { return 0.0f; }
#endif

int lanes(Isa isa) { return isa == Isa::avx2 ? 8 : 16; }

double fma_flops(Isa isa, long n) { return 2.0 * lanes(isa) * kPeakAccumulators * double(n); }

// Best 1-core rates (FLOP/s) seen in this process. The peak/ benchmarks run first (they are
// registered first) and raise these; a filtered run that skipped them calibrates once here.
double g_peak_avx2 = 0.0;
double g_peak_avx512 = 0.0;

double calibrate(Isa isa) {
    double best = 0.0;
    for (int i = 0; i < 8; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        benchmark::DoNotOptimize(fma_loop(isa, kPeakInner));
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        best = std::max(best, fma_flops(isa, kPeakInner) / dt.count());
    }
    return best;
}

double peak_avx2() {
    if (g_peak_avx2 == 0.0 && cpu_has(Isa::avx2)) g_peak_avx2 = calibrate(Isa::avx2);
    return g_peak_avx2;
}

// The machine's FP32 peak per core: the widest FMA the CPU has.
double peak_machine() {
    if (cpu_has(Isa::avx512)) {
        if (g_peak_avx512 == 0.0) g_peak_avx512 = calibrate(Isa::avx512);
        return std::max(g_peak_avx512, peak_avx2());
    }
    return peak_avx2();
}

// `threads` copies of the microkernel on std::threads (no OpenMP needed): do the vCPUs
// deliver the 1-core rate each, or do they share a physical core?
void BM_peak(benchmark::State& state, Isa isa, int threads) {
    if (!cpu_has(isa)) {
        state.SkipWithError("CPU lacks this ISA");
        return;
    }
    const OtherLoad load;
    for (auto _ : state) {
        if (threads == 1) {
            benchmark::DoNotOptimize(fma_loop(isa, kPeakInner));
        } else {
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; ++t)
                pool.emplace_back([isa] { benchmark::DoNotOptimize(fma_loop(isa, kPeakInner)); });
            for (auto& th : pool) th.join();
        }
    }
    state.counters["other_cpus"] = load.other_cpus();
    const double flops = fma_flops(isa, kPeakInner) * threads * double(state.iterations());
    state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
}

// Google Benchmark does not hand the measured time back to the benchmark, so the 1-core
// peak benchmarks also time themselves with steady_clock to feed the denominators.
void BM_peak_1core(benchmark::State& state, Isa isa) {
    if (!cpu_has(isa)) {
        state.SkipWithError("CPU lacks this ISA");
        return;
    }
    double best = 0.0;
    const OtherLoad load;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        benchmark::DoNotOptimize(fma_loop(isa, kPeakInner));
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
        best = std::max(best, fma_flops(isa, kPeakInner) / dt.count());
    }
    double& slot = isa == Isa::avx2 ? g_peak_avx2 : g_peak_avx512;
    slot = std::max(slot, best);
    const double flops = fma_flops(isa, kPeakInner) * double(state.iterations());
    state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
    state.counters["best_iter_GFLOP/s"] = best * 1e-9;
    state.counters["other_cpus"] = load.other_cpus();
}

// ---------------------------------------------------------------------------
// Threads. Eigen parallelises its GEMM only when built with OpenMP (and without
// EIGEN_DONT_PARALLELIZE); OpenBLAS (pthread build) has its own pool.
// ---------------------------------------------------------------------------
void set_threads(int threads) {
    Eigen::setNbThreads(threads);
#if defined(MOONMOE_GEMM_BENCH_OPENBLAS)
    openblas_set_num_threads(threads);
#endif
}

#if defined(EIGEN_USE_BLAS)
constexpr bool kEigenIsBlas = true;
#else
constexpr bool kEigenIsBlas = false;
#endif

enum class Backend { eigen, blas };
enum class Op { nn, nt, syrk };

const char* name(Backend b) { return b == Backend::eigen ? "eigen" : "blas"; }
const char* name(Op op) { return op == Op::nn ? "nn" : op == Op::nt ? "nt" : "syrk"; }

// Returns an error message if this build cannot run `backend` on `threads` threads.
const char* unsupported(Backend backend, int threads) {
    if (backend == Backend::blas) {
#if defined(MOONMOE_GEMM_BENCH_BLAS)
#if !defined(MOONMOE_GEMM_BENCH_OPENBLAS)
        if (threads > 1) return "not OpenBLAS: cannot set its thread count";
#endif
        return nullptr;
#else
        return "built without BLAS";
#endif
    }
    if (threads > 1 && !kEigenIsBlas && Eigen::nbThreads() < threads)
        return "Eigen runs 1 thread (built without OpenMP, or with EIGEN_DONT_PARALLELIZE)";
#if defined(EIGEN_USE_BLAS) && !defined(MOONMOE_GEMM_BENCH_OPENBLAS)
    if (threads > 1) return "Eigen calls a BLAS whose thread count this binary cannot set";
#endif
    return nullptr;
}

struct Shape {
    const char* name;
    Eigen::Index m, n, k;
    Op op;
    bool b_is_a = false;  // X X^T: B is the same buffer as A (m == n)
};

// Row-major operands: A [m,k]; B [k,n] (nn) or [n,k] (nt); syrk and the Newton-Schulz nt
// use B = A (X X^T). C [m,n].
struct Operands {
    std::vector<float> a, b, c;
    Operands(const Shape& s, bool b_is_a, std::size_t offset = 0)
        : a(std::size_t(s.m * s.k) + offset),
          b(b_is_a ? 0 : std::size_t(s.k * s.n) + offset),
          c(std::size_t(s.m * s.n) + offset) {
        std::mt19937 gen(12345);
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (auto& x : a) x = dist(gen);
        for (auto& x : b) x = dist(gen);
    }
};

void gemm(Backend backend, const Shape& s, const float* a, const float* b, float* c) {
    const Eigen::Index m = s.m, n = s.n, k = s.k;
    if (backend == Backend::eigen) {
        ConstMap A(a, m, k);
        Map C(c, m, n);
        switch (s.op) {
        case Op::nn: C.noalias() = A * ConstMap(b, k, n); break;
        case Op::nt: C.noalias() = A * ConstMap(b, n, k).transpose(); break;
        case Op::syrk: C.selfadjointView<Eigen::Lower>().rankUpdate(A); break;  // C += A A^T
        }
        return;
    }
#if defined(MOONMOE_GEMM_BENCH_BLAS)
    const auto M = int(m), N = int(n), K = int(k);
    switch (s.op) {
    case Op::nn: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N); break;
    case Op::nt: cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N); break;
    case Op::syrk: cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, N, K, 1.0f, a, K, 0.0f, c, N); break;
    }
#else
    (void)a, (void)b, (void)c;
#endif
}

void set_gemm_counters(benchmark::State& state, const Shape& s, int threads, double calls) {
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k) * calls;
    const double peak1 = peak_machine(), avx2 = peak_avx2();
    state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
    if (peak1 > 0)
        state.counters["frac_peak"] = benchmark::Counter(flops / (peak1 * threads), benchmark::Counter::kIsRate);
    if (avx2 > 0)
        state.counters["frac_avx2_peak"] = benchmark::Counter(flops / (avx2 * threads), benchmark::Counter::kIsRate);
    state.counters["peak_GFLOPs"] = peak1 * 1e-9;
    state.counters["threads"] = threads;
}

// The timed loop of the GEMM benchmarks (UseManualTime). One iteration is a batch of calls
// lasting at least kBatchSeconds; a batch during which other processes kept more than 0.1
// CPU busy is thrown away and redone, up to $MOONMOE_BENCH_REDO times (default 0, as in the
// CI smoke run, which shares the machine with other tests; compare_gemm_builds.sh sets 8),
// then kept: other_cpus shows it. Returns the number of calls timed. Counters: other_cpus
// (mean over the kept batches), redone (batches thrown away), calls_per_iter.
constexpr double kBatchSeconds = 0.1;

int max_redo() {
    static const int n = [] {
        const char* env = std::getenv("MOONMOE_BENCH_REDO");
        return env ? std::max(0, std::atoi(env)) : 0;
    }();
    return n;
}

template <class Call>
double clean_timed_loop(benchmark::State& state, Call&& call) {
    using clock = std::chrono::steady_clock;
    auto t0 = clock::now();
    call();  // warm-up (thread pools, page faults) and a first estimate of the call time
    const double first = std::chrono::duration<double>(clock::now() - t0).count();
    const long batch = std::max(1L, long(std::ceil(kBatchSeconds / std::max(first, 1e-6))));
    double calls = 0, other_sum = 0;
    long redone = 0;
    for (auto _ : state) {
        double seconds = 0, other = 0;
        for (int attempt = 0;; ++attempt) {
            const OtherLoad load;
            t0 = clock::now();
            for (long i = 0; i < batch; ++i) call();
            seconds = std::chrono::duration<double>(clock::now() - t0).count();
            other = load.other_cpus();
            if (other <= 0.1 || attempt >= max_redo()) break;
            ++redone;
        }
        state.SetIterationTime(seconds);
        calls += double(batch);
        other_sum += std::max(other, 0.0);
    }
    state.counters["other_cpus"] = state.iterations() ? other_sum / double(state.iterations()) : 0.0;
    state.counters["redone"] = double(redone);
    state.counters["calls_per_iter"] = double(batch);
    return calls;
}

void BM_gemm(benchmark::State& state, Backend backend, Shape s, int threads) {
    set_threads(threads);
    if (const char* why = unsupported(backend, threads)) {
        state.SkipWithError(why);
        return;
    }
    const bool b_is_a = s.op == Op::syrk || s.b_is_a;
    Operands x(s, b_is_a);
    const float* b = b_is_a ? x.a.data() : x.b.data();
    const double calls = clean_timed_loop(state, [&] {
        gemm(backend, s, x.a.data(), b, x.c.data());
        benchmark::ClobberMemory();
    });
    set_gemm_counters(state, s, threads, calls);
}

// A GEMM and then a row-wise OpenMP kernel on its output (an RMS-norm-like pass), as a layer
// of the library would alternate them. On 2 vCPUs, spinning idle threads of one pool steal
// the CPU from the other; the GFLOP/s counter only counts the GEMM.
void BM_mixed(benchmark::State& state, Backend backend, Shape s, int threads) {
#if !defined(_OPENMP)
    state.SkipWithError("built without OpenMP");
    (void)backend, (void)s, (void)threads;
#else
    set_threads(threads);
    omp_set_num_threads(threads);
    if (const char* why = unsupported(backend, threads)) {
        state.SkipWithError(why);
        return;
    }
    Operands x(s, false);
    const Eigen::Index m = s.m, n = s.n;
    float* c = x.c.data();
    const double calls = clean_timed_loop(state, [&] {
        gemm(backend, s, x.a.data(), x.b.data(), c);
#pragma omp parallel for schedule(static)
        for (Eigen::Index i = 0; i < m; ++i) {
            float* row = c + i * n;
            float ss = 0.0f;
            for (Eigen::Index j = 0; j < n; ++j) ss += row[j] * row[j];
            const float scale = 1.0f / std::sqrt(ss / float(n) + 1e-6f);
            for (Eigen::Index j = 0; j < n; ++j) row[j] *= scale;
        }
        benchmark::ClobberMemory();
    });
    set_gemm_counters(state, s, threads, calls);
#endif
}

// Bitwise repeatability of one backend at a fixed thread count, A B^T at a small awkward shape
// (no power of two, several k-blocks, ragged edges; cheap enough for the sanitizer smoke run)
// and at K2's kv_a_proj. Counters: identical = every repeat equals the first result bit for
// bit; align_identical = the same with every operand moved by one float (other alignment,
// other packing edge cases); same_as_1thread = equal to the 1-thread result; hash = FNV-1a of
// the result's bits (compare across processes and builds).
void BM_repeat(benchmark::State& state, Backend backend, Shape s, int threads) {
    set_threads(threads);
    if (const char* why = unsupported(backend, threads)) {
        state.SkipWithError(why);
        return;
    }
    Operands x(s, false), y(s, false, 1);
    const std::size_t mn = std::size_t(s.m * s.n);
    std::vector<float> first(mn), one_thread(mn);
    gemm(backend, s, x.a.data(), x.b.data(), first.data());
    bool identical = true, align_identical = true;
    for (auto _ : state) {
        gemm(backend, s, x.a.data(), x.b.data(), x.c.data());
        identical = identical && std::memcmp(x.c.data(), first.data(), mn * sizeof(float)) == 0;
        std::copy(x.a.begin(), x.a.end(), y.a.begin() + 1);
        std::copy(x.b.begin(), x.b.end(), y.b.begin() + 1);
        gemm(backend, s, y.a.data() + 1, y.b.data() + 1, y.c.data() + 1);
        align_identical = align_identical && std::memcmp(y.c.data() + 1, first.data(), mn * sizeof(float)) == 0;
    }
    set_threads(1);
    gemm(backend, s, x.a.data(), x.b.data(), one_thread.data());
    set_threads(threads);
    double max_abs = 0.0;
    for (std::size_t i = 0; i < mn; ++i) max_abs = std::max(max_abs, double(std::abs(first[i] - one_thread[i])));
    std::uint32_t hash = 2166136261u;
    for (float f : first) {
        std::uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        for (int byte = 0; byte < 4; ++byte) hash = (hash ^ ((bits >> (8 * byte)) & 0xffu)) * 16777619u;
    }
    state.counters["identical"] = identical;
    state.counters["align_identical"] = align_identical;
    state.counters["same_as_1thread"] = max_abs == 0.0;
    state.counters["max_abs_diff_vs_1thread"] = max_abs;
    state.counters["hash"] = double(hash);
}

// ---------------------------------------------------------------------------
// Registration. Kimi K2: hidden 7168, q_lora_rank 1536, kv latent 512 + rope 64 = 576,
// expert hidden 2048; 512 tokens. Newton-Schulz (Muon) X X^T for X [2048, 7168].
// ---------------------------------------------------------------------------
constexpr std::array kShapes{
    Shape{"sq512", 512, 512, 512, Op::nn},
    Shape{"sq512", 512, 512, 512, Op::nt},
    Shape{"sq1024", 1024, 1024, 1024, Op::nn},
    Shape{"sq1024", 1024, 1024, 1024, Op::nt},
    Shape{"sq2048", 2048, 2048, 2048, Op::nn},
    Shape{"sq2048", 2048, 2048, 2048, Op::nt},
    Shape{"sq4096", 4096, 4096, 4096, Op::nn},
    Shape{"sq4096", 4096, 4096, 4096, Op::nt},
    Shape{"k2_q_a_proj", 512, 1536, 7168, Op::nt},
    Shape{"k2_kv_a_proj", 512, 576, 7168, Op::nt},
    Shape{"k2_expert_gate", 512, 2048, 7168, Op::nt},
    Shape{"k2_expert_down", 512, 7168, 2048, Op::nt},
    Shape{"k2_ns_xxt", 2048, 2048, 7168, Op::nt, true},
    Shape{"k2_ns_xxt", 2048, 2048, 7168, Op::syrk},
};

// What this build is, in the JSON "context" (and the console header).
void add_build_context() {
    benchmark::AddCustomContext("eigen_simd", Eigen::SimdInstructionSetsInUse());
    benchmark::AddCustomContext("eigen_use_blas", kEigenIsBlas ? "yes" : "no");
#if defined(_OPENMP)
    benchmark::AddCustomContext("openmp", std::to_string(_OPENMP));
#else
    benchmark::AddCustomContext("openmp", "no");
#endif
#if defined(EIGEN_DONT_PARALLELIZE)
    benchmark::AddCustomContext("eigen_parallel", "no (EIGEN_DONT_PARALLELIZE)");
#else
    benchmark::AddCustomContext("eigen_parallel", std::to_string(Eigen::nbThreads()) + " threads max");
#endif
#if defined(MOONMOE_GEMM_BENCH_OPENBLAS)
    benchmark::AddCustomContext("openblas", std::string(openblas_get_config()) + ", core " + openblas_get_corename());
#elif defined(MOONMOE_GEMM_BENCH_BLAS)
    benchmark::AddCustomContext("openblas", "no (another CBLAS)");
#else
    benchmark::AddCustomContext("openblas", "no BLAS");
#endif
}

[[maybe_unused]] const bool kRegistered = [] {
    add_build_context();
    for (Isa isa : {Isa::avx2, Isa::avx512}) {
        const std::string isa_name = isa == Isa::avx2 ? "avx2" : "avx512";
        benchmark::RegisterBenchmark(("peak/" + isa_name + "_fma/threads:1").c_str(), BM_peak_1core, isa);
        benchmark::RegisterBenchmark(("peak/" + isa_name + "_fma/threads:2").c_str(), BM_peak, isa, 2)->UseRealTime();
    }
    for (int threads : {1, 2})
        for (Backend backend : {Backend::eigen, Backend::blas})
            for (const Shape& s : kShapes) {
                const std::string n = std::string("gemm/") + name(backend) + "/" + name(s.op) + "/" + s.name +
                                      "/threads:" + std::to_string(threads);
                benchmark::RegisterBenchmark(n.c_str(), BM_gemm, backend, s, threads)->UseManualTime();
            }
    for (Backend backend : {Backend::eigen, Backend::blas}) {
        const std::string n = std::string("mixed/") + name(backend) + "/nt/k2_kv_a_proj/threads:2";
        benchmark::RegisterBenchmark(n.c_str(), BM_mixed, backend, Shape{"k2_kv_a_proj", 512, 576, 7168, Op::nt}, 2)
            ->UseManualTime();
    }
    for (const Shape& s : {Shape{"small", 203, 301, 1100, Op::nt}, Shape{"k2_kv_a_proj", 512, 576, 7168, Op::nt}})
        for (Backend backend : {Backend::eigen, Backend::blas})
            for (int threads : {1, 2}) {
                const std::string n =
                    std::string("repeat/") + name(backend) + "/nt/" + s.name + "/threads:" + std::to_string(threads);
                benchmark::RegisterBenchmark(n.c_str(), BM_repeat, backend, s, threads)->Iterations(5)->UseRealTime();
            }
    return true;
}();

}  // namespace
