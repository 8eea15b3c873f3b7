// moonmoe/backend/graph.hpp: StepGraph<B>, a piece of device work replayed as one unit (CUDA graphs), the graph
// family of the backend contract. Like offload.hpp's, this family is optional: the primary definition below is the
// answer of a backend without graphs (the CPU: `work` runs every time), and a backend with graphs specialises it
// (cuda/graph.hpp).
//
// StepGraph<B>::run(key, work): on a backend with graphs, `work` runs eagerly for the first `warmups` calls with a
// key (libraries choose their algorithms, workspaces and plans are made), is then captured once and the capture is
// replayed for every later call with the same key; a call with another key starts over. A replay runs no host code,
// so whatever `work` reads on the host must be in the key (shapes, pointers, counts), and what changes between calls
// must be on the device, written before run(). Inside a capture the backend refuses what a graph cannot hold: a
// host wait, and a copy from the host (a replay would copy from a staging buffer that holds other bytes by then).
// Where the device cannot capture the work, it runs eagerly instead (capture_failure() says why).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace moonmoe::backend {

template <class B>
class StepGraph {
public:
    static constexpr bool captures_work = false;  ///< this backend runs `work` every time
    explicit StepGraph(int warmups = 1) { (void)warmups; }
    template <class F>
    void run(std::span<const std::int64_t> key, F&& work) {
        (void)key;
        work();
        ++eager_;
    }
    std::uint64_t eager_runs() const { return eager_; }
    const std::string& capture_failure() const { return none_; }
    std::uint64_t captures() const { return 0; }
    std::uint64_t replays() const { return 0; }

private:
    std::uint64_t eager_ = 0;
    std::string none_;
};

}  // namespace moonmoe::backend
