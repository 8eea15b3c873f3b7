// optim::Optimizer follows the Newton-Schulz precision of its type (Muon<NSPrecision<BF16>>, docs/precision.md):
// every Muon-routed matrix moves exactly as muon_step with the bf16 workspace moves it, and not as the f32 one does.
#include "support/nn_testing.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include <moonmoe/config.hpp>
#include <moonmoe/optim.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_optim_precision {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

template <class Config>
void check_optimizer_follows_ns_precision(bool bf16_expected) {
    nn::Transformer<> model(TinyK2::config);
    randomize(model, 61);
    const auto layout = nn::TokenLayout::sequences(2, 6);
    std::vector<index_t> ids(12);
    for (index_t i = 0; i < 12; ++i) ids[i] = (i * 31 + 5) % 256;
    model.zero_grad();
    model.train_step(ids.data(), layout);
    optim::Optimizer<Config> opt(model);
    REQUIRE((opt.config.muon.ns_precision == NumberFormat::bf16) == bf16_expected);
    const double lr = opt.learning_rates().first;
    // what muon_step gives each Muon matrix with either workspace, from the same weights and gradients
    struct Expected {
        float* value;
        std::vector<float> with_bf16, with_f32;
        bool has_gradient;
    };
    std::vector<Expected> expected;
    for (auto& s : opt.slots()) {
        if (s.route != optim::Route::muon) continue;
        const index_t rows = s.param.shape[0], cols = s.param.shape[1], n = rows * cols;
        const std::vector<float> grad(s.param.grad, s.param.grad + n);
        Expected e{s.param.value,
                   std::vector<float>(s.param.value, s.param.value + n),
                   {},
                   std::any_of(grad.begin(), grad.end(), [](float g) { return g != 0.0f; })};
        e.with_f32 = e.with_bf16;
        std::vector<float> m16(std::size_t(n), 0.0f), m32(std::size_t(n), 0.0f);
        Tensor<float, 2> u, o;
        optim::NSWorkspaceBF16<> ws16;
        optim::NSWorkspace<float> ws32;
        const View<const float, 2> g(grad.data(), {rows, cols});
        // each Newton-Schulz with the default products (NSProducts): symmetric
        MuonConfig muon16 = opt.config.muon, muon32 = opt.config.muon;
        muon16.products = Products::symmetric, muon32.products = Products::symmetric;
        optim::muon_step<KellerQuintic>(muon16, lr, View<float, 2>(e.with_bf16.data(), {rows, cols}), g,
                                        View<float, 2>(m16.data(), {rows, cols}), ws16, u, o);
        optim::muon_step<KellerQuintic>(muon32, lr, View<float, 2>(e.with_f32.data(), {rows, cols}), g,
                                        View<float, 2>(m32.data(), {rows, cols}), ws32, u, o);
        expected.push_back(std::move(e));
    }
    REQUIRE(!expected.empty());
    opt.step();
    std::size_t with_gradient = 0, policy_mattered = 0;
    for (const Expected& e : expected) {
        const std::vector<float>& want = bf16_expected ? e.with_bf16 : e.with_f32;
        CHECK(std::memcmp(e.value, want.data(), want.size() * sizeof(float)) == 0);
        with_gradient += e.has_gradient;
        policy_mattered += std::memcmp(e.with_bf16.data(), e.with_f32.data(), want.size() * sizeof(float)) != 0;
    }
    // An expert no token reached has no gradient and only decays, the same way in both precisions; every matrix
    // with a gradient steps differently in the two.
    CHECK(with_gradient >= expected.size() / 2);
    CHECK(policy_mattered == with_gradient);
}

}  // namespace

TEST_CASE("optim::Optimizer runs Newton-Schulz in the precision its type names") {
    using F32Opt = moonmoe::Optimizer<Muon<>, NoQKClip, BiasUpdateRate<0.0>>;
    using BF16Opt = moonmoe::Optimizer<Muon<NSPrecision<BF16>>, NoQKClip, BiasUpdateRate<0.0>>;
    check_optimizer_follows_ns_precision<F32Opt>(false);
    check_optimizer_follows_ns_precision<BF16Opt>(true);
}

}  // namespace unit_optim_precision
