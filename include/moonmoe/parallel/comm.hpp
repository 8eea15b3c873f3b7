// moonmoe/parallel/comm.hpp: the collectives the parallel runtime needs, as one small interface with an MPI
// implementation (parallel/mpi.hpp, host memory, the CPU backend) and an NCCL one (device memory, the CUDA backend).
// Nothing outside those two files includes <mpi.h> or <nccl.h>.
//
//   exchange_counts(send_counts)                 each rank learns how many elements every other rank sends it
//   all_to_all_v(send, send_counts, recv, recv_counts)
//                                                rank r's block i (send_counts[i] elements, blocks in rank order)
//                                                lands in rank i's recv as block r; counts known to both sides
//   all_reduce(data, sum | max)                  in place
//   reduce_scatter(in, out, sum)                 in = size() blocks of out.size(); rank r gets the sum of block r
//   reduce_scatter_v(in, out, counts, sum)       the same with blocks of counts[r] elements
//   all_gather(in, out)                          out = every rank's in, in rank order
//   all_gather_v(in, out, counts)                the same with counts[r] elements from rank r
//   send / recv, isend / irecv -> Request        point to point, tag-matched; a Request is waited on once
//   group_start(), group_end()                   point-to-point operations issued together (NCCL groups)
//   barrier(), split(color, key)                 a sub-group: the ranks with the same color, ordered by key
//
// Buffers live where the implementation's backend keeps tensors: host memory for MPI, device memory for NCCL
// (device_memory()). exchange_counts and host_all_to_all_v take host arrays on both (NCCL stages them through the
// device): the counts and small plans the host decides with.
//
// traffic() counts what this rank handed to the group since reset_traffic(): the payload bytes bound for other
// ranks, by the volume a bandwidth-optimal algorithm sends (all-to-all-v: the blocks for the other ranks;
// reduce-scatter(-v): the blocks of the other ranks; all-gather(-v): its block to each other rank; all-reduce: 2 (size
// - 1) / size of the data, the ring's; send: the message), and the wall time spent in the blocking operations (waits on
// a Request are the caller's).
//
// Every operation is a bounded wait: an operation that does not complete within timeout() (a rank died, or the
// ranks disagree on the sequence of collectives) throws comm_error naming the operation, the group and the rank,
// instead of hanging. Element types: float, double, index_t (int64), bf16 and bytes (std::byte).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "../backend/memory.hpp"
#include "../numeric/bf16.hpp"
#include "../tensor/shape.hpp"

namespace moonmoe::parallel {

/// A failed or timed-out communication; the message names the operation, the group and the rank.
struct comm_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class ReduceOp { sum, max };
enum class Element { f32, f64, i64, bf16, byte };

template <class T>
constexpr Element element_of() {
    if constexpr (std::is_same_v<T, float>) return Element::f32;
    else if constexpr (std::is_same_v<T, double>)
        return Element::f64;
    else if constexpr (std::is_same_v<T, index_t>)
        return Element::i64;
    else if constexpr (std::is_same_v<T, bf16>)
        return Element::bf16;
    else {
        static_assert(std::is_same_v<T, std::byte>, "Communicator: float, double, index_t, bf16 or std::byte");
        return Element::byte;
    }
}

/// A pending send or receive.
class Request {
public:
    virtual ~Request() = default;
    /// Blocks until done (or throws comm_error after the communicator's timeout).
    virtual void wait() = 0;
};

/// Bytes sent to other ranks and seconds spent in blocking operations (see the header comment).
struct Traffic {
    std::uint64_t bytes = 0;
    double seconds = 0;
};

class Communicator {
public:
    virtual ~Communicator() = default;

    Traffic traffic() const { return traffic_; }
    void reset_traffic() { traffic_ = {}; }

    virtual int rank() const = 0;
    virtual int size() const = 0;
    /// What the group is ("world", "expert group of pp 0, dp 1", ...), for messages.
    virtual std::string name() const = 0;
    virtual std::chrono::milliseconds timeout() const = 0;
    virtual void set_timeout(std::chrono::milliseconds t) = 0;

    /// Whether the buffers of the operations are device memory (NCCL) rather than host memory (MPI).
    virtual bool device_memory() const { return false; }

    virtual void barrier() = 0;
    /// Point-to-point operations posted between group_start() and group_end() are issued together, so a send and
    /// a receive of one group cannot block each other (NCCL's ncclGroupStart / ncclGroupEnd). MPI's non-blocking
    /// operations need no grouping: no-ops there.
    virtual void group_start() {}
    virtual void group_end() {}
    /// The ranks that pass the same color, ordered by key (then by rank here); `name` names the new group.
    virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

