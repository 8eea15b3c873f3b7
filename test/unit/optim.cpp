// The optimizer layer against external references: Newton-Schulz against SVD-built inputs (U p(S) V^T, the exact
// composed polynomial in f64), Muon against torch.optim.Muon and an f64 rendering of its algorithm, AdamW against
// torch.optim.AdamW, QK-Clip against a PyTorch rendering of Algorithm 1 (tools/make_optimizer_reference.py).
// Every test that computes runs on every backend of the build (data moved with on<B>() / host() / to_host), with
// the same tolerances: the references are external, so a backend that rounds differently must still meet them.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"

#include <cmath>
#include <cstring>
#include <numeric>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/io/optimizer_state.hpp>
#include <moonmoe/optim.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_optim {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

std::vector<double> f64(const Reference& r, const std::string& name) {
    const TensorRecord& rec = r.file.at(name);
    std::vector<double> out(std::size_t(rec.numel()));
    std::memcpy(out.data(), rec.bytes.data(), out.size() * sizeof(double));
    return out;
}

/// Newton-Schulz (5 iterations) of the [rows, cols] matrix g, rounded to T, on backend B; the result on the host.
template <class Coeffs, class T, class B>
std::vector<T> run_ns(const std::vector<double>& g, index_t rows, index_t cols, optim::Products p) {
    const std::vector<T> in(g.begin(), g.end());
    const Tensor<T, 2, B> G = to_device<B, 2>(std::span<const T>(in), {rows, cols});
    Tensor<T, 2, B> out({rows, cols});
    optim::NSWorkspace<T, B> ws;
    optim::newton_schulz<Coeffs, T, B>(G.view(), out.view(), 5, ws, p);
    return to_host(out);
}

/// Every parameter value of `model`, on the host, end to end in visit order.
template <class B>
std::vector<float> flat_values(nn::Transformer<B>& model) {
    std::vector<float> out;
    model.visit_params([&](const ParamRef& p) {
        const std::vector<float> v = floats_to_host<B>(p.value, p.numel());
        out.insert(out.end(), v.begin(), v.end());
    });
    return out;
}

double max_abs_diff(const auto& a, const auto& b) {
    double d = 0.0;
    for (std::size_t i = 0; i < b.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    return d;
}

}  // namespace

TEST_CASE_TEMPLATE("Newton-Schulz equals U p(S) V^T for SVD-built inputs (Keller and Polar Express, f64 and f32)", B,
                   MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/newton_schulz.safetensors");
    for (const char* shape : {"24x40", "40x24", "32x32", "32x32_rank31"}) {
        const index_t rows = std::atol(shape), cols = std::atol(std::strchr(shape, 'x') + 1);
        for (const char* schedule : {"keller", "polar_express"}) {
            CAPTURE(shape);
            CAPTURE(schedule);
            const std::string base = std::string("ns.") + shape + "." + schedule;
            const std::vector<double> g = f64(ref, base + ".input"), expected = f64(ref, base + ".expected");
            for (optim::Products p : {optim::Products::symmetric, optim::Products::general}) {
                const bool keller = std::string(schedule) == "keller";
                const auto got64 = keller ? run_ns<KellerQuintic, double, B>(g, rows, cols, p)
                                          : run_ns<PolarExpress, double, B>(g, rows, cols, p);
                CHECK(max_abs_diff(got64, expected) < 1e-10);  // f64 rounding through 5 iterations
                const auto got32 = keller ? run_ns<KellerQuintic, float, B>(g, rows, cols, p)
                                          : run_ns<PolarExpress, float, B>(g, rows, cols, p);
                CHECK(max_abs_diff(got32, expected) < 2e-5);  // f32: ~1e-7 per product, amplified by p' <= 8.2
            }
        }
    }
}

