// moonmoe/backend/cpu/memory.hpp: host memory for Backend<cpu>: zeroed (unless asked for Init::overwritten), 64-byte
// aligned (one cache line, one zmm).
//
// Large blocks (>= 4 MiB) come from mmap, in whole 2 MiB units with transparent huge pages requested: the kernel
// hands out zero pages on first touch, so a 10 GB layer costs no up-front memset and its pages are faulted in by
// the (parallel) code that first writes them. Medium blocks (64 KiB to 4 MiB) come from aligned_alloc in whole
// 4 KiB pages, small ones from aligned_alloc as they are, cleared with memset. Released large and medium blocks are
// kept in a cache (up to 4 GiB by default, set_cache_limit, trim) and handed out again, cleared with memset (on the
// pool's threads from 4 MiB), to the next request of about their size: a training step allocates the same activations
// every time, and faulting in fresh pages costs several times a memset (measured: page faults and clearing took a third
// of an MoE backward before the cache of large blocks; with medium blocks left to malloc, which returns them to the
// system, a small layer's forward spent a fifth of its time in page faults, and two threads faulting at once were no
// faster than one). A 64-byte header in front of each block records its allocated and requested sizes. stats() counts
// the bytes of live tensors (current and peak; MemoryStats, backend/memory.hpp), for benchmarks and memory reports.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>

#include "../memory.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {

inline constexpr std::size_t mmap_threshold = std::size_t(4) << 20;     ///< 4 MiB: from here on, blocks are mmap'ed
inline constexpr std::size_t mmap_unit = std::size_t(2) << 20;          ///< one huge page
inline constexpr std::size_t cached_threshold = std::size_t(64) << 10;  ///< 64 KiB: from here on, blocks are cached
inline constexpr std::size_t page = std::size_t(4) << 10;

/// Gives a block of `total` bytes back to where it came from (mmap or aligned_alloc, by its size).
inline void return_block(void* base, std::size_t total) {
    if (total >= mmap_threshold) munmap(base, total);
    else
        std::free(base);
}

/// Zeroes a reused block: large ones in 1 MiB pieces on the pool (one core's memset leaves the other cores'
/// bandwidth idle: a bf16 decode step at two threads spent a tenth of its time clearing its scratch on one).
inline void clear_block(void* p, std::size_t bytes) {
    constexpr std::size_t piece = std::size_t(1) << 20;
    if (bytes < mmap_threshold) {
        std::memset(p, 0, bytes);
        return;
    }
    parallel_for(index_t((bytes + piece - 1) / piece), [&](index_t i) {
        const std::size_t from = std::size_t(i) * piece;
        std::memset(static_cast<std::byte*>(p) + from, 0, std::min(piece, bytes - from));
    });
}

/// Released blocks by size, reused for requests of between 80% and 100% of a block's size.
class BlockCache {
public:
    void* take(std::size_t total) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = blocks_.lower_bound(total);
        if (it == blocks_.end() || it->first - total > it->first / 5) return nullptr;
        void* base = it->second;
        held_ -= it->first;
        blocks_.erase(it);
        return base;
    }
    bool keep(void* base, std::size_t total) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (held_ + total > limit_) return false;
        blocks_.emplace(total, base);
        held_ += total;
        return true;
    }
    /// Returns every cached block to the system; with `limit`, also sets how much may be kept from now on.
    void release_all(std::optional<std::size_t> limit = {}) {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& [size, base] : blocks_) return_block(base, size);
        blocks_.clear();
        held_ = 0;
        if (limit) limit_ = *limit;
    }
    std::size_t held() {
        std::lock_guard<std::mutex> lock(mutex_);
        return held_;
    }

private:
    std::mutex mutex_;
    std::multimap<std::size_t, void*> blocks_;
    std::size_t held_ = 0, limit_ = std::size_t(4) << 30;
};

}  // namespace cpu_detail

template <>
struct Memory<cpu> {
    static constexpr std::size_t alignment = 64;
    static constexpr bool in_host_memory = true;

    static void* allocate(std::size_t bytes, Init init = Init::zeroed) {
        using namespace cpu_detail;
        if (bytes == 0) return nullptr;
        std::size_t total = alignment + (bytes + alignment - 1) / alignment * alignment;
        const auto round_up = [&](std::size_t unit) { total = (total + unit - 1) / unit * unit; };
        if (total >= mmap_threshold) round_up(mmap_unit);
        else if (total >= cached_threshold)
            round_up(page);
        std::byte* base = total >= cached_threshold ? static_cast<std::byte*>(cache().take(total)) : nullptr;
        if (base) {  // a released block of about this size (maybe mapped, maybe not: its header says how large)
            total = reinterpret_cast<std::size_t*>(base)[0];
            if (init == Init::zeroed) clear_block(base + alignment, bytes);
        } else if (total >= mmap_threshold) {
            void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
            madvise(p, total, MADV_HUGEPAGE);  // advice only: fewer faults and TLB misses where THP is on
#endif
            base = static_cast<std::byte*>(p);
        } else {
            base = static_cast<std::byte*>(std::aligned_alloc(alignment, total));
            if (!base) throw std::bad_alloc();
            std::memset(base, 0, init == Init::zeroed ? alignment + bytes : alignment);
        }
        auto* header = reinterpret_cast<std::size_t*>(base);
        header[0] = total;
        header[1] = bytes;
        stats().add(bytes);
        return base + alignment;
    }
    static void release(void* p) {
        if (!p) return;
        std::byte* base = static_cast<std::byte*>(p) - alignment;
        const auto* header = reinterpret_cast<const std::size_t*>(base);
        const std::size_t total = header[0];
        stats().remove(header[1]);
        if (total < cpu_detail::cached_threshold || !cache().keep(base, total)) cpu_detail::return_block(base, total);
    }

    /// The most bytes of released large and medium blocks kept for reuse (default 4 GiB; 0 turns the cache off).
    static void set_cache_limit(std::size_t bytes) { cache().release_all(bytes); }
    /// Returns every cached block to the system.
    static void trim() { cache().release_all(); }
    static std::size_t cached_bytes() { return cache().held(); }

    static cpu_detail::BlockCache& cache() {
        static auto* c = new cpu_detail::BlockCache;  // never destroyed: tensors with static storage may outlive
        return *c;                                    // any other static; the system reclaims the blocks at exit
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
    /// The host and the CPU backend share memory: the crossings are copies.
    static void to_host(void* host_dst, const void* src, std::size_t bytes) { copy(host_dst, src, bytes); }
    static void to_device(void* dst, const void* host_src, std::size_t bytes) { copy(dst, host_src, bytes); }
};

}  // namespace moonmoe::backend
