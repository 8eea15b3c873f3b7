// header-check: nvcc-only
// moonmoe/parallel/nccl.hpp: the Communicator (parallel/comm.hpp) over NCCL, for device memory (the CUDA
// backend).
//
//   parallel::MpiSession mpi(argc, argv);                 MPI starts the processes and carries NCCL's unique id
//   auto world = parallel::NcclCommunicator::from(*mpi.world(), device);
//   auto one = parallel::NcclCommunicator::init(id, nranks, rank, "world", std::chrono::seconds(30));
//
// Communicators are non-blocking (ncclConfig_t::blocking = 0): NCCL then initialises them, and issues every
// operation, in a thread of its own, and a call may return ncclInProgress; the communicator may not be used again
// until ncclCommGetAsyncError stops saying so (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/
// communicators.html, "Fault Tolerance"). So initialisation, split and every operation's issue are waited on with a
// deadline (timeout(), 120 s unless set), and a rank that dies while the others initialise no longer hangs them.
//
// Streams. NCCL's thread would read cudaStreamPerThread as its own per-thread stream (NVIDIA/nccl#1976), so NCCL
// never sees the caller's stream: each communicator issues on a stream of its own, ordered after the work queued so
// far on the issuing stream (the thread's current one, backend/cuda/memory.hpp) and, once issued, with the issuing
// stream ordered after it. Each operation and each request gets an event of its own, recorded on that stream right
// after its issue, which wait() polls (cudaEventQuery) together with ncclCommGetAsyncError: a request can be waited
// on from any thread or under any StreamGuard, and two outstanding ones share nothing. Past timeout(), or on an NCCL
// error, the communicator is aborted (ncclCommAbort) and comm_error thrown.
//
// all-to-all-v is a group of ncclSend / ncclRecv (blocks with no elements are skipped on both sides, which both
// know from the counts); all-gather-v the same, the other collectives NCCL's own. isend / irecv are single NCCL
// operations, matched by order (NCCL has no tags): a rank that sends and receives at once (a ring) posts them
// between group_start() and group_end() (ncclGroupStart / ncclGroupEnd, per thread and across communicators, as
// NCCL's groups are), or uses all_to_all_v, which groups them. Requests posted in a group are issued, and their
// events recorded, at the outermost group_end(); collectives and split refuse to run inside a group.
// exchange_counts and host_all_to_all_v stage their host arrays through the device. Compiled in CI by nvcc; run by
// tools/gpu_check.sh (one GPU: NCCL with one rank per process still exercises every call).
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "../backend/cuda.hpp"
#include "comm.hpp"
#include "deadline.hpp"

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
    case Element::f64:
    case Element::i64: return 8;
    case Element::bf16: return 2;
    case Element::byte: return 1;
    }
    return 1;
}

inline ncclRedOp_t reduction(ReduceOp o) { return o == ReduceOp::sum ? ncclSum : ncclMax; }

inline std::string describe(ncclResult_t r) { return std::string("NCCL error: ") + ncclGetErrorString(r); }

/// A call's result or a communicator's state as progress (ncclInProgress: NCCL's thread is still at it).
inline Progress progress(ncclResult_t r) { return progress_of(r, ncclSuccess, ncclInProgress, describe); }

inline bool failed(ncclResult_t r) { return r != ncclSuccess && r != ncclInProgress; }

/// Communicator::where() for a communicator that does not exist yet.
inline std::string where(const std::string& op, const std::string& group, int rank, int size) {
    return op + " on " + group + " (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
}

/// ncclGroupStart, the NCCL calls `calls(call)` passes to `call`, and always ncclGroupEnd (a failed call leaves no
/// group open): the first failure, else ncclGroupEnd's result.
template <class Calls>
ncclResult_t grouped(Calls&& calls) {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    calls([&](ncclResult_t r) {
        if (first == ncclSuccess && r != ncclSuccess) first = r;
    });
    const ncclResult_t end = ncclGroupEnd();
    return first != ncclSuccess ? first : end;
}

/// One operation's or request's completion: its own event, recorded once on the communicator's stream right after
/// NCCL issued the work (by the thread that issued it: at once, or at the outermost group_end()).
struct Completion {
    enum State : int { unissued, recorded, failed };
    cudaEvent_t event{};
    std::atomic<int> state{unissued};
    std::string error;  ///< why it failed; written before state becomes failed
    const std::thread::id issuer = std::this_thread::get_id();