    /// The counts every rank sends this one, from the counts this one sends every rank (both size() long).
    std::vector<index_t> exchange_counts(std::span<const index_t> send_counts) {
        check_size("exchange_counts", "send_counts", send_counts.size());
        std::vector<index_t> recv(send_counts.size());
        std::vector<index_t> ones(send_counts.size(), 1);
        const Timed timed(*this, sizeof(index_t) * std::size_t(size() - 1));
        host_all_to_all_v_bytes(send_counts.data(), ones, recv.data(), ones, Element::i64);
        return recv;
    }

    /// all_to_all_v on host arrays whatever the implementation (small exchanges the host decides with).
    template <class T>
    void host_all_to_all_v(std::span<const T> send, std::span<const index_t> send_counts, std::span<T> recv,
                           std::span<const index_t> recv_counts) {
        check_size("host_all_to_all_v", "send_counts", send_counts.size());
        check_size("host_all_to_all_v", "recv_counts", recv_counts.size());
        check_total("host_all_to_all_v", "send", send.size(), send_counts);
        check_total("host_all_to_all_v", "recv", recv.size(), recv_counts);
        const Timed timed(*this, sizeof(T) * others(send_counts));
        host_all_to_all_v_bytes(send.data(), send_counts, recv.data(), recv_counts,
                                element_of<std::remove_const_t<T>>());
    }

    template <class T>
    void all_to_all_v(std::span<const T> send, std::span<const index_t> send_counts, std::span<T> recv,
                      std::span<const index_t> recv_counts) {
        check_size("all_to_all_v", "send_counts", send_counts.size());
        check_size("all_to_all_v", "recv_counts", recv_counts.size());
        check_total("all_to_all_v", "send", send.size(), send_counts);
        check_total("all_to_all_v", "recv", recv.size(), recv_counts);
        const Timed timed(*this, sizeof(T) * others(send_counts));
        all_to_all_v_bytes(send.data(), send_counts, recv.data(), recv_counts, element_of<std::remove_const_t<T>>());
    }

    template <class T>
    void all_reduce(std::span<T> data, ReduceOp op) {
        const Timed timed(*this, sizeof(T) * data.size() * 2 * std::size_t(size() - 1) / std::size_t(size()));
        all_reduce_bytes(data.data(), index_t(data.size()), element_of<T>(), op);
    }

    template <class T>
    void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
        if (in.size() != out.size() * std::size_t(size()))
            throw comm_error(where("reduce_scatter") + ": in holds " + std::to_string(in.size()) + " elements, " +
                             std::to_string(size()) + " ranks x out's " + std::to_string(out.size()) + " expected");
        const Timed timed(*this, sizeof(T) * out.size() * std::size_t(size() - 1));
        reduce_scatter_bytes(in.data(), out.data(), index_t(out.size()), element_of<std::remove_const_t<T>>(), op);
    }

    template <class T>
    void reduce_scatter_v(std::span<const T> in, std::span<T> out, std::span<const index_t> counts,
                          ReduceOp op = ReduceOp::sum) {
        check_size("reduce_scatter_v", "counts", counts.size());
        check_total("reduce_scatter_v", "in", in.size(), counts);
        if (index_t(out.size()) != counts[std::size_t(rank())])
            throw comm_error(where("reduce_scatter_v") + ": out holds " + std::to_string(out.size()) +
                             " elements, counts says " + std::to_string(counts[std::size_t(rank())]));
        const Timed timed(*this, sizeof(T) * others(counts));
        reduce_scatter_v_bytes(in.data(), out.data(), counts, element_of<std::remove_const_t<T>>(), op);
    }

    template <class T>
    void all_gather(std::span<const T> in, std::span<T> out) {
        if (out.size() != in.size() * std::size_t(size()))
            throw comm_error(where("all_gather") + ": out holds " + std::to_string(out.size()) + " elements, " +
                             std::to_string(size()) + " ranks x in's " + std::to_string(in.size()) + " expected");
        std::vector<index_t> counts(std::size_t(size()), index_t(in.size()));
        const Timed timed(*this, sizeof(T) * in.size() * std::size_t(size() - 1));
        all_gather_v_bytes(in.data(), index_t(in.size()), out.data(), counts, element_of<std::remove_const_t<T>>());
    }

    template <class T>
    void all_gather_v(std::span<const T> in, std::span<T> out, std::span<const index_t> counts) {
        check_size("all_gather_v", "counts", counts.size());
        check_total("all_gather_v", "out", out.size(), counts);
        if (index_t(in.size()) != counts[std::size_t(rank())])
            throw comm_error(where("all_gather_v") + ": in holds " + std::to_string(in.size()) +
                             " elements, counts says " + std::to_string(counts[std::size_t(rank())]));
        const Timed timed(*this, sizeof(T) * in.size() * std::size_t(size() - 1));
        all_gather_v_bytes(in.data(), index_t(in.size()), out.data(), counts, element_of<std::remove_const_t<T>>());
    }

