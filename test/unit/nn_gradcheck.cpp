// Every module's backward against central finite differences (nn/gradcheck.hpp), in f32 with eps = 1e-2 along
// random directions: a relative error under 1e-2 separates a right gradient (errors ~1e-4..1e-3 from f32
// rounding and O(eps^2) truncation) from a wrong one (errors of order 1). Every case runs on every backend of the
// build, the module's parameters and inputs in that backend's memory (the same random values on each).
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <cstring>

#include <moonmoe/config.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_nn_gradcheck {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {
template <class B, class Module, class Forward, class Backward>
void check(Module& m, Tensor<float, 2, B>& x, index_t out_cols, Forward forward, Backward backward, double tol = 1e-2) {
    using M = Tensor<float, 2, B>;
    const M r = random_matrix<B>(x.size(0), out_cols, 7);
    M y({x.size(0), out_cols});
    forward(x, y);
    M dx(x.shape());
    backward(r, dx);
    check_module_gradients(
        m, x.data(), dx.data(), x.numel(),
        [&] {
            M y2({x.size(0), out_cols});
            forward(x, y2);
            return dot(y2, r);
        },
        tol);
}
}  // namespace

TEST_CASE_TEMPLATE("RMSNorm backward", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    nn::RMSNorm<B> norm(24, 1e-6);
    randomize(norm, 3);
    M x = random_matrix<B>(5, 24, 4);
    Tensor<float, 1, B> rstd({5});
    check(
        norm, x, 24, [&](M& in, M& out) { norm.forward(in.view(), out.view(), rstd.view()); },
        [&](const M& dy, M& dx) { norm.backward(x.view(), rstd.view(), dy.view(), dx.view()); });
}

TEST_CASE_TEMPLATE("Linear backward", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    nn::Linear<B> lin(12, 7);
    randomize(lin, 5);
    M x = random_matrix<B>(6, 12, 6);
    check(
        lin, x, 7, [&](M& in, M& out) { lin.forward(in.view(), out.view()); },
        [&](const M& dy, M& dx) { lin.backward(x.view(), dy.view(), dx.view()); });
}

TEST_CASE_TEMPLATE("SwiGLU backward", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    nn::SwiGLU<B> mlp(16, 24);
    randomize(mlp, 8);
    M x = random_matrix<B>(5, 16, 9);
    typename nn::SwiGLU<B>::Cache cache;
    check(
        mlp, x, 16, [&](M& in, M& out) { mlp.forward(in.view(), out.view(), cache); },
        [&](const M& dy, M& dx) { mlp.backward(dy.view(), cache, dx.view()); });
}

TEST_CASE_TEMPLATE("RoPE backward is the transpose of forward", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    const nn::RotaryEmbedding<B> rope(TinyV3::config.rope, 8);
    M a = random_matrix<B>(6, 3 * 8, 10), b = random_matrix<B>(6, 3 * 8, 11);
    const auto pos = to_device<B>(std::vector<index_t>{0, 1, 2, 7, 100, 3000});
    const double before = dot(a, b);
    M ra = a.clone(), rb = b.clone();
    rope.apply(ra.view().template reshape<3>({6, 3, 8}), pos.view());
    rope.apply(rb.view().template reshape<3>({6, 3, 8}), pos.view(), nn::Rotation::transposed);
    CHECK(dot(ra, b) == doctest::Approx(dot(a, rb)).epsilon(1e-6));  // <R a, b> = <a, R^T b>
    // R^T R = 1 (attention_factor 1)
    rope.apply(ra.view().template reshape<3>({6, 3, 8}), pos.view(), nn::Rotation::transposed);
    CHECK(dot(ra, b) == doctest::Approx(before).epsilon(1e-5));
}

TEST_CASE_TEMPLATE("MLA backward (naive form), with and without query compression", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    for (index_t q_rank : {index_t{32}, index_t{0}}) {
        CAPTURE(q_rank);
        ModelConfig cfg = TinyK2::config;
        cfg.attention.q_rank = q_rank;
        nn::MLA<B> attn(cfg);
        randomize(attn, 12);
        const auto layout = nn::TokenLayout::sequences(2, 5);
        M x = random_matrix<B>(10, cfg.dims.hidden, 13);
        typename nn::MLA<B>::Cache cache;
        check(
            attn, x, cfg.dims.hidden, [&](M& in, M& out) { attn.forward(in.view(), layout, out.view(), cache); },
            [&](const M& dy, M& dx) { attn.backward(dy.view(), cache, dx.view()); });
    }
}