    Completion() { MOONMOE_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming)); }
    ~Completion() { MOONMOE_CUDA_NOTE(cudaEventDestroy(event)); }  // a failure waits for the next checked call
    Completion(const Completion&) = delete;
    Completion& operator=(const Completion&) = delete;
};

/// Waits (bounded) for a communicator that ncclCommInitRankConfig returned `r` for; aborts it and throws comm_error
/// when that failed, reports an error later, or does not complete within `timeout`.
inline void await_created(ncclComm_t comm, ncclResult_t r, const std::string& what, std::chrono::milliseconds timeout) {
    if (failed(r)) {
        if (comm) ncclCommAbort(comm);
        throw comm_error(what + ": " + describe(r));
    }
    await_progress(
        [&] {
            ncclResult_t state = ncclSuccess;
            const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
            return progress(q != ncclSuccess ? q : state);
        },
        [&] { ncclCommAbort(comm); }, timeout, what, "not every rank joined: one has died or has not called it");
}

}  // namespace nccl_detail

class NcclCommunicator : public Communicator {
public:
    static constexpr std::chrono::milliseconds default_timeout{120000};

    /// Takes ownership of `comm`, a communicator whose initialisation has completed (destroyed with this object).
    NcclCommunicator(ncclComm_t comm, std::string name, std::chrono::milliseconds timeout = default_timeout)
        : comm_(comm), name_(std::move(name)), timeout_(timeout) {
        check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
        check(ncclCommCount(comm_, &size_), "ncclCommCount");
        MOONMOE_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    }
    /// Finalizes (flushes this rank's operations), then destroys; aborts instead after an error or past timeout().
    ~NcclCommunicator() override {
        if (!aborted_) {
            try {
                if (nccl_detail::failed(ncclCommFinalize(comm_))) throw comm_error("ncclCommFinalize");
                await_progress([&] { return state("ncclCommFinalize"); }, [&] { abort(); }, timeout_,
                               where("ncclCommFinalize"), "a peer has not completed its side");
                ncclCommDestroy(comm_);
            } catch (...) {  // a destructor cannot report: abort is what is left
                abort();
            }
        }
        MOONMOE_CUDA_NOTE(cudaEventDestroy(ready_));
    }
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;

