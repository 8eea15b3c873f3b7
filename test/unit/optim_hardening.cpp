// The optimizer step never lets a number go bad silently: a NaN or an infinity in a gradient skips the whole step
// (weights, optimizer state, step count, router bias untouched) and says so; with MuonClip's re-measure, the weights a
// step leaves have every head at or below tau on the step's batch, by an independent forward, on runs this test has
// not been tuned on (several seeds, taus and learning rates); the router's balancing update counts only the
// training forward's tokens, and inference (decoding, evaluation) between two steps changes nothing. Every test runs on
// every backend of the build.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <type_traits>

#include <moonmoe/config.hpp>
#include <moonmoe/optim.hpp>

#include "../../examples/train_tiny.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_optim_hardening {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

using HardenedOpt = moonmoe::Optimizer<Muon<>, QKClip<1.0>>;

/// Every float the step could change: weights (router biases included), then each slot's optimizer state.
template <class B, class Opt>
std::vector<float> snapshot(nn::Transformer<B>& model, Opt& opt) {
    std::vector<float> all;
    model.visit_params([&](const ParamRef& p) {
        const std::vector<float> v = to_host(View<const float, 1, B>(p.value, {p.numel()}));
        all.insert(all.end(), v.begin(), v.end());
    });
    for (auto& s : opt.slots())
        for (const auto* t : {&s.momentum, &s.exp_avg, &s.exp_avg_sq}) {
            const std::vector<float> v = to_host(*t);
            all.insert(all.end(), v.begin(), v.end());
        }
    return all;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Sets element `at` of the gradient of parameter `name` (in backend B's memory) to `value`.
template <class B>
void set_grad(nn::Transformer<B>& model, const std::string& name, std::size_t at, float value) {
    float* g = nullptr;
    model.visit_params([&](const ParamRef& p) {
        if (p.name == name) g = p.grad;
    });
    REQUIRE(g != nullptr);
    backend::Memory<B>::to_device(g + at, &value, sizeof(float));
}

template <class B>
struct Bench {
    nn::Transformer<B> model{TinyK2::config};
    optim::Optimizer<HardenedOpt, B> opt{model};
    std::vector<index_t> ids = std::vector<index_t>(12);
    const nn::TokenLayout layout = nn::TokenLayout::sequences(2, 6);
    int remeasures = 0;

    explicit Bench(std::uint64_t seed) {
        randomize(model, seed);
        opt.config.qk_clip.tau = 2.0;  // low: the clip acts on every step that is taken
        opt.bias_update_rate = 1e-2f;
    }
    void forward_backward(int batch) {
        for (index_t i = 0; i < 12; ++i) ids[std::size_t(i)] = (i * 29 + 7 * batch + 3) % 256;
        model.zero_grad();
        model.train_step(ids.data(), layout);
    }
    optim::StepReport step() {
        return opt.step([&] {
            ++remeasures;
            typename nn::Transformer<B>::Cache cache;
            model.forward(ids.data(), layout, cache, nn::Pass::measurement);
        });
    }
};

}  // namespace

TEST_CASE_TEMPLATE("run-time settings out of range are refused by name before anything changes", B,
                   MOONMOE_TEST_BACKENDS) {
    // issue 29: a learning rate of 1e38 or infinity passed, and the step made weights non-finite
    const auto refused = [](const std::function<void(Bench<B>&)>& set, std::initializer_list<std::string> parts) {
        Bench<B> b(3);
        b.forward_backward(0);
        const std::vector<float> before = snapshot(b.model, b.opt);
        set(b);
        try {
            b.step();
            FAIL("the step was taken");
        } catch (const std::invalid_argument& e) {
            for (const std::string& part : parts)
                CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, std::string(e.what())
                                                                                         << " lacks " << part);
        }
        CHECK(bitwise_equal(snapshot(b.model, b.opt), before));
        CHECK(b.opt.steps() == 0);
    };
    refused([](Bench<B>& b) { b.opt.config.muon.learning_rate = INFINITY; },
            {"Optimizer::step: config.muon.learning_rate is inf", "finite and in [0, 10]"});
    refused([](Bench<B>& b) { b.opt.config.muon.learning_rate = 1e38; }, {"config.muon.learning_rate is 1e+38"});
    refused([](Bench<B>& b) { b.opt.config.adamw.learning_rate = NAN; }, {"config.adamw.learning_rate is nan"});
    refused([](Bench<B>& b) { b.opt.config.adamw.learning_rate = -1e-3; }, {"config.adamw.learning_rate is -0.001"});
    refused([](Bench<B>& b) { b.opt.config.muon.momentum = 1.0; }, {"config.muon.momentum is 1", "in [0, 1)"});
    refused([](Bench<B>& b) { b.opt.config.adamw.eps = 0.0; }, {"config.adamw.eps is 0", "> 0"});
    refused([](Bench<B>& b) { b.opt.config.adamw.beta2 = NAN; }, {"config.adamw.beta2 is nan"});
    refused([](Bench<B>& b) { b.opt.config.qk_clip.tau = INFINITY; }, {"config.qk_clip.tau is inf"});
    refused([](Bench<B>& b) { b.opt.config.schedule.final_fraction = 2.0; }, {"config.schedule.final_fraction is 2"});
    refused([](Bench<B>& b) { b.opt.bias_update_rate = NAN; }, {"bias_update_rate is nan"});
    // in range: taken
    Bench<B> ok(3);
    ok.forward_backward(0);
    ok.opt.config.muon.learning_rate = 10.0;
    CHECK(ok.step().step == 1);
}

