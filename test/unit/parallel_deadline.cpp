// await_progress and progress_of (parallel/deadline.hpp), the bounded waits of the NCCL communicator, with fake
// operations and a clock that steps 1 ms per reading instead of sleeping.
#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include <moonmoe/parallel/deadline.hpp>

namespace unit_parallel_deadline {

using namespace moonmoe::parallel;
using std::chrono::milliseconds;

struct SteppingClock {
    using duration = std::chrono::steady_clock::duration;
    using time_point = std::chrono::steady_clock::time_point;
    static inline time_point t{};
    static time_point now() { return t += milliseconds(1); }
};

/// A fake operation in flight: reports `script` one entry per poll, then repeats its last entry.
struct Fake {
    std::vector<Progress> script;
    int polls = 0, aborts = 0;
    Progress poll() {
        const std::size_t i = std::size_t(polls++);
        return script[i < script.size() ? i : script.size() - 1];
    }
};

/// Runs await_progress over `f`; returns the comm_error's message, or "" when it completed.
std::string run(Fake& f, milliseconds timeout) {
    try {
        await_progress<SteppingClock>([&] { return f.poll(); }, [&] { ++f.aborts; }, timeout,
                                      "all_reduce on world (rank 1 of 4)", "a rank has died");
    } catch (const comm_error& e) {
        return e.what();
    }
    return "";
}

// NCCL's states, as a non-blocking communicator reports them (ncclSuccess, ncclInProgress, ncclRemoteError).
enum class Status { success, in_progress, remote_error };
const char* describe(Status s) { return s == Status::remote_error ? "NCCL error: remote process exited" : "?"; }
Progress of(Status s) { return progress_of(s, Status::success, Status::in_progress, describe); }

TEST_CASE("await_progress: pending polls continue until done, without aborting") {
    Fake f{{Progress::pending(), Progress::pending(), Progress::pending(), Progress::done()}};
    CHECK(run(f, milliseconds(1000)) == "");
    CHECK(f.polls == 4);
    CHECK(f.aborts == 0);
}

TEST_CASE("await_progress: past the deadline it aborts once and names the operation, the rank and the timeout") {
    Fake f{{Progress::pending()}};
    const std::string message = run(f, milliseconds(50));
    CHECK(message ==
          "all_reduce on world (rank 1 of 4): not complete after 50 ms (a rank has died); "
          "the communicator was aborted");
    CHECK(f.aborts == 1);
    CHECK(f.polls == 50);  // one clock reading per poll, 1 ms each
}

TEST_CASE("await_progress: a failure aborts at once with the error, before the deadline") {
    Fake f{{Progress::pending(), Progress::pending(), Progress::failed("NCCL error: remote process exited")}};
    CHECK(run(f, milliseconds(1000)) ==
          "all_reduce on world (rank 1 of 4): NCCL error: remote process exited; the communicator was aborted");
    CHECK(f.polls == 3);
    CHECK(f.aborts == 1);
}

TEST_CASE("await_progress: an exception from poll propagates unchanged and does not abort") {
    int aborts = 0;
    CHECK_THROWS_WITH_AS(await_progress<SteppingClock>([]() -> Progress { throw std::logic_error("waited too early"); },
                                                       [&] { ++aborts; }, milliseconds(1000), "recv", "hint"),
                         "waited too early", std::logic_error);
    CHECK(aborts == 0);
}

TEST_CASE("await_progress: an abort that throws still reports the failure") {
    CHECK_THROWS_WITH_AS(await_progress<SteppingClock>([] { return Progress::pending(); },
                                                       [] { throw std::runtime_error("abort failed"); },
                                                       milliseconds(3), "split on world (rank 0 of 2)", "hint"),
                         "split on world (rank 0 of 2): not complete after 3 ms (hint); the communicator was aborted",
                         comm_error);
}

TEST_CASE("progress_of: success is done, in progress is pending, anything else failed with its description") {
    CHECK(of(Status::success).state == Progress::State::done);
    CHECK(of(Status::in_progress).state == Progress::State::pending);
    const Progress failed = of(Status::remote_error);
    CHECK(failed.state == Progress::State::failed);
    CHECK(failed.error == "NCCL error: remote process exited");
}

TEST_CASE("a non-blocking initialisation: in progress keeps polling, then success completes or an error aborts") {
    Fake joins{{of(Status::in_progress), of(Status::in_progress), of(Status::in_progress), of(Status::in_progress),
                of(Status::in_progress), of(Status::success)}};
    CHECK(run(joins, milliseconds(1000)) == "");
    CHECK(joins.polls == 6);
    CHECK(joins.aborts == 0);

    Fake dies{{of(Status::in_progress), of(Status::in_progress), of(Status::remote_error)}};
    CHECK(run(dies, milliseconds(1000)) ==
          "all_reduce on world (rank 1 of 4): NCCL error: remote process exited; the communicator was aborted");
    CHECK(dies.polls == 3);
    CHECK(dies.aborts == 1);

    Fake never{{of(Status::in_progress)}};
    CHECK(run(never, milliseconds(20)).find("not complete after 20 ms") != std::string::npos);
    CHECK(never.aborts == 1);
}

}  // namespace unit_parallel_deadline
