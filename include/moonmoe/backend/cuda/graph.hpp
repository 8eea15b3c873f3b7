// moonmoe/backend/cuda/graph.hpp: StepGraph<cuda> (backend/graph.hpp), device work captured once as a CUDA graph and
// replayed.
//
// nvcc: after the warm-up calls, run() captures `work` on the current stream (cudaStreamBeginCapture, thread-local
// mode: other threads' CUDA calls are not disturbed), instantiates the graph and launches it there; later calls with
// the same key launch the instance (cudaGraphLaunch: one call for the whole step). Memory the work allocates and
// frees becomes the graph's own allocation nodes (Memory<cuda> allocates stream-ordered), so temporaries are fine;
// anything the work keeps past its end must have been allocated before the capture.
// Emulated: there is no graph; the captured and replayed calls run `work` again, with the capture's rules in force
// (host waits and copies from the host throw), so CI holds a step to what a graph can hold. What the emulation cannot
// check is that the work reads nothing on the host outside its key: on a GPU a replay does not run host code.
#pragma once

#include "memory.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <algorithm>
#include <cstdint>
#include <span>
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
        capture(work);
        ++captures_;
    }
    std::uint64_t eager_runs() const { return eager_; }
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
        MOONMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        const cudaError_t made = cudaGraphInstantiate(&exec_, graph, 0);
        cudaGraphDestroy(graph);
        MOONMOE_CUDA_CHECK(made);
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
    bool captured_ = false;
    std::uint64_t eager_ = 0, captures_ = 0, replays_ = 0;
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
