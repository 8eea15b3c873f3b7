// Memory<B> on every backend of the build (MOONMOE_TEST_BACKENDS): zeroed allocations, copies, the host crossings
// and the byte counts; on CUDA also the per-thread current stream, the errors of failed calls (the first failure
// named, none thrown from a destructor), the retry of an allocation after trimming the pool, and the activation
// offload to pinned host memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "support/backends.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_memory {

using namespace moonmoe;
using namespace moonmoe::testing;

TEST_CASE_TEMPLATE("Memory: zeroed allocations, copies within the backend, the crossings, live bytes counted", B,
                   MOONMOE_TEST_BACKENDS) {
    auto& stats = backend::Memory<B>::stats();
    const std::size_t before = stats.current.load();
    {
        Tensor<float, 2, B> t({7, 9});
        CHECK(stats.current.load() == before + 7 * 9 * sizeof(float));
        CHECK(stats.peak.load() >= stats.current.load());
        for (float x : to_host(t)) CHECK(x == 0.0f);

        std::vector<float> values(63);
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.5f;
        copy_to_device(std::span<const float>(values), t.view());
        const Tensor<float, 2, B> c = t.clone();
        CHECK(to_host(c) == values);
        CHECK(element_to_host(c.view(), 10) == 5.0f);
        t.zero();
        for (float x : to_host(t)) CHECK(x == 0.0f);
        CHECK(to_host(c) == values);  // the clone is its own memory
    }
    CHECK(stats.current.load() == before);
    CHECK(backend::Memory<B>::allocate(0) == nullptr);
    backend::Memory<B>::release(nullptr);
}

TEST_CASE_TEMPLATE("Tensor::for_overwrite: the shape and the byte count of a tensor, the contents left to the writer",
                   B, MOONMOE_TEST_BACKENDS) {
    auto& stats = backend::Memory<B>::stats();
    const std::size_t before = stats.current.load();
    {
        auto t = Tensor<float, 2, B>::for_overwrite({300, 500});
        CHECK(t.shape() == Shape<2>{300, 500});
        CHECK(stats.current.load() == before + 300 * 500 * sizeof(float));
        if constexpr (std::is_same_v<B, moonmoe::cuda>) {
            if (backend::Memory<B>::in_host_memory) {  // the emulation marks it: NaN until written
                const std::vector<float> host = to_host(t);
                CHECK(std::all_of(host.begin(), host.end(), [](float x) { return std::isnan(x); }));
            }
        }
        std::vector<float> values(std::size_t(t.numel()));
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i % 13);
        copy_to_device(std::span<const float>(values), t.view());
        CHECK(to_host(t) == values);
        CHECK(to_host(t.clone()) == values);  // clone writes all of its copy
        using Vec = Tensor<float, 1, B>;
        CHECK(Vec::for_overwrite({0}).empty());
        CHECK_THROWS_AS(Vec::for_overwrite({-1}), shape_error);
    }
    CHECK(stats.current.load() == before);
}

TEST_CASE("Memory<cpu>: released medium and large blocks are reused, cleared, for requests of about their size") {
    using Memory = backend::Memory<cpu>;
    Memory::trim();
    for (const std::size_t bytes : {std::size_t(300) << 10, std::size_t(7) << 20}) {  // aligned_alloc'ed, mmap'ed
        CAPTURE(bytes);
        auto* p = static_cast<unsigned char*>(Memory::allocate(bytes));
        std::memset(p, 0xab, bytes);
        Memory::release(p);
        const std::size_t held = Memory::cached_bytes();
        CHECK(held >= bytes);
        // within 20 % of the block: the same memory again, zeroed up to the request; a tenth of it: not this block
        auto* q = static_cast<unsigned char*>(Memory::allocate(bytes - bytes / 8));
        CHECK(q == p);
        CHECK(Memory::cached_bytes() == 0);
        CHECK(std::all_of(q, q + (bytes - bytes / 8), [](unsigned char b) { return b == 0; }));
        auto* r = static_cast<unsigned char*>(Memory::allocate(bytes / 10));
        CHECK(r != q);
        Memory::release(r);
        Memory::release(q);
        Memory::trim();
        CHECK(Memory::cached_bytes() == 0);
    }
    // Init::overwritten takes a reused block as it is; the next zeroed request for it is cleared again
    for (const std::size_t bytes : {std::size_t(300) << 10, std::size_t(7) << 20}) {
        CAPTURE(bytes);
        auto* p = static_cast<unsigned char*>(Memory::allocate(bytes));
        std::memset(p, 0xab, bytes);
        Memory::release(p);
        auto* q = static_cast<unsigned char*>(Memory::allocate(bytes, backend::Init::overwritten));
        REQUIRE(q == p);
        CHECK(std::all_of(q, q + bytes, [](unsigned char b) { return b == 0xab; }));
        Memory::release(q);
        auto* r = static_cast<unsigned char*>(Memory::allocate(bytes));
        REQUIRE(r == p);
        CHECK(std::all_of(r, r + bytes, [](unsigned char b) { return b == 0; }));
        Memory::release(r);
        Memory::trim();
    }
    // Small blocks are not kept; a cache limit of 0 keeps nothing
    Memory::release(Memory::allocate(1000));
    CHECK(Memory::cached_bytes() == 0);
    Memory::set_cache_limit(0);
    Memory::release(Memory::allocate(std::size_t(300) << 10));
    CHECK(Memory::cached_bytes() == 0);
    Memory::set_cache_limit(std::size_t(4) << 30);
}

