// moonmoe/backend/memory.hpp: where a backend keeps tensors, and the only ways data crosses to and from the host.
//
// Memory<B> (one specialisation per backend, backend/<name>/memory.hpp):
//   allocate(bytes, init = Init::zeroed) -> void*
//                                64-byte aligned, null for 0 bytes; zeroed, or with Init::overwritten contents left
//                                unspecified, for a tensor whose every element is written before it is read
//                                (Tensor::for_overwrite: a widened copy, a product's output); the CPU backend then
//                                skips clearing a reused block, the CUDA backend its memset, and the emulated CUDA
//                                backend fills it with 0xff bytes (NaN in float and bf16), so that a kernel reading
//                                such memory before writing it fails the tests
//   release(void*)               null is a no-op; never throws (Tensor's destructor calls it): the CUDA backend
//                                records a failure for its next checked call to throw (cuda/error.hpp)
//   copy(dst, src, bytes)        within the backend's memory
//   fill_zero(p, bytes)
//   to_host(host_dst, src, bytes), to_device(dst, host_src, bytes)
//                                the explicit crossings; on the CUDA backend they synchronise the current stream,
//                                and every call site in nn/ and optim/ says why it needs the values on the host
//   stats() -> MemoryStats&      the bytes of the backend's live tensors (their requested sizes), current and peak:
//                                one counter per backend, for benchmarks and memory reports
// host_visible<B> says whether the host may dereference the backend's pointers: View::operator() and Tensor's
// element access compile only when it holds, so module code that indexes tensor data fails to build for CUDA.
// in_host_memory<B> says where the tensors are at run time (host memory in the emulated CUDA backend too).
// MemoryStats, the counter that stats() hands out, is defined here, in the contract, for every backend: neither
// backend's directory includes the other's (ctest layering.backend_cuda, layering.backend_cpu).
#pragma once

#include <atomic>
#include <cstddef>

#include "../config/backend.hpp"

namespace moonmoe::backend {

template <class B>
inline constexpr bool missing_backend = false;

/// What Memory<B>::allocate leaves in a new block: zeros, or whatever was there (the caller overwrites it all).
enum class Init { zeroed, overwritten };

/// Bytes held by a backend's live tensors (their requested sizes), and the most held at once since reset_peak().
struct MemoryStats {
    std::atomic<std::size_t> current{0}, peak{0};

    void add(std::size_t bytes) {
        const std::size_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
        std::size_t seen = peak.load(std::memory_order_relaxed);
        while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
    }
    void remove(std::size_t bytes) { current.fetch_sub(bytes, std::memory_order_relaxed); }
    void reset_peak() { peak.store(current.load(std::memory_order_relaxed), std::memory_order_relaxed); }
};

template <class B>
struct Memory {
    static_assert(missing_backend<B>,
                  "moonmoe: no memory primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// Whether host code may read and write the backend's memory through plain pointers.
template <class B>
inline constexpr bool host_visible = B::kind == BackendKind::cpu;

/// Whether the backend's tensors are in host memory at run time (Memory<B>::in_host_memory): the CPU backend's and
/// the emulated CUDA backend's are, the CUDA backend's on a GPU are not. It decides which communicators can move
/// them (parallel/comm.hpp, Communicator::device_memory). Module code still indexes only host_visible backends.
template <class B>
inline constexpr bool in_host_memory = Memory<B>::in_host_memory;

}  // namespace moonmoe::backend
