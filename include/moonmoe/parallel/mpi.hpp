// moonmoe/parallel/mpi.hpp: the Communicator (parallel/comm.hpp) over MPI, for host memory (the CPU backend).
// Every operation is MPI's own non-blocking collective or point-to-point call (no hand-rolled algorithms), waited
// on with a deadline: MPI_Test in a loop until done or until timeout() has passed, then comm_error.
//
//   parallel::MpiSession mpi(argc, argv);          MPI_Init_thread (funneled) ... MPI_Finalize
//   std::unique_ptr<Communicator> world = mpi.world();
//   mpi.abort(2, message)                          every rank ends (MPI_Abort), after printing the message
//
// MPI's counts are int: an all-to-all-v or all-gather-v block beyond 2^31 - 1 elements is refused, named.
// bf16 travels as 16-bit integers; reductions take f32, f64 and index_t.
#pragma once

// MPI's C interface only (its deprecated C++ bindings warn under -Wextra)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>

#include "comm.hpp"

namespace moonmoe::parallel {

namespace mpi_detail {

inline std::string error_string(int code) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, text, &len);
    return std::string(text, std::size_t(len));
}

inline MPI_Datatype datatype(Element e) {
    switch (e) {
    case Element::f32: return MPI_FLOAT;
    case Element::f64: return MPI_DOUBLE;
    case Element::i64: return MPI_INT64_T;
    case Element::bf16: return MPI_UINT16_T;
    case Element::byte: return MPI_BYTE;
    }
    return MPI_BYTE;
}

inline MPI_Op op(ReduceOp o) { return o == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

}  // namespace mpi_detail

class MpiCommunicator;

/// A pending MPI_Isend / MPI_Irecv. Destroyed before completion (its wait timed out), it is cancelled and freed.
class MpiRequest : public Request {
public:
    MpiRequest(const MpiCommunicator& c, MPI_Request r, std::string op) : comm_(c), request_(r), op_(std::move(op)) {}
    ~MpiRequest() override {
        if (request_ != MPI_REQUEST_NULL) {
            MPI_Cancel(&request_);
            MPI_Request_free(&request_);
        }
    }
    void wait() override;

private:
    const MpiCommunicator& comm_;
    MPI_Request request_;
    std::string op_;
};

class MpiCommunicator : public Communicator {
public:
    /// Takes ownership of `comm` (freed on destruction unless it is MPI_COMM_WORLD); errors come back as codes.
    MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
        MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm_, &rank_);
        MPI_Comm_size(comm_, &size_);
    }
    ~MpiCommunicator() override {
        if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    }
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    std::string name() const override { return name_; }
    std::chrono::milliseconds timeout() const override { return timeout_; }
    void set_timeout(std::chrono::milliseconds t) override { timeout_ = t; }
    MPI_Comm handle() const { return comm_; }

    void barrier() override {
        MPI_Request r;
        check(MPI_Ibarrier(comm_, &r), "barrier");
        wait(r, "barrier");
    }

    std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
        MPI_Comm sub;
        check(MPI_Comm_split(comm_, color, key, &sub), "split");
        auto c = std::make_unique<MpiCommunicator>(sub, name);
        c->set_timeout(timeout_);
        return c;
    }

    /// Completes `r` or throws comm_error once timeout() has passed. A timed-out send or receive is cancelled and
    /// freed; a collective cannot be cancelled in MPI, so after a timed-out collective the ranks must end (abort).
    void wait(MPI_Request& r, const std::string& op, bool point_to_point = false) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout_;
        for (int spins = 0;; ++spins) {
            int done = 0;
            check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), op);
            if (done) return;
            if (std::chrono::steady_clock::now() > deadline) {
                if (point_to_point) {
                    MPI_Cancel(&r);
                    MPI_Request_free(&r);
                }
                throw comm_error(where(op) + ": not complete after " + std::to_string(timeout_.count()) +
                                 " ms: a rank has died or stopped, or the ranks issued different sequences of "
                                 "collectives");
            }
            if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    void check(int code, const std::string& op) const {
        if (code != MPI_SUCCESS) throw comm_error(where(op) + ": MPI error: " + mpi_detail::error_string(code));
    }