using TinyMHA = TinyK2::with<Attention<MHA<Heads<4>, KVHeads<2>, HeadDim<8>, RopeDim<4>>>>;

TEST_CASE_TEMPLATE("MHA backward, grouped-query (4 query heads, 2 key/value heads)", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    nn::MHA<B> attn(TinyMHA::config);
    randomize(attn, 22);
    const auto layout = nn::TokenLayout::sequences(2, 5);
    M x = random_matrix<B>(10, 64, 23);
    typename nn::MHA<B>::Cache cache;
    check(
        attn, x, 64, [&](M& in, M& out) { attn.forward(in.view(), layout, out.view(), cache); },
        [&](const M& dy, M& dx) { attn.backward(dy.view(), cache, dx.view()); });
}

TEST_CASE_TEMPLATE("an MHA model decodes with its K/V cache exactly as its full forward", B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model(TinyMHA::config);
    randomize(model, 24);
    const std::vector<index_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
    typename nn::Transformer<B>::Cache cache;
    const Mat full = host(model.forward(ids.data(), nn::TokenLayout::sequences(1, 8), cache));
    auto state = model.start_decoding(8);
    const Mat first = host(model.decode(ids.data(), 5, state));
    std::vector<Mat> steps;
    for (index_t t = 5; t < 8; ++t) steps.push_back(host(model.decode(&ids[std::size_t(t)], 1, state)));
    const index_t V = 256;
    for (index_t t = 0; t < 8; ++t) {
        const float* got = t < 5 ? first.data() + t * V : steps[std::size_t(t - 5)].data();
        for (index_t v = 0; v < V; ++v) CHECK(got[v] == doctest::Approx(full(t, v)).epsilon(1e-5));
    }
}

TEST_CASE_TEMPLATE("Router backward, with the sequence-wise balance loss", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    for (const ModelConfig& cfg : {TinyK2::config, TinyV3::config}) {
        nn::Router<B> router(cfg.moe, cfg.dims.hidden);
        randomize(router, 14, 0.05f);
        const auto layout = nn::TokenLayout::sequences(2, 4);
        M u = random_matrix<B>(8, cfg.dims.hidden, 15);
        const M r = random_matrix<B>(8, cfg.moe.top_k, 16);
        auto loss = [&](typename nn::Router<B>::Cache& c) {  // <weights, r> + balance loss
            router.forward(u.view(), c);
            double l = router.balance_loss(c, layout, 0.3);
            l += dot(c.routing.weight, r);
            return l;
        };
        typename nn::Router<B>::Cache cache;
        loss(cache);
        const std::vector<index_t> chosen = to_host(cache.routing.idx);
        M du(u.shape());
        router.backward(r.view(), cache, du.view());
        check_module_gradients(
            router, u.data(), du.data(), u.numel(),
            [&] {
                typename nn::Router<B>::Cache c;
                const double l = loss(c);
                REQUIRE(to_host(c.routing.idx) ==
                        chosen);  // a step too large to keep the same experts would void the check
                return l;
            },
            1e-2, 1e-3);
    }
}

// Expert selection is discrete: a finite-difference step that changes it measures a jump, not a derivative. The
// checks below hold the selection of the analytic pass fixed (Router::fixed_selection), as the gradient assumes.
TEST_CASE_TEMPLATE("MoE backward: routed experts grouped by expert, shared expert, router", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    for (const ModelConfig& cfg : {TinyK2::config, TinyV3::config}) {
        nn::MoE<B> moe(cfg.moe, cfg.dims.hidden);
        randomize(moe, 17);
        M x = random_matrix<B>(12, cfg.dims.hidden, 18);
        typename nn::MoE<B>::Cache cache;
        M y({12, cfg.dims.hidden}), dx(x.shape());
        const M r = random_matrix<B>(12, cfg.dims.hidden, 7);
        moe.forward(x.view(), y.view(), cache);
        const std::vector<index_t> chosen = to_host(cache.router.routing.idx);
        moe.backward(r.view(), cache, dx.view());
        moe.gate.fixed_selection = &chosen;
        check_module_gradients(moe, x.data(), dx.data(), x.numel(), [&] {
            typename nn::MoE<B>::Cache c;
            M y2({12, cfg.dims.hidden});
            moe.forward(x.view(), y2.view(), c);
            return dot(y2, r);
        });
    }
}

