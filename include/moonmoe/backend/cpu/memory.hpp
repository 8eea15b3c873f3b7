// moonmoe/backend/cpu/memory.hpp: host memory for Backend<cpu>: zeroed, 64-byte aligned (one cache line, one zmm).
//
// Large blocks come straight from mmap: the kernel hands out zero pages on first touch, so a 10 GB layer costs no
// up-front memset and its pages are faulted in by the (parallel) code that first writes them. Small blocks come
// from aligned_alloc and are cleared. A 64-byte header in front of each block records which it was.
// MemoryStats counts the bytes of live tensors (current and peak), for benchmarks and memory reports.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "../backend.hpp"

namespace moonmoe::backend {

/// Bytes held by live CPU tensors (their requested sizes), and the most held at once since reset_peak().
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

template <>
struct Memory<cpu> {
    static constexpr std::size_t alignment = 64;
    static constexpr std::size_t mmap_threshold = std::size_t(4) << 20;  ///< 4 MiB

    static void* allocate(std::size_t bytes) {
        if (bytes == 0) return nullptr;
        const std::size_t total = alignment + (bytes + alignment - 1) / alignment * alignment;
        std::byte* base;
        if (total >= mmap_threshold) {
            void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            base = static_cast<std::byte*>(p);
        } else {
            base = static_cast<std::byte*>(std::aligned_alloc(alignment, total));
            if (!base) throw std::bad_alloc();
            std::memset(base, 0, total);
        }
        auto* header = reinterpret_cast<std::size_t*>(base);
        header[0] = total;
        stats().add(total - alignment);
        return base + alignment;
    }
    static void release(void* p) {
        if (!p) return;
        std::byte* base = static_cast<std::byte*>(p) - alignment;
        const std::size_t total = reinterpret_cast<std::size_t*>(base)[0];
        stats().remove(total - alignment);
        if (total >= mmap_threshold) munmap(base, total);
        else std::free(base);
    }
    static MemoryStats& stats() {
        static MemoryStats s;
        return s;
    }
    static void copy(void* dst, const void* src, std::size_t bytes) {
        if (bytes) std::memcpy(dst, src, bytes);
    }
    static void fill_zero(void* p, std::size_t bytes) {
        if (bytes) std::memset(p, 0, bytes);
    }
};

}  // namespace moonmoe::backend