TEST_CASE_TEMPLATE(
    "non-finite scan: a NaN or an infinity anywhere in a block is found, huge, tiny and zero values are finite", B,
    MOONMOE_TEST_BACKENDS) {
    // the optimizer's scan (first_nonfinite) over one view: 0 when it holds a NaN or an infinity, 1 when finite
    const auto all_finite = [](const std::vector<float>& x) {
        const Tensor<float, 1, B> on_b = to_device<B>(x);
        Tensor<index_t, 1, B> first({1});
        const View<const float, 1, B> views[] = {on_b.view()};
        backend::Ops<B>::first_nonfinite(views, first.view());
        return element_to_host(first.view(), 0) == 1;
    };
    for (index_t n : {1, 7, 255, 256, 257, 1000, 4096}) {
        std::vector<float> x(static_cast<std::size_t>(n));
        for (index_t i = 0; i < n; ++i) x[std::size_t(i)] = float(i % 3 == 0 ? 3.0e38 : i % 3 == 1 ? 1e-42 : -0.0);
        CHECK(all_finite(x));
        for (index_t at : {index_t(0), n / 2, n - 1})
            for (float bad : {NAN, INFINITY, -INFINITY, -std::numeric_limits<float>::quiet_NaN()}) {
                CAPTURE(n);
                CAPTURE(at);
                CAPTURE(bad);
                const float keep = x[std::size_t(at)];
                x[std::size_t(at)] = bad;
                CHECK_FALSE(all_finite(x));
                x[std::size_t(at)] = keep;
            }
    }
}

