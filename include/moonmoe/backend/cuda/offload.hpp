// moonmoe/backend/cuda/offload.hpp: activation offload to host memory (Kimi K2 technical report, §2.4.3 "Activation
// CPU offload"): a tensor's bytes move to a pinned host buffer and back on a copy stream of their own, ordered
// against the compute stream by events, so the copies run while the compute queued meanwhile runs.
//
//   HostOffload off;
//   auto ticket = off.offload(std::move(t));  // D2H on the copy stream, after the compute queued so far; the
//                                              // device block goes back to the pool once copied (stream-ordered)
//   ...                                        // compute that does not need t
//   off.prefetch(ticket);                      // H2D on the copy stream into a fresh device block
//   ...                                        // compute meanwhile
//   Tensor<float, 2, cuda> t2 = off.take(ticket);  // the compute stream waits for the H2D; t2 holds t's bytes
//
// Host buffers are page-locked (cudaMallocHost: the copies are DMA, asynchronous to the host) and reused by size,
// so a training step that offloads the same activations every time allocates them once. The emulated backend
// copies synchronously into ordinary host memory: the same results, nothing overlapped. The CPU backend has no
// offload (its activations already live in host memory): models that ask for it there are refused.
// OffloadOps<cuda> (backend/offload.hpp) names HostOffload as the backend's mover, for nn/offload.hpp.
#pragma once

#include "../offload.hpp"
#include "memory.hpp"

#if defined(MOONMOE_CUDA_EMULATED)

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "../../tensor/tensor.hpp"

namespace moonmoe::backend {

namespace cuda_detail {

/// A CUDA event that orders one stream after work on another (the emulation: nothing to order).
class Event {
public:
    Event() {
#if !MOONMOE_CUDA_EMULATED
        MOONMOE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
#endif
    }
    ~Event() {
#if !MOONMOE_CUDA_EMULATED
        MOONMOE_CUDA_NOTE(cudaEventDestroy(event_));
#endif
    }
    Event(const Event&) = delete;
    Event& operator=(const Event&) = delete;
    /// Marks the work queued so far on `s`.
    void record([[maybe_unused]] cuda_stream_t s) {
#if !MOONMOE_CUDA_EMULATED
        MOONMOE_CUDA_CHECK(cudaEventRecord(event_, s));
#endif
    }
    /// Work queued on `s` from now on waits for the recorded work.
    void wait_on([[maybe_unused]] cuda_stream_t s) const {
#if !MOONMOE_CUDA_EMULATED
        MOONMOE_CUDA_CHECK(cudaStreamWaitEvent(s, event_, 0));
#endif
    }

private:
#if !MOONMOE_CUDA_EMULATED
    cudaEvent_t event_{};
#endif
};

/// Page-locked host buffers, reused by size. The pool frees every buffer it made, also those of tickets never
/// taken back (an exception unwinding through a forward): a ticket's buffer is only usable through its HostOffload.
class PinnedPool {
public:
    PinnedPool() = default;
    PinnedPool(const PinnedPool&) = delete;
    PinnedPool& operator=(const PinnedPool&) = delete;
    ~PinnedPool() {
        for (void* p : made_) release(p);
    }
    void* take(std::size_t bytes) {
        if (const auto it = free_.find(bytes); it != free_.end()) {
            void* p = it->second;
            free_.erase(it);
            return p;
        }
        if (made_.size() == made_.capacity()) made_.reserve(2 * made_.size() + 8);
        void* p = nullptr;
#if MOONMOE_CUDA_EMULATED
        p = std::malloc(bytes);
        if (!p) throw std::bad_alloc();
#else
        MOONMOE_CUDA_CHECK(cudaMallocHost(&p, bytes));
#endif
        made_.push_back(p);  // room reserved above: cannot throw and lose p
        held_ += bytes;
        return p;
    }
    void give_back(void* p, std::size_t bytes) { free_.emplace(bytes, p); }
    /// Pinned bytes allocated (in use or free for reuse).
    std::size_t held() const { return held_; }

private:
    static void release(void* p) noexcept {
#if MOONMOE_CUDA_EMULATED
        std::free(p);
#else
        MOONMOE_CUDA_NOTE(cudaFreeHost(p));  // from the destructor: a failure waits for the next checked call
#endif
    }
    std::multimap<std::size_t, void*> free_;
    std::vector<void*> made_;
    std::size_t held_ = 0;
};

}  // namespace cuda_detail

/// Moves tensors of the CUDA backend to pinned host memory and back (see the header comment). One object per
/// thread of compute: its copy stream serialises its copies, which is what lets a host buffer be reused as soon as
/// its tensor is taken back.
class HostOffload {
public:
    /// One offloaded tensor: its bytes in a pinned buffer until prefetch() / take() bring them back.
    template <class T, int R>
    class Ticket {
    public:
        Ticket() = default;
        bool empty() const { return host_ == nullptr && device_.empty(); }
        const Shape<R>& shape() const { return shape_; }

