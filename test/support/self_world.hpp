// A world of one process for the parallel runtime's code paths without MPI: every group is itself, collectives copy
// or do nothing, and there is no one to send to (a one-stage pipeline sends nothing; a one-rank expert group runs
// an MoE layer through parallel::ExpertParallelDispatcher, with the caches of EP > 1). It moves the memory of the
// backend it is made for, self_world<B>(): device memory for the CUDA backend on a GPU (copies by cudaMemcpy, which
// takes either kind), host memory otherwise.
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include <moonmoe/parallel/comm.hpp>
#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace moonmoe::testing {

/// Rank 0 of 1 in every group.
class SelfWorld final : public parallel::Communicator {
public:
    explicit SelfWorld(std::string name = "self", bool device = false) : name_(std::move(name)), device_(device) {}
    bool device_memory() const override { return device_; }
    int rank() const override { return 0; }
    int size() const override { return 1; }
    std::string name() const override { return name_; }
    std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(1000); }
    void set_timeout(std::chrono::milliseconds) override {}
    void barrier() override {}
    std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
        return std::make_unique<SelfWorld>(name, device_);
    }

protected:
    static std::size_t width(parallel::Element e) {
        using parallel::Element;
        return e == Element::f64 || e == Element::i64 ? 8 : e == Element::f32 ? 4 : e == Element::bf16 ? 2 : 1;
    }
    static void copy(void* to, const void* from, index_t n, parallel::Element e) {
        if (n <= 0 || to == from) return;
#if defined(__CUDACC__)
        // the backend queues its work on its own stream: wait for it, copy (host or device, by address), wait again
        if (cudaDeviceSynchronize() != cudaSuccess ||
            cudaMemcpy(to, from, std::size_t(n) * width(e), cudaMemcpyDefault) != cudaSuccess ||
            cudaDeviceSynchronize() != cudaSuccess)
            throw std::runtime_error("SelfWorld: a copy of " + std::to_string(n) + " elements failed");
#else
        std::memcpy(to, from, std::size_t(n) * width(e));
#endif
    }
    void all_to_all_v_bytes(const void* send, std::span<const index_t> counts, void* recv, std::span<const index_t>,
                            parallel::Element e) override {
        copy(recv, send, counts[0], e);
    }
    void all_reduce_bytes(void*, index_t, parallel::Element, parallel::ReduceOp) override {}
    void reduce_scatter_bytes(const void* in, void* out, index_t n, parallel::Element e, parallel::ReduceOp) override {
        copy(out, in, n, e);
    }
    void reduce_scatter_v_bytes(const void* in, void* out, std::span<const index_t> counts, parallel::Element e,
                                parallel::ReduceOp) override {
        copy(out, in, counts[0], e);
    }
    void all_gather_v_bytes(const void* in, index_t n, void* out, std::span<const index_t>,
                            parallel::Element e) override {
        copy(out, in, n, e);
    }
    std::unique_ptr<parallel::Request> isend_bytes(const void*, index_t, parallel::Element, int, int) override {
        throw std::logic_error("self: isend (a one-stage pipeline sends nothing)");
    }
    std::unique_ptr<parallel::Request> irecv_bytes(void*, index_t, parallel::Element, int, int) override {
        throw std::logic_error("self: irecv (a one-stage pipeline receives nothing)");
    }

private:
    std::string name_;
    bool device_ = false;
};

/// The world of one process that moves backend B's tensors (Communicator::device_memory, parallel::check_moves).
template <class B>
SelfWorld self_world(std::string name = "self") {
    return SelfWorld(std::move(name), !backend::in_host_memory<B>);
}

}  // namespace moonmoe::testing
