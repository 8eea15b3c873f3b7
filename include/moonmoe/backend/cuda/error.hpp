// moonmoe/backend/cuda/error.hpp: how the CUDA backend reports failed calls (cuda_error), and the process's record
// of them. Host-only C++, shared by the backend's two modes (cuda/memory.hpp) and testable without a GPU.
//
// A kernel that faults (an illegal address) does so asynchronously, and the fault is sticky: every later runtime
// call of the process fails with it. The first call to see it is often a cudaFreeAsync in a Tensor's destructor,
// which must not throw (a throw there during unwinding is std::terminate, and every later result is lost). So:
//   check(status, call, file, line)   a checked call (MOONMOE_CUDA_CHECK): throws cuda_error when it failed, or
//                                     when an earlier failure could not be thrown; the message names this call and
//                                     the first CUDA call to fail in the process, with where each was made
//   note(status, call, file, line)    a call where nothing may throw (release, destructors: MOONMOE_CUDA_NOTE):
//                                     records the failure, which the next checked call throws
// Also here: allocate_or_reclaim, Memory<cuda>::allocate's one way through an out-of-memory failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string>
#if defined(__CUDACC__)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

namespace moonmoe::backend {

/// A CUDA runtime or cuBLAS call failed; what() names the call, the error and where it was made, and the first
/// CUDA call of the process to fail when that was another one.
struct cuda_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

namespace cuda_detail {

/// A runtime call's outcome by name, whichever library made it: a null name is success.
struct CallStatus {
    const char* name = nullptr;
    const char* text = nullptr;
    bool failed() const { return name != nullptr; }
};

/// "cudaMallocAsync(&p, bytes, stream) failed with cudaErrorMemoryAllocation (out of memory) at f.hpp:12"
inline std::string describe_failure(const char* call, const char* error_name, const char* error_text, const char* file,
                                    int line) {
    return std::string(call) + " failed with " + error_name + " (" + error_text + ") at " + file + ":" +
           std::to_string(line);
}

/// The message of a failed call: "moonmoe: " and its description.
inline std::string call_error_message(const char* call, const char* error_name, const char* error_text,
                                      const char* file, int line) {
    return "moonmoe: " + describe_failure(call, error_name, error_text, file, line);
}

/// Set while a failure recorded by note() waits to be thrown: the one thing a successful check() reads.
inline std::atomic<bool> failure_waiting{false};

/// The first failed CUDA call of the process, and the first failure since the last throw that could not be thrown.
class FailureRecord {
public:
    /// A checked call failed: records it, returns the message to throw.
    std::string thrown(const std::string& failure) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (first_.empty()) first_ = failure;
        std::string message = "moonmoe: " + failure;
        if (first_ != failure) message += "; the first CUDA call to fail in this process: " + first_;
        if (!waiting_.empty() && waiting_ != first_) message += "; since then, where it could not throw: " + waiting_;
        clear_waiting();
        return message;
    }

    /// A call that may not throw failed: records it for the next checked call.
    void noted(const std::string& failure) {
        const std::string where = failure + " where nothing may throw (a destructor or release)";
        std::lock_guard<std::mutex> lock(mutex_);
        if (first_.empty()) first_ = where;
        if (waiting_.empty()) waiting_ = where;
        failure_waiting.store(true, std::memory_order_relaxed);
    }

    /// A checked call succeeded while a noted failure waits: returns the message to throw (empty if another thread
    /// has thrown it already).
    std::string waiting(const char* call, const char* file, int line) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (waiting_.empty()) return {};
        std::string message = "moonmoe: " + waiting_ + "; thrown at the next checked call, " + call + " at " + file +
                              ":" + std::to_string(line);
        if (first_ != waiting_) message += "; the first CUDA call to fail in this process: " + first_;
        clear_waiting();
        return message;
    }

    /// The first failure recorded, or an empty string.
    std::string first() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return first_;
    }

    /// Forgets every failure: for a process that has handled them (a test that made them on purpose).
    void forget() {
        std::lock_guard<std::mutex> lock(mutex_);
        first_.clear();
        clear_waiting();
    }

private:
    void clear_waiting() {
        waiting_.clear();
        failure_waiting.store(false, std::memory_order_relaxed);
    }

    mutable std::mutex mutex_;
    std::string first_, waiting_;
};

/// The process's record; never destroyed, since tensors with static storage are released after static destructors.
inline FailureRecord& failure_record() {
    static auto* record = new FailureRecord;
    return *record;
}

