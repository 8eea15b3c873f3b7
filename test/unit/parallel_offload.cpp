// The pipeline's schedule-aware activation offload (parallel/pipeline.hpp; Kimi K2 technical report, §2.4.3): a
// micro-batch's kept matrices leave for pinned host memory after its forward while the next step computes, and come
// back one step before its backward. On one process: a pipeline of one stage whose warm-up runs extra forwards
// (K2's trick), so micro-batches wait between forward and backward as on an inner stage of a deep pipeline. The
// same losses and gradients bit for bit as the pipeline that keeps everything on the device, less device memory at
// the peak, and pinned buffers reused by the next step. The expert-parallel MoE's cache (the rows received from the
// expert group, kept for the experts' backward) moves too: a layer whose MoE dispatches over a one-rank expert
// group (parallel::ExpertParallelDispatcher) leaves on the device exactly what the accounting (config/accounting.hpp)
// says stays there, the per-token statistics and routing plans, and its backward gives the same bits. The CPU backend
// refuses it.
#include "support/backends.hpp"
#include "support/io_testing.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"
#include "support/self_world.hpp"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/nn/offload.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>
#include <moonmoe/parallel/pipeline.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_parallel_offload {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

constexpr index_t micro_batches = 4, extra_warmup = 2;  // F0 F1 F2 B0 F3 B1 B2 B3
const auto layout = nn::TokenLayout::sequences(2, 8);

[[maybe_unused]] std::vector<std::vector<index_t>> batches(int step) {  // the CUDA backend's cases
    std::vector<std::vector<index_t>> out;
    for (index_t m = 0; m < micro_batches; ++m) {
        std::vector<index_t> ids(std::size_t(layout.tokens()));
        for (std::size_t t = 0; t < ids.size(); ++t)
            ids[t] = index_t((37 * t + 11 * std::size_t(m) + 5 * std::size_t(step) + 3) % 100);
        out.push_back(std::move(ids));
    }
    return out;
}

}  // namespace

TEST_CASE_TEMPLATE("Pipeline with Activations<Offload<true>>: refused on the CPU backend, built on the CUDA backend", B,
                   MOONMOE_TEST_BACKENDS) {
    SelfWorld world = self_world<B>();
    ModelConfig c = TinyK2::config;
    parallel::ProcessGroups g(world, c.parallel);
    if constexpr (!backend::offloads<B>) {
        nn::Transformer<B> part(c, parallel::model_part(c, g.at), parallel::expert_dispatcher<B>(g));
        part.config.activations.offload = true;  // past the model's own check: the pipeline checks again
        io_testing::check_error([&] { parallel::Pipeline<B> p(part, g, micro_batches); },
                                {"Offload<true>", "host memory already", "CUDA backend"});
    } else {
        c.activations.offload = true;
        nn::Transformer<B> part(c, parallel::model_part(c, g.at), parallel::expert_dispatcher<B>(g));
        parallel::Pipeline<B> p(part, g, micro_batches);
        CHECK(p.offload() != nullptr);
        c.activations.offload = false;
        nn::Transformer<B> kept(c, parallel::model_part(c, g.at), parallel::expert_dispatcher<B>(g));
        parallel::Pipeline<B> q(kept, g, micro_batches);
        CHECK(q.offload() == nullptr);
    }
}

#if defined(MOONMOE_TEST_CUDA)
TEST_CASE_TEMPLATE(
    "Pipeline with Activations<Offload<true>>: waiting micro-batches in host memory, the same losses "
    "and gradients bit for bit, a lower device peak",
    B, moonmoe::cuda) {
    static_assert(backend::offloads<B>);
    using K2bf16 = TinyK2::with<Precision<BF16>>;
    for (const bool k2_policy : {false, true}) {
        CAPTURE(k2_policy);
        const auto load = [&] {
            return k2_policy ? load_transformer<K2bf16, B>(data_dir("tiny_k2"))
                             : load_transformer<TinyK2, B>(data_dir("tiny_k2"));
        };
        nn::Transformer<B> a = load(), b = load();
        ActivationsConfig policy = k2_policy ? KimiK2Activations::value : TinyK2::config.activations;
        a.set_activations(policy);
        policy.offload = true;
        b.set_activations(policy);
        SelfWorld world = self_world<B>();
        parallel::ProcessGroups g(world, a.config.parallel);
        parallel::Pipeline<B> kept(a, g, micro_batches, extra_warmup), offloaded(b, g, micro_batches, extra_warmup);
        REQUIRE(offloaded.offload() != nullptr);
        REQUIRE(kept.schedule().size() == 8);
        CHECK(kept.schedule()[3] == parallel::Step{parallel::Pass::backward, 0, 0});  // three forwards wait first

        auto& device = backend::Memory<B>::stats();
        std::size_t pinned = 0;
        for (int step = 0; step < 2; ++step) {
            CAPTURE(step);
            const auto ids = batches(step);
            device.reset_peak();
            const std::size_t base_a = device.current.load();
            const auto ra = kept.run(ids, layout);
            const std::size_t peak_kept = device.peak.load() - base_a;
            device.reset_peak();
            const std::size_t base_b = device.current.load();
            const std::size_t moved_before = offloaded.offload()->host().offloaded_bytes();
            const auto rb = offloaded.run(ids, layout);
            const std::size_t peak_offloaded = device.peak.load() - base_b;
            const std::size_t moved = offloaded.offload()->host().offloaded_bytes() - moved_before;

            CHECK(ra.losses == rb.losses);
            CHECK(gradients_of<B>(a) == gradients_of<B>(b));
            // four forwards, of which the last (F3, followed by B1) and the three warm-up ones wait: all offloaded
            CHECK(moved > 0);
            CHECK(peak_offloaded < peak_kept);
            // at the peak the kept pipeline holds three micro-batches' matrices, the offloaded one at most two (the
            // forward computing and the one prefetched for the next backward): a micro-batch's worth less at least
            CHECK(peak_kept - peak_offloaded >= moved / micro_batches);
            MESSAGE(std::string(k2_policy ? "K2's policy: " : "f32: ")
                    << moved << " bytes offloaded per step; device peak " << peak_kept << " kept, " << peak_offloaded
                    << " offloaded");
            if (step == 0) pinned = offloaded.offload()->host().pinned_bytes();
            else
                CHECK(offloaded.offload()->host().pinned_bytes() == pinned);  // the second step reuses them
        }
    }
}

