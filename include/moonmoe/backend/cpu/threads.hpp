// moonmoe/backend/cpu/threads.hpp: how many threads the CPU backend uses, and the pool its parallel loops run on.
//
// The default thread count honours the process's CPU affinity and its cgroup CPU quota (a container limited to
// 1.5 CPUs on a 64-core host gets 2 threads, not 64); OMP_NUM_THREADS, when set, wins; set_threads() overrides all.
//
// The loops do not use OpenMP's runtime: libgomp's threads spin at every barrier (GOMP_SPINCOUNT, fixed when the
// program starts), so on a machine where another process holds a core, a thread waiting for a descheduled partner
// burns its time slice and every small parallel region costs a scheduler round (measured on 2 loaded vCPUs: an
// empty 2-thread region took 20 ms, against 50 us with OMP_WAIT_POLICY=passive). Here:
// - work is split into more chunks than threads and claimed dynamically, and the caller works too, so a
//   descheduled thread costs a share of the work, never a wait for it to start;
// - idle workers spin briefly, then sleep on a futex (std::atomic::wait); a caller that will post a job after
//   serial work of its own (packing an operand) can wake them first (wake_workers), so that their wake-up, tens of
//   microseconds on a VM, overlaps that work;
// - a loop runs inline until it has taken a few tens of microseconds, so small loops never wake a thread.
// Results never depend on the timing: a loop's f(i) is the same computation on any thread, and a parallel
// primitive called inside another's body (a GEMM inside a per-head loop) runs inline, as one piece, whether the
// outer loop went parallel or not. How a GEMM is cut into panels depends on the thread count (ops.hpp), so
// results are bitwise repeatable for a fixed thread count. Built without OpenMP (MOONMOE_WITH_OPENMP off),
// everything runs on the calling thread.
#pragma once

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "../../config/named.hpp"

namespace moonmoe {

/// Where a default thread count came from.
enum class ThreadSource { omp_num_threads, cgroup_quota, affinity, hardware };

/// The default thread count and what decided it (default_threads()).
struct ThreadDefault {
    int count = 1;
    ThreadSource source = ThreadSource::hardware;
    int affinity_cpus = 0;    ///< CPUs this process may run on (sched_getaffinity), 0 if unknown
    double quota_cpus = 0.0;  ///< the tightest cgroup CPU quota found, in CPUs (quota / period), 0 if none

    std::string describe() const {
        std::ostringstream s;
        s << count << " thread" << (count == 1 ? "" : "s") << " (";
        switch (source) {
        case ThreadSource::omp_num_threads: s << "OMP_NUM_THREADS"; break;
        case ThreadSource::cgroup_quota: s << "cgroup CPU quota " << quota_cpus << " CPUs"; break;
        case ThreadSource::affinity: s << "CPU affinity"; break;
        case ThreadSource::hardware: s << "std::thread::hardware_concurrency"; break;
        }
        if (affinity_cpus > 0) s << "; " << affinity_cpus << " CPUs in the affinity mask";
        if (quota_cpus > 0 && source != ThreadSource::cgroup_quota) s << "; cgroup quota " << quota_cpus << " CPUs";
        s << ")";
        return s.str();
    }
};

namespace detail::cpu_count {

inline std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r'))
        s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
        s.remove_suffix(1);
    return s;
}
/// A whole non-negative decimal integer, or nothing.
inline std::optional<long long> parse_count(std::string_view s) {
    s = trim(s);
    if (s.empty() || s.size() > 18) return std::nullopt;
    long long v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        v = v * 10 + (c - '0');
    }
    return v;
}

/// cgroup v2 `cpu.max`: "$MAX $PERIOD" in microseconds, "max" for no limit. Returns the quota in CPUs (MAX /
/// PERIOD), or nothing for no limit or a malformed file.
inline std::optional<double> parse_cpu_max(std::string_view text) {
    text = trim(text);
    const std::size_t space = text.find_first_of(" \t");
    const std::string_view max = text.substr(0, space);
    if (max == "max") return std::nullopt;
    const auto quota = parse_count(max);
    const auto period = space == std::string_view::npos ? std::optional<long long>(100000)  // the kernel's default
                                                        : parse_count(text.substr(space));
    if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
    return double(*quota) / double(*period);
}

/// cgroup v1 `cpu.cfs_quota_us` ("-1": no limit) and `cpu.cfs_period_us`: the quota in CPUs, or nothing.
inline std::optional<double> parse_cfs_quota(std::string_view quota_text, std::string_view period_text) {
    const auto quota = parse_count(quota_text), period = parse_count(period_text);  // "-1" is not a count
    if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
    return double(*quota) / double(*period);
}