TEST_CASE_TEMPLATE("Newton-Schulz invariances: scale, transpose (bitwise), zero, orthogonal fixed point", B,
                   MOONMOE_TEST_BACKENDS) {
    const index_t n = 24, m = 40;
    Mat g = random_matrix(n, m, 50);
    std::vector<double> gd(g.data(), g.data() + g.numel()), g3(gd), gt(std::size_t(n * m));
    for (auto& v : g3) v *= 3.0;
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) gt[j * n + i] = gd[i * m + j];
    const auto a = run_ns<KellerQuintic, float, B>(gd, n, m, optim::Products::symmetric);
    const auto b = run_ns<KellerQuintic, float, B>(g3, n, m, optim::Products::symmetric);
    const auto t = run_ns<KellerQuintic, float, B>(gt, m, n, optim::Products::symmetric);
    CHECK(max_abs_diff(a, b) < 1e-5);
    bool transposed = true;
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) transposed = transposed && t[j * n + i] == a[i * m + j];
    CHECK(transposed);
    const auto z =
        run_ns<KellerQuintic, float, B>(std::vector<double>(std::size_t(n * m), 0.0), n, m, optim::Products::symmetric);
    CHECK(max_abs_diff(z, std::vector<float>(z.size(), 0.0f)) == 0.0);
    // an orthogonal input (all singular values 1 after normalisation by sqrt(n)) maps to p^5(1/sqrt(n)) * Q
    std::vector<double> q(std::size_t(n * n), 0.0);
    for (index_t i = 0; i < n; ++i) q[i * n + (i * 7) % n] = 1.0;  // a permutation matrix
    const auto o = run_ns<PolarExpress, double, B>(q, n, n, optim::Products::symmetric);
    double x = 1.0 / (std::sqrt(double(n)) * 1.02 + 1e-6);
    for (const auto& k : PolarExpress::table) x = k.a * x + k.b * x * x * x + k.c * x * x * x * x * x;
    for (index_t i = 0; i < n; ++i) CHECK(o[i * n + (i * 7) % n] == doctest::Approx(x).epsilon(1e-12));
    CHECK(x == doctest::Approx(1.0).epsilon(0.15));  // near the fixed point
}

TEST_CASE_TEMPLATE("Muon matches torch.optim.Muon: tall, wide, square and per-expert matrices, Nesterov on and off", B,
                   MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/muon_torch.safetensors");
    struct Case {
        const char* name;
        bool nesterov;
        UpdateScaleKind scale;
    };
    const Case cases[] = {{"match_nesterov", true, UpdateScaleKind::match_adamw_rms},
                          {"match_no_nesterov", false, UpdateScaleKind::match_adamw_rms},
                          {"original_nesterov", true, UpdateScaleKind::shape}};
    const std::pair<const char*, Shape<2>> params[] = {{"wide", {48, 96}},    {"tall", {96, 40}},
                                                       {"square", {64, 64}},  {"expert0", {32, 80}},
                                                       {"expert1", {32, 80}}, {"expert2", {32, 80}}};
    double worst64 = 0.0, worst_torch = 0.0;
    for (const Case& c : cases) {
        MuonConfig cfg = Muon<>::value;
        cfg.nesterov = c.nesterov, cfg.scale = c.scale,
        cfg.scale_factor = c.scale == UpdateScaleKind::shape ? 1.0 : 0.2;
        cfg.momentum = 0.95, cfg.weight_decay = 0.1, cfg.ns_steps = 5;
        for (const auto& [param, shape] : params) {
            CAPTURE(c.name);
            CAPTURE(param);
            const std::vector<float> init = ref.f32(std::string(param) + ".init");
            Tensor<float, 2, B> W = to_device<B, 2>(std::span<const float>(init), shape), M(shape), u, o;
            optim::NSWorkspace<float, B> ws;
            for (int t = 1; t <= 3; ++t) {
                const std::string s = std::to_string(t);
                const std::vector<float> before = to_host(W), grad = ref.f32(std::string(param) + ".grad." + s);
                const Tensor<float, 2, B> G = to_device<B, 2>(std::span<const float>(grad), shape);
                optim::muon_step<KellerQuintic, B>(cfg, 0.02, W.view(), G.view(), M.view(), ws, u, o);
                const std::vector<float> w = to_host(W), momentum = to_host(M);
                const std::vector<float> f64_result = ref.f32(std::string(c.name) + "." + param + ".after64." + s);
                const std::vector<float> torch_result = ref.f32(std::string(c.name) + "." + param + ".after." + s);
                double update = 0.0;
                for (std::size_t i = 0; i < w.size(); ++i)
                    update = std::max(update, std::abs(double(f64_result[i]) - before[i]));
                // momentum: the same EMA in f32 as torch
                CHECK(max_abs_diff(momentum, ref.f32(std::string(param) + ".momentum." + s)) < 1e-6);
                const double e64 = max_abs_diff(w, f64_result) / update, et = max_abs_diff(w, torch_result) / update;
                worst64 = std::max(worst64, e64), worst_torch = std::max(worst_torch, et);
                CHECK(e64 < 1e-4);  // f32 Newton-Schulz against the f64 rendering of the same algorithm
                // torch runs Newton-Schulz in bf16 (8-bit mantissa): its own result is up to 0.052 of the update
                // away from the f64 rendering (tools/README.md), so ours can be no closer to it than that
                CHECK(et < 8e-2);
            }
        }
    }
    MESSAGE("Muon: worst error against the f64 rendering " << worst64 << ", against torch (bf16 NS) " << worst_torch
                                                           << ", as fractions of the largest update");
}

