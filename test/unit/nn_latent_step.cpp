// nn/latent_step.hpp: a bf16 MLA decode step for a fixed batch, captured as a CUDA graph after warm-up
// (backend/graph.hpp). Its outputs and caches must be bitwise those of the eager absorbed decode
// (MLA::forward_absorbed) step after step, across bucket boundaries, with sequences of different lengths; the steps
// after the warm-up are captured or replayed, and none of them makes the host wait (on the CUDA backend a captured
// step refuses waits and uploads, so this also shows the step is capturable).
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <moonmoe/moonmoe.hpp>
#include <moonmoe/nn/latent_step.hpp>

namespace unit_nn_latent_step {

using namespace moonmoe;
using namespace moonmoe::testing;

using TinyK2BF16 = TinyK2::with<Precision<BF16>>;

/// The host waits the backend has made so far (the CUDA backend counts them; the CPU has none to make).
template <class B>
std::uint64_t host_waits() {
#if defined(MOONMOE_TEST_CUDA)
    if constexpr (std::is_same_v<B, moonmoe::cuda>) return backend::cuda_host_waits();
#endif
    return 0;
}

TEST_CASE_TEMPLATE("LatentDecodeStep: the eager absorbed decode's bits, step after step, captured after warm-up", B,
                   MOONMOE_TEST_BACKENDS) {
    using MLA = nn::MLA<B>;
    MLA attn(TinyK2BF16::config);
    randomize(attn, 71);
    attn.refresh_working();
    const index_t hidden = TinyK2BF16::config.dims.hidden, capacity = 24;
    // three sequences holding 1, 0 and 2 tokens, taking 1, 2 and 1 rows per step; with buckets of 16 rows the
    // second sequence's keys outgrow theirs at the ninth step (18 > 16: its extent becomes the capacity, 24)
    const std::vector<index_t> prefill = {1, 0, 2}, rows = {1, 2, 1};
    std::vector<typename MLA::LatentCache> eager, stepped;
    for (index_t s = 0; s < 3; ++s) {
        eager.push_back(attn.make_latent_cache(capacity));
        if (prefill[std::size_t(s)] > 0) {
            const Tensor<float, 2, B> x = random_matrix<B>(prefill[std::size_t(s)], hidden, 72 + std::uint64_t(s));
            Tensor<float, 2, B> y(x.shape());
            attn.forward_absorbed(x.view(), eager.back(), y.view());
        }
        stepped.push_back(attn.make_latent_cache(capacity));
        backend::Memory<B>::copy(stepped.back().rows.data(), eager.back().rows.data(),
                                 std::size_t(eager.back().rows.numel()) * sizeof(bf16));
        stepped.back().length = eager.back().length;
    }
    std::vector<typename MLA::LatentCache*> eager_ptrs, step_ptrs;
    for (index_t s = 0; s < 3; ++s)
        eager_ptrs.push_back(&eager[std::size_t(s)]), step_ptrs.push_back(&stepped[std::size_t(s)]);
    nn::LatentDecodeStep<B> step(attn, step_ptrs, rows, 16);
    const index_t steps = 9, T = 4;
    std::uint64_t step_waits = 0;
    for (index_t k = 0; k < steps; ++k) {
        CAPTURE(k);
        const Tensor<float, 2, B> x = random_matrix<B>(T, hidden, 80 + std::uint64_t(k));
        Tensor<float, 2, B> want({T, hidden}), got({T, hidden});
        std::vector<index_t> positions;
        for (index_t s = 0; s < 3; ++s)
            for (index_t i = 0; i < rows[std::size_t(s)]; ++i) positions.push_back(eager[std::size_t(s)].length + i);
        nn::TokenLayout layout = nn::TokenLayout::packed(rows);
        layout.positions = positions;
        attn.forward_absorbed(x.view(), layout, eager_ptrs, want.view());
        const std::uint64_t before = host_waits<B>();
        step.run(x.view(), got.view());
        step_waits += host_waits<B>() - before;
#if defined(MOONMOE_CUDA_EMULATED) && !MOONMOE_CUDA_EMULATED
        // on a GPU the padded extents give cuBLAS other shapes, so other summation orders: bf16 agreement
        if constexpr (std::is_same_v<B, moonmoe::cuda>) {
            CHECK(relative_distance(to_host(got), to_host(want)) < 1e-2);
            continue;
        }
#endif
        CHECK(to_host(got) == to_host(want));
    }
    if constexpr (backend::StepGraph<B>::captures_work) {
        // steps 1-8 share their shapes: a warm-up, the capture, six replays; step 9 has new ones: a warm-up again
        CHECK(step.graph().eager_runs() == 2);
        CHECK(step.graph().captures() == 1);
        CHECK(step.graph().replays() == 6);
    } else {
        CHECK(step.graph().eager_runs() == std::uint64_t(steps));
    }
    CHECK(step_waits == 0);  // uploads through the staging ring, device copies, the graph or the work itself
    for (index_t s = 0; s < 3; ++s) {
        CHECK(stepped[std::size_t(s)].length == eager[std::size_t(s)].length);
        const std::vector<bf16> a = to_host(stepped[std::size_t(s)].rows), b = to_host(eager[std::size_t(s)].rows);
        CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end(), [](bf16 x, bf16 y) { return x.bits == y.bits; }));
    }
}

#if defined(MOONMOE_TEST_CUDA)
TEST_CASE("StepGraph<cuda> refuses host waits and uploads inside a capture, with what to do instead") {
    backend::StepGraph<moonmoe::cuda> graph(0);  // no warm-up: the first run captures
    Tensor<float, 1, moonmoe::cuda> t({4});
    const std::int64_t key[1] = {1};
    CHECK_THROWS_WITH_AS(graph.run(key, [&] { (void)to_host(t); }),
                         doctest::Contains("a host wait inside the capture of a StepGraph"), std::logic_error);
    const std::vector<float> values = {1, 2, 3, 4};
    CHECK_THROWS_WITH_AS(graph.run(key, [&] { copy_to_device(std::span<const float>(values), t.view()); }),
                         doctest::Contains("a copy from the host inside the capture"), std::logic_error);
    CHECK(graph.captures() == 0);
    graph.run(key, [&] { backend::Ops<moonmoe::cuda>::fill(t.view().template reshape<2>({1, 4}), 2.0f); });
    CHECK(graph.captures() == 1);
    CHECK(to_host(t) == std::vector<float>(4, 2.0f));  // outside the capture: allowed again
}

TEST_CASE("StepGraph<cuda> runs eagerly where the device cannot capture the work, and says why") {
    backend::StepGraph<moonmoe::cuda> graph(1);
    int runs = 0, refused = 0;
    auto work = [&] {
        if (backend::cuda_detail::capturing) {  // as a library call the CUDA version cannot capture
            ++refused;
            throw backend::cuda_error("moonmoe: cublasExample failed with CUBLAS_STATUS_NOT_SUPPORTED");
        }
        ++runs;
    };
    const std::int64_t key[1] = {7};
    for (int i = 0; i < 4; ++i) graph.run(key, work);
    CHECK(runs == 4);     // every call computed its step: the warm-up, the failed capture's rerun, two more
    CHECK(refused == 1);  // one capture tried per key
    CHECK(graph.captures() == 0);
    CHECK(graph.eager_runs() == 4);
    CHECK(graph.capture_failure().find("CUBLAS_STATUS_NOT_SUPPORTED") != std::string::npos);
    const std::int64_t other[1] = {8};  // a new key tries again
    graph.run(other, work), graph.run(other, work);
    CHECK(refused == 2);
}
#endif

}  // namespace unit_nn_latent_step