TEST_CASE_TEMPLATE(
    "a NaN or an infinity in one gradient element skips the whole step, bit for bit, and the report says so", B,
    MOONMOE_TEST_BACKENDS) {
    const int threads = moonmoe::threads();
    moonmoe::set_threads(2);
    Bench<B> a(81), twin(81);          // twin never sees the bad steps
    for (Bench<B>* b : {&a, &twin}) {  // one clean step first, so momentum and Adam moments are not zero
        b->forward_backward(0);
        CHECK(b->step().skipped_nonfinite == 0);
    }
    // a Muon-routed expert matrix, an AdamW-routed norm gain, the AdamW-routed embedding
    const std::string muon_param = "model.layers.2.mlp.experts.5.down_proj.weight";
    const std::string adamw_param = "model.layers.1.input_layernorm.weight";
    const std::string first_param = "model.embed_tokens.weight";
    struct Injection {
        std::string where;
        float value;
        std::size_t at;
    };
    const std::vector<Injection> cases = {
        {muon_param, NAN, 17}, {muon_param, INFINITY, 0}, {adamw_param, -INFINITY, 63}, {adamw_param, NAN, 5}};
    int batch = 1;
    for (const Injection& inj : cases) {
        CAPTURE(inj.where);
        CAPTURE(inj.value);
        a.forward_backward(batch++);
        set_grad(a.model, inj.where, inj.at, inj.value);
        const std::vector<float> before = snapshot(a.model, a.opt);
        const long long steps = a.opt.steps();
        const auto rates = a.opt.learning_rates();
        const int remeasures = a.remeasures;
        const optim::StepReport r = a.step();
        CHECK(r.skipped_nonfinite == 1);
        CHECK(r.nonfinite_param == inj.where);
        CHECK(r.step == steps);
        CHECK(r.clip.total() == 0);
        CHECK(r.clip_rounds == 0);
        CHECK(bitwise_equal(snapshot(a.model, a.opt), before));  // weights, router biases, momentum, Adam moments
        CHECK(a.opt.steps() == steps);  // no step count, so no schedule or bias-correction advance
        CHECK(a.opt.learning_rates() == rates);
        CHECK(a.remeasures == remeasures);  // no QK-Clip
        for (auto& layer : a.model.layers)
            if (!layer.dense)  // the skipped step's routing statistics are dropped, not carried into the next update
                for (index_t l : to_host(layer.moe.gate.load)) CHECK(l == 0);
    }
    CHECK(a.opt.skipped_nonfinite_steps() == static_cast<long long>(cases.size()));
    // two bad parameters: the report names the first in visit order, whatever the threads found first
    a.forward_backward(batch++);
    set_grad(a.model, muon_param, 3, NAN);
    set_grad(a.model, first_param, 100, INFINITY);
    CHECK(a.step().nonfinite_param == first_param);
    CHECK(a.opt.skipped_nonfinite_steps() == static_cast<long long>(cases.size()) + 1);
    // a clean step afterwards proceeds, and is exactly the step a run that never saw the bad ones takes
    a.forward_backward(100);
    twin.forward_backward(100);
    const optim::StepReport ra = a.step(), rt = twin.step();
    CHECK(ra.skipped_nonfinite == 0);
    CHECK(ra.nonfinite_param.empty());
    CHECK(ra.step == 2);
    CHECK(ra.clip.total() > 0);
    CHECK(ra.clip.total() == rt.clip.total());
    CHECK(bitwise_equal(snapshot(a.model, a.opt), snapshot(twin.model, twin.opt)));
    moonmoe::set_threads(threads);
}