TEST_CASE_TEMPLATE("AdamW matches torch.optim.AdamW", B, MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/adamw_torch.safetensors");
    AdamWConfig cfg{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .learning_rate = 2e-3};
    for (const char* param : {"vector", "embedding"}) {
        Tensor<float, 1, B> W = to_device<B>(ref.f32(std::string(param) + ".init"));
        const index_t n = W.numel();
        Tensor<float, 1, B> M({n}), V({n});
        for (int t = 1; t <= 3; ++t) {
            const std::string s = std::to_string(t);
            const Tensor<float, 1, B> G = to_device<B>(ref.f32(std::string(param) + ".grad." + s));
            optim::adamw_step<B>(cfg, 2e-3, t, W.data(), G.data(), M.data(), V.data(), n);
            const std::vector<float> w = to_host(W), m = to_host(M), v = to_host(V);
            // f32 on both sides, other operation order: a few ulps (torch is 5e-7 from an f64 rendering)
            CHECK(scaled_error(w.data(), ref.f32(std::string(param) + ".after." + s)) < 1e-6);
            CHECK(scaled_error(m.data(), ref.f32(std::string(param) + ".exp_avg." + s)) < 1e-6);
            CHECK(scaled_error(v.data(), ref.f32(std::string(param) + ".exp_avg_sq." + s)) < 1e-6);
        }
    }
}