    private:
        friend class HostOffload;
        Shape<R> shape_{};
        std::size_t bytes_ = 0;
        void* host_ = nullptr;
        Tensor<T, R, cuda> device_;  ///< after prefetch(), until take()
        std::unique_ptr<cuda_detail::Event> copied_in_;
    };

    HostOffload() = default;
    /// Waits for the queued copies before the pinned buffers are freed; a failure (a broken context: nothing left
    /// to wait for) is recorded for the next checked call, as a destructor cannot throw.
    ~HostOffload() {
#if !MOONMOE_CUDA_EMULATED
        MOONMOE_CUDA_NOTE(cudaStreamSynchronize(copy_.get()));
#endif
    }
    HostOffload(const HostOffload&) = delete;
    HostOffload& operator=(const HostOffload&) = delete;

    /// Queues t's bytes to a pinned buffer after the work queued so far on the current stream, and releases its
    /// device block once they are copied. An empty tensor gives an empty ticket (take() gives it back empty).
    template <class T, int R>
    Ticket<T, R> offload(Tensor<T, R, cuda>&& t) {
        Ticket<T, R> k;
        k.shape_ = t.shape();
        k.bytes_ = t.bytes();
        if (k.bytes_ == 0) return k;
        k.host_ = pinned_.take(k.bytes_);
        ready_.record(current_stream());  // what produced t
        ready_.wait_on(copy_.get());
        const StreamGuard on_copy(copy_.get());
        Tensor<T, R, cuda> leaving =
            std::move(t);  // released before the guard ends: on the copy stream, after the copy
        copy_async(k.host_, leaving.data(), k.bytes_, /*to_host=*/true);
        offloaded_ += k.bytes_;
        return k;
    }

    /// Queues the bytes back into a fresh device tensor on the copy stream (nothing if already prefetched).
    template <class T, int R>
    void prefetch(Ticket<T, R>& k) {
        if (!k.host_) return;
        const StreamGuard on_copy(copy_.get());
        k.device_ = Tensor<T, R, cuda>(k.shape_);  // allocated (and zeroed) on the copy stream
        copy_async(k.device_.data(), k.host_, k.bytes_, /*to_host=*/false);
        k.copied_in_ = std::make_unique<cuda_detail::Event>();
        k.copied_in_->record(copy_.get());
        // the copy stream orders the next offload's D2H into this buffer after the H2D above
        pinned_.give_back(k.host_, k.bytes_);
        k.host_ = nullptr;
    }

    /// The tensor back on the device: the current stream waits for its H2D (queued now if prefetch() was not).
    template <class T, int R>
    Tensor<T, R, cuda> take(Ticket<T, R>& k) {
        prefetch(k);
        if (k.copied_in_) k.copied_in_->wait_on(current_stream());
        k.copied_in_.reset();
        return std::move(k.device_);
    }

    /// Forgets an offloaded tensor no one will take (a forward whose backward never ran): its host buffer goes back
    /// for reuse (later copies on the copy stream are ordered after the ones queued for it).
    template <class T, int R>
    void drop(Ticket<T, R>& k) {
        if (k.host_) pinned_.give_back(k.host_, k.bytes_);
        k.host_ = nullptr;
        if (k.copied_in_) k.copied_in_->wait_on(current_stream());  // the H2D into device_ before its release
        k.device_ = Tensor<T, R, cuda>{};
        k.copied_in_.reset();
    }

    /// Bytes offloaded since construction, and pinned host bytes held (in use or kept for reuse).
    std::size_t offloaded_bytes() const { return offloaded_; }
    std::size_t pinned_bytes() const { return pinned_.held(); }
    /// Waits for every queued copy.
    void synchronize() const { copy_.synchronize(); }

private:
    void copy_async(void* dst, const void* src, std::size_t bytes, [[maybe_unused]] bool to_host) {
#if MOONMOE_CUDA_EMULATED
        std::memcpy(dst, src, bytes);
#else
        MOONMOE_CUDA_CHECK(
            cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, copy_.get()));
#endif
    }

    Stream copy_;
    cuda_detail::Event ready_;
    cuda_detail::PinnedPool pinned_;
    std::size_t offloaded_ = 0;
};

template <>
struct OffloadOps<cuda> {
    static constexpr bool available = true;
    using type = HostOffload;
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
