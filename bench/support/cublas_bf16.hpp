// bench/support/cublas_bf16.hpp: the dense bf16 cuBLAS GEMM of moonmoe_cuda_bench, the yardstick of issue 11's MoE
// target ("grouped expert GEMMs at >= 60 % of the same run's dense bf16 cuBLAS rate").
//
// C = A B, row-major A [m, k], B [k, n], C [m, n], all bf16, through cublasGemmEx with CUDA_R_16BF operands and
// CUBLAS_COMPUTE_32F (f32 accumulation on the tensor cores, what torch.matmul does on bf16 tensors). The rate is
// measured once per process, 8192^3 (MOONMOE_BENCH_BF16_SIZE to change), best of ten after one warm-up, and every
// row of the CUDA suite reports `of_bf16_cublas`, its FLOP/s over that rate. On the CPU and the emulated backend
// there is no cuBLAS: MOONMOE_BENCH_HAVE_CUBLAS is 0 and the rate is 0 (the counter is left out).
// The second yardstick, of issue 26's decode target: the device's copy bandwidth, bytes read plus bytes written per
// second by a device-to-device cudaMemcpyAsync of 1 GiB (best of ten after one warm-up); rows with a byte count
// report `of_copy`, their bytes per second over it. On the host the same counter is over a memcpy's bandwidth (below).
// On the host, issue 28's bf16 yardstick stands where cuBLAS does: host_bf16_rate(), the library's own bf16 product
// (oneDNN's matmul) on a large square where the CPU multiplies bf16 natively; rows report `of_bf16_gemm` over it.
// Included by suite.hpp (which defines index_t, Clock, seconds_since, wait_for_device and best_seconds before it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <moonmoe/tensor/dtype.hpp>

#if defined(MOONMOE_BENCH_CUDA) && !MOONMOE_CUDA_EMULATED
#define MOONMOE_BENCH_HAVE_CUBLAS 1
#else
#define MOONMOE_BENCH_HAVE_CUBLAS 0
#endif

namespace bench {

/// The side of the square bf16 product behind bf16_cublas_rate() (8192) and host_bf16_rate() (2048).
inline const index_t bf16_cublas_size = [] {
    const char* s = std::getenv("MOONMOE_BENCH_BF16_SIZE");
    return s && *s ? std::max<index_t>(16, std::atol(s)) : index_t(MOONMOE_BENCH_HAVE_CUBLAS ? 8192 : 2048);
}();

#if MOONMOE_BENCH_HAVE_CUBLAS

/// Device operands of one bf16 product, filled once with values in [-1, 1) (a fixed hash of the index: the rate does
/// not depend on them, and zeros could let the hardware idle).
class Bf16Gemm {
public:
    Bf16Gemm(index_t m, index_t n, index_t k)
        : m_(m), n_(n), k_(k), a_(filled(m * k, 1)), b_(filled(k * n, 2)), c_(filled(m * n, 3)) {}
    ~Bf16Gemm() {
        for (void* p : {a_, b_, c_}) moonmoe::backend::Memory<moonmoe::cuda>::release(p);
    }
    Bf16Gemm(const Bf16Gemm&) = delete;
    Bf16Gemm& operator=(const Bf16Gemm&) = delete;

    double flops() const { return 2.0 * double(m_) * double(n_) * double(k_); }