TEST_CASE_TEMPLATE(
    "QK-Clip on MLA matches Algorithm 1: clipped weights, untouched heads bit for bit, v and k_rope untouched", B,
    MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/qk_clip.safetensors");
    const float tau = ref.f32("tau")[0];
    nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
    std::vector<std::vector<float>> before_q, before_kv, before_kva;
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        auto& a = model.layers[l].self_attn;
        before_q.push_back(to_host(a.q_b_proj.weight.value));
        before_kv.push_back(to_host(a.kv_b_proj.weight.value));
        before_kva.push_back(to_host(a.kv_a_proj_with_mqa.weight.value));
        a.max_logit_per_head =
            to_device<B>(ref.f32("max_logit." + std::to_string(l)));  // PyTorch's maxima decide, as in the oracle
    }
    QKClipConfig clip = QKClip<1.0>::value;
    clip.tau = tau;
    const optim::ClipReport report = optim::apply_qk_clip(model, clip);
    index_t expected_total = 0;
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        CAPTURE(l);
        const std::string L = std::to_string(l), prefix = "model.layers." + L + ".self_attn.";
        const auto clipped = ref.i64("clipped." + L);
        for (index_t c : clipped) expected_total += c;
        CHECK(report.heads_clipped[l] == std::accumulate(clipped.begin(), clipped.end(), index_t{0}));
        auto& a = model.layers[l].self_attn;
        const std::vector<float> q_after = to_host(a.q_b_proj.weight.value),
                                 kv_after = to_host(a.kv_b_proj.weight.value);
        const float* q = q_after.data();
        const float* kv = kv_after.data();
        CHECK(scaled_error(q, ref.f32(prefix + "q_b_proj.weight")) < 1e-7);  // one f32 rounding of w * factor
        CHECK(scaled_error(kv, ref.f32(prefix + "kv_b_proj.weight")) < 1e-7);
        const nn::MLAHeadLayout hl = a.head_layout();
        const index_t qc = a.q_b_proj.in_features(), kc = a.kv_b_proj.in_features();
        for (index_t h = 0; h < hl.heads; ++h) {
            CHECK(std::memcmp(kv + hl.v_row(h) * kc, before_kv[l].data() + hl.v_row(h) * kc,
                              sizeof(float) * kc * hl.v) == 0);
            if (clipped[h]) continue;
            CHECK(std::memcmp(q + hl.q_row(h) * qc, before_q[l].data() + hl.q_row(h) * qc,
                              sizeof(float) * qc * (hl.nope + hl.rope)) == 0);
            CHECK(std::memcmp(kv + hl.k_nope_row(h) * kc, before_kv[l].data() + hl.k_nope_row(h) * kc,
                              sizeof(float) * kc * hl.nope) == 0);
        }
        CHECK(to_host(a.kv_a_proj_with_mqa.weight.value) == before_kva[l]);
        CHECK(std::isinf(element_to_host(a.max_logit_per_head.view(), 0)));  // reset for the next step
    }
    CHECK(report.total() == expected_total);
    CHECK(expected_total > 0);
    // the forward after clipping every layer at once gives PyTorch's maxima (later layers see changed inputs, so
    // only their isolated clip is bounded by tau: next test)
    const Reference hf(data_dir("tiny_k2") + "/reference.safetensors");
    const std::vector<index_t> ids = hf.i64("input_ids");
    typename nn::Transformer<B>::Cache cache;
    model.forward(ids.data(), nn::TokenLayout::sequences(2, 10), cache, nn::Pass::measurement);
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        const std::vector<float> after = ref.f32("max_logit_after." + std::to_string(l));
        const std::vector<float> ours = to_host(model.layers[l].self_attn.max_logit_per_head);
        for (std::size_t h = 0; h < after.size(); ++h) CHECK(ours[h] == doctest::Approx(after[h]).epsilon(1e-5));
    }
}

TEST_CASE_TEMPLATE("after QK-Clip of one layer, re-running the forward gives S <= tau for every clipped head", B,
                   MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/qk_clip.safetensors");
    const Reference hf(data_dir("tiny_k2") + "/reference.safetensors");
    const std::vector<index_t> ids = hf.i64("input_ids");
    const auto layout = nn::TokenLayout::sequences(2, 10);
    QKClipConfig clip = QKClip<1.0>::value;
    clip.tau = ref.f32("tau")[0];
    for (std::size_t l = 0; l < 3; ++l) {
        CAPTURE(l);
        nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
        typename nn::Transformer<B>::Cache cache;
        model.forward(ids.data(), layout, cache, nn::Pass::measurement);  // our own maxima decide here
        auto& a = model.layers[l].self_attn;
        const std::vector<float> before = to_host(a.max_logit_per_head);
        const index_t n = optim::clip_mla_heads<B>(a.q_b_proj.weight.value.data(), a.q_b_proj.in_features(),
                                                   a.kv_b_proj.weight.value.data(), a.kv_b_proj.in_features(),
                                                   a.head_layout(), before, clip);
        for (auto& layer : model.layers) layer.self_attn.reset_max_logits();
        model.forward(ids.data(), layout, cache, nn::Pass::measurement);
        const std::vector<float> isolated = ref.f32("max_logit_after_isolated." + std::to_string(l));
        const std::vector<float> after = to_host(a.max_logit_per_head);
        index_t clipped = 0;
        for (std::size_t h = 0; h < before.size(); ++h) {
            if (before[h] > clip.tau) {
                ++clipped;
                CHECK(after[h] <= clip.tau * (1 + 1e-5));  // = tau when the arg-max pair is kept
                CHECK(after[h] == doctest::Approx(clip.tau).epsilon(1e-5));
            } else {
                CHECK(after[h] == before[h]);  // untouched heads see the same inputs: bitwise
            }
            CHECK(after[h] == doctest::Approx(isolated[h]).epsilon(1e-5));
        }
        CHECK(n == clipped);
    }
}