    /// The NCCL communicator of the processes of `bootstrap` (an MPI one), on CUDA device `device`: rank 0's unique
    /// id travels through `bootstrap`, then init().
    static std::unique_ptr<NcclCommunicator> from(Communicator& bootstrap, int device,
                                                  const std::string& name = "world",
                                                  std::chrono::milliseconds timeout = default_timeout) {
        MOONMOE_CUDA_CHECK(cudaSetDevice(device));
        ncclUniqueId id{};
        if (bootstrap.rank() == 0 && ncclGetUniqueId(&id) != ncclSuccess)
            throw comm_error(bootstrap.where("ncclGetUniqueId") + ": failed");
        std::vector<std::byte> all(sizeof(id) * std::size_t(bootstrap.size()));
        bootstrap.all_gather(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&id), sizeof(id)),
                             std::span<std::byte>(all));
        std::memcpy(&id, all.data(), sizeof(id));  // rank 0's
        return init(id, bootstrap.size(), bootstrap.rank(), name, timeout);
    }

    /// Rank `rank` of the `nranks` that call this with the same `id`, on the current CUDA device. Throws comm_error
    /// (the communicator aborted) when not every rank has joined within `timeout`, which becomes timeout().
    static std::unique_ptr<NcclCommunicator> init(const ncclUniqueId& id, int nranks, int rank,
                                                  const std::string& name = "world",
                                                  std::chrono::milliseconds timeout = default_timeout) {
        // NCCL allocates with plain cudaMalloc, which fails while the stream-ordered pool holds the free memory.
        backend::Memory<cuda>::trim();
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;  // fixed for the communicator's life: NCCL has no call that changes it afterwards
        ncclComm_t comm = nullptr;
        const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
        nccl_detail::await_created(comm, r, nccl_detail::where("ncclCommInitRankConfig", name, rank, nranks), timeout);
        return std::make_unique<NcclCommunicator>(comm, name, timeout);
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return name_; }
    std::chrono::milliseconds timeout() const override { return timeout_; }
    void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }
    bool device_memory() const override { return true; }

    void group_start() override {
        check(ncclGroupStart(), "group_start");
        ++group().depth;
    }
    /// The outermost one issues the group (every communicator's operations in it), then records each request's event.
    void group_end() override {
        Group& g = group();
        if (g.depth == 0) throw comm_error(where("group_end") + ": no group_start() open on this thread");
        const ncclResult_t r = ncclGroupEnd();
        if (--g.depth > 0) {
            if (nccl_detail::failed(r)) throw comm_error(where("group_end") + ": " + nccl_detail::describe(r));
            return;
        }
        std::vector<Pending> pending = std::move(g.pending);
        g.pending.clear();
        try {
            if (nccl_detail::failed(r)) throw comm_error(where("group_end") + ": " + nccl_detail::describe(r));
            for (std::size_t i = 0; i < pending.size(); ++i) {
                bool first = true;
                for (std::size_t j = 0; j < i; ++j) first = first && pending[j].comm != pending[i].comm;
                if (first) pending[i].comm->await_issued("group_end");
            }
            for (Pending& p : pending) p.comm->complete(*p.done, p.issuing);
        } catch (const std::exception& e) {  // no request of the group may then wait for a completion never recorded
            for (Pending& p : pending)
                if (p.done->state.load() == nccl_detail::Completion::unissued) {
                    p.done->error = e.what();
                    p.done->state.store(nccl_detail::Completion::failed, std::memory_order_release);
                }
            throw;
        }
    }

    void barrier() override {
        Tensor<float, 1, cuda> one({1});
        all_reduce_bytes(one.data(), 1, Element::f32, ReduceOp::sum);
    }

    /// The child inherits this communicator's mode (config nullptr): NCCL runs a split in the parent's mode anyway,
    /// polled on the parent, and refuses a group mixing blocking and non-blocking communicators.
    std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
        refuse_in_group("split");
        backend::Memory<cuda>::trim();  // as in init()
        ncclComm_t sub = nullptr;
        {
            std::lock_guard lock(mutex_);
            refuse_aborted("ncclCommSplit");
            const ncclResult_t r = ncclCommSplit(comm_, color, key, &sub, nullptr);
            if (nccl_detail::failed(r)) throw comm_error(where("ncclCommSplit") + ": " + nccl_detail::describe(r));
        }
        // NCCL publishes `sub` when its thread is done; aborting the parent also aborts the child's initialisation.
        await_progress([&] { return state("ncclCommSplit"); },
                       [&] {
                           abort();
                           if (sub) ncclCommAbort(sub);
                       },
                       timeout_, where("ncclCommSplit"), "not every rank called split, or one has died");
        if (!sub) throw comm_error(where("ncclCommSplit") + ": NCCL returned no communicator");
        nccl_detail::await_created(sub, ncclSuccess, where("ncclCommSplit"), timeout_);
        return std::make_unique<NcclCommunicator>(sub, name, timeout_);
    }

    void check(ncclResult_t r, const std::string& op) const {
        if (r != ncclSuccess) throw comm_error(where(op) + ": " + nccl_detail::describe(r));
    }