    template <class T>
    void send(std::span<const T> data, int dest, int tag) {
        isend(data, dest, tag)->wait();
    }
    template <class T>
    void recv(std::span<T> data, int source, int tag) {
        irecv(data, source, tag)->wait();
    }
    template <class T>
    std::unique_ptr<Request> isend(std::span<const T> data, int dest, int tag) {
        check_peer("isend", dest);
        if (dest != rank()) traffic_.bytes += sizeof(T) * data.size();
        return isend_bytes(data.data(), index_t(data.size()), element_of<std::remove_const_t<T>>(), dest, tag);
    }
    template <class T>
    std::unique_ptr<Request> irecv(std::span<T> data, int source, int tag) {
        check_peer("irecv", source);
        return irecv_bytes(data.data(), index_t(data.size()), element_of<T>(), source, tag);
    }

    /// "<op> on <group> (rank r of n)": the start of every message.
    std::string where(const std::string& op) const {
        return op + " on " + name() + " (rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ")";
    }

protected:
    virtual void all_to_all_v_bytes(const void* send, std::span<const index_t> send_counts, void* recv,
                                    std::span<const index_t> recv_counts, Element e) = 0;
    /// The same on host arrays; an implementation on device memory stages them (the default: host memory).
    virtual void host_all_to_all_v_bytes(const void* send, std::span<const index_t> send_counts, void* recv,
                                         std::span<const index_t> recv_counts, Element e) {
        all_to_all_v_bytes(send, send_counts, recv, recv_counts, e);
    }
    virtual void all_reduce_bytes(void* data, index_t n, Element e, ReduceOp op) = 0;
    virtual void reduce_scatter_bytes(const void* in, void* out, index_t n, Element e, ReduceOp op) = 0;
    virtual void reduce_scatter_v_bytes(const void* in, void* out, std::span<const index_t> counts, Element e,
                                        ReduceOp op) = 0;
    virtual void all_gather_v_bytes(const void* in, index_t n, void* out, std::span<const index_t> counts,
                                    Element e) = 0;
    virtual std::unique_ptr<Request> isend_bytes(const void* data, index_t n, Element e, int dest, int tag) = 0;
    virtual std::unique_ptr<Request> irecv_bytes(void* data, index_t n, Element e, int source, int tag) = 0;

private:
    /// Adds `bytes` and the scope's wall time to traffic_.
    class Timed {
    public:
        Timed(Communicator& c, std::size_t bytes) : c_(c), start_(std::chrono::steady_clock::now()) {
            c_.traffic_.bytes += bytes;
        }
        ~Timed() {
            c_.traffic_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        }
        Timed(const Timed&) = delete;
        Timed& operator=(const Timed&) = delete;

    private:
        Communicator& c_;
        std::chrono::steady_clock::time_point start_;
    };
    /// The elements of `counts` bound for the other ranks.
    std::size_t others(std::span<const index_t> counts) const {
        std::size_t n = 0;
        for (std::size_t i = 0; i < counts.size(); ++i)
            if (int(i) != rank()) n += std::size_t(counts[i]);
        return n;
    }

    Traffic traffic_;

    void check_size(const char* op, const char* what, std::size_t n) const {
        if (n != std::size_t(size()))
            throw comm_error(where(op) + ": " + what + " has " + std::to_string(n) + " entries, one per rank (" +
                             std::to_string(size()) + ") expected");
    }
    void check_total(const char* op, const char* what, std::size_t n, std::span<const index_t> counts) const {
        index_t total = 0;
        for (index_t c : counts) {
            if (c < 0) throw comm_error(where(op) + ": a negative count (" + std::to_string(c) + ")");
            total += c;
        }
        if (index_t(n) != total)
            throw comm_error(where(op) + ": " + what + " holds " + std::to_string(n) + " elements, its counts sum to " +
                             std::to_string(total));
    }
    void check_peer(const char* op, int peer) const {
        if (peer < 0 || peer >= size())
            throw comm_error(where(op) + ": peer rank " + std::to_string(peer) + " outside [0, " +
                             std::to_string(size()) + ")");
    }
};

/// Refuses a communicator that cannot move backend B's tensors, naming both: host-memory collectives (MPI) for
/// tensors in device memory (the CUDA backend on a GPU: NCCL moves those, parallel/nccl.hpp), or device-memory ones
/// for tensors in host memory. `who` is the component that would exchange them.
template <class B>
void check_moves(const Communicator& c, const std::string& who) {
    if (c.device_memory() != backend::in_host_memory<B>) return;
    const char* tensors = backend::in_host_memory<B> ? "host" : "device";
    const char* moves = c.device_memory() ? "device" : "host";
    throw std::invalid_argument(c.where(who) + ": the " + std::string(B::name) + " backend's tensors are in " +
                                tensors + " memory and this communicator moves " + moves +
                                " memory; give the CUDA backend on a GPU a NcclCommunicator (parallel/nccl.hpp), the "
                                "CPU backend an MpiCommunicator (parallel/mpi.hpp)");
}

}  // namespace moonmoe::parallel
