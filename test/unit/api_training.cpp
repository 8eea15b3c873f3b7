// The runtime API a training loop is written against: the README's Quick start loop (a model from a type and a
// seed, train_step then step(), 20 steps on a fixed token pattern) trains, because step() leaves the gradients at
// zero; micro-batches accumulate until step(); a second backward on one cache is refused with a message that
// says what to do; the seeded initialiser follows transformers' DeepseekV3 _init_weights.
#include "support/nn_testing.hpp"

#include <cmath>
#include <cstring>
#include <numeric>

#include <moonmoe/moonmoe.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_api_training {

using namespace moonmoe;

namespace {

// The Quick start's optimizer, spelled as in README.md: MuonClip at a constant rate after two warm-up steps.
using QuickStartOptimizer = moonmoe::Optimizer<Muon<LearningRate<0.02>>, AdamW<LearningRate<0.003>>, QKClip<100>,
                                               WSD<Warmup<2>, Stable<1000>, Decay<0>>>;

// The Quick start's data: 4 sequences of 32 tokens, token i of sequence b is (b * 50 + 7 * i) % 256.
std::vector<index_t> quick_start_batch() {
    std::vector<index_t> ids;
    for (index_t b = 0; b < 4; ++b)
        for (index_t i = 0; i < 32; ++i) ids.push_back((b * 50 + 7 * i) % 256);
    return ids;
}

std::vector<float> gradients(nn::Transformer<>& model) {
    std::vector<float> all;
    model.visit_params([&](const ParamRef& p) {
        if (p.grad) all.insert(all.end(), p.grad, p.grad + p.numel());
    });
    return all;
}

}  // namespace

TEST_CASE("Quick start loop: a seeded TinyK2, train_step then step(), 20 steps on a fixed pattern: the loss falls") {
    nn::Transformer<> model(TinyK2::config);
    nn::init_weights(model, {.seed = 42});
    optim::Optimizer<QuickStartOptimizer> opt(model);
    const std::vector<index_t> ids = quick_start_batch();
    const auto layout = nn::TokenLayout::sequences(4, 32);
    std::vector<float> losses;
    for (int step = 1; step <= 20; ++step) {
        losses.push_back(model.train_step(ids.data(), layout));
        opt.step();
        MESSAGE("step " << step << " loss " << losses.back());
    }
    CHECK(losses.front() == doctest::Approx(std::log(256.0)).epsilon(0.02));           // near-uniform logits at init
    for (std::size_t s = 1; s < losses.size(); ++s) CHECK(losses[s] < losses[s - 1]);  // every step helps
    CHECK(losses.back() < 0.5f * losses.front());
}

TEST_CASE("step() leaves every gradient it stepped with at zero, the same loop without zeroing trains worse") {
    const std::vector<index_t> ids = quick_start_batch();
    const auto layout = nn::TokenLayout::sequences(4, 32);
    const auto train = [&](bool zero, std::vector<float>& losses) {
        nn::Transformer<> model(TinyK2::config);
        nn::init_weights(model, {.seed = 42});
        optim::Optimizer<QuickStartOptimizer> opt(model);
        opt.zero_grads_after_step = zero;
        for (int step = 0; step < 12; ++step) {
            losses.push_back(model.train_step(ids.data(), layout));
            opt.step();
            const std::vector<float> g = gradients(model);
            const bool all_zero = std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; });
            CHECK(all_zero == zero);
        }
    };
    std::vector<float> zeroed, accumulated;
    train(true, zeroed);
    train(false, accumulated);
    // The first two steps see the same gradient; from the third on, the stale sum steers the step away.
    CHECK(zeroed[0] == accumulated[0]);
    CHECK(zeroed[1] == accumulated[1]);
    CHECK(zeroed.back() < accumulated.back());
}

TEST_CASE(
    "micro-batches accumulate until step(): two train_steps sum their gradients, and a skipped step clears them") {
    nn::Transformer<> model(TinyK2::config);
    nn::init_weights(model, {.seed = 3});
    const std::vector<index_t> ids = quick_start_batch();
    const auto half = nn::TokenLayout::sequences(2, 32);
    model.train_step(ids.data(), half);
    const std::vector<float> first = gradients(model);
    model.zero_grad();
    model.train_step(ids.data() + 64, half);
    const std::vector<float> second = gradients(model);
    model.zero_grad();
    model.train_step(ids.data(), half);
    model.train_step(ids.data() + 64, half);
    const std::vector<float> both = gradients(model);
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < both.size(); ++i) {
        worst = std::max(worst, std::abs(double(both[i]) - (double(first[i]) + second[i])));
        scale = std::max(scale, std::abs(double(first[i]) + second[i]));
    }
    CHECK(worst <= 1e-6 * scale);  // the same sums, rounded in another order

    optim::Optimizer<QuickStartOptimizer> opt(model);
    model.visit_params([](const ParamRef& p) {
        if (p.name == "model.norm.weight") p.grad[0] = NAN;
    });
    CHECK(opt.step().skipped_nonfinite == 1);
    const std::vector<float> after = gradients(model);
    CHECK(std::all_of(after.begin(), after.end(), [](float x) { return x == 0.0f; }));  // the NaN is gone too
}