/// Threads for a quota of `cpus` CPUs: rounded up (1.5 CPUs of time can keep 2 threads busy 75% each), at least 1.
inline int threads_for_quota(double cpus) { return int(std::clamp(std::ceil(cpus - 1e-9), 1.0, 1e6)); }

/// OMP_NUM_THREADS as OpenMP reads it: a positive integer, or a comma list whose first entry is used here.
inline std::optional<int> parse_omp_num_threads(const char* value) {
    if (!value) return std::nullopt;
    std::string_view s(value);
    const auto n = parse_count(s.substr(0, s.find(',')));
    if (!n || *n < 1 || *n > 1'000'000) return std::nullopt;
    return int(*n);
}

/// The directories whose CPU limits apply to this process, innermost first, from the text of /proc/self/cgroup
/// and /proc/self/mountinfo: for cgroup v2 the unified hierarchy, for v1 the one with the `cpu` controller. Each is
/// the mount point joined with the process's cgroup path (relative to the mount's root), then its parents up to
/// the mount point. `version` is set to 1 or 2 for the hierarchy found (0: none).
inline std::vector<std::string> cgroup_cpu_dirs(std::string_view proc_cgroup, std::string_view mountinfo,
                                                int& version) {
    auto lines = [](std::string_view text) {
        std::vector<std::string_view> out;
        while (!text.empty()) {
            const std::size_t nl = text.find('\n');
            out.push_back(text.substr(0, nl));
            if (nl == std::string_view::npos) break;
            text.remove_prefix(nl + 1);
        }
        return out;
    };
    auto fields = [](std::string_view line, char sep) {
        std::vector<std::string_view> out;
        for (;;) {
            const std::size_t p = line.find(sep);
            out.push_back(line.substr(0, p));
            if (p == std::string_view::npos) return out;
            line.remove_prefix(p + 1);
        }
    };
    auto has_cpu = [&](std::string_view list) {
        for (std::string_view c : fields(list, ','))
            if (c == "cpu") return true;
        return false;
    };
    // /proc/self/cgroup: "ID:controllers:path"; v2 is "0::path"
    std::string_view v1_path, v2_path;
    bool have_v1 = false, have_v2 = false;
    for (std::string_view line : lines(proc_cgroup)) {
        const std::size_t a = line.find(':'), b = a == std::string_view::npos ? a : line.find(':', a + 1);
        if (b == std::string_view::npos) continue;
        const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1),
                               path = line.substr(b + 1);
        if (id == "0" && controllers.empty()) have_v2 = true, v2_path = path;
        else if (has_cpu(controllers))
            have_v1 = true, v1_path = path;
    }
    // /proc/self/mountinfo: "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS"
    version = 0;
    for (int want : {1, 2}) {  // v1's cpu controller first: on a hybrid system it is the one that limits
        if ((want == 1 && !have_v1) || (want == 2 && !have_v2)) continue;
        for (std::string_view line : lines(mountinfo)) {
            const std::size_t dash = line.find(" - ");
            if (dash == std::string_view::npos) continue;
            const auto pre = fields(line.substr(0, dash), ' '), post = fields(line.substr(dash + 3), ' ');
            if (pre.size() < 5 || post.size() < 3) continue;
            const bool match = want == 2 ? post[0] == "cgroup2" : post[0] == "cgroup" && has_cpu(post[2]);
            if (!match) continue;
            std::string root(pre[3]), mount(pre[4]), path(want == 2 ? v2_path : v1_path);
            if (root != "/" && path.compare(0, root.size(), root) == 0) path.erase(0, root.size());
            else if (root != "/")
                path = "/";  // the process's cgroup is outside this mount's view: use its root
            if (path.empty() || path.front() != '/') path.insert(path.begin(), '/');
            std::vector<std::string> dirs;
            for (;;) {
                while (path.size() > 1 && path.back() == '/') path.pop_back();
                dirs.push_back(path == "/" ? mount : mount + path);
                if (path == "/") break;
                path.erase(std::max<std::size_t>(1, path.rfind('/')));
            }
            version = want;
            return dirs;
        }
    }
    return {};
}