protected:
    void all_to_all_v_bytes(const void* send, std::span<const index_t> send_counts, void* recv,
                            std::span<const index_t> recv_counts, Element e) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        const ncclDataType_t t = nccl_detail::datatype(e);
        collective("all_to_all_v", [&](cudaStream_t stream) {
            return nccl_detail::grouped([&](auto&& call) {
                std::size_t s_at = 0, r_at = 0;
                for (int peer = 0; peer < size_; ++peer) {
                    const auto sc = std::size_t(send_counts[std::size_t(peer)]);
                    const auto rc = std::size_t(recv_counts[std::size_t(peer)]);
                    if (sc) call(ncclSend(static_cast<const char*>(send) + s_at * w, sc, t, peer, comm_, stream));
                    if (rc) call(ncclRecv(static_cast<char*>(recv) + r_at * w, rc, t, peer, comm_, stream));
                    s_at += sc, r_at += rc;
                }
            });
        });
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
        collective("all_reduce", [&](cudaStream_t stream) {
            return ncclAllReduce(data, data, std::size_t(n), nccl_detail::datatype(e), nccl_detail::reduction(o), comm_,
                                 stream);
        });
    }
    void reduce_scatter_bytes(const void* in, void* out, index_t n, Element e, ReduceOp o) override {
        collective("reduce_scatter", [&](cudaStream_t stream) {
            return ncclReduceScatter(in, out, std::size_t(n), nccl_detail::datatype(e), nccl_detail::reduction(o),
                                     comm_, stream);
        });
    }
    /// A group of ncclReduce calls, one per rank as the root of its block (NCCL has no reduce-scatter-v).
    void reduce_scatter_v_bytes(const void* in, void* out, std::span<const index_t> counts, Element e,
                                ReduceOp o) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        const ncclDataType_t t = nccl_detail::datatype(e);
        collective("reduce_scatter_v", [&](cudaStream_t stream) {
            return nccl_detail::grouped([&](auto&& call) {
                std::size_t at = 0;
                for (int root = 0; root < size_; ++root) {
                    const auto c = std::size_t(counts[std::size_t(root)]);
                    if (c)
                        call(ncclReduce(static_cast<const char*>(in) + at * w, out, c, t, nccl_detail::reduction(o),
                                        root, comm_, stream));
                    at += c;
                }
            });
        });
    }
    void all_gather_v_bytes(const void* in, index_t n, void* out, std::span<const index_t> counts, Element e) override {
        const std::size_t w = nccl_detail::bytes_of(e);
        const ncclDataType_t t = nccl_detail::datatype(e);
        collective("all_gather_v", [&](cudaStream_t stream) {
            return nccl_detail::grouped([&](auto&& call) {
                std::size_t at = 0;
                for (int peer = 0; peer < size_; ++peer) {
                    const auto c = std::size_t(counts[std::size_t(peer)]);
                    if (n) call(ncclSend(in, std::size_t(n), t, peer, comm_, stream));
                    if (c) call(ncclRecv(static_cast<char*>(out) + at * w, c, t, peer, comm_, stream));
                    at += c;
                }
            });
        });
    }
    std::unique_ptr<Request> isend_bytes(const void* data, index_t n, Element e, int dest, int tag) override {
        (void)tag;  // NCCL matches sends and receives by order, not by tag: post them in one global order
        std::string op = "send to rank " + std::to_string(dest);
        auto done = issue(op, [&](cudaStream_t stream) {
            return ncclSend(data, std::size_t(n), nccl_detail::datatype(e), dest, comm_, stream);
        });
        return std::make_unique<Queued>(*this, std::move(op), std::move(done));
    }
    std::unique_ptr<Request> irecv_bytes(void* data, index_t n, Element e, int source, int tag) override {
        (void)tag;
        std::string op = "receive from rank " + std::to_string(source);
        auto done = issue(op, [&](cudaStream_t stream) {
            return ncclRecv(data, std::size_t(n), nccl_detail::datatype(e), source, comm_, stream);
        });
        return std::make_unique<Queued>(*this, std::move(op), std::move(done));
    }