TEST_CASE("backward twice on one cache, or without a forward, is refused with what to do instead") {
    nn::Transformer<> model(TinyK2::config);
    nn::init_weights(model, {.seed = 5});
    const std::vector<index_t> ids = quick_start_batch();
    const auto layout = nn::TokenLayout::sequences(1, 32);
    nn::Transformer<>::Cache cache;
    Tensor<float, 2> dlogits({32, 256});
    CHECK_THROWS_WITH_AS(
        model.backward(dlogits.view(), cache),
        doctest::Contains("the cache holds no forward (or its forward threw); run forward(ids, layout, "
                          "cache, nn::Pass::training) before backward"),
        std::logic_error);
    // an inference forward (the default) fed no training statistics: its backward is refused, naming the mark
    model.forward(ids.data(), layout, cache);
    CHECK_THROWS_WITH_AS(model.backward(dlogits.view(), cache),
                         doctest::Contains("the cache holds an inference forward, which fed no router load and no "
                                           "QK-Clip maxima; a forward whose backward trains is marked: forward(ids, "
                                           "layout, cache, nn::Pass::training)"),
                         std::logic_error);
    Tensor<float, 2> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
    nn::cross_entropy<cpu>(logits.view(), targets.data(), dlogits.view());
    Tensor<float, 2> wrong({31, 256});
    CHECK_THROWS_WITH_AS(model.backward(wrong.view(), cache),
                         doctest::Contains("dlogits is [31, 256], the forward's logits are [32, 256]"), shape_error);
    model.backward(dlogits.view(), cache);  // the failed call above changed nothing
    const std::vector<float> once = gradients(model);
    CHECK_THROWS_WITH_AS(model.backward(dlogits.view(), cache),
                         doctest::Contains("this cache's backward has already run; backward consumes (and frees) the "
                                           "activations its forward stored, so each forward allows one backward. Run "
                                           "forward again"),
                         std::logic_error);
    CHECK(gradients(model) == once);                               // nothing was added by the refused call
    model.forward(ids.data(), layout, cache, nn::Pass::training);  // a new forward makes the cache usable again
    model.backward(dlogits.view(), cache);
    const std::vector<float> twice = gradients(model);
    for (std::size_t i = 0; i < once.size(); i += 997) CHECK(twice[i] == doctest::Approx(2.0 * once[i]).epsilon(1e-5));
}

TEST_CASE(
    "init_weights: N(0, initializer_range^2) matrices and embedding, norms 1, correction bias 0, by (seed, name)") {
    nn::Transformer<> model(TinyV3::config);
    nn::init_weights(model, {.seed = 11, .initializer_range = 0.05});
    int matrices = 0;
    model.visit_params([&](const ParamRef& p) {
        CAPTURE(p.name);
        const index_t n = p.numel();
        if (p.kind == ParamKind::vector) {
            CHECK(std::all_of(p.value, p.value + n, [](float x) { return x == 1.0f; }));
        } else if (p.kind == ParamKind::router_bias) {
            CHECK(std::all_of(p.value, p.value + n, [](float x) { return x == 0.0f; }));
        } else if (n >= 4096) {  // enough values for the moments: sd of the sample sd ~ 0.05 / sqrt(2n) < 6e-4
            double sum = 0.0, sq = 0.0;
            for (index_t i = 0; i < n; ++i) sum += p.value[i], sq += double(p.value[i]) * p.value[i];
            const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
            CHECK(std::abs(mean) < 5.0 * 0.05 / std::sqrt(double(n)));
            CHECK(sd == doctest::Approx(0.05).epsilon(0.05));
            ++matrices;
        }
    });
    CHECK(matrices >= 5);

    // The same (seed, name) gives the same values whatever the threads or the rest of the model; another seed or
    // another name gives others.
    const auto values = [](nn::Transformer<>& m, const std::string& name) {
        std::vector<float> out;
        m.visit_params([&](const ParamRef& p) {
            if (p.name == name) out.assign(p.value, p.value + p.numel());
        });
        REQUIRE(!out.empty());
        return out;
    };
    using Shallow = TinyV3::with<TinyV3::dims::with<Layers<3>>>;
    nn::Transformer<> shallow(Shallow::config);
    const int threads = moonmoe::threads();
    moonmoe::set_threads(1);
    nn::init_weights(shallow, {.seed = 11, .initializer_range = 0.05});
    moonmoe::set_threads(threads);
    for (const char* name : {"model.embed_tokens.weight", "model.layers.2.self_attn.q_a_proj.weight",
                             "model.layers.2.mlp.experts.3.up_proj.weight", "model.layers.2.mlp.gate.weight"})
        CHECK(values(shallow, name) == values(model, name));
    CHECK(values(model, "model.layers.0.self_attn.q_a_proj.weight") !=
          values(model, "model.layers.1.self_attn.q_a_proj.weight"));
    nn::init_weights(shallow, {.seed = 12, .initializer_range = 0.05});
    CHECK(values(shallow, "model.layers.2.self_attn.q_a_proj.weight") !=
          values(model, "model.layers.2.self_attn.q_a_proj.weight"));
}

}  // namespace unit_api_training