    /// Queues C = A B. Row-major C = A B is column-major C^T = B^T A^T: B first, A second, no transposes.
    void run() const {
        const float alpha = 1.0f, beta = 0.0f;
        MOONMOE_CUBLAS_CHECK(cublasGemmEx_64(moonmoe::backend::cuda_detail::cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N,
                                             n_, m_, k_, &alpha, b_, CUDA_R_16BF, n_, a_, CUDA_R_16BF, k_, &beta, c_,
                                             CUDA_R_16BF, n_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }

private:
    static void* filled(index_t count, std::uint64_t seed) {
        std::vector<moonmoe::bf16> host(static_cast<std::size_t>(count));
        for (std::size_t i = 0; i < host.size(); ++i) {
            std::uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed * 0xBF58476D1CE4E5B9ull;
            h ^= h >> 31;
            host[i] = moonmoe::bf16::from_float(float(h >> 40) / float(1ull << 23) - 1.0f);
        }
        void* p = moonmoe::backend::Memory<moonmoe::cuda>::allocate(host.size() * sizeof(moonmoe::bf16));
        moonmoe::backend::Memory<moonmoe::cuda>::to_device(p, host.data(), host.size() * sizeof(moonmoe::bf16));
        return p;
    }

    index_t m_, n_, k_;
    void* a_;
    void* b_;
    void* c_;
};

/// FLOP/s of the dense bf16 product, bf16_cublas_size^3: the best of ten after one warm-up.
inline double bf16_cublas_rate() {
    static const double rate = [] {
        const Bf16Gemm g(bf16_cublas_size, bf16_cublas_size, bf16_cublas_size);
        double best = 1e30;
        for (int rep = 0; rep < 11; ++rep) {
            const auto t = Clock::now();
            g.run();
            wait_for_device();
            if (rep > 0) best = std::min(best, seconds_since(t));
        }
        return g.flops() / best;
    }();
    return rate;
}

/// Bytes per second a device-to-device copy moves (read + written), 1 GiB: the best of ten after one warm-up.
inline double copy_bandwidth() {
    static const double rate = [] {
        using Memory = moonmoe::backend::Memory<moonmoe::cuda>;
        const std::size_t bytes = std::size_t(1) << 30;
        void* a = Memory::allocate(bytes);
        void* b = Memory::allocate(bytes);
        double best = 1e30;
        for (int rep = 0; rep < 11; ++rep) {
            const auto t = Clock::now();
            Memory::copy(b, a, bytes);
            wait_for_device();
            if (rep > 0) best = std::min(best, seconds_since(t));
        }
        Memory::release(a), Memory::release(b);
        return 2.0 * double(bytes) / best;
    }();
    return rate;
}

inline double host_bf16_rate() { return 0; }

/// The read-only yardstick is the host's (below); on the GPU the copy bandwidth stands alone: no counter.
inline double read_bandwidth(double) { return 0; }

#else

inline double bf16_cublas_rate() { return 0; }

/// The CPU's own bf16 rate, issue 28's peak for its bf16 rows: FLOP/s of C = A B with bf16 operands and an f32 C
/// through BlasOps::gemm_bf16 (oneDNN's matmul on the suite's threads), bf16_cublas_size^3 (2048; CI's smoke runs
/// 256), the best of ten after one warm-up, on oneDNN's native bf16 kernels whatever gemm_engine.hpp's rules choose
/// for the suite's rows (so a row that runs widened to f32 can pass 1). 0 (no counter) where gemm_bf16 cannot run
/// natively: its widened f32 path is no bf16 peak.
inline double host_bf16_rate() {
#if defined(MOONMOE_BENCH_CUDA)
    return 0;  // the emulated CUDA backend: no host yardstick
#else
    static const double rate = [] {
        namespace mb = moonmoe::backend;
        if (!mb::bf16_gemm_uses_onednn()) return 0.0;
        const mb::Bf16Gemm chosen = mb::cpu_detail::bf16_gemm_choice();
        mb::set_bf16_gemm(mb::Bf16Gemm::onednn);
        const index_t n = bf16_cublas_size;
        Mat a32({n, n}), b32({n, n});
        Ops::fill_normal(a32.view(), 0.0f, 1.0f, 1);
        Ops::fill_normal(b32.view(), 0.0f, 1.0f, 2);
        moonmoe::Tensor<moonmoe::bf16, 2> a({n, n}), b({n, n});
        Ops::cast<moonmoe::bf16, float>(std::as_const(a32).view(), a.view());
        Ops::cast<moonmoe::bf16, float>(std::as_const(b32).view(), b.view());
        const double best = best_seconds(10, [&] {
            Ops::gemm_bf16<float>(moonmoe::backend::Trans::no, moonmoe::backend::Trans::no, 1.0f,
                                  std::as_const(a).view(), std::as_const(b).view(), 0.0f, a32.view());
        });
        mb::set_bf16_gemm(chosen);
        return 2.0 * double(n) * n * n / best;
    }();
    return rate;
#endif
}

/// The best of seven timings, after one warm-up that also touches every page, of `work(k)` for k = 0 .. threads - 1
/// run on the pool (parallel_chunks: one item per thread; parallel_for would start inline and could run two on one).
template <class Work>
double best_time_per_thread_slice(Work work) {
    double best = 1e30;
    for (int rep = 0; rep < 7; ++rep) {
        const auto t = Clock::now();
        moonmoe::backend::cpu_detail::parallel_chunks(moonmoe::index_t(moonmoe::threads()), work);
        if (rep > 0) best = std::min(best, seconds_since(t));
    }
    return best;
}

/// The host's copy bandwidth, the same yardstick for issue 28's decode target: bytes read plus bytes written per
/// second copying 256 MiB (past any cache; MOONMOE_BENCH_COPY_MIB to change) into a second buffer, the suite's
/// threads each copying an equal slice.
inline double copy_bandwidth() {
    static const double rate = [] {
        const char* env = std::getenv("MOONMOE_BENCH_COPY_MIB");
        const long mib = env && *env ? std::strtol(env, nullptr, 10) : 256;
        const std::size_t bytes = std::size_t(mib > 0 ? mib : 256) << 20;
        std::vector<char> a(bytes, 1), b(bytes);
        const std::size_t slices = std::size_t(moonmoe::threads()), slice = (bytes + slices - 1) / slices;
        const double best = best_time_per_thread_slice([&](moonmoe::index_t k) {
            const std::size_t from = std::size_t(k) * slice, n = std::min(slice, bytes - std::min(bytes, from));
            if (n) std::memcpy(b.data() + from, a.data() + from, n);
        });
        return 2.0 * double(bytes) / best;
    }();
    return rate;
}

/// The host's read rate for `bytes`, the yardstick of rows that only stream memory (one decoded token's product reads
/// a weight and writes a few KiB): bytes read per second summing a buffer of that size as 64-bit words, the suite's
/// threads each reading an equal slice as four streams side by side. Measured at the row's own size because the rate
/// depends on it: this host's L3 is large and shared, and one core read 30 GB/s from 32 MiB, 23 GB/s from 117 MiB and
/// 14 GB/s from 256 MiB or more (four streams; one stream: about half).
/// Measured once per size, for rows of up to 256 MiB (0, no counter, above: the buffer would add to the RSS that
/// run_suite.sh reports); the buffer is freed before the row goes on.
inline double read_bandwidth(double bytes) {
    constexpr std::size_t streams = 4, line = 8;  // words per 64-byte cache line
    if (bytes <= 0 || bytes > double(std::size_t(256) << 20)) return 0;
    static std::vector<std::pair<double, double>> measured;  // (bytes, rate)
    for (const auto& [size, rate] : measured)
        if (size == bytes) return rate;
    const moonmoe::index_t slices = moonmoe::index_t(moonmoe::threads());
    const std::size_t part = std::max<std::size_t>(  // words per stream
        line, std::size_t(bytes) / sizeof(std::uint64_t) / (std::size_t(slices) * streams) / line * line);
    std::vector<std::uint64_t> a(part * streams * std::size_t(slices), 1);
    std::vector<std::uint64_t> sums(static_cast<std::size_t>(slices), 0);
    const double best = best_time_per_thread_slice([&](moonmoe::index_t k) {
        const std::uint64_t* p = a.data() + std::size_t(k) * streams * part;
        std::uint64_t acc[line] = {};
        for (std::size_t o = 0; o < part; o += line)
            for (std::size_t s = 0; s < streams; ++s)
                for (std::size_t w = 0; w < line; ++w) acc[w] += p[s * part + o + w];
        std::uint64_t sum = 0;
        for (std::uint64_t v : acc) sum += v;
        sums[std::size_t(k)] = sum;
    });
    std::uint64_t total = 0;  // used, so that the reads are not optimised away
    for (std::uint64_t v : sums) total += v;
    const double rate = total == a.size() ? double(a.size() * sizeof(std::uint64_t)) / best : 0.0;
    measured.emplace_back(bytes, rate);
    return rate;
}

#endif

}  // namespace bench
