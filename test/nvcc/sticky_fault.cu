// A kernel's sticky fault on a GPU (backend/cuda/error.hpp), in a program of its own: after the fault every CUDA call
// of the process fails. A kernel writes through an invalid pointer while tensors, an activation offload (pinned
// buffers, events, a copy stream) and a stream are alive in nested scopes, which then unwind from an exception.
// Checks that no destructor throws (one that did would be std::terminate: the program would die of SIGABRT before
// its summary), that the first failing call is recorded with where it was made, and that the next crossing and a
// later allocation throw cuda_error naming it. tools/gpu_check.sh runs it; CI compiles it (nvcc.sticky_fault).
// Exit status: the number of failed checks.
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <moonmoe/backend/cuda/offload.hpp>
#include <moonmoe/tensor/transfer.hpp>

#include "../support/expect.hpp"

using namespace moonmoe;
using Dev = moonmoe::cuda;

namespace {

using test_support::expect;
using test_support::failures;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

__global__ void write_through(float* p) { *p = 1.0f; }

/// Waits until the stream has run the faulting kernel, without a moonmoe call, so that the releases of the
/// unwinding scopes are the first calls to meet the fault (cudaStreamQuery returns the sticky error once it is there).
void wait_for_fault(cudaStream_t s) {
    while (cudaStreamQuery(s) == cudaErrorNotReady) {}
}

/// What the next checked call throws: the cuda_error's message, or a note that nothing (or something else) was thrown.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const backend::cuda_error& e) {
        return e.what();
    } catch (const std::exception& e) {
        return std::string("not a cuda_error: ") + e.what();
    }
    return "nothing thrown";
}

void run() {
    const std::vector<float> values = {1.0f, -2.5f, 3.0f, 0.25f};
    Tensor<float, 1, Dev> outer = to_device<Dev>(std::span<const float>(values));
    expect(to_host(outer) == values, "before the fault, a tensor goes to the device and back");

    std::string unwound = "nothing thrown";
    try {
        Tensor<float, 2, Dev> a({64, 64});
        backend::HostOffload off;
        auto ticket = off.offload(Tensor<float, 1, Dev>({1024}));
        off.synchronize();
        {
            backend::Stream side;
            Tensor<float, 1, Dev> b({256});  // released first: the first call to meet the fault
            write_through<<<1, 1, 0, backend::current_stream()>>>(reinterpret_cast<float*>(std::uintptr_t(16)));
            MOONMOE_CUDA_CHECK(cudaGetLastError());  // the launch itself succeeds: the fault comes later
            wait_for_fault(backend::current_stream());
            throw std::runtime_error("unwinding");
        }
    } catch (const backend::cuda_error& e) {
        unwound = std::string("cuda_error: ") + e.what();
    } catch (const std::runtime_error& e) {
        unwound = e.what();
    }
    expect(unwound == "unwinding",
           "tensors, an offload's pinned buffers and events, and streams released while unwinding: nothing threw (" +
               unwound + ")");

    const std::string first = backend::cuda_detail::failure_record().first();
    std::printf("     first failing call: %s\n", first.c_str());
    expect(contains(first, "cudaErrorIllegalAddress"), "the first failure recorded is the kernel's illegal address");
    expect(contains(first, "where nothing may throw") && contains(first, ".hpp:"),
           "the first failing call is a release of the unwinding scopes, named with where it was made");
    expect(first.rfind("cudaFreeAsync(p, current_stream())", 0) == 0,
           "it is the innermost tensor's cudaFreeAsync (Memory<cuda>::release)");

    const std::string crossing = error_of([&] { (void)to_host(outer); });
    std::printf("     to_host threw: %s\n", crossing.c_str());
    expect(!first.empty() && contains(crossing, "the first CUDA call to fail in this process: " + first),
           "the next crossing (to_host) throws cuda_error naming the first failing call");
    const std::string allocation =
        error_of([] { backend::Memory<Dev>::release(backend::Memory<Dev>::allocate(4096)); });
    expect(!first.empty() && contains(allocation, first), "a later allocation throws cuda_error naming it too");
}  // outer is released here, after the fault: noted, not thrown

}  // namespace

int main() {
    try {
        run();
    } catch (const std::exception& e) {  // a device that cannot even start: one failure, and the reason
        expect(false, std::string("an unexpected exception: ") + e.what());
    }
    std::printf("sticky_fault: %d failed\n", failures);
    return failures;
}