/// A checked call: throws cuda_error when it failed or when a noted failure waits (see the header comment).
inline void check(CallStatus s, const char* call, const char* file, int line) {
    if (!s.failed() && !failure_waiting.load(std::memory_order_relaxed)) return;
    if (s.failed()) throw cuda_error(failure_record().thrown(describe_failure(call, s.name, s.text, file, line)));
    if (std::string message = failure_record().waiting(call, file, line); !message.empty()) throw cuda_error(message);
}

/// A call where nothing may throw: a failure is recorded for the next checked call. Never throws (where even the
/// record cannot be written, host memory is gone: the failure goes to stderr instead).
inline void note(CallStatus s, const char* call, const char* file, int line) noexcept {
    if (!s.failed()) return;
    try {
        failure_record().noted(describe_failure(call, s.name, s.text, file, line));
    } catch (...) {
        std::fprintf(stderr, "moonmoe: %s failed with %s at %s:%d\n", call, s.name, file, line);
    }
}

/// Memory<cuda>::allocate's way through an out-of-memory failure: a stream-ordered pool keeps what is freed (and
/// fragments), so when it cannot serve a request, `reclaim()` waits for the device and gives the pool's unused
/// memory back to the driver, and the request is tried once more. `try_allocate()` returns false for out of memory
/// (with the runtime's error cleared) and throws any other error; `message()` gives what() of the cuda_error thrown
/// when the second try fails too.
template <class TryAllocate, class Reclaim, class Message>
void allocate_or_reclaim(TryAllocate&& try_allocate, Reclaim&& reclaim, Message&& message) {
    if (try_allocate()) return;
    reclaim();
    if (try_allocate()) return;
    throw cuda_error(message());
}

/// "1073741824 bytes (1.00 GiB)"
inline std::string bytes_and_gib(std::uint64_t bytes) {
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.2f", double(bytes) / double(1ull << 30));
    return std::to_string(bytes) + " bytes (" + gib + " GiB)";
}

/// What allocate_or_reclaim's failure says: the request, and what the pool reserves from the driver and uses.
inline std::string out_of_memory_message(std::uint64_t requested, std::uint64_t pool_reserved,
                                         std::uint64_t pool_used) {
    return "moonmoe: out of device memory: cudaMallocAsync of " + bytes_and_gib(requested) +
           " failed, also after the pool's unused memory went back to the driver (cudaMemPoolTrimTo); the pool "
           "reserves " +
           bytes_and_gib(pool_reserved) + ", " + bytes_and_gib(pool_used) + " of it in use";
}

#if defined(__CUDACC__)
/// The CUDA runtime's and cuBLAS's statuses as a CallStatus, and check / note for them (nvcc only).
inline CallStatus status(cudaError_t e) {
    return e == cudaSuccess ? CallStatus{} : CallStatus{cudaGetErrorName(e), cudaGetErrorString(e)};
}
inline CallStatus status(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? CallStatus{} : CallStatus{cublasGetStatusName(s), cublasGetStatusString(s)};
}
inline void check(cudaError_t e, const char* call, const char* file, int line) { check(status(e), call, file, line); }
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
    check(status(s), call, file, line);
}
/// As note(CallStatus): except while the runtime unloads at process exit (a static tensor's release), when there is
/// nothing left to free and no one left to tell.
inline void note(cudaError_t e, const char* call, const char* file, int line) noexcept {
    if (e != cudaSuccess && e != cudaErrorCudartUnloading) note(status(e), call, file, line);
}
#endif

}  // namespace cuda_detail

}  // namespace moonmoe::backend

// cuda_detail::check and note take a CallStatus, and under nvcc a cudaError_t or cublasStatus_t.
/// Checks a CUDA runtime call: throws cuda_error with the call's text, the error's name and description.
#define MOONMOE_CUDA_CHECK(call) ::moonmoe::backend::cuda_detail::check((call), #call, __FILE__, __LINE__)
/// Checks a cuBLAS call the same way.
#define MOONMOE_CUBLAS_CHECK(call) ::moonmoe::backend::cuda_detail::check((call), #call, __FILE__, __LINE__)
/// Checks a call where nothing may throw (a destructor, Memory<cuda>::release): a failure is recorded, and the
/// next checked call throws it.
#define MOONMOE_CUDA_NOTE(call) ::moonmoe::backend::cuda_detail::note((call), #call, __FILE__, __LINE__)
