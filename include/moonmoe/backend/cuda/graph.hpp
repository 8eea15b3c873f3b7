// moonmoe/backend/cuda/graph.hpp: StepGraph<cuda> (backend/graph.hpp), device work captured once as a CUDA graph and
// replayed.
//
// nvcc: after the warm-up calls, run() captures `work` on the current stream (cudaStreamBeginCapture, thread-local
// mode: other threads' CUDA calls are not disturbed), instantiates the graph and launches it there; later calls with
// the same key launch the instance (cudaGraphLaunch: one call for the whole step). Memory the work allocates and
// frees becomes the graph's own allocation nodes (Memory<cuda> allocates stream-ordered), so temporaries are fine;
// anything the work keeps past its end must have been allocated before the capture.
// Where the capture fails (a library call the CUDA version cannot capture, or instantiation), the step is not lost:
// the capture is ended and discarded, the work runs eagerly, and so does every later call with that key;
// capture_failure() says what failed. A graph is a speed-up, never a condition for the results.
// Emulated: there is no graph; the captured and replayed calls run `work` again, with the capture's rules in force
// (host waits and copies from the host throw), so CI holds a step to what a graph can hold. What the emulation cannot
// check is that the work reads nothing on the host outside its key: on a GPU a replay does not run host code.
#pragma once

#include "memory.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../graph.hpp"

namespace moonmoe::backend {

template <>
class StepGraph<cuda> {
public:
    static constexpr bool captures_work = true;
    explicit StepGraph(int warmups = 1) : warmups_(warmups) {}
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph() { release(); }

    template <class F>
    void run(std::span<const std::int64_t> key, F&& work) {
        if (!std::equal(key.begin(), key.end(), key_.begin(), key_.end())) {
            release();
            key_.assign(key.begin(), key.end());
            seen_ = 0;
            eager_only_ = false;
        }
        if (eager_only_) {
            work();
            ++eager_;
            return;
        }
        if (captured_) {
            replay(work);
            ++replays_;
            return;
        }
        if (seen_ < warmups_) {
            work();
            ++seen_, ++eager_;
            return;
        }
        try {
            capture(work);
        } catch (const cuda_error& e) {  // not capturable here: eager from now on for this key
            capture_failure_ = e.what();
            cuda_detail::failure_record().forget();  // handled: the work runs again below, checked
            eager_only_ = true;
            work();
            ++eager_;
            return;
        }
        ++captures_;
    }
    std::uint64_t eager_runs() const { return eager_; }
    /// Why the last failed capture failed (empty if none has): the calls with its key then ran eagerly.
    const std::string& capture_failure() const { return capture_failure_; }
    std::uint64_t captures() const { return captures_; }
    std::uint64_t replays() const { return replays_; }

private:
    /// Marks this thread as capturing for the scope (cuda/host_waits.hpp refuses waits and uploads meanwhile).
    struct CaptureScope {
        const char* previous = cuda_detail::capturing;
        CaptureScope() { cuda_detail::capturing = "a StepGraph"; }
        ~CaptureScope() { cuda_detail::capturing = previous; }
    };

#if MOONMOE_CUDA_EMULATED
    template <class F>
    void capture(F& work) {
        CaptureScope scope;
        work();
        captured_ = true;
    }
    template <class F>
    void replay(F& work) {
        CaptureScope scope;
        work();
    }
    void release() { captured_ = false; }
#else
    template <class F>
    void capture(F& work) {
        const cudaStream_t stream = current_stream();
        MOONMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        cudaGraph_t graph = nullptr;
        try {
            CaptureScope scope;
            work();
        } catch (...) {
            (void)cudaStreamEndCapture(stream, &graph);  // ends the capture; its error is the one thrown already
            if (graph) cudaGraphDestroy(graph);
            (void)cudaGetLastError();
            throw;
        }
        const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
        if (ended != cudaSuccess) {
            if (graph) cudaGraphDestroy(graph);
            (void)cudaGetLastError();
            MOONMOE_CUDA_CHECK(ended);
        }
        const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
        cudaGraphDestroy(graph);
        if (made != cudaSuccess) {
            exec_ = nullptr;
            (void)cudaGetLastError();
            MOONMOE_CUDA_CHECK(made);
        }
        captured_ = true;
        MOONMOE_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
    }
    template <class F>
    void replay(F&) {
        MOONMOE_CUDA_CHECK(cudaGraphLaunch(exec_, current_stream()));
    }
    /// Not checked: called from the destructor too (after a sticky fault every call fails; the next check says so).
    void release() {
        if (exec_) cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
        captured_ = false;
    }
    cudaGraphExec_t exec_ = nullptr;
#endif

    int warmups_;
    std::vector<std::int64_t> key_;
    int seen_ = 0;
    bool captured_ = false, eager_only_ = false;
    std::string capture_failure_;
    std::uint64_t eager_ = 0, captures_ = 0, replays_ = 0;
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