inline std::optional<std::string> read_text(const std::string& path) {
    std::ifstream in(path);
    if (!in) return std::nullopt;
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// The tightest CPU quota of the cgroups this process is in, in CPUs; nothing when unlimited or unknown.
inline std::optional<double> cgroup_cpu_quota() {
    const auto cgroup = read_text("/proc/self/cgroup"), mountinfo = read_text("/proc/self/mountinfo");
    if (!cgroup || !mountinfo) return std::nullopt;
    int version = 0;
    std::optional<double> best;
    for (const std::string& dir : cgroup_cpu_dirs(*cgroup, *mountinfo, version)) {
        std::optional<double> q;
        if (version == 2) {
            if (const auto t = read_text(dir + "/cpu.max")) q = parse_cpu_max(*t);
        } else {
            const auto quota = read_text(dir + "/cpu.cfs_quota_us"), period = read_text(dir + "/cpu.cfs_period_us");
            if (quota && period) q = parse_cfs_quota(*quota, *period);
        }
        if (q && (!best || *q < *best)) best = q;
    }
    return best;
}

/// CPUs in this process's affinity mask (taskset, cpusets, a container's --cpuset-cpus), 0 if unknown.
inline int affinity_cpus() {
#if defined(__linux__)
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
    return 0;
}

}  // namespace detail::cpu_count

/// The thread count the CPU backend uses unless set_threads() says otherwise: OMP_NUM_THREADS if set (its first
/// entry), else the CPUs of the affinity mask, lowered to the cgroup CPU quota (cgroup v2 cpu.max, v1
/// cpu.cfs_quota_us / cpu.cfs_period_us) rounded up. Reads the environment and /proc afresh on every call.
inline ThreadDefault default_threads() {
    ThreadDefault d;
    d.affinity_cpus = detail::cpu_count::affinity_cpus();
    if (const auto q = detail::cpu_count::cgroup_cpu_quota()) d.quota_cpus = *q;
    if (const auto n = detail::cpu_count::parse_omp_num_threads(std::getenv("OMP_NUM_THREADS"))) {
        d.count = *n, d.source = ThreadSource::omp_num_threads;
        return d;
    }
    if (d.affinity_cpus > 0) d.count = d.affinity_cpus, d.source = ThreadSource::affinity;
    else
        d.count = int(std::max(1u, std::thread::hardware_concurrency())), d.source = ThreadSource::hardware;
    if (d.quota_cpus > 0 && detail::cpu_count::threads_for_quota(d.quota_cpus) < d.count)
        d.count = detail::cpu_count::threads_for_quota(d.quota_cpus), d.source = ThreadSource::cgroup_quota;
    return d;
}

namespace backend::cpu_detail {
inline std::atomic<int>& thread_setting() {  // 0: not set, use the default
    static std::atomic<int> n{0};
    return n;
}
inline int default_thread_count() {
    static const int n = [] {
        Eigen::setNbThreads(1);  // products are split by Ops::gemm; Eigen's own GEMM threads synchronise by spinning
        return default_threads().count;
    }();
    return n;
}
}  // namespace backend::cpu_detail

/// Threads used by GEMM and the parallel loops from now on (n >= 1; the default: default_threads()). This does
/// not change OpenMP's settings; Eigen's own GEMM threading is kept off (Eigen::setNbThreads(1)).
inline void set_threads(int n) {
    backend::cpu_detail::default_thread_count();
    backend::cpu_detail::thread_setting().store(std::max(1, n), std::memory_order_relaxed);
}

/// The threads the CPU backend uses (1 when built without OpenMP).
inline int threads() {
#if defined(_OPENMP)
    const int n = backend::cpu_detail::thread_setting().load(std::memory_order_relaxed);
    return n > 0 ? n : backend::cpu_detail::default_thread_count();
#else
    return 1;
#endif
}

namespace backend::cpu_detail {

/// > 0 while this thread runs the body of a parallel loop: parallel primitives called there run in order, inline.
inline thread_local int parallel_depth = 0;
struct BodyScope {
    BodyScope() { ++parallel_depth; }
    ~BodyScope() { --parallel_depth; }
    BodyScope(const BodyScope&) = delete;
    BodyScope& operator=(const BodyScope&) = delete;
};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
}

/// Spins while pred() holds, for at most `seconds`; returns whether pred() stopped holding.
template <class Pred>
bool spin_while(Pred pred, double seconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (int i = 1;; ++i) {
        if (!pred()) return true;
        cpu_relax();
        if (i % 64 == 0 && std::chrono::steady_clock::now() > until) return !pred();
    }
}

/// Worker threads that run chunks of one job at a time alongside the caller (see the top of this file).
class ThreadPool {
public:
    // Spinning longer cost 5-10% more CPU time per small layer step at 2 threads on 2 loaded vCPUs (200 us against
    // 5-50 us) and bought nothing measurable; a sleeping worker is woken by a futex (tens of us on a VM).
    static constexpr double worker_spin_seconds = 20e-6;  ///< an idle worker's wait for the next job before sleeping
    static constexpr double caller_spin_seconds = 20e-6;  ///< the caller's wait for chunks in flight before sleeping
#if defined(_OPENMP)
    static constexpr bool threads_enabled = true;
#else
    static constexpr bool threads_enabled = false;  // no worker is ever started (nor std::thread linked)
#endif