TEST_CASE_TEMPLATE(
    "a step that would leave a NaN or an infinity in a weight or its state is skipped, bit for bit, and named", B,
    MOONMOE_TEST_BACKENDS) {
    // issue 29: finite gradients and settings in range can still make the update non-finite (a gradient near the
    // float range squared into Adam's v, a weight decay whose lr * wd overflows the decay factor); such a step was
    // taken, reported as taken, and left NaN / Inf weights for save_transformer to write.
    Bench<B> a(82), twin(82);
    for (Bench<B>* b : {&a, &twin}) {
        b->forward_backward(0);
        CHECK(b->step().skipped_nonfinite == 0);
    }
    const std::string muon_param = "model.layers.2.mlp.experts.5.down_proj.weight";
    const std::string adamw_param = "model.layers.1.input_layernorm.weight";
    struct Case {
        const char* what;
        std::string param;
        std::function<void(Bench<B>&)> set, unset;
    };
    const auto nothing = [](Bench<B>&) {};
    const auto momentum_of = [](Bench<B>& b, const std::string& name) -> float* {
        for (auto& slot : b.opt.slots())
            if (slot.param.name == name) return slot.momentum.data();
        FAIL("no slot " << name);
        return nullptr;
    };
    float saved_m = 0;
    const std::vector<Case> cases = {
        // v = b2 v + (1 - b2) g^2 overflows (g^2 > 3.4e38): an infinite second moment
        {"a finite gradient whose square overflows Adam's v", adamw_param,
         [&](Bench<B>& b) { set_grad(b.model, adamw_param, 7, 3.0e38f); }, nothing},
        // m.lerp_(g, 1 - beta) with m and g of opposite signs near the range: g - m overflows
        {"Muon's momentum overflowing", muon_param,
         [&](Bench<B>& b) {
             set_grad(b.model, muon_param, 11, 3.0e38f);
             float* m = momentum_of(b, muon_param);
             backend::Memory<B>::to_host(&saved_m, m + 11, sizeof(float));
             const float huge = -3.0e38f;
             backend::Memory<B>::to_device(m + 11, &huge, sizeof huge);
         },
         [&](Bench<B>& b) {  // the skipped step left that momentum as set: the value it had before
             backend::Memory<B>::to_device(momentum_of(b, muon_param) + 11, &saved_m, sizeof(float));
         }},
        // 1 - lr * wd is -inf in float: every Muon weight would be multiplied by it (the first Muon one is named)
        {"Muon's weight decay factor overflowing", "model.layers.0.self_attn.q_a_proj.weight",
         [](Bench<B>& b) { b.opt.config.muon.weight_decay = 1e300; },
         [&](Bench<B>& b) { b.opt.config.muon.weight_decay = twin.opt.config.muon.weight_decay; }},
        // the same for AdamW: the embedding is the first AdamW parameter in visit order
        {"AdamW's weight decay factor overflowing", "model.embed_tokens.weight",
         [](Bench<B>& b) { b.opt.config.adamw.weight_decay = 1e300; },
         [&](Bench<B>& b) { b.opt.config.adamw.weight_decay = twin.opt.config.adamw.weight_decay; }},
    };
    int batch = 1;
    for (const Case& c : cases) {
        CAPTURE(c.what);
        a.forward_backward(batch++);
        c.set(a);
        const std::vector<float> before = snapshot(a.model, a.opt);
        const long long steps = a.opt.steps();
        const ParamRef* unsafe = a.opt.first_unsafe_update();
        REQUIRE(unsafe != nullptr);
        CHECK(unsafe->name == c.param);
        const optim::StepReport r = a.step();
        CHECK(r.skipped_nonfinite == 1);
        CHECK(r.nonfinite_update);
        CHECK(r.nonfinite_param == c.param);
        CHECK(r.step == steps);
        CHECK(r.clip.total() == 0);
        CHECK(bitwise_equal(snapshot(a.model, a.opt), before));
        CHECK(a.opt.steps() == steps);
        c.unset(a);
    }
    CHECK(a.opt.skipped_nonfinite_steps() == static_cast<long long>(cases.size()));
    // the weights stayed finite, and a clean step afterwards is the step of a run that never saw the bad ones
    a.forward_backward(100);
    twin.forward_backward(100);
    CHECK(a.opt.first_unsafe_update() == nullptr);
    const optim::StepReport ra = a.step(), rt = twin.step();
    CHECK(ra.skipped_nonfinite == 0);
    CHECK_FALSE(ra.nonfinite_update);
    CHECK(ra.clip.total() == rt.clip.total());
    CHECK(bitwise_equal(snapshot(a.model, a.opt), snapshot(twin.model, twin.opt)));
}

/// A schedule that multiplies every singular value by 100 per iteration.
struct Diverging {
    static constexpr NSCoefficients table[] = {{100.0, 0.0, 0.0}};
    static constexpr bool cycle = true;
};