TEST_CASE_TEMPLATE("decoder layers (dense and MoE) backward", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    const auto layout = nn::TokenLayout::sequences(2, 4);
    for (index_t index : {index_t{0}, index_t{2}}) {
        CAPTURE(index);
        nn::DecoderLayer<B> layer(TinyV3::config, index);
        randomize(layer, 19);
        M x = random_matrix<B>(8, 64, 20);
        typename nn::DecoderLayer<B>::Cache cache;
        std::vector<index_t> chosen;
        check(
            layer, x, 64, [&](M& in, M& out) { layer.forward(in.view(), layout, out.view(), cache); },
            [&](const M& dy, M& dx) {
                if (!layer.dense)
                    chosen = to_host(cache.moe.router.routing.idx), layer.moe.gate.fixed_selection = &chosen;
                layer.backward(dy.view(), cache, dx.view());
            });
    }
}

TEST_CASE_TEMPLATE("whole model with cross-entropy backward", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    nn::Transformer<B> model(TinyK2::config);
    randomize(model, 21);
    const auto layout = nn::TokenLayout::sequences(2, 5);
    std::vector<index_t> ids = {1, 5, 9, 200, 3, 7, 7, 30, 255, 0};
    const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
    typename nn::Transformer<B>::Cache cache;
    M logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    std::vector<std::vector<index_t>> chosen(model.layers.size());
    for (std::size_t l = 0; l < model.layers.size(); ++l)
        if (!model.layers[l].dense)
            chosen[l] = to_host(cache.layers[l].moe.router.routing.idx),
            model.layers[l].moe.gate.fixed_selection = &chosen[l];
    M dlogits(logits.shape());
    nn::cross_entropy<B>(logits.view(), targets.data(), dlogits.view());
    model.backward(dlogits.view(), cache);
    check_module_gradients(
        model, nullptr, nullptr, 0,
        [&] {
            typename nn::Transformer<B>::Cache c;
            M logits = model.forward(ids.data(), layout, c);
            return double(nn::cross_entropy<B>(logits.view(), targets.data()));
        },
        1e-2, 1e-3);
}

// Run to run on the same backend; on the CPU for a fixed thread count of its pool (one thread and all of them),
// since the GEMM panels and row loops split by thread count.
TEST_CASE_TEMPLATE("a training step is bitwise repeatable (CPU: for a fixed thread count)", B, MOONMOE_TEST_BACKENDS) {
    auto run = [](int threads) {
        set_threads(threads);
        nn::Transformer<B> model(TinyV3::config);
        randomize(model, 31);
        const auto layout = nn::TokenLayout::sequences(3, 7);
        std::vector<index_t> ids(21);
        for (index_t i = 0; i < 21; ++i) ids[i] = (i * 53 + 11) % 256;
        const float loss = model.train_step(ids.data(), layout);
        std::vector<float> grads;
        model.visit_params([&](const ParamRef& p) {
            if (!p.grad) return;
            const std::vector<float> g = to_host(View<const float, 1, B>(p.grad, {p.numel()}));
            grads.insert(grads.end(), g.begin(), g.end());
        });
        grads.push_back(loss);
        return grads;
    };
    const int n = threads();
    for (int t : {1, n}) {
        CAPTURE(t);
        const std::vector<float> a = run(t), b = run(t);
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
    set_threads(n);
}

TEST_CASE_TEMPLATE("auxiliary-loss-free balancing: bias += gamma * sign(mean load - load), then the counts restart", B,
                   MOONMOE_TEST_BACKENDS) {
    nn::Router<B> router(TinyK2::config.moe, 64);
    router.load = to_device<B>(std::vector<index_t>{10, 2, 4, 4, 0, 8, 3, 1});  // 32 assignments over 8 experts: mean 4
    router.update_bias(0.001f);
    std::vector<float> b = to_host(router.bias.value);
    const float expected[] = {-0.001f, 0.001f, 0.0f, 0.0f, 0.001f, -0.001f, 0.001f, 0.001f};
    for (int e = 0; e < 8; ++e) CHECK(b[std::size_t(e)] == expected[e]);
    for (index_t l : to_host(router.load)) CHECK(l == 0);
    // the bias only selects: it never reaches the routing weights
    const Tensor<float, 2, B> u = random_matrix<B>(6, 64, 40);
    typename nn::Router<B>::Cache c1, c2;
    router.forward(u.view(), c1);
    for (float& x : b) x += 10.0f;  // a uniform shift changes no choice
    copy_to_device(std::span<const float>(b), router.bias.value.view());
    router.forward(u.view(), c2);
    CHECK(to_host(c1.routing.idx) == to_host(c2.routing.idx));
    CHECK(to_host(c1.routing.weight) == to_host(c2.routing.weight));
}

}  // namespace unit_nn_gradcheck