#if defined(MOONMOE_TEST_CUDA)
// The CUDA-only cases are templates over the one backend: their names end in <cuda>, which is what the emulated
// test binary's ctest registration selects (test/CMakeLists.txt, TEST_SPEC "*<cuda>").
TEST_CASE_TEMPLATE("StreamGuard switches this thread's current stream and restores it, each thread has its own", B,
                   moonmoe::cuda) {
    const backend::cuda_stream_t initial = backend::current_stream();
    backend::Stream a, b;
    CHECK(a.get() != b.get());
    {
        backend::StreamGuard on_a(a.get());
        CHECK(backend::current_stream() == a.get());
        {
            backend::StreamGuard on_b(b.get());
            CHECK(backend::current_stream() == b.get());
            backend::cuda_stream_t seen_elsewhere = b.get();
            std::thread([&] { seen_elsewhere = backend::current_stream(); }).join();
            CHECK(seen_elsewhere == initial);  // another thread is on its own default stream
            Tensor<float, 1, B> t({4});        // work on the guarded stream, then its crossing
            for (float x : to_host(t)) CHECK(x == 0.0f);
        }
        CHECK(backend::current_stream() == a.get());
        a.synchronize();
    }
    CHECK(backend::current_stream() == initial);
}

TEST_CASE_TEMPLATE("cuda_error messages name the call, the error and where the call was made", B, moonmoe::cuda) {
    CHECK(backend::cuda_detail::call_error_message("cudaMallocAsync(&p, bytes, current_stream())",
                                                   "cudaErrorMemoryAllocation", "out of memory", "memory.hpp", 12) ==
          "moonmoe: cudaMallocAsync(&p, bytes, current_stream()) failed with cudaErrorMemoryAllocation (out of "
          "memory) at memory.hpp:12");
    static_assert(!backend::host_visible<B>, "module code must not index CUDA tensor data, emulated or not");
}

