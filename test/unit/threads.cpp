// The CPU backend's thread count (affinity, cgroup quota, OMP_NUM_THREADS) and its parallel loops.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include "support/thread_count.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_threads {

using namespace moonmoe;
using backend::cpu_detail::parallel_chunks;
using backend::cpu_detail::parallel_for;

namespace cc = moonmoe::detail::cpu_count;

using moonmoe::testing::ThreadCount;

TEST_CASE("cgroup v2 cpu.max: quota / period in CPUs, nothing for 'max' or a malformed file") {
    CHECK(cc::parse_cpu_max("150000 100000\n") == 1.5);
    CHECK(cc::parse_cpu_max("50000 100000") == 0.5);
    CHECK(cc::parse_cpu_max("400000 100000") == 4.0);
    CHECK(cc::parse_cpu_max("200000") == 2.0);  // period omitted: the kernel's 100000
    CHECK_FALSE(cc::parse_cpu_max("max 100000\n"));
    CHECK_FALSE(cc::parse_cpu_max("max"));
    CHECK_FALSE(cc::parse_cpu_max(""));
    CHECK_FALSE(cc::parse_cpu_max("0 100000"));
    CHECK_FALSE(cc::parse_cpu_max("1.5 100000"));
    CHECK_FALSE(cc::parse_cpu_max("100000 0"));
    CHECK_FALSE(cc::parse_cpu_max("abc def"));
}

TEST_CASE("cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us: -1 is no limit") {
    CHECK(cc::parse_cfs_quota("250000\n", "100000\n") == 2.5);
    CHECK(cc::parse_cfs_quota("50000", "100000") == 0.5);
    CHECK_FALSE(cc::parse_cfs_quota("-1\n", "100000\n"));
    CHECK_FALSE(cc::parse_cfs_quota("100000", ""));
    CHECK_FALSE(cc::parse_cfs_quota("x", "100000"));
}

TEST_CASE("a CPU quota becomes a thread count rounded up, at least 1, OMP_NUM_THREADS is read as OpenMP reads it") {
    CHECK(cc::threads_for_quota(0.01) == 1);
    CHECK(cc::threads_for_quota(0.5) == 1);
    CHECK(cc::threads_for_quota(1.0) == 1);
    CHECK(cc::threads_for_quota(1.5) == 2);
    CHECK(cc::threads_for_quota(2.0) == 2);
    CHECK(cc::threads_for_quota(7.2) == 8);
    CHECK(cc::parse_omp_num_threads("3") == 3);
    CHECK(cc::parse_omp_num_threads(" 4\n") == 4);
    CHECK(cc::parse_omp_num_threads("2,1") == 2);  // nested levels: the first is ours
    CHECK_FALSE(cc::parse_omp_num_threads(nullptr));
    CHECK_FALSE(cc::parse_omp_num_threads(""));
    CHECK_FALSE(cc::parse_omp_num_threads("0"));
    CHECK_FALSE(cc::parse_omp_num_threads("-2"));
    CHECK_FALSE(cc::parse_omp_num_threads("many"));
}

TEST_CASE("the cgroup directories that limit this process, from /proc/self/cgroup and /proc/self/mountinfo") {
    int version = -1;
    const std::string v2_mount =
        "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 "
        "rw,nsdelegate,memory_recursiveprot\n";
    SUBCASE("cgroup v2 on a host: the process's cgroup and its parents") {
        const auto dirs =
            cc::cgroup_cpu_dirs("0::/user.slice/user-0.slice/session-3.scope\n",
                                "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n" + v2_mount, version);
        CHECK(version == 2);
        CHECK(dirs == std::vector<std::string>{"/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope",
                                               "/sys/fs/cgroup/user.slice/user-0.slice", "/sys/fs/cgroup/user.slice",
                                               "/sys/fs/cgroup"});
    }
    SUBCASE("cgroup v2 in a container with its own cgroup namespace") {
        const auto dirs = cc::cgroup_cpu_dirs("0::/\n", v2_mount, version);
        CHECK(version == 2);
        CHECK(dirs == std::vector<std::string>{"/sys/fs/cgroup"});
    }
    const std::string v1_cgroup = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n";
    SUBCASE("cgroup v1 in a container: the cpu hierarchy mounted at the container's own cgroup") {
        const auto dirs = cc::cgroup_cpu_dirs(
            v1_cgroup,
            "40 35 0:35 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
            "41 35 0:36 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid master:17 - cgroup cgroup rw,cpu,cpuacct\n",
            version);
        CHECK(version == 1);
        CHECK(dirs == std::vector<std::string>{"/sys/fs/cgroup/cpu,cpuacct"});
    }
    SUBCASE("cgroup v1 on a host: the hierarchy's root is the mount point") {
        const auto dirs = cc::cgroup_cpu_dirs(
            v1_cgroup, "41 35 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:17 - cgroup cgroup rw,cpu,cpuacct\n",
            version);
        CHECK(version == 1);
        CHECK(dirs == std::vector<std::string>{"/sys/fs/cgroup/cpu,cpuacct/docker/abc",
                                               "/sys/fs/cgroup/cpu,cpuacct/docker", "/sys/fs/cgroup/cpu,cpuacct"});
    }
    SUBCASE("no cgroup file system") {
        CHECK(cc::cgroup_cpu_dirs("", "", version).empty());
        CHECK(version == 0);
    }
}