protected:
    void all_to_all_v_bytes(const void* send, std::span<const index_t> send_counts, void* recv,
                            std::span<const index_t> recv_counts, Element e) override {
        const std::vector<int> sc = ints("all_to_all_v", send_counts), rc = ints("all_to_all_v", recv_counts);
        const std::vector<int> sd = displacements("all_to_all_v", sc), rd = displacements("all_to_all_v", rc);
        MPI_Request r;
        const MPI_Datatype t = mpi_detail::datatype(e);
        check(MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_, &r), "all_to_all_v");
        wait(r, "all_to_all_v");
    }
    void all_reduce_bytes(void* data, index_t n, Element e, ReduceOp o) override {
        reducible("all_reduce", e);
        MPI_Request r;
        check(MPI_Iallreduce(MPI_IN_PLACE, data, count("all_reduce", n), mpi_detail::datatype(e), mpi_detail::op(o),
                             comm_, &r),
              "all_reduce");
        wait(r, "all_reduce");
    }
    void reduce_scatter_bytes(const void* in, void* out, index_t n, Element e, ReduceOp o) override {
        reducible("reduce_scatter", e);
        MPI_Request r;
        check(MPI_Ireduce_scatter_block(in, out, count("reduce_scatter", n), mpi_detail::datatype(e), mpi_detail::op(o),
                                        comm_, &r),
              "reduce_scatter");
        wait(r, "reduce_scatter");
    }
    void reduce_scatter_v_bytes(const void* in, void* out, std::span<const index_t> counts, Element e,
                                ReduceOp o) override {
        reducible("reduce_scatter_v", e);
        const std::vector<int> c = ints("reduce_scatter_v", counts);
        MPI_Request r;
        check(MPI_Ireduce_scatter(in, out, c.data(), mpi_detail::datatype(e), mpi_detail::op(o), comm_, &r),
              "reduce_scatter_v");
        wait(r, "reduce_scatter_v");
    }
    void all_gather_v_bytes(const void* in, index_t n, void* out, std::span<const index_t> counts, Element e) override {
        const std::vector<int> c = ints("all_gather_v", counts), d = displacements("all_gather_v", c);
        MPI_Request r;
        const MPI_Datatype t = mpi_detail::datatype(e);
        check(MPI_Iallgatherv(in, count("all_gather_v", n), t, out, c.data(), d.data(), t, comm_, &r), "all_gather_v");
        wait(r, "all_gather_v");
    }
    std::unique_ptr<Request> isend_bytes(const void* data, index_t n, Element e, int dest, int tag) override {
        MPI_Request r;
        check(MPI_Isend(data, count("isend", n), mpi_detail::datatype(e), dest, tag, comm_, &r), "isend");
        return std::make_unique<MpiRequest>(
            *this, r, "send to rank " + std::to_string(dest) + " (tag " + std::to_string(tag) + ")");
    }
    std::unique_ptr<Request> irecv_bytes(void* data, index_t n, Element e, int source, int tag) override {
        MPI_Request r;
        check(MPI_Irecv(data, count("irecv", n), mpi_detail::datatype(e), source, tag, comm_, &r), "irecv");
        return std::make_unique<MpiRequest>(
            *this, r, "receive from rank " + std::to_string(source) + " (tag " + std::to_string(tag) + ")");
    }

private:
    int count(const char* op, index_t n) const {
        if (n < 0 || n > INT_MAX)
            throw comm_error(where(op) + ": " + std::to_string(n) + " elements exceed MPI's int counts");
        return int(n);
    }
    std::vector<int> ints(const char* op, std::span<const index_t> counts) const {
        std::vector<int> out;
        for (index_t c : counts) out.push_back(count(op, c));
        return out;
    }
    std::vector<int> displacements(const char* op, const std::vector<int>& counts) const {
        std::vector<int> d(counts.size());
        index_t at = 0;
        for (std::size_t i = 0; i < counts.size(); ++i) d[i] = count(op, at), at += counts[i];
        return d;
    }
    void reducible(const char* op, Element e) const {
        if (e == Element::bf16 || e == Element::byte)
            throw comm_error(where(op) + ": reductions take f32, f64 or index_t elements");
    }

    MPI_Comm comm_;
    std::string name_;
    int rank_ = 0, size_ = 1;
    std::chrono::milliseconds timeout_{std::chrono::seconds(120)};
};

inline void MpiRequest::wait() {
    comm_.wait(request_, op_, true);
    request_ = MPI_REQUEST_NULL;
}

/// MPI for the life of this object: MPI_Init_thread (funneled: only the thread that made it calls MPI) in the
/// constructor, MPI_Finalize in the destructor.
class MpiSession {
public:
    MpiSession(int* argc, char*** argv) {
        int provided = 0;
        MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    }
    ~MpiSession() { MPI_Finalize(); }
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;

    std::unique_ptr<Communicator> world() const { return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world"); }

    /// Ends every rank: prints `message` on this one, then MPI_Abort with `code`.
    [[noreturn]] static void abort(int code, const std::string& message) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        std::fprintf(stderr, "moonmoe rank %d: %s\n", rank, message.c_str());
        std::fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, code);
        std::abort();
    }
};

}  // namespace moonmoe::parallel