TEST_CASE("Newton-Schulz's output bound holds for the library's schedules, and a diverging one is refused") {
    // The bound Muon's weight pre-check uses: above the largest singular value each schedule reaches (measured
    // here on random matrices by the f32 iteration itself), and finite.
    const auto reached = [](auto schedule) {
        double top = 0;
        for (std::uint64_t seed : {1, 2, 3}) {
            Tensor<float, 2> g({24, 40}), o({24, 40});
            backend::Ops<cpu>::fill_normal(g.view(), 0.0f, 1.0f, seed);
            optim::NSWorkspace<float> ws;
            optim::newton_schulz<decltype(schedule)>(g.view(), o.view(), 5, ws);
            for (float v : to_host(o)) top = std::max(top, double(std::abs(v)));
        }
        return top;
    };
    for (const auto& [bound, top] : {std::pair{optim::newton_schulz_bound<KellerQuintic>(5), reached(KellerQuintic{})},
                                     std::pair{optim::newton_schulz_bound<PolarExpress>(5), reached(PolarExpress{})},
                                     std::pair{optim::newton_schulz_bound<YouQuintic>(5), reached(YouQuintic{})}}) {
        CHECK(std::isfinite(bound));
        CHECK(bound < 5.0);
        CHECK(top > 0.1);
        CHECK(top <= bound);
    }
    CHECK(optim::newton_schulz_bound<Diverging>(5) > 1e9);
    nn::Transformer<cpu> model{TinyK2::config};
    CHECK_THROWS_WITH_AS((optim::Optimizer<moonmoe::Optimizer<Muon<Coefficients<Diverging>>>, cpu>(model)),
                         doctest::Contains("diverge"), std::invalid_argument);
}

TEST_CASE_TEMPLATE(
    "inference between two training steps changes nothing: train, decode, evaluate, train equals "
    "train, train bit for bit",
    B, MOONMOE_TEST_BACKENDS) {
    // Without the remeasure, the step's QK-Clip uses the maxima the forwards since the last step recorded, and the
    // bias update the loads they counted: a decode or an evaluation forward in between that fed either would move
    // the next step (a low tau, so the clip acts; other tokens than the training batch's, so their maxima differ).
    const auto run = [](const std::function<void(Bench<B>&)>& between) {
        Bench<B> b(57);
        b.forward_backward(0);
        b.opt.step();
        between(b);
        b.forward_backward(1);
        const optim::StepReport r = b.opt.step();
        CHECK(r.clip.total() > 0);
        return snapshot(b.model, b.opt);
    };
    std::vector<index_t> other(24);
    for (std::size_t i = 0; i < other.size(); ++i) other[i] = index_t((i * 53 + 11) % 256);
    const std::vector<float> plain = run([](Bench<B>&) {});
    const std::vector<float> decoded = run([&](Bench<B>& b) {
        auto state = b.model.start_decoding(32);
        b.model.decode(other.data(), 16, state);                                       // a prompt
        for (index_t t = 16; t < 24; ++t) b.model.decode(other.data() + t, 1, state);  // token by token
    });
    const std::vector<float> evaluated = run([&](Bench<B>& b) {
        typename nn::Transformer<B>::Cache cache;
        b.model.forward(other.data(), nn::TokenLayout::sequences(2, 12), cache);  // nn::Pass::inference
    });
    CHECK(bitwise_equal(decoded, plain));
    CHECK(bitwise_equal(evaluated, plain));
    // the same forward marked as training moves the next step: what the check above would see if inference fed
    // the statistics
    const std::vector<float> trained = run([&](Bench<B>& b) {
        typename nn::Transformer<B>::Cache cache;
        b.model.forward(other.data(), nn::TokenLayout::sequences(2, 12), cache, nn::Pass::training);
    });
    CHECK_FALSE(bitwise_equal(trained, plain));
}