TEST_CASE_TEMPLATE(
    "A failure where nothing may throw is thrown by the next checked call, and later errors name the "
    "first failing call",
    B, moonmoe::cuda) {
    using namespace backend::cuda_detail;
    failure_record().forget();
    const CallStatus ok{}, invalid{"cudaErrorInvalidResourceHandle", "invalid resource handle"},
        fault{"cudaErrorIllegalAddress", "an illegal memory access was encountered"};
    CHECK_NOTHROW(check(ok, "cudaStreamSynchronize(s)", "memory.hpp", 7));
    note(ok, "cudaEventDestroy(event_)", "offload.hpp", 50);
    CHECK(failure_record().first().empty());

    // A destructor's failure, then a call that succeeds: that call throws the destructor's failure, once.
    note(invalid, "cudaEventDestroy(event_)", "offload.hpp", 50);
    const std::string destroy =
        "cudaEventDestroy(event_) failed with cudaErrorInvalidResourceHandle (invalid "
        "resource handle) at offload.hpp:50 where nothing may throw (a destructor or release)";
    CHECK(failure_record().first() == destroy);
    CHECK_THROWS_WITH_AS(check(ok, "cudaStreamSynchronize(s)", "memory.hpp", 7),
                         ("moonmoe: " + destroy +
                          "; thrown at the next checked call, cudaStreamSynchronize(s) at "
                          "memory.hpp:7")
                             .c_str(),
                         backend::cuda_error);
    CHECK_NOTHROW(check(ok, "cudaStreamSynchronize(s)", "memory.hpp", 7));

    // Every later failure names the first one, and a destructor's failure since the last throw.
    note(fault, "cudaFreeAsync(p, current_stream())", "memory.hpp", 20);
    CHECK_THROWS_WITH_AS(check(fault, "cudaMemcpyAsync(d, s, n, k, stream)", "memory.hpp", 9),
                         ("moonmoe: cudaMemcpyAsync(d, s, n, k, stream) failed with cudaErrorIllegalAddress (an "
                          "illegal memory access was encountered) at memory.hpp:9; the first CUDA call to fail in this "
                          "process: " +
                          destroy +
                          "; since then, where it could not throw: cudaFreeAsync(p, "
                          "current_stream()) failed with cudaErrorIllegalAddress (an illegal memory access was "
                          "encountered) at memory.hpp:20 where nothing may throw (a destructor or release)")
                             .c_str(),
                         backend::cuda_error);
    CHECK_THROWS_WITH_AS(
        check(fault, "cudaMallocAsync(&p, bytes, current_stream())", "memory.hpp", 11),
        doctest::Contains(("at memory.hpp:11; the first CUDA call to fail in this process: " + destroy).c_str()),
        backend::cuda_error);
    failure_record().forget();
    CHECK(failure_record().first().empty());
    CHECK_NOTHROW(check(ok, "cudaStreamSynchronize(s)", "memory.hpp", 7));
}

#if MOONMOE_CUDA_EMULATED
TEST_CASE_TEMPLATE(
    "After a device fault, tensors released while an exception unwinds do not throw, and the next "
    "crossing names the first failing call",
    B, moonmoe::cuda) {
    using namespace backend::cuda_detail;
    failure_record().forget();
    auto& stats = backend::Memory<B>::stats();
    const std::size_t before = stats.current.load();
    Tensor<float, 1, B> outer({4});
    // A kernel queued in the inner scope faults; the scopes' tensors die while its exception unwinds. Had release
    // thrown there, this would end in std::terminate.
    auto work = [] {
        Tensor<float, 2, B> a({3, 5});
        {
            Tensor<bf16, 1, B> b({7});
            backend::HostOffload off;
            auto ticket = off.offload(Tensor<float, 1, B>({9}));
            emulated_device_fault = true;
            throw std::runtime_error("unwinding");
        }
    };
    CHECK_THROWS_WITH_AS(work(), "unwinding", std::runtime_error);
    CHECK(stats.current.load() == before + 4 * sizeof(float));  // a's and b's bytes are no longer counted
    const std::string first = failure_record().first();
    CHECK(first.rfind("cudaFreeAsync(p, current_stream()) failed with cudaErrorIllegalAddress (an illegal memory "
                      "access was encountered) at ",
                      0) == 0);
    CHECK(first.find("memory.hpp:") != std::string::npos);
    CHECK_THROWS_WITH_AS(to_host(outer),
                         doctest::Contains(("; the first CUDA call to fail in this process: " + first).c_str()),
                         backend::cuda_error);
    CHECK_THROWS_WITH_AS(outer.zero(), doctest::Contains(first.c_str()), backend::cuda_error);
    CHECK_THROWS_WITH_AS(backend::Memory<B>::allocate(32), doctest::Contains(first.c_str()), backend::cuda_error);
    // On a GPU only a new process clears a sticky fault; here, the emulation's flag and the record.
    emulated_device_fault = false;
    failure_record().forget();
    CHECK(to_host(outer) == std::vector<float>(4, 0.0f));
}
#endif

