// moonmoe/backend/cuda/memory.hpp: Memory<cuda> (backend/memory.hpp), the per-thread stream and cuBLAS handle, the
// checked CUDA calls, and the choice between the two modes of the CUDA backend.
//
// Modes, chosen by the compiler:
//   nvcc (__CUDACC__)            the real backend: CUDA runtime, cuBLAS, Thrust on CUDA. Memory comes from the
//                                device's stream-ordered pool (cudaMallocAsync / cudaFreeAsync on the current stream),
//                                its release threshold raised once so freed blocks stay in the pool for the next step
//                                (a training step allocates the same activations every time), like the CPU's cache.
//   a host compiler with         the emulated backend (MOONMOE_CUDA_EMULATED): host memory, Thrust on OpenMP, and the
//   THRUST_DEVICE_SYSTEM ==      cuBLAS calls served by host functions that take the same column-major arguments
//   THRUST_DEVICE_SYSTEM_OMP     (cuda/layout.hpp), so everything but the kernels' hardware runs where no GPU is
// Any other host compile stops with an #error that says how to build. Either way host_visible<cuda> is false: module
// code cannot index tensor data, even where the emulation could.
//
// Streams: each thread has a current stream (cudaStreamPerThread until a StreamGuard switches it) and its own cuBLAS
// handle, bound to the current stream whenever it is handed out. Every CUDA and cuBLAS call goes through
// MOONMOE_CUDA_CHECK / MOONMOE_CUBLAS_CHECK, which throw cuda_error naming the call, the error and the place, or,
// where nothing may throw (release, destructors), through MOONMOE_CUDA_NOTE, which leaves the failure for the next
// checked call to throw (cuda/error.hpp: after a kernel's sticky fault, the error names the first failing call).
#pragma once

#if defined(__CUDACC__)
#define MOONMOE_CUDA_EMULATED 0
#include <cublas_v2.h>
#include <cuda_runtime.h>
#else
#if !__has_include(<thrust/version.h>)
// clang-format off: an #error line cannot break
#error "moonmoe: <moonmoe/backend/cuda.hpp> needs nvcc (the CUDA backend), or a host compiler emulating it with Thrust's OpenMP device system: -fopenmp -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem <cuda>/include/cccl -isystem <cuda>/include (Thrust was not found on the include path)"
// clang-format on
#elif !defined(THRUST_DEVICE_SYSTEM) || !defined(_OPENMP)
// clang-format off: an #error line cannot break
#error "moonmoe: <moonmoe/backend/cuda.hpp> needs nvcc (the CUDA backend), or a host compiler emulating it with Thrust's OpenMP device system: -fopenmp -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem <cuda>/include/cccl -isystem <cuda>/include"
// clang-format on
#else
#include <thrust/detail/config.h>
#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_OMP
// clang-format off: an #error line cannot break
#error "moonmoe: a host compile of <moonmoe/backend/cuda.hpp> emulates the CUDA backend on Thrust's OpenMP device system only: -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (or compile with nvcc)"
// clang-format on
#else
#define MOONMOE_CUDA_EMULATED 1
#endif
#endif
#endif
// Without a mode (the #error above) nothing below is compiled, so that error is the only one.
#if defined(MOONMOE_CUDA_EMULATED)

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "../memory.hpp"  // Memory<B>, MemoryStats
#include "error.hpp"
#include "host_waits.hpp"

