// Memory<B> on every backend of the build (MOONMOE_TEST_BACKENDS): zeroed allocations, copies, the host crossings
// and the byte counts; on CUDA also the per-thread current stream, the errors of failed calls and the activation
// offload to pinned host memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <thread>
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
            Tensor<float, 1, B> t({4});  // work on the guarded stream, then its crossing
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

TEST_CASE_TEMPLATE("HostOffload: tensors to pinned host memory and back, bit for bit, device memory released while "
                   "away, host buffers reused", B, moonmoe::cuda) {
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
