// The optimizer layer against external references: Newton-Schulz against SVD-built inputs (U p(S) V^T, the exact
// composed polynomial in f64), Muon against torch.optim.Muon and an f64 rendering of its algorithm, AdamW against
// torch.optim.AdamW, QK-Clip against a PyTorch rendering of Algorithm 1 (tools/make_optimizer_reference.py).
#include "support/nn_testing.hpp"
#include "support/reference.hpp"

#include <cmath>
#include <cstring>
#include <numeric>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/io/optimizer_state.hpp>
#include <moonmoe/optim.hpp>

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

std::vector<double> f64(const Reference& r, const std::string& name) {
    const TensorRecord& rec = r.file.at(name);
    std::vector<double> out(std::size_t(rec.numel()));
    std::memcpy(out.data(), rec.bytes.data(), out.size() * sizeof(double));
    return out;
}

template <class Coeffs, class T>
std::vector<T> run_ns(const std::vector<double>& g, index_t rows, index_t cols, optim::Products p) {
    std::vector<T> in(g.begin(), g.end()), out(g.size());
    optim::NSWorkspace<T> ws;
    optim::newton_schulz<Coeffs, T>(View<const T, 2>(in.data(), {rows, cols}), View<T, 2>(out.data(), {rows, cols}), 5,
                                    ws, p);
    return out;
}

double max_abs_diff(const auto& a, const auto& b) {
    double d = 0.0;
    for (std::size_t i = 0; i < b.size(); ++i) d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    return d;
}

}  // namespace

TEST_CASE("Newton-Schulz equals U p(S) V^T for SVD-built inputs (Keller and Polar Express, f64 and f32)") {
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
                const auto got64 = keller ? run_ns<KellerQuintic, double>(g, rows, cols, p)
                                          : run_ns<PolarExpress, double>(g, rows, cols, p);
                CHECK(max_abs_diff(got64, expected) < 1e-10);  // f64 rounding through 5 iterations
                const auto got32 = keller ? run_ns<KellerQuintic, float>(g, rows, cols, p)
                                          : run_ns<PolarExpress, float>(g, rows, cols, p);
                CHECK(max_abs_diff(got32, expected) < 2e-5);   // f32: ~1e-7 per product, amplified by p' <= 8.2
            }
        }
    }
}

TEST_CASE("Newton-Schulz invariances: scale, transpose (bitwise), zero, orthogonal fixed point") {
    const index_t n = 24, m = 40;
    Mat g = random_matrix(n, m, 50);
    std::vector<double> gd(g.data(), g.data() + g.numel()), g3(gd), gt(std::size_t(n * m));
    for (auto& v : g3) v *= 3.0;
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) gt[j * n + i] = gd[i * m + j];
    const auto a = run_ns<KellerQuintic, float>(gd, n, m, optim::Products::symmetric);
    const auto b = run_ns<KellerQuintic, float>(g3, n, m, optim::Products::symmetric);
    const auto t = run_ns<KellerQuintic, float>(gt, m, n, optim::Products::symmetric);
    CHECK(max_abs_diff(a, b) < 1e-5);
    bool transposed = true;
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < m; ++j) transposed = transposed && t[j * n + i] == a[i * m + j];
    CHECK(transposed);
    const auto z = run_ns<KellerQuintic, float>(std::vector<double>(std::size_t(n * m), 0.0), n, m, optim::Products::symmetric);
    CHECK(max_abs_diff(z, std::vector<float>(z.size(), 0.0f)) == 0.0);
    // an orthogonal input (all singular values 1 after normalisation by sqrt(n)) maps to p^5(1/sqrt(n)) * Q
    std::vector<double> q(std::size_t(n * n), 0.0);
    for (index_t i = 0; i < n; ++i) q[i * n + (i * 7) % n] = 1.0;  // a permutation matrix
    const auto o = run_ns<PolarExpress, double>(q, n, n, optim::Products::symmetric);
    double x = 1.0 / (std::sqrt(double(n)) * 1.02 + 1e-6);
    for (const auto& k : PolarExpress::table) x = k.a * x + k.b * x * x * x + k.c * x * x * x * x * x;
    for (index_t i = 0; i < n; ++i) CHECK(o[i * n + (i * 7) % n] == doctest::Approx(x).epsilon(1e-12));
    CHECK(x == doctest::Approx(1.0).epsilon(0.15));  // near the fixed point
}