namespace moonmoe::backend {

#if MOONMOE_CUDA_EMULATED
/// The emulation runs everything on the host in order: a stream is only a name (one per Stream object).
using cuda_stream_t = const void*;
#else
using cuda_stream_t = cudaStream_t;
#endif

namespace cuda_detail {

/// What one host thread holds: its current stream and its cuBLAS handle (created on first use).
struct ThreadContext {
#if MOONMOE_CUDA_EMULATED
    cuda_stream_t stream = nullptr;
#else
    cuda_stream_t stream = cudaStreamPerThread;  // each thread's own default stream, not the legacy one
    cublasHandle_t handle = nullptr;
    cuda_stream_t handle_stream = nullptr;  // the stream the handle was last bound to
    ThreadContext() = default;
    ThreadContext(const ThreadContext&) = delete;
    ThreadContext& operator=(const ThreadContext&) = delete;
    // Not checked: at process exit the CUDA context may already be gone, and there is no one left to tell.
    ~ThreadContext() {
        if (handle) cublasDestroy(handle);
    }
#endif
};

inline ThreadContext& thread_context() {
    thread_local ThreadContext c;
    return c;
}

}  // namespace cuda_detail

/// The stream this thread's CUDA work goes to.
inline cuda_stream_t current_stream() { return cuda_detail::thread_context().stream; }

/// Makes `s` this thread's current stream until the guard goes out of scope, then restores the previous one.
class StreamGuard {
public:
    explicit StreamGuard(cuda_stream_t s) : previous_(cuda_detail::thread_context().stream) {
        cuda_detail::thread_context().stream = s;
    }
    ~StreamGuard() { cuda_detail::thread_context().stream = previous_; }
    StreamGuard(const StreamGuard&) = delete;
    StreamGuard& operator=(const StreamGuard&) = delete;

private:
    cuda_stream_t previous_;
};

/// An owned non-blocking stream (the emulation: a distinct name).
class Stream {
public:
    Stream() {
#if MOONMOE_CUDA_EMULATED
        stream_ = new char;
#else
        MOONMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
#endif
    }
    ~Stream() {
#if MOONMOE_CUDA_EMULATED
        delete static_cast<const char*>(stream_);
#else
        MOONMOE_CUDA_NOTE(cudaStreamDestroy(stream_));  // the work already queued completes
#endif
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cuda_stream_t get() const { return stream_; }
    /// Waits for the work queued on this stream (a host wait).
    void synchronize() const {
        cuda_detail::count_host_wait();
#if !MOONMOE_CUDA_EMULATED
        MOONMOE_CUDA_CHECK(cudaStreamSynchronize(stream_));
#endif
    }

private:
    cuda_stream_t stream_;
};

#if !MOONMOE_CUDA_EMULATED
namespace cuda_detail {
/// This thread's cuBLAS handle, bound to the current stream. FP32 products stay FP32: the default math mode, and
/// the calls ask for the pedantic compute types (no TF32, whatever NVIDIA_TF32_OVERRIDE says).
inline cublasHandle_t cublas_handle() {
    ThreadContext& c = thread_context();
    if (!c.handle) {
        MOONMOE_CUBLAS_CHECK(cublasCreate(&c.handle));
        MOONMOE_CUBLAS_CHECK(cublasSetMathMode(c.handle, CUBLAS_DEFAULT_MATH));
        MOONMOE_CUBLAS_CHECK(cublasSetStream(c.handle, c.stream));
        c.handle_stream = c.stream;
    } else if (c.handle_stream != c.stream) {
        MOONMOE_CUBLAS_CHECK(cublasSetStream(c.handle, c.stream));
        c.handle_stream = c.stream;
    }
    return c.handle;
}

/// Raises the release threshold of the current device's default pool once, so memory freed with cudaFreeAsync
/// stays in the pool across stream synchronisations instead of going back to the driver (Memory<cuda>::trim
/// returns it).
inline void configure_pool() {
    thread_local std::vector<bool> seen;  // devices this thread has already configured (cheap check per allocation)
    int device = 0;
    MOONMOE_CUDA_CHECK(cudaGetDevice(&device));
    if (std::size_t(device) < seen.size() && seen[std::size_t(device)]) return;
    static std::mutex mutex;
    static std::vector<bool> done;
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (done.size() <= std::size_t(device)) done.resize(std::size_t(device) + 1, false);
        if (!done[std::size_t(device)]) {
            cudaMemPool_t pool;
            MOONMOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
            std::uint64_t threshold = UINT64_MAX;
            MOONMOE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
            done[std::size_t(device)] = true;
        }
    }
    if (seen.size() <= std::size_t(device)) seen.resize(std::size_t(device) + 1, false);
    seen[std::size_t(device)] = true;
}

/// The current device's default pool, the one cudaMallocAsync serves.
inline cudaMemPool_t default_pool() {
    int device = 0;
    MOONMOE_CUDA_CHECK(cudaGetDevice(&device));
    cudaMemPool_t pool;
    MOONMOE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    return pool;
}

/// Bytes the current device's pool holds from the driver and hands out, for an out-of-memory message (0 where
/// the queries fail: that message is already an error).
struct PoolUsage {
    std::uint64_t reserved = 0, used = 0;
};
inline PoolUsage pool_usage() {
    PoolUsage u;
    int device = 0;
    cudaMemPool_t pool;
    if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return u;
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &u.reserved) != cudaSuccess) u.reserved = 0;
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &u.used) != cudaSuccess) u.used = 0;
    return u;
}