TEST_CASE_TEMPLATE("QK-Clip on MHA: q by gamma^alpha, k by gamma^(1-alpha), maxima at or below tau, or <= 0, untouched",
                   B, MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/qk_clip.safetensors");
    const std::vector<float> maxima = ref.f32("mha.max_logit");
    for (double alpha : {0.5, 0.25}) {
        CAPTURE(alpha);
        Tensor<float, 1, B> q_on = to_device<B>(ref.f32("mha.q_weight")), k_on = to_device<B>(ref.f32("mha.k_weight"));
        QKClipConfig c = QKClip<1.0>::value;
        c.tau = ref.f32("mha.tau")[0], c.alpha = alpha;
        const std::string a = alpha == 0.5 ? "mha.alpha0.5." : "mha.alpha0.25.";
        const index_t clipped =
            optim::clip_mha_heads<B>(q_on.data(), k_on.data(), 32, nn::MHAHeadLayout{4, 4, 8}, maxima, c);
        const std::vector<float> q = to_host(q_on), k = to_host(k_on);
        const std::vector<float> q_after = ref.f32(a + "q_after"), k_after = ref.f32(a + "k_after");
        const std::vector<float> q0 = ref.f32("mha.q_weight"), k0 = ref.f32("mha.k_weight");
        for (std::size_t i = 0; i < q.size(); ++i) {
            CHECK(q[i] == doctest::Approx(q_after[i]).epsilon(1e-6));
            CHECK(k[i] == doctest::Approx(k_after[i]).epsilon(1e-6));
            CHECK(std::isfinite(q[i]));
            if (q_after[i] == q0[i]) CHECK(q[i] == q0[i]);  // untouched heads: bit for bit
            if (k_after[i] == k0[i]) CHECK(k[i] == k0[i]);
        }
        index_t expected = 0;
        for (index_t v : ref.i64("mha.clipped")) expected += v;
        CHECK(clipped == expected);
    }
}

TEST_CASE_TEMPLATE(
    "the composed optimizer: routing by kind, WSD schedule, frozen router bias, exact state save and load", B,
    MOONMOE_TEST_BACKENDS) {
    using Opt =
        moonmoe::Optimizer<Muon<>, QKClip<1e9>, WSD<Warmup<2>, Stable<3>, Decay<5>, FinalLR<0.1>>, BiasUpdateRate<0.0>>;
    nn::Transformer<B> model(TinyK2::config);
    randomize(model, 60);
    optim::Optimizer<Opt, B> opt(model);
    for (auto& s : opt.slots()) {
        CAPTURE(s.param.name);
        const bool is_matrix = s.param.kind == ParamKind::matrix || s.param.kind == ParamKind::expert_matrix;
        CHECK((s.route == optim::Route::muon) == is_matrix);
        CHECK((s.route == optim::Route::none) == (s.param.kind == ParamKind::router_bias));
    }
    const auto layout = nn::TokenLayout::sequences(2, 6);
    std::vector<index_t> ids(12);
    for (index_t i = 0; i < 12; ++i) ids[i] = (i * 29 + 3) % 256;
    const std::vector<float> bias = to_host(model.layers[1].moe.gate.bias.value);
    REQUIRE(bias.size() == 8);
    auto train = [&](optim::Optimizer<Opt, B>& o, int steps) {
        for (int s = 0; s < steps; ++s) {
            model.zero_grad();
            model.train_step(ids.data(), layout);
            o.step();
        }
    };
    CHECK(opt.learning_rates().first == doctest::Approx(2e-4 * 0.5));  // warm-up step 1 of 2
    train(opt, 3);
    CHECK(opt.steps() == 3);
    CHECK(to_host(model.layers[1].moe.gate.bias.value) == bias);
    const std::string dir = std::string(MOONMOE_TEST_BINARY_DIR) + "/" + B::name + "_";  // one file set per backend
    save_optimizer_state(dir + "opt_state.safetensors", opt);
    save_parameters(dir + "opt_weights.safetensors", model, Saved::values);
    // continue two steps, then reload weights and state and repeat: bitwise the same
    train(opt, 2);
    const std::vector<float> first = flat_values(model);
    {
        const Reference w(dir + "opt_weights.safetensors");
        model.visit_params([&](const ParamRef& p) {
            copy_to_device(std::span<const float>(w.f32(p.name)), View<float, 1, B>(p.value, {p.numel()}));
        });
    }
    optim::Optimizer<Opt, B> reloaded(model);
    load_optimizer_state(dir + "opt_state.safetensors", reloaded);
    CHECK(reloaded.steps() == 3);
    train(reloaded, 2);
    const std::vector<float> second = flat_values(model);
    CHECK(first.size() == second.size());
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
    // a state file for another model is refused, naming what is wrong
    nn::Transformer<B> other(TinyV3::config);
    optim::Optimizer<Opt, B> wrong(other);
    CHECK_THROWS_WITH_AS(load_optimizer_state(dir + "opt_state.safetensors", wrong),
                         doctest::Contains("opt_state.safetensors"), io_error);
}