TEST_CASE_TEMPLATE(
    "the router bias moves by the training forward's loads only: QK-Clip's re-measure forwards do not count", B,
    MOONMOE_TEST_BACKENDS) {
    Bench<B> b(82);
    b.forward_backward(0);
    std::vector<std::vector<index_t>> loads;
    std::vector<std::vector<float>> expected;
    for (auto& layer : b.model.layers) {
        if (layer.dense) continue;
        const auto& g = layer.moe.gate;
        const std::vector<index_t> load = to_host(g.load);
        loads.push_back(load);
        CHECK(std::accumulate(load.begin(), load.end(), index_t{0}) == 12 * 2);  // 12 tokens, top-2
        std::vector<float> bias = to_host(g.bias.value);
        const double mean = 12.0 * 2 / double(g.experts());
        for (index_t e = 0; e < g.experts(); ++e) {
            const double diff = mean - double(load[std::size_t(e)]);
            bias[std::size_t(e)] += b.opt.bias_update_rate * float((diff > 0) - (diff < 0));
        }
        expected.push_back(bias);
    }
    const optim::StepReport r = b.step();
    CHECK(r.clip_rounds >= 2);  // the clip acted, so at least one more measurement ran after it
    CHECK(b.remeasures == r.clip_rounds);
    std::size_t m = 0;
    for (auto& layer : b.model.layers) {
        if (layer.dense) continue;
        const auto& g = layer.moe.gate;
        const std::vector<float> bias = to_host(g.bias.value);
        CHECK(std::memcmp(bias.data(), expected[m].data(), expected[m].size() * sizeof(float)) == 0);
        for (index_t l : to_host(g.load)) CHECK(l == 0);  // the re-measure forwards left the counts alone
        ++m;
    }
    // the caller's own measurements and inference forwards leave them alone too
    for (const nn::Pass pass : {nn::Pass::measurement, nn::Pass::inference}) {
        typename nn::Transformer<B>::Cache cache;
        b.model.forward(b.ids.data(), b.layout, cache, pass);
    }
    for (auto& layer : b.model.layers)
        if (!layer.dense)
            for (index_t l : to_host(layer.moe.gate.load)) CHECK(l == 0);
    CHECK_THROWS_WITH_AS(b.opt.step([] {}, 0), doctest::Contains("rounds must be at least 1"), std::invalid_argument);
}

TEST_CASE_TEMPLATE(
    "QK-Clip: a head over tau by less than f32 resolves in the factor still shrinks, so no round repeats itself", B,
    MOONMOE_TEST_BACKENDS) {
    nn::MLA<B> attn(TinyK2::config);
    randomize(attn, 83);
    const nn::MLAHeadLayout L = attn.head_layout();
    const index_t qc = attn.q_b_proj.in_features(), kc = attn.kv_b_proj.in_features();
    const std::vector<float> q0 = to_host(attn.q_b_proj.weight.value), kv0 = to_host(attn.kv_b_proj.weight.value);
    QKClipConfig c = QKClip<1.0>::value;
    const float over = std::nextafter(8.0f, 16.0f);  // 8 + 2^-20: the next float above 8
    c.tau = 8.0 + 0.9 * (double(over) - 8.0);        // gamma = tau / over = 1 - 1.2e-8: 1 in f32, so is its root
    CHECK(float(c.tau / over) == 1.0f);
    CHECK(float(std::sqrt(c.tau / over)) == 1.0f);
    CHECK(optim::clip_mla_heads<B>(attn.q_b_proj.weight.value.data(), qc, attn.kv_b_proj.weight.value.data(), kc, L,
                                   {over, 1.0f, 1.0f, 1.0f}, c) == 1);
    const std::vector<float> q_after = to_host(attn.q_b_proj.weight.value),
                             kv_after = to_host(attn.kv_b_proj.weight.value);
    const float* q = q_after.data();
    const float* kv = kv_after.data();
    auto shrank = [](const float* now, const std::vector<float>& before, index_t cols, index_t row, index_t rows) {
        for (index_t i = row * cols; i < (row + rows) * cols; ++i)
            if (before[std::size_t(i)] != 0.0f && !(std::abs(now[i]) < std::abs(before[std::size_t(i)]))) return false;
        return true;
    };
    CHECK(shrank(q, q0, qc, L.q_row(0), L.nope));       // q_nope of head 0
    CHECK(shrank(q, q0, qc, L.q_rope_row(0), L.rope));  // q_rope
    CHECK(shrank(kv, kv0, kc, L.k_nope_row(0), L.nope));
    CHECK(std::memcmp(kv + L.v_row(0) * kc, kv0.data() + L.v_row(0) * kc, std::size_t(L.v * kc) * sizeof(float)) == 0);
    CHECK(std::memcmp(q + L.q_row(1) * qc, q0.data() + L.q_row(1) * qc,
                      std::size_t(3 * (L.nope + L.rope) * qc) * sizeof(float)) == 0);
}