/// Requested sizes of live device blocks, for MemoryStats (a device block has no host-readable header).
class BlockSizes {
public:
    void add(void* p, std::size_t bytes) {
        std::lock_guard<std::mutex> lock(mutex_);
        sizes_.emplace(p, bytes);
    }
    std::size_t remove(void* p) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = sizes_.find(p);
        if (it == sizes_.end()) return 0;
        const std::size_t bytes = it->second;
        sizes_.erase(it);
        return bytes;
    }

private:
    std::mutex mutex_;
    std::unordered_map<void*, std::size_t> sizes_;
};
}  // namespace cuda_detail

template <>
struct Memory<cuda> {
    static constexpr bool in_host_memory = false;  ///< device memory: a communicator must move it (NCCL)

    /// Zeroed device memory from the pool, ordered on the current stream (cudaMallocAsync aligns to 256 bytes at
    /// least). Out of memory, the pool's unused memory goes back to the driver and the request is tried once more
    /// (cuda_detail::allocate_or_reclaim); then cuda_error gives the request and the pool's reserved and used bytes.
    static void* allocate(std::size_t bytes, Init init = Init::zeroed) {
        if (bytes == 0) return nullptr;
        cuda_detail::configure_pool();
        void* p = nullptr;
        cuda_detail::allocate_or_reclaim(
            [&] {
                const cudaError_t e = cudaMallocAsync(&p, bytes, current_stream());
                if (e == cudaErrorMemoryAllocation) {
                    (void)cudaGetLastError();  // not sticky: cleared, so no later launch check reads it as its own
                    return false;
                }
                // Only a failure throws here: once p is allocated, a waiting failure is left for the next check.
                if (e != cudaSuccess)
                    cuda_detail::check(e, "cudaMallocAsync(&p, bytes, current_stream())", __FILE__, __LINE__);
                return true;
            },
            [] { trim(); },
            [&] {
                const cuda_detail::PoolUsage u = cuda_detail::pool_usage();
                return cuda_detail::out_of_memory_message(bytes, u.reserved, u.used);
            });
        if (const cudaError_t e = init == Init::zeroed ? cudaMemsetAsync(p, 0, bytes, current_stream()) : cudaSuccess;
            e != cudaSuccess) {
            (void)cudaFreeAsync(p, current_stream());  // never handed out; its own failure would only repeat e's
            cuda_detail::check(e, "cudaMemsetAsync(p, 0, bytes, current_stream())", __FILE__, __LINE__);
        }
        sizes().add(p, bytes);
        stats().add(bytes);
        return p;
    }
    /// Back to the pool, ordered after the work queued so far on the current stream. Work on other streams that
    /// still reads the block must have been ordered before this (an event, or the same stream). Called from
    /// Tensor's destructor, so it never throws: a failure (after a kernel's sticky fault, every call fails) is
    /// recorded, and the next checked call throws it (cuda/error.hpp).
    static void release(void* p) noexcept {
        if (!p) return;
        stats().remove(sizes().remove(p));
        MOONMOE_CUDA_NOTE(cudaFreeAsync(p, current_stream()));
    }
    static void copy(void* dst, const void* src, std::size_t bytes) {
        if (bytes) MOONMOE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current_stream()));
    }
    static void fill_zero(void* p, std::size_t bytes) {
        if (bytes) MOONMOE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream()));
    }
    /// Copies to the host and waits for the current stream: the values are there when this returns (a host wait).
    static void to_host(void* host_dst, const void* src, std::size_t bytes) {
        if (!bytes) return;
        cuda_detail::count_host_wait();
        MOONMOE_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, current_stream()));
        MOONMOE_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    }
    /// Queues a copy from the host; the host buffer may be reused when this returns. Up to staging_largest bytes
    /// through this thread's pinned staging ring, without a wait (cuda/host_waits.hpp); a larger copy is waited for.
    static void to_device(void* dst, const void* host_src, std::size_t bytes) {
        if (!bytes) return;
        cuda_detail::refuse_in_capture("a copy from the host");
        if (cuda_detail::upload_ring().upload(dst, host_src, bytes, current_stream())) return;
        cuda_detail::count_host_wait();
        MOONMOE_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, current_stream()));
        MOONMOE_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    }
    /// Returns the pool's unused memory on the current device to the driver, for what allocates outside the pool
    /// (cuBLAS's workspaces, NCCL's buffers). Waits for the whole device first: a block freed with cudaFreeAsync
    /// stays reserved until the host has seen its stream's work complete, on whichever stream that was.
    static void trim() {
        cuda_detail::count_host_wait();
        MOONMOE_CUDA_CHECK(cudaDeviceSynchronize());
        MOONMOE_CUDA_CHECK(cudaMemPoolTrimTo(cuda_detail::default_pool(), 0));
    }
    /// Bytes held by live CUDA tensors (their requested sizes), current and peak.
    static MemoryStats& stats() {
        static MemoryStats s;
        return s;
    }

