// An MoE layer with its experts spread over the world as an expert group (nn::MoE with an
// ExpertParallelDispatcher, parallel/expert_parallel.hpp) against the same layer on one process (every expert, the
// local dispatcher), on every rank's own tokens: the outputs, the input
// gradients, the router's and shared expert's gradients, and each expert's gradient summed over the ranks.
//
// Tolerance 1e-5 of each tensor's largest magnitude: the exchange moves rows without touching them, but an
// expert's GEMMs run over other row sets than on one process (the rows of every rank together, or of one rank),
// which changes the order of f32 sums inside them, and the expert weight gradients are sums over the ranks' rows
// in another grouping. Measured at most 3.4e-6 (the router weight's gradient on 2 ranks, through the routing
// weights' gradients dy . y_e).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn/moe.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>
#include <moonmoe/tensor/transfer.hpp>

#include "mpi_support.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_moe {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::world;
using Ops = backend::Ops<cpu>;

namespace {

double scaled_error(std::span<const float> a, std::span<const float> b) {
    REQUIRE(a.size() == b.size());
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
        diff = std::max(diff, std::abs(double(a[i]) - b[i])), scale = std::max(scale, std::abs(double(b[i])));
    return scale > 0 ? diff / scale : diff;
}

template <int R>
std::span<const float> all(const Tensor<float, R>& t) {
    return {t.data(), std::size_t(t.numel())};
}

/// Under activation policy `a` (both layers), with the input kept by the layers or handed to backward (recomputed
/// norm outputs); `tol` bounds the scaled differences.
void run(index_t tokens_here, std::uint64_t seed, const ActivationsConfig& a = {},
         nn::KeepInput keep = nn::KeepInput::yes, double tol = 1e-5) {
    Communicator& w = world();
    const int n = w.size(), r = w.rank();
    MoEConfig cfg = TinyK2::config.moe;
    cfg.experts = 4 * n;
    cfg.routed_scale = 2.5;
    const index_t H = 16, L = 4;
    nn::MoE<cpu> full(cfg, H), ep(cfg, H, r * L, L, {}, std::make_shared<ExpertParallelDispatcher<cpu>>(w));
    full.set_activations(a, keep);
    ep.set_activations(a, keep);
    // the same weights everywhere: the full layer from seeds, the EP layer's share copied from it
    std::uint64_t s = 7;
    full.visit_params("moe", [&](const ParamRef& p) {
        Ops::fill_normal(View<float, 2>(p.value, {1, p.numel()}), 0.0f, p.kind == ParamKind::router_bias ? 0.05f : 0.3f,
                         s++);
    });
    std::map<std::string, std::vector<float>> values;
    full.visit_params("moe", [&](const ParamRef& p) { values[p.name].assign(p.value, p.value + p.numel()); });
    ep.visit_params("moe", [&](const ParamRef& p) {
        const auto& v = values.at(p.name);
        std::copy(v.begin(), v.end(), p.value);
    });
    Tensor<float, 2> u({tokens_here, H}), dy({tokens_here, H}), y_full({tokens_here, H}), y_ep({tokens_here, H}),
        du_full({tokens_here, H}), du_ep({tokens_here, H});
    Ops::fill_normal(u.view(), 0.0f, 1.0f, seed);
    Ops::fill_normal(dy.view(), 0.0f, 1.0f, seed + 1000);

    typename nn::MoE<cpu>::Cache c_full;
    full.forward(u.view(), y_full.view(), c_full);
    const bool keep_input = keep == nn::KeepInput::yes;
    const View<const float, 2> given = keep_input ? View<const float, 2>{} : View<const float, 2>(u.view());
    full.backward(dy.view(), c_full, du_full.view(), nn::Accumulate::no, given);
    CHECK(c_full.x.empty());  // the local dispatch re-gathers the experts' rows in backward
    typename nn::MoE<cpu>::Cache c_ep;
    ep.forward(u.view(), y_ep.view(), c_ep);
    CHECK(c_ep.router.u.empty() == !keep_input);
    CHECK(c_ep.x.format == (a.fp8_mlp_inputs ? nn::KeptFormat::fp8 : nn::KeptFormat::f32));
    ep.backward(dy.view(), c_ep, du_ep.view(), nn::Accumulate::no, given);
    CHECK(scaled_error(all(y_ep), all(y_full)) <= 1e-5);
    CHECK(scaled_error(all(du_ep), all(du_full)) <= tol);

    // gradients: router and shared expert are this rank's own; the experts' are summed over every rank's tokens
    std::map<std::string, std::vector<float>> full_grads;
    full.visit_params("moe", [&](const ParamRef& p) {
        if (p.grad) full_grads[p.name].assign(p.grad, p.grad + p.numel());
    });
    int experts_checked = 0;
    ep.visit_params("moe", [&](const ParamRef& p) {
        if (!p.grad) return;
        INFO(p.name);
        if (p.kind == ParamKind::expert_matrix) {
            ++experts_checked;  // compared below, with the sum over the ranks
            return;
        }
        const std::vector<float> got(p.grad, p.grad + p.numel());
        CHECK(scaled_error(got, full_grads.at(p.name)) <= tol);
    });
    CHECK(experts_checked == 3 * L);
    // the experts' sums: all-reduce the full layer's expert gradients, compare this rank's share
    std::vector<float> summed;
    full.visit_params("moe", [&](const ParamRef& p) {
        if (p.kind == ParamKind::expert_matrix) summed.insert(summed.end(), p.grad, p.grad + p.numel());
    });
    w.all_reduce(std::span<float>(summed), ReduceOp::sum);
    std::size_t at = 0;
    full.visit_params("moe", [&](const ParamRef& p) {
        if (p.kind != ParamKind::expert_matrix) return;
        const std::vector<float> total(summed.begin() + std::ptrdiff_t(at),
                                       summed.begin() + std::ptrdiff_t(at + std::size_t(p.numel())));
        at += std::size_t(p.numel());
        ep.visit_params("moe", [&](const ParamRef& q) {
            if (q.name != p.name) return;
            INFO(q.name);
            CHECK(scaled_error(std::span<const float>(q.grad, std::size_t(q.numel())), total) <= tol);
        });
    });
}

}  // namespace

TEST_CASE("expert-parallel MoE equals the one-process MoE: outputs, input gradients, every parameter gradient") {
    const int r = world().rank(), n = world().size();
    SUBCASE("uneven token counts") { run(3 + 2 * r, 11 + std::uint64_t(r)); }
    SUBCASE("rank 0 has no tokens") { run(r == 0 ? 0 : 5, 21 + std::uint64_t(r)); }
    SUBCASE("fewer tokens than ranks") { run(r == n - 1 ? 1 : 0, 31); }
}

TEST_CASE("expert-parallel MoE honours the activation policy: the input handed to backward, FP8 MLP inputs") {
    const int r = world().rank();
    // recomputed norm outputs: the layers keep no input and backward is handed it; the same sums as above
    SUBCASE("input not kept") {
        run(3 + 2 * r, 41 + std::uint64_t(r), Activations<Recompute<NormOutputs>>::value, nn::KeepInput::no);
    }
    // FP8: the expert ranks keep the received rows, gate(x) and up(x) as FP8 tiles (the one-process layer re-gathers
    // exact rows), so the experts' weight gradients differ by the quantization of x (1/17 of a value at most)
    SUBCASE("FP8 MLP inputs") {
        run(3 + 2 * r, 51 + std::uint64_t(r), Activations<Recompute<NormOutputs>, MlpInputs<FP8>>::value,
            nn::KeepInput::no, 0.1);
    }
}

}  // namespace mpi_moe