TEST_CASE_TEMPLATE("QK-Clip per layer: every head by the layer's largest maximum, maxima at or below zero never clip",
                   B, MOONMOE_TEST_BACKENDS) {
    nn::MLA<B> attn(TinyK2::config);
    randomize(attn, 70);
    const nn::MLAHeadLayout L = attn.head_layout();
    const std::vector<float> q0 = to_host(attn.q_b_proj.weight.value), kv0 = to_host(attn.kv_b_proj.weight.value);
    // clips copies of the weights on the backend with these maxima, and brings the results back into q and kv
    std::vector<float> q, kv;
    auto clip = [&](const std::vector<float>& maxima, const QKClipConfig& c) {
        Tensor<float, 1, B> q_on = to_device<B>(q0), kv_on = to_device<B>(kv0);
        const index_t n = optim::clip_mla_heads<B>(q_on.data(), 32, kv_on.data(), 16, L, maxima, c);
        q = to_host(q_on), kv = to_host(kv_on);
        return n;
    };
    QKClipConfig c = QKClip<10.0, Scope<PerLayer>>::value;
    const std::vector<float> maxima = {-3.0f, 0.0f, 4.0f, 40.0f};  // layer maximum 40: gamma = 1/4 for every head
    CHECK(clip(maxima, c) == 4);
    for (index_t h = 0; h < 4; ++h) {
        CHECK(q[L.q_row(h) * 32] == doctest::Approx(q0[L.q_row(h) * 32] * 0.5f));             // nope: sqrt(1/4)
        CHECK(q[L.q_rope_row(h) * 32] == doctest::Approx(q0[L.q_rope_row(h) * 32] * 0.25f));  // rope: 1/4
        CHECK(kv[L.k_nope_row(h) * 16] == doctest::Approx(kv0[L.k_nope_row(h) * 16] * 0.5f));
        CHECK(kv[L.v_row(h) * 16] == kv0[L.v_row(h) * 16]);
    }
    // per head, the same maxima clip only head 3; the others, including the negative and zero ones, stay exact
    c.scope = ClipScope::per_head;
    CHECK(clip(maxima, c) == 1);
    for (std::size_t i = 0; i < std::size_t(L.q_row(3) * 32); ++i) CHECK(q[i] == q0[i]);
    for (float v : q) CHECK(std::isfinite(v));
    // all maxima <= 0 (and -inf: no forward since the last step): nothing happens
    CHECK(clip({-1.0f, 0.0f, -INFINITY, -5.0f}, c) == 0);
    CHECK(std::memcmp(q.data(), q0.data(), q.size() * 4) == 0);
    CHECK(std::memcmp(kv.data(), kv0.data(), kv.size() * 4) == 0);
}

}  // namespace unit_optim