TEST_CASE_TEMPLATE(
    "MuonClip with re-measure: every head of an independent forward on the weights a step leaves is <= tau", B,
    MOONMOE_TEST_BACKENDS) {
    // Runs that nothing here was tuned on: seeds, taus and learning rates around the aggressive tau 12.5 / lr 0.05
    // of train_tiny (taus that f32 cannot hold among them). With the router-bias update after the clip's last
    // measurement, 5 of these 6 runs ended steps with a head up to 15% above tau. The promise is exact (no
    // tolerance): the measurement that ends the clip loop is a forward of the very weights the step leaves, and
    // forwards are bitwise repeatable at a fixed thread count.
    struct Run {
        std::uint64_t seed;
        double tau, lr;
        float bias_rate;
    };
    std::vector<Run> runs = {{101, 12.5, 0.05, 1e-3f}, {102, 12.5, 0.08, 1e-2f}, {103, 8.0, 0.05, 1e-2f},
                             {104, 19.7, 0.1, 1e-3f},  {105, 6.3, 0.03, 1e-2f},  {106, 12.5, 0.05, 1e-2f}};
    index_t steps = 40;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
    runs.resize(2), steps = 15;  // memory errors need the code paths, not every run
#endif
#if defined(MOONMOE_CUDA_EMULATED) && MOONMOE_CUDA_EMULATED
    // The emulated CUDA backend (Thrust on OpenMP, a host stand-in for cuBLAS) runs all six in ~6 minutes, where
    // the CPU takes 40 s: there its code paths, every run on a GPU.
    if constexpr (std::is_same_v<B, moonmoe::cuda>) runs.resize(2), steps = 15;
#endif
    const int threads = moonmoe::threads();
    moonmoe::set_threads(2);
    index_t clips = 0;
    for (const Run& run : runs) {
        train_tiny::Options o;
        o.steps = steps, o.batch = 4, o.seq = 32, o.warmup = 5;
        o.seed = run.seed, o.tau = run.tau, o.lr = run.lr, o.bias_rate = run.bias_rate;
        o.measure_after_step = false;  // measured here instead
        train_tiny::Trainer<B> t(o, true);
        for (index_t s = 0; s < o.steps; ++s) {
            CAPTURE(run.seed);
            CAPTURE(run.tau);
            CAPTURE(run.lr);
            CAPTURE(s);
            const train_tiny::StepLog log = t.step();
            clips += log.heads_clipped;
            CHECK_FALSE(t.report.clip_exhausted);
            for (auto& layer : t.model.layers) layer.self_attn.reset_max_logits();
            typename nn::Transformer<B>::Cache cache;
            t.model.forward(t.batch().data(), t.layout, cache, nn::Pass::measurement);
            for (std::size_t l = 0; l < t.model.layers.size(); ++l) {
                CAPTURE(l);
                const std::vector<float> m = to_host(t.model.layers[l].self_attn.max_logit_per_head);
                for (float head : m) CHECK(head <= run.tau);
                CHECK(*std::max_element(m.begin(), m.end()) == t.report.max_logit_remeasured[l]);  // the same forward
            }
            for (auto& layer : t.model.layers) layer.self_attn.reset_max_logits();
        }
    }
    CHECK(clips > 0);
    moonmoe::set_threads(threads);
}

}  // namespace unit_optim_hardening
