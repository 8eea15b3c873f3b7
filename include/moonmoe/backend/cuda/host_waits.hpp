// moonmoe/backend/cuda/host_waits.hpp: where the CUDA backend makes the host wait for the device, counted, and the
// staging ring that lets small uploads go without a wait. Included by cuda/memory.hpp, which uses both.
//
// A host wait stalls the queue: while the host waits, no kernel is queued behind the one running, so the device idles
// between the wait's end and the next launch, and a stream with waits cannot be captured as a CUDA graph. The
// backend counts every wait it makes (cuda_host_waits()), the same way in both modes, so a test holds the line on
// the emulated build:
//   Memory<cuda>::to_host      always one (the values must be there when it returns)
//   Memory<cuda>::to_device    none up to staging_largest bytes (the ring below), else one (the copy is waited for)
//   Memory<cuda>::trim         one (a device-wide wait), and Stream::synchronize, one
//   the ring itself            one when the region it reuses is still being copied (on a GPU; never emulated)
//
// The ring (nvcc): one pinned host buffer of staging_capacity bytes per thread. An upload copies its bytes into
// the next free region, queues cudaMemcpyAsync from there on the current stream (pinned: a true DMA, the host does
// not wait) and records an event behind it; a region is reused only after its event has completed, waited for then
// if it has not (rare: the device is more than a ring's worth of uploads behind). Regions are handed out in order
// around the ring, so the regions in flight, oldest first, are those from the write position on: reuse retires them
// from the front of a queue.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "error.hpp"
#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <cstring>
#include <deque>
#include <vector>
#endif

namespace moonmoe::backend {

namespace cuda_detail {

inline std::atomic<std::uint64_t> host_wait_count{0};

/// What this thread is capturing into a graph (cuda/graph.hpp), or null.
inline thread_local const char* capturing = nullptr;

/// Throws where a capture is under way: `what` cannot be part of a graph.
inline void refuse_in_capture(const char* what) {
    if (capturing)
        throw std::logic_error(std::string("moonmoe: ") + what + " inside the capture of " + capturing +
                               ": a CUDA graph holds device work only (keep host waits and uploads outside the "
                               "captured work; values that change go to the device before StepGraph::run)");
}

/// Records one host wait for the device (refused inside a capture).
inline void count_host_wait() {
    refuse_in_capture("a host wait");
    host_wait_count.fetch_add(1, std::memory_order_relaxed);
}

/// The pinned staging ring's size per thread, and the largest upload it takes (a larger one is waited for).
inline constexpr std::size_t staging_capacity = std::size_t(16) << 20;
inline constexpr std::size_t staging_largest = staging_capacity / 4;

#if defined(__CUDACC__)
/// One thread's staging ring (the file comment says how regions are reused).
class UploadRing {
public:
    static constexpr std::size_t granule = 256;  // regions start on 256-byte boundaries (DMA-friendly)

    UploadRing() = default;
    UploadRing(const UploadRing&) = delete;
    UploadRing& operator=(const UploadRing&) = delete;
    /// At thread exit: not checked (the context may be gone at process exit, and there is no one left to tell).
    ~UploadRing() {
        for (const Region& r : in_flight_) cudaEventDestroy(r.copied);
        for (cudaEvent_t e : spare_) cudaEventDestroy(e);
        if (pinned_) cudaFreeHost(pinned_);
    }

    /// Queues a copy of `bytes` host bytes at `src` to device `dst` on `stream` through the ring; `src` may be reused
    /// when this returns. False, with nothing queued, when bytes > staging_largest.
    bool upload(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) {
        if (bytes > staging_largest) return false;
        if (!pinned_) MOONMOE_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&pinned_), staging_capacity, 0));
        const std::size_t size = (bytes + granule - 1) / granule * granule;
        if (head_ + size > staging_capacity) {  // wrap: the last lap's regions past head_ go first
            while (!in_flight_.empty() && in_flight_.front().begin >= head_) retire_front();
            head_ = 0;
        }
        while (!in_flight_.empty() && in_flight_.front().begin >= head_ && in_flight_.front().begin < head_ + size)
            retire_front();
        std::memcpy(pinned_ + head_, src, bytes);
        MOONMOE_CUDA_CHECK(cudaMemcpyAsync(dst, pinned_ + head_, bytes, cudaMemcpyHostToDevice, stream));
        cudaEvent_t copied = take_event();
        MOONMOE_CUDA_CHECK(cudaEventRecord(copied, stream));
        in_flight_.push_back({head_, copied});
        head_ += size;
        return true;
    }

private:
    struct Region {
        std::size_t begin;
        cudaEvent_t copied;
    };

    cudaEvent_t take_event() {
        if (!spare_.empty()) {
            const cudaEvent_t e = spare_.back();
            spare_.pop_back();
            return e;
        }
        cudaEvent_t e = nullptr;
        MOONMOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        return e;
    }

    /// The oldest region's copy has completed (waited for if not yet, and counted then); its event is kept for reuse.
    void retire_front() {
        const cudaEvent_t e = in_flight_.front().copied;
        const cudaError_t state = cudaEventQuery(e);
        if (state == cudaErrorNotReady) {
            count_host_wait();
            MOONMOE_CUDA_CHECK(cudaEventSynchronize(e));
        } else {
            MOONMOE_CUDA_CHECK(state);
        }
        in_flight_.pop_front();
        spare_.push_back(e);
    }

    std::byte* pinned_ = nullptr;
    std::size_t head_ = 0;  // where the next region starts
    std::deque<Region> in_flight_;
    std::vector<cudaEvent_t> spare_;
};

inline UploadRing& upload_ring() {
    thread_local UploadRing ring;
    return ring;
}
#endif

}  // namespace cuda_detail

/// How many times the CUDA backend has made the host wait for the device in this process (the file comment lists
/// where); the difference across a piece of work is its waits.
inline std::uint64_t cuda_host_waits() { return cuda_detail::host_wait_count.load(std::memory_order_relaxed); }

}  // namespace moonmoe::backend