    static ThreadPool& instance() {
        static auto* pool = new ThreadPool;  // never destroyed: workers sleep until the process ends
        return *pool;
    }

    /// body(c) for every c in [0, chunks), on up to `threads` threads (the caller included), each chunk once, in
    /// any order. The first exception thrown by a chunk is rethrown here after the others have finished or been
    /// skipped. Called while the pool is busy (another application thread) or from inside a body: runs inline.
    template <class Body>
    void run(index_t chunks, int threads, Body& body) {
        if (threads <= 1 || chunks <= 1 || parallel_depth > 0 || !threads_enabled || !busy_.try_lock()) {
            BodyScope scope;
            for (index_t c = 0; c < chunks; ++c) body(c);
            return;
        }
#if defined(_OPENMP)
        std::lock_guard<std::mutex> lock(busy_, std::adopt_lock);
        const int helpers = int(std::min<index_t>(threads, chunks)) - 1;
        start_workers(helpers);
        Job job;
        job.call = [](void* b, index_t c) { (*static_cast<Body*>(b))(c); };
        job.body = const_cast<void*>(static_cast<const void*>(&body));
        job.chunks = std::uint32_t(chunks), job.helpers = helpers;
        job_.store(&job);
        epoch_.fetch_add(1, std::memory_order_release);
        epoch_.notify_all();
        work(job);
        // chunks still running on workers: spin a little, then sleep until the last one finishes
        auto pending = [&] { return job.done.load(std::memory_order_acquire) < job.chunks; };
        if (!spin_while(pending, caller_spin_seconds))
            for (std::uint32_t d; (d = job.done.load(std::memory_order_acquire)) < job.chunks;) job.done.wait(d);
        // close the job, then wait for the workers that may still be looking at it (a few instructions each)
        job_.store(nullptr);
        while (inside_.load() != 0) std::this_thread::yield();
        if (job.error) std::rethrow_exception(job.error);
#endif
    }

    /// Wakes the idle workers of up to `threads` threads (the caller included) ahead of a job this thread will post
    /// once it has done `seconds` of work of its own (packing an operand), and keeps them spinning that long: a
    /// sleeping worker takes tens of microseconds to wake (60-80 us on 2 vCPUs of a VM), which then overlaps that
    /// work instead of delaying the job. Does nothing where run() would run the job inline.
    void wake(int threads, double seconds) {
        if (threads <= 1 || parallel_depth > 0 || !threads_enabled || !busy_.try_lock()) return;
#if defined(_OPENMP)
        std::lock_guard<std::mutex> lock(busy_, std::adopt_lock);
        start_workers(threads - 1);
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        spin_until_.store(until.time_since_epoch().count(), std::memory_order_relaxed);
        epoch_.fetch_add(1, std::memory_order_release);  // no job: woken workers find none, and spin
        epoch_.notify_all();
#endif
    }

private:
    struct Job {
        void (*call)(void*, index_t) = nullptr;
        void* body = nullptr;
        std::uint32_t chunks = 0;
        int helpers = 0;  ///< workers 0 .. helpers-1 may take part
        std::atomic<std::uint32_t> next{0}, done{0};
        std::atomic<bool> failed{false};
        std::mutex error_mutex;
        std::exception_ptr error;
    };

    ThreadPool() = default;

    static void work(Job& job) {
        BodyScope scope;
        for (std::uint32_t c; (c = job.next.fetch_add(1, std::memory_order_relaxed)) < job.chunks;) {
            if (!job.failed.load(std::memory_order_relaxed)) {
                try {
                    job.call(job.body, index_t(c));
                } catch (...) {
                    std::lock_guard<std::mutex> lock(job.error_mutex);
                    if (!job.error) job.error = std::current_exception();
                    job.failed.store(true, std::memory_order_relaxed);
                }
            }
            if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks) job.done.notify_all();
        }
    }

    void start_workers(int n) {
        while (int(workers_) < n) {
            std::thread(&ThreadPool::worker_loop, this, int(workers_), epoch_.load()).detach();
            ++workers_;
        }
    }

    void worker_loop(int id, std::uint32_t seen) {
        using clock = std::chrono::steady_clock;
        for (;;) {
            auto idle = [&] { return epoch_.load(std::memory_order_acquire) == seen; };
            // spin the usual while, or until a job announced by wake() is due
            const clock::time_point due{clock::duration(spin_until_.load(std::memory_order_relaxed))};
            const double announced = std::chrono::duration<double>(due - clock::now()).count();
            if (!spin_while(idle, std::max(worker_spin_seconds, announced)))
                while (idle()) epoch_.wait(seen, std::memory_order_acquire);
            seen = epoch_.load(std::memory_order_acquire);
            // Announce before looking (both sequentially consistent): either the caller sees us inside and waits,
            // or we see the job already closed and never touch it.
            inside_.fetch_add(1);
            if (Job* job = job_.load(); job && id < job->helpers) work(*job);
            inside_.fetch_sub(1);
        }
    }

    std::mutex busy_;          ///< held by the application thread whose job the pool runs
    std::size_t workers_ = 0;  ///< started so far (guarded by busy_)
    std::atomic<Job*> job_{nullptr};
    std::atomic<std::uint32_t> epoch_{0};  ///< bumped for every job and by wake(); idle workers wait on it
    std::atomic<std::chrono::steady_clock::rep> spin_until_{0};  ///< the job wake() announced is due by then
    std::atomic<int> inside_{0};                                 ///< workers that may be reading job_
};