TEST_CASE_TEMPLATE(
    "Activations<Offload<true>>: an expert-parallel MoE layer's cache leaves the statistics and plans "
    "on the device, as the accounting says, and gives the same backward",
    B, moonmoe::cuda) {
    using K2bf16 = TinyK2::with<Precision<BF16>>;
    for (const bool k2_policy : {false, true}) {
        CAPTURE(k2_policy);
        ModelConfig c = k2_policy ? K2bf16::config : TinyK2::config;
        if (k2_policy) c.activations = KimiK2Activations::value;
        c.activations.offload = true;
        const index_t T = 12, H = c.dims.hidden, index = c.dims.dense_layers;  // the first MoE layer
        SelfWorld group = self_world<B>();
        const auto dispatcher = std::make_shared<parallel::ExpertParallelDispatcher<B>>(group);
        nn::DecoderLayer<B> a(c, index, 0, -1, dispatcher), b(c, index, 0, -1, dispatcher);
        randomize(a, 5), randomize(b, 5);
        a.refresh_working(), b.refresh_working();
        Tensor<float, 2, B> x = random_matrix<B>(T, H, 6), ya({T, H}), yb({T, H});
        nn::round_to(c.precision.compute, x.view());
        const auto layout = nn::TokenLayout::sequences(2, T / 2);
        typename nn::DecoderLayer<B>::Cache ca, cb;
        a.forward(x.view(), layout, ya.view(), ca);
        b.forward(x.view(), layout, yb.view(), cb);
        CHECK(to_host(ya) == to_host(yb));

        const std::size_t held = cb.bytes();
        nn::KeptOffload<B> off;
        off.offload(cb);
        const std::size_t resident = cb.bytes(), moved = off.host().offloaded_bytes();
        CHECK(moved == held - resident);
        ModelConfig accounted = c;
        accounted.parallel.ep = 2;  // the accounting of EP > 1: all pairs land on this one-rank group
        const ActivationsConfig& policy = c.activations;
        index_t stays = 0;
        for (const KeptTensor& k : layer_activations(accounted, false, T))
            if (k.kind == Kept::f32 || k.kind == Kept::index) stays += k.bytes(policy);
        CHECK(index_t(resident) == stays);
        CHECK(index_t(held) == layer_activations(accounted, false, T).bytes(policy));
        MESSAGE(std::string(k2_policy ? "K2's policy: " : "f32: ")
                << moved << " of " << held << " bytes offloaded, " << resident << " stay");

        off.prefetch(cb);
        off.restore(cb);
        CHECK(cb.bytes() == held);
        const Tensor<float, 2, B> dy = random_matrix<B>(T, H, 7);
        Tensor<float, 2, B> dxa({T, H}), dxb({T, H});
        a.backward(dy.view(), ca, dxa.view());
        b.backward(dy.view(), cb, dxb.view());
        CHECK(to_host(dxa) == to_host(dxb));
        const auto grads = [](nn::DecoderLayer<B>& l) {
            std::map<std::string, std::vector<float>> out;
            for_params(l, [&](const ParamRef& p) {
                if (p.grad) out[p.name] = floats_to_host<B>(p.grad, p.numel());
            });
            return out;
        };
        CHECK(grads(a) == grads(b));
        CHECK(!grads(a).empty());
    }
}
#endif

}  // namespace unit_parallel_offload