TEST_CASE("default_threads: OMP_NUM_THREADS wins, otherwise at most the affinity mask and the cgroup quota allow") {
    const char* saved = std::getenv("OMP_NUM_THREADS");
    const std::string saved_value = saved ? saved : "";
    ::setenv("OMP_NUM_THREADS", "3", 1);
    const ThreadDefault omp = default_threads();
    CHECK(omp.count == 3);
    CHECK(omp.source == ThreadSource::omp_num_threads);
    CHECK(omp.describe().find("OMP_NUM_THREADS") != std::string::npos);
    ::unsetenv("OMP_NUM_THREADS");
    const ThreadDefault d = default_threads();
    if (saved) ::setenv("OMP_NUM_THREADS", saved_value.c_str(), 1);
    MESSAGE("default here: " << d.describe());
    CHECK(d.count >= 1);
    CHECK(d.source != ThreadSource::omp_num_threads);
    if (d.affinity_cpus > 0) CHECK(d.count <= d.affinity_cpus);
    if (d.quota_cpus > 0) CHECK(d.count <= cc::threads_for_quota(d.quota_cpus));
}

TEST_CASE("parallel_for calls every index exactly once, short and long loops, cheap and costly items") {
    const ThreadCount restore;
    for (int t : {1, 2, 3}) {
        set_threads(t);
        CAPTURE(t);
        for (index_t n : {0, 1, 2, 7, 1000, 200000}) {
            CAPTURE(n);
            std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
            parallel_for(n, [&](index_t i) { hits[std::size_t(i)].fetch_add(1, std::memory_order_relaxed); });
            int wrong = 0;
            for (auto& h : hits) wrong += h.load() != 1;
            CHECK(wrong == 0);
        }
        // items of ~100 us: the loop leaves the calling thread after the first few
        std::vector<std::atomic<int>> hits(64);
        std::atomic<int> on_other_threads{0};
        const auto caller = std::this_thread::get_id();
        parallel_for(64, [&](index_t i) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
            while (std::chrono::steady_clock::now() < until) {}
            hits[std::size_t(i)].fetch_add(1);
            if (std::this_thread::get_id() != caller) on_other_threads.fetch_add(1);
        });
        int wrong = 0;
        for (auto& h : hits) wrong += h.load() != 1;
        CHECK(wrong == 0);
        if (t == 1) CHECK(on_other_threads.load() == 0);
        MESSAGE(t << " threads: " << on_other_threads.load() << " of 64 costly items ran on a worker");
    }
}

TEST_CASE("parallel loops: nested loops run inline, an exception reaches the caller, two callers at once both finish") {
    const ThreadCount restore;
    set_threads(2);
    // nested: every (i, j) once
    std::vector<std::atomic<int>> hits(40 * 300);
    parallel_chunks(
        40, [&](index_t i) { parallel_for(300, [&](index_t j) { hits[std::size_t(i * 300 + j)].fetch_add(1); }); });
    int wrong = 0;
    for (auto& h : hits) wrong += h.load() != 1;
    CHECK(wrong == 0);
    // an exception in a chunk: rethrown once every other chunk has finished or been skipped; the pool still works
    std::atomic<int> ran{0};
    CHECK_THROWS_WITH_AS(parallel_chunks(64,
                                         [&](index_t c) {
                                             ran.fetch_add(1);
                                             std::this_thread::sleep_for(std::chrono::microseconds(200));
                                             if (c == 5) throw std::runtime_error("chunk 5 failed");
                                         }),
                         "chunk 5 failed", std::runtime_error);
    CHECK(ran.load() >= 1);
    std::atomic<long> sum{0};
    parallel_chunks(100, [&](index_t c) { sum.fetch_add(long(c)); });
    CHECK(sum.load() == 4950);
    // two application threads: one gets the pool, the other runs inline; both complete every chunk
    std::atomic<long> a{0}, b{0};
    auto job = [](std::atomic<long>& s) {
        for (int r = 0; r < 20; ++r)
            parallel_chunks(50, [&](index_t c) {
                std::this_thread::sleep_for(std::chrono::microseconds(20));
                s.fetch_add(long(c));
            });
    };
    std::thread other([&] { job(a); });
    job(b);
    other.join();
    CHECK(a.load() == 20 * 1225);
    CHECK(b.load() == 20 * 1225);
}

TEST_CASE("wake_workers: jobs after a wake, or after a wake that no job followed, run every chunk once") {
    using backend::cpu_detail::wake_workers;
    const ThreadCount restore;
    set_threads(2);
    // a wake with no job wakes workers that find none; a wake ahead of a job, before or after the workers have gone
    // back to sleep; a wake inside a chunk (nested: nothing to do) and from a second application thread at once
    auto caller = [](std::vector<std::atomic<int>>& hits) {
        for (int r = 0; r < 60; ++r) {
            wake_workers(r % 3 == 0 ? 0.0 : 200e-6);
            if (r % 4 == 1) std::this_thread::sleep_for(std::chrono::microseconds(300));
            if (r % 5 == 2) continue;  // no job
            parallel_chunks(17, [&](index_t c) {
                if (c == 3) wake_workers(1e-3);
                hits[std::size_t(r * 17 + c)].fetch_add(1);
            });
        }
    };
    std::vector<std::atomic<int>> mine(60 * 17), other_hits(60 * 17);
    std::thread other([&] { caller(other_hits); });
    caller(mine);
    other.join();
    int wrong = 0;
    for (int r = 0; r < 60; ++r)
        for (int c = 0; c < 17; ++c) {
            const int want = r % 5 == 2 ? 0 : 1;
            wrong += mine[std::size_t(r * 17 + c)].load() != want;
            wrong += other_hits[std::size_t(r * 17 + c)].load() != want;
        }
    CHECK(wrong == 0);
    set_threads(1);
    wake_workers(1e-3);  // one thread: nothing to wake
    std::atomic<long> sum{0};
    parallel_chunks(10, [&](index_t c) { sum.fetch_add(long(c)); });
    CHECK(sum.load() == 45);
}

}  // namespace unit_threads
