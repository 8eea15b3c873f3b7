// moonmoe/parallel/deadline.hpp: waiting with a deadline for something in flight whose progress is polled: the NCCL
// communicator's requests and its initialisation (parallel/nccl.hpp). Host-only, free of CUDA and NCCL, so the
// logic is unit-tested with fakes (test/unit/parallel_deadline.cpp).
//
//   await_progress(poll, abort, timeout, what, hint)
//       calls poll() -> Progress until it reports done or failed, or `timeout` has passed since the call began;
//       on failure or timeout calls abort() (once) and throws comm_error:
//         "<what>: <error>; the communicator was aborted"
//         "<what>: not complete after <timeout> ms (<hint>); the communicator was aborted"
//       An exception thrown by poll() itself (a usage error, a CUDA error) propagates as it is, without abort().
//   progress_of(status, success, in_progress, describe)
//       an NCCL-style status as Progress: success is done, in_progress (ncclInProgress: a non-blocking
//       communicator still working in its own thread) is pending, anything else failed with describe(status).
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "comm.hpp"

namespace moonmoe::parallel {

/// What one look at an operation in flight found.
struct Progress {
    enum class State { pending, done, failed };
    State state = State::pending;
    std::string error;  ///< what went wrong, when failed

    static Progress pending() { return {}; }
    static Progress done() { return {State::done, {}}; }
    static Progress failed(std::string error) { return {State::failed, std::move(error)}; }
};

template <class Status, class Describe>
Progress progress_of(Status status, Status success, Status in_progress, Describe&& describe) {
    if (status == success) return Progress::done();
    if (status == in_progress) return Progress::pending();
    return Progress::failed(std::string(describe(status)));
}

/// Clock is a parameter so that tests can step time instead of sleeping.
template <class Clock = std::chrono::steady_clock, class Poll, class Abort>
void await_progress(Poll&& poll, Abort&& abort, std::chrono::milliseconds timeout, const std::string& what,
                    const std::string& hint) {
    const auto deadline = Clock::now() + timeout;
    const auto give_up = [&](const std::string& why) {
        try {
            abort();
        } catch (...) {  // the failure being reported matters more than one in tearing down
        }
        throw comm_error(what + ": " + why + "; the communicator was aborted");
    };
    for (long polls = 1;; ++polls) {
        Progress p = poll();
        if (p.state == Progress::State::done) return;
        if (p.state == Progress::State::failed) give_up(p.error);
        if (Clock::now() >= deadline)
            give_up("not complete after " + std::to_string(timeout.count()) + " ms (" + hint + ")");
        // Spin first (a collective often completes within microseconds), then stop burning a core.
        if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

}  // namespace moonmoe::parallel
