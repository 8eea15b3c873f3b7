// header-check: nvcc-only
// moonmoe/parallel/nccl.hpp: the Communicator (parallel/comm.hpp) over NCCL, for device memory (the CUDA
// backend). Operations are queued on the calling thread's current stream (backend/cuda/memory.hpp) and waited on
// with a deadline: an event recorded after them is polled (cudaEventQuery) together with ncclCommGetAsyncError until
// it completes or timeout() passes; then the communicator is aborted (ncclCommAbort) and comm_error thrown.
//
//   parallel::MpiSession mpi(argc, argv);                 MPI starts the processes and carries NCCL's unique id
//   auto world = parallel::NcclCommunicator::from(*mpi.world(), device);
//
// all-to-all-v is a group of ncclSend / ncclRecv (blocks with no elements are skipped on both sides, which both
// know from the counts); all-gather-v the same, the other collectives NCCL's own. isend / irecv are single NCCL
// operations on the stream, matched by order (NCCL has no tags): a rank that sends and receives at once (a ring)
// posts them between group_start() and group_end() (ncclGroupStart / ncclGroupEnd), or uses all_to_all_v, which
// groups them. exchange_counts and
// host_all_to_all_v stage their host arrays through the device. Compiled in CI by nvcc; run by tools/gpu_check.sh
// (one GPU: NCCL with one rank per process still exercises every call).
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "../backend/cuda.hpp"
#include "comm.hpp"