private:
    using Completion = nccl_detail::Completion;

    /// A send or receive: waiting on it waits for its own completion, whatever thread or stream waits.
    struct Queued : Request {
        NcclCommunicator& comm;
        std::string op;
        std::shared_ptr<Completion> done;
        Queued(NcclCommunicator& c, std::string o, std::shared_ptr<Completion> d)
            : comm(c), op(std::move(o)), done(std::move(d)) {}
        void wait() override { comm.wait(op, *done); }
    };

    /// A request posted inside a group, issued at the outermost group_end() of its thread.
    struct Pending {
        NcclCommunicator* comm;
        std::shared_ptr<Completion> done;
        backend::cuda_stream_t issuing;
    };
    /// NCCL's groups are per thread and span communicators; so is this record of them.
    struct Group {
        int depth = 0;
        std::vector<Pending> pending;
    };
    static Group& group() {
        thread_local Group g;
        return g;
    }

    void refuse_in_group(const std::string& op) const {
        if (group().depth > 0)
            throw comm_error(where(op) +
                             ": inside group_start() / group_end(), which only point-to-point operations "
                             "may be posted in");
    }
    /// With mutex_ held.
    void refuse_aborted(const std::string& op) const {
        if (aborted_) throw comm_error(where(op) + ": the communicator was aborted after an earlier failure");
    }

    /// ncclCommGetAsyncError as progress (pending while NCCL's thread still issues or initialises).
    Progress state(const std::string& op) {
        std::lock_guard lock(mutex_);
        refuse_aborted(op);
        ncclResult_t s = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(comm_, &s);
        return nccl_detail::progress(q != ncclSuccess ? q : s);
    }

    /// Once only, from whichever thread fails first; later calls find aborted_ set.
    void abort() noexcept {
        std::lock_guard lock(mutex_);
        if (aborted_) return;
        aborted_ = true;
        ncclCommAbort(comm_);
    }

    /// Queues `launch(stream)` (one operation's NCCL calls) on this communicator's stream, after the work queued so
    /// far on the issuing stream. Outside a group, waits (bounded) until NCCL has issued it and records its
    /// completion; inside one, leaves that to the outermost group_end().
    template <class Launch>
    std::shared_ptr<Completion> issue(const std::string& op, Launch&& launch) {
        auto done = std::make_shared<Completion>();
        const backend::cuda_stream_t issuing = backend::current_stream();  // resolved here, on the issuing thread
        {
            std::lock_guard lock(mutex_);
            refuse_aborted(op);
            MOONMOE_CUDA_CHECK(cudaEventRecord(ready_, issuing));
            MOONMOE_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), ready_, 0));
            const ncclResult_t r = launch(stream_.get());
            if (nccl_detail::failed(r)) throw comm_error(where(op) + ": " + nccl_detail::describe(r));
        }
        Group& g = group();
        if (g.depth > 0) {
            g.pending.push_back({this, done, issuing});
            return done;
        }
        await_issued(op);
        complete(*done, issuing);
        return done;
    }
    template <class Launch>
    void collective(const std::string& op, Launch&& launch) {
        refuse_in_group(op);
        wait(op, *issue(op, std::forward<Launch>(launch)));
    }

    /// Until NCCL's thread has put the operations on the stream: before that an event would complete at once, and
    /// NCCL refuses the next call on the communicator.
    void await_issued(const std::string& op) {
        await_progress([&] { return state(op); }, [&] { abort(); }, timeout_, where(op),
                       "NCCL has not issued it: a peer rank has died or has not posted its side");
    }
    /// Records `done` after what NCCL issued so far, and orders the issuing stream after it (same thread as issue).
    void complete(Completion& done, backend::cuda_stream_t issuing) {
        MOONMOE_CUDA_CHECK(cudaEventRecord(done.event, stream_.get()));
        MOONMOE_CUDA_CHECK(cudaStreamWaitEvent(issuing, done.event, 0));
        done.state.store(Completion::recorded, std::memory_order_release);
    }

    /// Until `done`'s event has completed, or aborts and throws (see await_progress).
    void wait(const std::string& op, Completion& done) {
        await_progress(
            [&] {
                switch (done.state.load(std::memory_order_acquire)) {
                case Completion::failed: return Progress::failed(done.error);
                case Completion::unissued:
                    if (done.issuer == std::this_thread::get_id())
                        throw comm_error(where(op) + ": waited on inside its group: call group_end() first");
                    return Progress::pending();  // its thread's group_end() will issue it
                default: break;
                }
                const cudaError_t q = cudaEventQuery(done.event);
                if (q == cudaSuccess) return Progress::done();
                if (q != cudaErrorNotReady) MOONMOE_CUDA_CHECK(q);
                const Progress s = state(op);
                return s.state == Progress::State::failed ? s : Progress::pending();
            },
            [&] { abort(); }, timeout_, where(op),
            "a rank has died or stopped, or the ranks issued different sequences of collectives");
    }

    ncclComm_t comm_ = nullptr;
    std::string name_;
    int rank_ = 0, size_ = 1;
    std::chrono::milliseconds timeout_;
    backend::Stream stream_;  ///< where NCCL's work goes: never a per-thread handle (see the header comment)
    cudaEvent_t ready_{};     ///< the issuing stream's work so far, for stream_ to wait on (under mutex_)
    std::mutex mutex_;        ///< comm_ may be aborted by a waiter on another thread: every use holds this
    bool aborted_ = false;
};

}  // namespace moonmoe::parallel
