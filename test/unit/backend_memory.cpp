// Memory<B> on every backend of the build (MOONMOE_TEST_BACKENDS): zeroed allocations, copies, the host crossings
// and the byte counts; on CUDA also the per-thread current stream and the errors of failed calls.
#include <doctest/doctest.h>

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

#if defined(MOONMOE_TEST_CUDA)
TEST_CASE("StreamGuard switches this thread's current stream and restores it, each thread has its own") {
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
            Tensor<float, 1, moonmoe::cuda> t({4});// work on the guarded stream, then its crossing
            for (float x : to_host(t)) CHECK(x == 0.0f);
        }
        CHECK(backend::current_stream() == a.get());
        a.synchronize();
    }
    CHECK(backend::current_stream() == initial);
}

TEST_CASE("cuda_error messages name the call, the error and where the call was made") {
    CHECK(backend::cuda_detail::call_error_message("cudaMallocAsync(&p, bytes, current_stream())",
                                                   "cudaErrorMemoryAllocation", "out of memory", "memory.hpp", 12) ==
          "moonmoe: cudaMallocAsync(&p, bytes, current_stream()) failed with cudaErrorMemoryAllocation (out of "
          "memory) at memory.hpp:12");
    static_assert(!backend::host_visible<moonmoe::cuda>, "module code must not index CUDA tensor data, emulated or not");
}
#endif

}  // namespace unit_backend_memory