namespace moonmoe::parallel {

namespace nccl_detail {

inline ncclDataType_t datatype(Element e) {
    switch (e) {
    case Element::f32: return ncclFloat32;
    case Element::f64: return ncclFloat64;
    case Element::i64: return ncclInt64;
    case Element::bf16: return ncclBfloat16;
    case Element::byte: return ncclUint8;
    }
    return ncclUint8;
}

inline std::size_t bytes_of(Element e) {
    switch (e) {
    case Element::f32: return 4;
    case Element::f64: case Element::i64: return 8;
    case Element::bf16: return 2;
    case Element::byte: return 1;
    }
    return 1;
}

}  // namespace nccl_detail

class NcclCommunicator : public Communicator {
public:
    /// Takes ownership of `comm` (destroyed with this object).
    NcclCommunicator(ncclComm_t comm, std::string name) : comm_(comm), name_(std::move(name)) {
        check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
        check(ncclCommCount(comm_, &size_), "ncclCommCount");
        MOONMOE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    ~NcclCommunicator() override {
        cudaEventDestroy(done_);
        if (comm_) ncclCommDestroy(comm_);
    }
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    /// The NCCL communicator of the processes of `bootstrap` (an MPI one), on CUDA device `device`: rank 0's unique
    /// id travels through `bootstrap`.
    static std::unique_ptr<NcclCommunicator> from(Communicator& bootstrap, int device, const std::string& name = "world") {
        MOONMOE_CUDA_CHECK(cudaSetDevice(device));
        ncclUniqueId id{};
        if (bootstrap.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess)
            throw comm_error(bootstrap.where("ncclGetUniqueId") + ": failed");
        std::vector<std::byte> all(sizeof(id) * std::size_t(bootstrap.size()));
        bootstrap.all_gather(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&id), sizeof(id)),
                             std::span<std::byte>(all));
        std::memcpy(&id, all.data(), sizeof(id));  // rank 0's
        ncclComm_t comm = nullptr;
        const ncclResult_t r = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank());
        if (r != ncclSuccess)
            throw comm_error(bootstrap.where("ncclCommInitRank") + ": " + ncclGetErrorString(r));
        return std::make_unique<NcclCommunicator>(comm, name);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return name_; }
    std::chrono::milliseconds timeout() const override { return timeout_; }
    void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }
    bool device_memory() const override { return true; }

    void group_start() override { check(ncclGroupStart(), "group_start"); }
    void group_end() override { check(ncclGroupEnd(), "group_end"); }

    void barrier() override {
        Tensor<float, 1, cuda> one({1});
        all_reduce_bytes(one.data(), 1, Element::f32, ReduceOp::sum);
    }

    std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
        ncclComm_t sub = nullptr;
        check(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
        auto c = std::make_unique<NcclCommunicator>(sub, name);
        c->set_timeout(timeout_);
        return c;
    }

    void check(ncclResult_t r, const std::string& op) const {
        if (r != ncclSuccess) throw comm_error(where(op) + ": NCCL error: " + ncclGetErrorString(r));
    }

    /// Waits for everything queued on the current stream so far, or aborts the communicator and throws.
    void wait(const std::string& op) {
        MOONMOE_CUDA_CHECK(cudaEventRecord(done_, backend::current_stream()));
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (int spins = 0;; ++spins) {
            const cudaError_t q = cudaEventQuery(done_);
            if (q == cudaSuccess) return;
            if (q != cudaErrorNotReady) MOONMOE_CUDA_CHECK(q);
            ncclResult_t async = ncclSuccess;
            check(ncclCommGetAsyncError(comm_, &async), op);
            if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
                ncclCommAbort(comm_);
                comm_ = nullptr;
                throw comm_error(where(op) + (async != ncclSuccess
                                                  ? ": NCCL error: " + std::string(ncclGetErrorString(async))
                                                  : ": not complete after " + std::to_string(timeout_.count()) +
                                                        " ms: a rank has died or stopped, or the ranks issued "
                                                        "different sequences of collectives") +
                                 "; the communicator was aborted");
            }
            if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

protected:
    void all_to_all_v_bytes(const void* send, std::span<const index_t> send_counts, void* recv,
                            std::span<const index_t> recv_counts, Element e) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        const ncclDataType_t t = nccl_detail::datatype(e);
        const auto stream = backend::current_stream();
        std::size_t s_at = 0, r_at = 0;
        check(ncclGroupStart(), "all_to_all_v");
        for (int peer = 0; peer < size_; ++peer) {
            const auto sc = std::size_t(send_counts[std::size_t(peer)]), rc = std::size_t(recv_counts[std::size_t(peer)]);
            if (sc) check(ncclSend(static_cast<const char*>(send) + s_at * w, sc, t, peer, comm_, stream), "all_to_all_v");
            if (rc) check(ncclRecv(static_cast<char*>(recv) + r_at * w, rc, t, peer, comm_, stream), "all_to_all_v");
            s_at += sc, r_at += rc;
        }
        check(ncclGroupEnd(), "all_to_all_v");
        wait("all_to_all_v");
    }
    void host_all_to_all_v_bytes(const void* send, std::span<const index_t> send_counts, void* recv,
                                 std::span<const index_t> recv_counts, Element e) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        index_t ns = 0, nr = 0;
        for (index_t c : send_counts) ns += c;
        for (index_t c : recv_counts) nr += c;
        Tensor<std::byte, 1, cuda> s({index_t(std::size_t(ns) * w)}), r({index_t(std::size_t(nr) * w)});
        if (ns) backend::Memory<cuda>::to_device(s.data(), send, std::size_t(ns) * w);
        all_to_all_v_bytes(s.data(), send_counts, r.data(), recv_counts, e);
        if (nr) backend::Memory<cuda>::to_host(recv, r.data(), std::size_t(nr) * w);
    }
    void all_reduce_bytes(void* data, index_t n, Element e, ReduceOp o) override {
        check(ncclAllReduce(data, data, std::size_t(n), nccl_detail::datatype(e), o == ReduceOp::sum ? ncclSum : ncclMax,
                            comm_, backend::current_stream()),
              "all_reduce");
        wait("all_reduce");
    }
    void reduce_scatter_bytes(const void* in, void* out, index_t n, Element e, ReduceOp o) override {
        check(ncclReduceScatter(in, out, std::size_t(n), nccl_detail::datatype(e), o == ReduceOp::sum ? ncclSum : ncclMax,
                                comm_, backend::current_stream()),
              "reduce_scatter");
        wait("reduce_scatter");
    }
    /// A group of ncclReduce calls, one per rank as the root of its block (NCCL has no reduce-scatter-v).
    void reduce_scatter_v_bytes(const void* in, void* out, std::span<const index_t> counts, Element e,
                                ReduceOp o) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        const ncclDataType_t t = nccl_detail::datatype(e);
        const auto stream = backend::current_stream();
        std::size_t at = 0;
        check(ncclGroupStart(), "reduce_scatter_v");
        for (int root = 0; root < size_; ++root) {
            const auto c = std::size_t(counts[std::size_t(root)]);
            if (c) check(ncclReduce(static_cast<const char*>(in) + at * w, out, c, t, o == ReduceOp::sum ? ncclSum : ncclMax,
                                    root, comm_, stream),
                         "reduce_scatter_v");
            at += c;
        }
        check(ncclGroupEnd(), "reduce_scatter_v");
        wait("reduce_scatter_v");
    }
    void all_gather_v_bytes(const void* in, index_t n, void* out, std::span<const index_t> counts, Element e) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        const ncclDataType_t t = nccl_detail::datatype(e);
        const auto stream = backend::current_stream();
        std::size_t at = 0;
        check(ncclGroupStart(), "all_gather_v");
        for (int peer = 0; peer < size_; ++peer) {
            const auto c = std::size_t(counts[std::size_t(peer)]);
            if (n) check(ncclSend(in, std::size_t(n), t, peer, comm_, stream), "all_gather_v");
            if (c) check(ncclRecv(static_cast<char*>(out) + at * w, c, t, peer, comm_, stream), "all_gather_v");
            at += c;
        }
        check(ncclGroupEnd(), "all_gather_v");
        wait("all_gather_v");
    }
    std::unique_ptr<Request> isend_bytes(const void* data, index_t n, Element e, int dest, int tag) override {
        (void)tag;  // NCCL matches sends and receives by order, not by tag: post them in one global order
        check(ncclSend(data, std::size_t(n), nccl_detail::datatype(e), dest, comm_, backend::current_stream()), "isend");
        return std::make_unique<Queued>(*this, "send to rank " + std::to_string(dest));
    }
    std::unique_ptr<Request> irecv_bytes(void* data, index_t n, Element e, int source, int tag) override {
        (void)tag;
        check(ncclRecv(data, std::size_t(n), nccl_detail::datatype(e), source, comm_, backend::current_stream()), "irecv");
        return std::make_unique<Queued>(*this, "receive from rank " + std::to_string(source));
    }

private:
    /// A send or receive queued on the stream: waiting on it waits for the stream.
    struct Queued : Request {
        NcclCommunicator& comm;
        std::string op;
        Queued(NcclCommunicator& c, std::string o) : comm(c), op(std::move(o)) {}
        void wait() override { comm.wait(op); }
    };

    ncclComm_t comm_ = nullptr;
    std::string name_;
    int rank_ = 0, size_ = 1;
    cudaEvent_t done_{};
    std::chrono::milliseconds timeout_{std::chrono::seconds(120)};
};

}  // namespace moonmoe::parallel