/// How a loop of unknown cost per item goes parallel (parallel_for). A worker that arrives late takes the next
/// chunk and the caller may wait for it: short chunks bound that loss, and a remainder too short to share is not.
struct LoopPolicy {
    static constexpr double inline_seconds = 20e-6;    ///< run inline at least this long before going parallel
    static constexpr double min_rest_seconds = 50e-6;  ///< below this estimated remainder, finish inline
    static constexpr double chunk_seconds = 10e-6;     ///< aim for chunks at least this long
    static constexpr int chunks_per_thread = 16;       ///< at most this many chunks per thread
};

/// f(i) for i in [lo, hi). Every path of parallel_for runs its items through this one out-of-line loop, so f is
/// compiled once, in one context: GCC vectorised a row loop of f called from a plain loop but not the same f in a
/// loop that also read the clock (scale_rows: 120 us against 10 us at two threads).
template <class F>
[[gnu::noinline]] void run_items(F& f, index_t lo, index_t hi) {
    for (index_t i = lo; i < hi; ++i) f(i);
}
/// run_items as the body of a loop: the parallel primitives f calls run inline.
template <class F>
void run_items_inline(F& f, index_t lo, index_t hi) {
    const BodyScope scope;
    run_items(f, lo, hi);
}

/// Calls f(i) for every i in [0, n). f must not write what another i writes or reads, so the order and the
/// threads do not matter: the loop starts inline and, once it has taken LoopPolicy::inline_seconds, hands the
/// rest to the pool in chunks sized from the time per item so far.
template <class F>
void parallel_for(index_t n, F&& f) {
    if (n <= 0) return;
    const int T = threads();
    if (T <= 1 || n == 1 || parallel_depth > 0) return run_items_inline(f, 0, n);
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    index_t done = 0;
    double elapsed = 0;
    for (index_t next = 1;; next = std::min(n, 2 * next)) {  // the clock is read when the count doubles
        run_items_inline(f, done, next);
        done = next;
        if (done == n) return;
        elapsed = std::chrono::duration<double>(clock::now() - start).count();
        if (elapsed >= LoopPolicy::inline_seconds) break;
    }
    const index_t first = done, rest = n - done;
    const double rest_seconds = elapsed / double(first) * double(rest);
    if (rest_seconds < LoopPolicy::min_rest_seconds) return run_items_inline(f, first, n);
    const index_t most = std::min<index_t>(rest, index_t(T) * LoopPolicy::chunks_per_thread);
    const index_t chunks =
        std::clamp<index_t>(index_t(rest_seconds / LoopPolicy::chunk_seconds), std::min<index_t>(T, most), most);
    auto body = [&](index_t c) { run_items(f, first + rest * c / chunks, first + rest * (c + 1) / chunks); };
    ThreadPool::instance().run(chunks, T, body);
}

/// Wakes the pool's idle workers ahead of a parallel_chunks or parallel_for that this thread starts after `seconds`
/// of serial work (ThreadPool::wake).
inline void wake_workers(double seconds) { ThreadPool::instance().wake(threads(), seconds); }

/// Calls body(c) for c in [0, chunks): chunks of fixed extent, each as heavy as a parallel task should be (GEMM
/// panels, SYRK blocks). In parallel on up to threads() threads; in order on the calling thread inside another
/// loop's body.
template <class Body>
void parallel_chunks(index_t chunks, Body&& body) {
    if (chunks <= 0) return;
    ThreadPool::instance().run(chunks, threads(), body);
}

}  // namespace backend::cpu_detail
}  // namespace moonmoe