TEST_CASE("Muon matches torch.optim.Muon: tall, wide, square and per-expert matrices, Nesterov on and off") {
    const Reference ref(data_dir("optim") + "/muon_torch.safetensors");
    struct Case { const char* name; bool nesterov; UpdateScaleKind scale; };
    const Case cases[] = {{"match_nesterov", true, UpdateScaleKind::match_adamw_rms},
                          {"match_no_nesterov", false, UpdateScaleKind::match_adamw_rms},
                          {"original_nesterov", true, UpdateScaleKind::shape}};
    const std::pair<const char*, Shape<2>> params[] = {{"wide", {48, 96}}, {"tall", {96, 40}}, {"square", {64, 64}},
                                                       {"expert0", {32, 80}}, {"expert1", {32, 80}}, {"expert2", {32, 80}}};
    double worst64 = 0.0, worst_torch = 0.0;
    for (const Case& c : cases) {
        MuonConfig cfg = Muon<>::value;
        cfg.nesterov = c.nesterov, cfg.scale = c.scale, cfg.scale_factor = c.scale == UpdateScaleKind::shape ? 1.0 : 0.2;
        cfg.momentum = 0.95, cfg.weight_decay = 0.1, cfg.ns_steps = 5;
        for (const auto& [param, shape] : params) {
            CAPTURE(c.name);
            CAPTURE(param);
            std::vector<float> w = ref.f32(std::string(param) + ".init"), momentum(w.size(), 0.0f);
            optim::NSWorkspace<float> ws;
            Mat u, o;
            for (int t = 1; t <= 3; ++t) {
                const std::string s = std::to_string(t);
                const std::vector<float> before = w, grad = ref.f32(std::string(param) + ".grad." + s);
                optim::muon_step<KellerQuintic>(cfg, 0.02, View<float, 2>(w.data(), shape),
                                                View<const float, 2>(grad.data(), shape), View<float, 2>(momentum.data(), shape),
                                                ws, u, o);
                const std::vector<float> f64_result = ref.f32(std::string(c.name) + "." + param + ".after64." + s);
                const std::vector<float> torch_result = ref.f32(std::string(c.name) + "." + param + ".after." + s);
                double update = 0.0;
                for (std::size_t i = 0; i < w.size(); ++i) update = std::max(update, std::abs(double(f64_result[i]) - before[i]));
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

TEST_CASE("AdamW matches torch.optim.AdamW") {
    const Reference ref(data_dir("optim") + "/adamw_torch.safetensors");
    AdamWConfig cfg{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .learning_rate = 2e-3};
    for (const char* param : {"vector", "embedding"}) {
        std::vector<float> w = ref.f32(std::string(param) + ".init"), m(w.size(), 0.0f), v(w.size(), 0.0f);
        for (int t = 1; t <= 3; ++t) {
            const std::string s = std::to_string(t);
            const std::vector<float> g = ref.f32(std::string(param) + ".grad." + s);
            optim::adamw_step(cfg, 2e-3, t, w.data(), g.data(), m.data(), v.data(), index_t(w.size()));
            // f32 on both sides, other operation order: a few ulps (torch is 5e-7 from an f64 rendering)
            CHECK(scaled_error(w.data(), ref.f32(std::string(param) + ".after." + s)) < 1e-6);
            CHECK(scaled_error(m.data(), ref.f32(std::string(param) + ".exp_avg." + s)) < 1e-6);
            CHECK(scaled_error(v.data(), ref.f32(std::string(param) + ".exp_avg_sq." + s)) < 1e-6);
        }
    }
}

TEST_CASE("QK-Clip on MLA matches Algorithm 1: clipped weights, untouched heads bit for bit, v and k_rope untouched") {
    const Reference ref(data_dir("optim") + "/qk_clip.safetensors");
    const float tau = ref.f32("tau")[0];
    nn::Transformer<> model = load_transformer<TinyK2>(data_dir("tiny_k2"));
    std::vector<std::vector<float>> before_q, before_kv, before_kva;
    auto copy_of = [](const Tensor<float, 2>& t) { return std::vector<float>(t.data(), t.data() + t.numel()); };
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        auto& a = model.layers[l].self_attn;
        before_q.push_back(copy_of(a.q_b_proj.weight.value));
        before_kv.push_back(copy_of(a.kv_b_proj.weight.value));
        before_kva.push_back(copy_of(a.kv_a_proj_with_mqa.weight.value));
        a.max_logit_per_head = to_device<cpu>(ref.f32("max_logit." + std::to_string(l)));  // PyTorch's maxima decide, as in the oracle
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
        const float* q = a.q_b_proj.weight.value.data();
        const float* kv = a.kv_b_proj.weight.value.data();
        CHECK(scaled_error(q, ref.f32(prefix + "q_b_proj.weight")) < 1e-7);  // one f32 rounding of w * factor
        CHECK(scaled_error(kv, ref.f32(prefix + "kv_b_proj.weight")) < 1e-7);
        const nn::MLAHeadLayout hl = a.head_layout();
        const index_t qc = a.q_b_proj.in_features(), kc = a.kv_b_proj.in_features();
        for (index_t h = 0; h < hl.heads; ++h) {
            CHECK(std::memcmp(kv + hl.v_row(h) * kc, before_kv[l].data() + hl.v_row(h) * kc, sizeof(float) * kc * hl.v) == 0);
            if (clipped[h]) continue;
            CHECK(std::memcmp(q + hl.q_row(h) * qc, before_q[l].data() + hl.q_row(h) * qc,
                              sizeof(float) * qc * (hl.nope + hl.rope)) == 0);
            CHECK(std::memcmp(kv + hl.k_nope_row(h) * kc, before_kv[l].data() + hl.k_nope_row(h) * kc,
                              sizeof(float) * kc * hl.nope) == 0);
        }
        CHECK(std::memcmp(a.kv_a_proj_with_mqa.weight.value.data(), before_kva[l].data(), before_kva[l].size() * 4) == 0);
        CHECK(std::isinf(a.max_logit_per_head(0)));  // reset for the next step
    }
    CHECK(report.total() == expected_total);
    CHECK(expected_total > 0);
    // the forward after clipping every layer at once gives PyTorch's maxima (later layers see changed inputs, so
    // only their isolated clip is bounded by tau: next test)
    const Reference hf(data_dir("tiny_k2") + "/reference.safetensors");
    const std::vector<index_t> ids = hf.i64("input_ids");
    nn::Transformer<>::Cache cache;
    model.forward(ids.data(), nn::TokenLayout::sequences(2, 10), cache);
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        const std::vector<float> after = ref.f32("max_logit_after." + std::to_string(l));
        for (std::size_t h = 0; h < after.size(); ++h)
            CHECK(model.layers[l].self_attn.max_logit_per_head(h) == doctest::Approx(after[h]).epsilon(1e-5));
    }
}

TEST_CASE("after QK-Clip of one layer, re-running the forward gives S <= tau for every clipped head") {
    const Reference ref(data_dir("optim") + "/qk_clip.safetensors");
    const Reference hf(data_dir("tiny_k2") + "/reference.safetensors");
    const std::vector<index_t> ids = hf.i64("input_ids");
    const auto layout = nn::TokenLayout::sequences(2, 10);
    QKClipConfig clip = QKClip<1.0>::value;
    clip.tau = ref.f32("tau")[0];
    for (std::size_t l = 0; l < 3; ++l) {
        CAPTURE(l);
        nn::Transformer<> model = load_transformer<TinyK2>(data_dir("tiny_k2"));
        nn::Transformer<>::Cache cache;
        model.forward(ids.data(), layout, cache);  // our own maxima decide here
        auto& a = model.layers[l].self_attn;
        const std::vector<float> before = to_host(a.max_logit_per_head);
        const index_t n = optim::clip_mla_heads(a.q_b_proj.weight.value.data(), a.q_b_proj.in_features(),
                                                a.kv_b_proj.weight.value.data(), a.kv_b_proj.in_features(),
                                                a.head_layout(), before, clip);
        for (auto& layer : model.layers) layer.self_attn.reset_max_logits();
        model.forward(ids.data(), layout, cache);
        const std::vector<float> isolated = ref.f32("max_logit_after_isolated." + std::to_string(l));
        index_t clipped = 0;
        for (std::size_t h = 0; h < before.size(); ++h) {
            if (before[h] > clip.tau) {
                ++clipped;
                CHECK(a.max_logit_per_head(h) <= clip.tau * (1 + 1e-5));  // = tau when the arg-max pair is kept
                CHECK(a.max_logit_per_head(h) == doctest::Approx(clip.tau).epsilon(1e-5));
            } else {
                CHECK(a.max_logit_per_head(h) == before[h]);  // untouched heads see the same inputs: bitwise
            }
            CHECK(a.max_logit_per_head(h) == doctest::Approx(isolated[h]).epsilon(1e-5));
        }
        CHECK(n == clipped);
    }
}

TEST_CASE("QK-Clip on MHA: q by gamma^alpha, k by gamma^(1-alpha); maxima at or below tau, or <= 0, untouched") {
    const Reference ref(data_dir("optim") + "/qk_clip.safetensors");
    const std::vector<float> maxima = ref.f32("mha.max_logit");
    for (double alpha : {0.5, 0.25}) {
        CAPTURE(alpha);
        std::vector<float> q = ref.f32("mha.q_weight"), k = ref.f32("mha.k_weight");
        QKClipConfig c = QKClip<1.0>::value;
        c.tau = ref.f32("mha.tau")[0], c.alpha = alpha;
        const std::string a = alpha == 0.5 ? "mha.alpha0.5." : "mha.alpha0.25.";
        const index_t clipped = optim::clip_mha_heads(q.data(), k.data(), 32, nn::MHAHeadLayout{4, 4, 8}, maxima, c);
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

TEST_CASE("the composed optimizer: routing by kind, WSD schedule, frozen router bias, exact state save and load") {
    using Opt = moonmoe::Optimizer<Muon<>, QKClip<1e9>, WSD<Warmup<2>, Stable<3>, Decay<5>, FinalLR<0.1>>,
                                   BiasUpdateRate<0.0>>;
    nn::Transformer<> model(TinyK2::config);
    randomize(model, 60);
    optim::Optimizer<Opt> opt(model);
    for (auto& s : opt.slots()) {
        CAPTURE(s.param.name);
        const bool is_matrix = s.param.kind == ParamKind::matrix || s.param.kind == ParamKind::expert_matrix;
        CHECK((s.route == optim::Route::muon) == is_matrix);
        CHECK((s.route == optim::Route::none) == (s.param.kind == ParamKind::router_bias));
    }
    const auto layout = nn::TokenLayout::sequences(2, 6);
    std::vector<index_t> ids(12);
    for (index_t i = 0; i < 12; ++i) ids[i] = (i * 29 + 3) % 256;
    const std::vector<float> bias(model.layers[1].moe.gate.bias.value.data(), model.layers[1].moe.gate.bias.value.data() + 8);
    auto train = [&](optim::Optimizer<Opt>& o, int steps) {
        for (int s = 0; s < steps; ++s) {
            model.zero_grad();
            model.train_step(ids.data(), layout);
            o.step();
        }
    };
    CHECK(opt.learning_rates().first == doctest::Approx(2e-4 * 0.5));  // warm-up step 1 of 2
    train(opt, 3);
    CHECK(opt.steps() == 3);
    CHECK(std::memcmp(bias.data(), model.layers[1].moe.gate.bias.value.data(), 8 * sizeof(float)) == 0);
    save_optimizer_state(std::string(MOONMOE_TEST_BINARY_DIR) + "/opt_state.safetensors", opt);
    save_parameters(std::string(MOONMOE_TEST_BINARY_DIR) + "/opt_weights.safetensors", model, Saved::values);
    // continue two steps, then reload weights and state and repeat: bitwise the same
    train(opt, 2);
    std::vector<float> first;
    model.visit_params([&](const ParamRef& p) { first.insert(first.end(), p.value, p.value + p.numel()); });
    {
        const Reference w(std::string(MOONMOE_TEST_BINARY_DIR) + "/opt_weights.safetensors");
        model.visit_params([&](const ParamRef& p) {
            const std::vector<float> v = w.f32(p.name);
            std::copy(v.begin(), v.end(), p.value);
        });
    }
    optim::Optimizer<Opt> reloaded(model);
    load_optimizer_state(std::string(MOONMOE_TEST_BINARY_DIR) + "/opt_state.safetensors", reloaded);
    CHECK(reloaded.steps() == 3);
    train(reloaded, 2);
    std::vector<float> second;
    model.visit_params([&](const ParamRef& p) { second.insert(second.end(), p.value, p.value + p.numel()); });
    CHECK(first.size() == second.size());
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)) == 0);
    // a state file for another model is refused, naming what is wrong
    nn::Transformer<> other(TinyV3::config);
    optim::Optimizer<Opt> wrong(other);
    CHECK_THROWS_WITH_AS(load_optimizer_state(std::string(MOONMOE_TEST_BINARY_DIR) + "/opt_state.safetensors", wrong),
                         doctest::Contains("opt_state.safetensors"), io_error);
}

TEST_CASE("QK-Clip per layer: every head by the layer's largest maximum; maxima at or below zero never clip") {
    nn::MLA<> attn(TinyK2::config);
    randomize(attn, 70);
    const nn::MLAHeadLayout L = attn.head_layout();
    const std::vector<float> q0(attn.q_b_proj.weight.value.data(), attn.q_b_proj.weight.value.data() + attn.q_b_proj.weight.value.numel());
    const std::vector<float> kv0(attn.kv_b_proj.weight.value.data(), attn.kv_b_proj.weight.value.data() + attn.kv_b_proj.weight.value.numel());
    QKClipConfig c = QKClip<10.0, Scope<PerLayer>>::value;
    const std::vector<float> maxima = {-3.0f, 0.0f, 4.0f, 40.0f};  // layer maximum 40: gamma = 1/4 for every head
    std::vector<float> q = q0, kv = kv0;
    CHECK(optim::clip_mla_heads(q.data(), 32, kv.data(), 16, L, maxima, c) == 4);
    for (index_t h = 0; h < 4; ++h) {
        CHECK(q[L.q_row(h) * 32] == doctest::Approx(q0[L.q_row(h) * 32] * 0.5f));       // nope: sqrt(1/4)
        CHECK(q[L.q_rope_row(h) * 32] == doctest::Approx(q0[L.q_rope_row(h) * 32] * 0.25f));  // rope: 1/4
        CHECK(kv[L.k_nope_row(h) * 16] == doctest::Approx(kv0[L.k_nope_row(h) * 16] * 0.5f));
        CHECK(kv[L.v_row(h) * 16] == kv0[L.v_row(h) * 16]);
    }
    // per head, the same maxima clip only head 3; the others, including the negative and zero ones, stay exact
    q = q0, kv = kv0;
    c.scope = ClipScope::per_head;
    CHECK(optim::clip_mla_heads(q.data(), 32, kv.data(), 16, L, maxima, c) == 1);
    for (std::size_t i = 0; i < std::size_t(L.q_row(3) * 32); ++i) CHECK(q[i] == q0[i]);
    for (float v : q) CHECK(std::isfinite(v));
    // all maxima <= 0 (and -inf: no forward since the last step): nothing happens
    q = q0, kv = kv0;
    CHECK(optim::clip_mla_heads(q.data(), 32, kv.data(), 16, L, {-1.0f, 0.0f, -INFINITY, -5.0f}, c) == 0);
    CHECK(std::memcmp(q.data(), q0.data(), q.size() * 4) == 0);
}