TEST_CASE_TEMPLATE(
    "allocate_or_reclaim: out of memory, the pool's unused memory goes back to the driver and the "
    "request is tried once more, then refused with the pool's numbers",
    B, moonmoe::cuda) {
    using backend::cuda_detail::allocate_or_reclaim;
    // A device with `device_free` bytes and a pool holding `chunks` unused blocks of `chunk` bytes: a request fits
    // one of them or the device's free memory; reclaim (trim) gives the blocks back to the device.
    struct FakeDevice {
        std::size_t device_free, chunks, chunk;
        int tries = 0, reclaims = 0;
        bool try_allocate(std::size_t n) {
            ++tries;
            if (chunks > 0 && n <= chunk) return --chunks, true;
            if (n <= device_free) return device_free -= n, true;
            return false;
        }
        void reclaim() {
            ++reclaims;
            device_free += chunks * chunk;
            chunks = 0;
        }
        void allocate(std::size_t n) {
            allocate_or_reclaim([&] { return try_allocate(n); }, [&] { reclaim(); },
                                [&] { return "out of memory: " + std::to_string(n) + " bytes"; });
        }
    };
    FakeDevice fits{100, 3, 30};
    fits.allocate(80);
    CHECK((fits.tries == 1 && fits.reclaims == 0 && fits.device_free == 20));
    FakeDevice held{40, 3, 30};  // 130 bytes free, 90 of them in the pool's 30-byte blocks
    held.allocate(100);
    CHECK((held.tries == 2 && held.reclaims == 1 && held.device_free == 30 && held.chunks == 0));
    FakeDevice full{40, 3, 30};
    CHECK_THROWS_WITH_AS(full.allocate(200), "out of memory: 200 bytes", backend::cuda_error);
    CHECK((full.tries == 2 && full.reclaims == 1));
    // Any other error is thrown as it is, with nothing trimmed.
    int reclaims = 0;
    CHECK_THROWS_WITH_AS(allocate_or_reclaim([]() -> bool { throw backend::cuda_error("invalid value"); },
                                             [&] { ++reclaims; }, [] { return std::string("unused"); }),
                         "invalid value", backend::cuda_error);
    CHECK(reclaims == 0);

    CHECK(backend::cuda_detail::out_of_memory_message(std::uint64_t(1) << 30, std::uint64_t(70) << 30,
                                                      (std::uint64_t(137) << 30) / 2) ==
          "moonmoe: out of device memory: cudaMallocAsync of 1073741824 bytes (1.00 GiB) failed, also after the "
          "pool's unused memory went back to the driver (cudaMemPoolTrimTo); the pool reserves 75161927680 bytes "
          "(70.00 GiB), 73551314944 bytes (68.50 GiB) of it in use");
}

TEST_CASE_TEMPLATE(
    "HostOffload: tensors to pinned host memory and back, bit for bit, device memory released while "
    "away, host buffers reused",
    B, moonmoe::cuda) {
    auto& device = backend::Memory<B>::stats();
    backend::HostOffload off;
    std::vector<float> values(3 * 1000);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.25f - 7.0f;
    std::vector<bf16> halves(513);
    for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = bf16::from_float(float(i) / 3.0f);

    for (int round = 0; round < 2; ++round) {
        CAPTURE(round);
        Tensor<float, 2, B> a({3, 1000});
        copy_to_device(std::span<const float>(values), a.view());
        Tensor<bf16, 1, B> h({513});
        copy_to_device(std::span<const bf16>(halves), h.view());
        Tensor<float, 2, B> none;
        const std::size_t held = device.current.load();
        auto ka = off.offload(std::move(a));
        auto kh = off.offload(std::move(h));
        auto kn = off.offload(std::move(none));
        off.synchronize();
        CHECK(a.empty());
        CHECK(device.current.load() == held - 3 * 1000 * sizeof(float) - 513 * sizeof(bf16));
        CHECK(kn.empty());
        off.prefetch(kh);  // one prefetched, the other taken directly
        const Tensor<float, 2, B> a2 = off.take(ka);
        const Tensor<bf16, 1, B> h2 = off.take(kh);
        CHECK(off.take(kn).empty());
        CHECK(a2.shape() == Shape<2>{3, 1000});
        CHECK(to_host(a2) == values);
        const std::vector<bf16> back = to_host(h2);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < back.size(); ++i) differ += back[i].bits != halves[i].bits;
        CHECK(differ == 0);
        CHECK(device.current.load() == held);
        // the second round reuses the first round's two pinned buffers
        CHECK(off.pinned_bytes() == 3 * 1000 * sizeof(float) + 513 * sizeof(bf16));
    }
    CHECK(off.offloaded_bytes() == 2 * (3 * 1000 * sizeof(float) + 513 * sizeof(bf16)));
}
#endif

}  // namespace unit_backend_memory