private:
    static cuda_detail::BlockSizes& sizes() {
        static auto* s = new cuda_detail::BlockSizes;  // never destroyed: static tensors may be released after it
        return *s;
    }
};

#else  // MOONMOE_CUDA_EMULATED

namespace cuda_detail {

/// The emulation's device fault. While set, every call of the emulated runtime (Memory<cuda>'s) fails with
/// cudaErrorIllegalAddress, as every CUDA call does after a kernel wrote through a bad pointer (a sticky error: on
/// a GPU only a new process clears it), so the failure paths the two modes share (release in destructors, the
/// first-failure record of cuda/error.hpp) run without a GPU. Tests set and clear it.
inline std::atomic<bool> emulated_device_fault{false};

/// One emulated runtime call: a failure only while the fault is set.
inline CallStatus emulated_call() {
    if (!emulated_device_fault.load(std::memory_order_relaxed)) return {};
    return {"cudaErrorIllegalAddress", "an illegal memory access was encountered"};
}

}  // namespace cuda_detail

template <>
struct Memory<cuda> {
    static constexpr std::size_t alignment = 64;
    static constexpr bool in_host_memory = true;  ///< the emulation's "device" memory is the host's

    /// 64-byte aligned host memory, zeroed or (Init::overwritten) filled with 0xff bytes, with a header in front
    /// recording the requested size (for stats).
    static void* allocate(std::size_t bytes, Init init = Init::zeroed) {
        if (bytes == 0) return nullptr;
        cuda_detail::check(cuda_detail::emulated_call(), "cudaMallocAsync(&p, bytes, current_stream())", __FILE__,
                           __LINE__);
        const std::size_t total = alignment + (bytes + alignment - 1) / alignment * alignment;
        auto* base = static_cast<std::byte*>(std::aligned_alloc(alignment, total));
        if (!base) throw std::bad_alloc();
        std::memset(base, 0, alignment);
        // Init::overwritten: NaN bytes, so that reading before writing shows in the tests' results
        std::memset(base + alignment, init == Init::zeroed ? 0 : 0xff, total - alignment);
        reinterpret_cast<std::size_t*>(base)[0] = bytes;
        stats().add(bytes);
        return base + alignment;
    }
    /// Never throws, as on a GPU; the host memory is freed even under the fault, so a test of it leaks nothing.
    static void release(void* p) noexcept {
        if (!p) return;
        std::byte* base = static_cast<std::byte*>(p) - alignment;
        stats().remove(reinterpret_cast<const std::size_t*>(base)[0]);
        cuda_detail::note(cuda_detail::emulated_call(), "cudaFreeAsync(p, current_stream())", __FILE__, __LINE__);
        std::free(base);
    }
    static void copy(void* dst, const void* src, std::size_t bytes) {
        if (!bytes) return;
        cuda_detail::check(cuda_detail::emulated_call(), "cudaMemcpyAsync(dst, src, bytes, kind, current_stream())",
                           __FILE__, __LINE__);
        std::memcpy(dst, src, bytes);
    }
    static void fill_zero(void* p, std::size_t bytes) {
        if (!bytes) return;
        cuda_detail::check(cuda_detail::emulated_call(), "cudaMemsetAsync(p, 0, bytes, current_stream())", __FILE__,
                           __LINE__);
        std::memset(p, 0, bytes);
    }
    /// The copies to and from the host count the host waits a GPU would make (cuda/host_waits.hpp): every copy to
    /// the host, and a copy to the device too large for the staging ring.
    static void to_host(void* host_dst, const void* src, std::size_t bytes) {
        if (bytes) cuda_detail::count_host_wait();
        copy(host_dst, src, bytes);
    }
    static void to_device(void* dst, const void* host_src, std::size_t bytes) {
        cuda_detail::refuse_in_capture("a copy from the host");
        if (bytes > cuda_detail::staging_largest) cuda_detail::count_host_wait();
        copy(dst, host_src, bytes);
    }
    /// Nothing is pooled in the emulation; on a GPU this is a device-wide wait, counted as one.
    static void trim() { cuda_detail::count_host_wait(); }
    static MemoryStats& stats() {
        static MemoryStats s;
        return s;
    }
};

#endif  // MOONMOE_CUDA_EMULATED

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
