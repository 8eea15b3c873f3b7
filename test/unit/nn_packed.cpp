// Packed batches (sequences of different lengths in one batch, nn::TokenLayout::packed) and batched decoding
// (several sequences, each with its own latent or K/V cache of its own length), on every backend of the build
// (TokenLayout and the causal targets are host code, tested once).
//
// Oracles: test/data/packed/, written by tools/make_packed_reference.py, which runs each sequence alone through
// transformers' DeepseekV3ForCausalLM (float32, eager) and greedy-decodes each prompt alone with generate().
// Tolerances are README's accuracy table's: logits 1e-5, loss 1e-6, gradients 2e-5 (errors relative to each
// reference tensor's largest magnitude).
//
// Batched decoding against decoding each sequence alone with the same code: only the row counts of the GEMMs
// differ between the two. The CPU backend's few-rows kernel (backend/cpu/gemm_small.hpp: k >= 256, n >= 64, at most
// 64 rows, on AVX-512) computes each row in an order that does not depend on the other rows, so at such widths the
// two are bitwise equal; at the tiny models' widths (k = 16..96) Eigen's GEMM runs, whose kernels for the remainder
// rows of a panel sum in another order, and the two differ by a few f32 roundings per layer (measured 0.8e-6 to
// 1.6e-6 of the largest logit; held to 4e-6).
#include "support/backends.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"

#include <set>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_nn_packed {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

using TinyMHA = TinyK2::with<Attention<MHA<Heads<4>, KVHeads<2>, HeadDim<8>, RopeDim<4>>>>;

/// A parameter's gradient, on the host.
template <class B>
std::vector<float> grad_to_host(const ParamRef& p) {
    return to_host(View<const float, 1, B>(p.grad, {p.numel()}));
}

/// Rows [t0, t0 + n) of a [tokens, V] backend matrix.
template <class T, class B>
View<T, 2, B> rows_of(T* data, index_t t0, index_t n, index_t V) {
    return View<T, 2, B>(data + t0 * V, {n, V});
}

template <class Model, class B>
void check_packed_against_transformers(const std::string& name) {
    CAPTURE(name);
    const std::string backend = B::name;
    CAPTURE(backend);
    nn::Transformer<B> model = load_transformer<Model, B>(data_dir(name));
    const Reference ref(data_dir("packed") + "/" + name + ".safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids"), lengths = ref.i64("lengths");
    const auto layout = nn::TokenLayout::packed(lengths);
    REQUIRE(layout.tokens() == index_t(ids.size()));
    REQUIRE(!layout.uniform());

    typename nn::Transformer<B>::Cache cache;
    Tensor<float, 2, B> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    const double logit_error = scaled_error(to_host(logits).data(), ref.f32("logits"));
    MESSAGE(name << " on " << backend << " packed " << layout.sequences() << " sequences: logits error "
                 << logit_error);
    CHECK(logit_error < 1e-5);

    for (std::size_t l = 0; l < model.layers.size(); ++l) {  // QK-Clip's statistic: the max over every sequence
        const std::vector<float> expected = ref.f32("max_logit." + std::to_string(l));
        const std::vector<float> ours = to_host(model.layers[l].self_attn.max_logit_per_head);
        for (std::size_t h = 0; h < expected.size(); ++h) CHECK(ours[h] == doctest::Approx(expected[h]).epsilon(1e-5));
    }
    for (std::size_t l = 0; l < model.layers.size(); ++l) {  // router choices, as sets
        if (model.layers[l].dense) continue;
        const nn::Routing<B>& routing = cache.layers[l].moe.router.routing;
        const struct {
            index_t tokens, k;
            std::vector<index_t> idx;
        } r{routing.tokens, routing.k, to_host(routing.idx)};
        const std::vector<index_t> idx = ref.i64("topk_idx." + std::to_string(l));
        REQUIRE(r.tokens == layout.tokens());
        for (index_t t = 0; t < r.tokens; ++t)
            CHECK(std::set<index_t>(r.idx.begin() + t * r.k, r.idx.begin() + (t + 1) * r.k) ==
                  std::set<index_t>(idx.begin() + t * r.k, idx.begin() + (t + 1) * r.k));
    }

    // transformers' loss of each sequence alone is cross_entropy over that sequence's rows; their sum's gradient
    // with respect to the logits is each sequence's own gradient in its rows
    const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
    const std::vector<float> expected_losses = ref.f32("loss.per_sequence");
    Tensor<float, 2, B> dlogits(logits.shape());
    double sum = 0.0;
    for (index_t s = 0; s < layout.sequences(); ++s) {
        CAPTURE(s);
        CHECK(targets[std::size_t(layout.end(s) - 1)] == nn::ignore_index);  // no target across the boundary
        const index_t t0 = layout.begin(s), n = layout.length(s), V = logits.size(1);
        const float loss = nn::cross_entropy<B>(rows_of<const float, B>(logits.data(), t0, n, V), targets.data() + t0,
                                                rows_of<float, B>(dlogits.data(), t0, n, V));
        CHECK(loss == doctest::Approx(expected_losses[std::size_t(s)]).epsilon(1e-6));
        sum += loss;
    }
    CHECK(sum == doctest::Approx(ref.f32("loss.sum")[0]).epsilon(1e-6));
    model.zero_grad();
    model.backward(dlogits.view(), cache);
    double worst = 0.0;
    int compared = 0;
    model.visit_params([&](const ParamRef& p) {
        if (!p.grad) return;
        const double e = scaled_error(grad_to_host<B>(p).data(), ref.f32("grad." + p.name));
        CAPTURE(p.name);
        CHECK(e < 2e-5);
        worst = std::max(worst, e), ++compared;
    });
    MESSAGE(name << " on " << backend << ": " << compared
                 << " gradients of the sum of per-sequence losses, worst error " << worst);

    // train_step on the packed batch: the mean over all its targets
    model.zero_grad();
    CHECK(model.train_step(ids.data(), layout) == doctest::Approx(ref.f32("loss.token_mean")[0]).epsilon(1e-6));
}

/// Greedy decoding of several prompts by a schedule: at each step, the listed sequences advance (a prompt's first
/// step prefills it). Records each sequence's last-row logits per step and its generated tokens.
struct Decoded {
    std::vector<std::vector<index_t>> tokens;
    std::vector<std::vector<std::vector<float>>> step_logits;
};

template <class B>
Decoded greedy(nn::Transformer<B>& model, const std::vector<std::vector<index_t>>& prompts, index_t new_tokens,
               const std::vector<std::vector<std::size_t>>& schedule) {
    const index_t V = model.config.dims.vocab;
    std::vector<typename nn::Transformer<B>::DecodeState> states;
    for (const auto& p : prompts) states.push_back(model.start_decoding(index_t(p.size()) + new_tokens));
    Decoded d{std::vector<std::vector<index_t>>(prompts.size()),
              std::vector<std::vector<std::vector<float>>>(prompts.size())};
    for (const auto& step : schedule) {
        std::vector<index_t> ids, counts;
        std::vector<typename nn::Transformer<B>::DecodeState*> active;
        for (std::size_t s : step) {
            const bool prefill = states[s].length() == 0;
            if (prefill) ids.insert(ids.end(), prompts[s].begin(), prompts[s].end());
            else
                ids.push_back(d.tokens[s].back());
            counts.push_back(prefill ? index_t(prompts[s].size()) : 1);
            active.push_back(&states[s]);
        }
        const Mat logits = host(model.decode(ids.data(), counts, active));
        index_t row = -1;
        for (std::size_t i = 0; i < step.size(); ++i) {
            row += counts[i];
            const float* last = logits.data() + row * V;
            d.step_logits[step[i]].emplace_back(last, last + V);
            d.tokens[step[i]].push_back(index_t(std::max_element(last, last + V) - last));
        }
    }
    return d;
}

/// Every sequence alone, one after another.
std::vector<std::vector<std::size_t>> one_at_a_time(std::size_t sequences, index_t new_tokens) {
    std::vector<std::vector<std::size_t>> schedule;
    for (std::size_t s = 0; s < sequences; ++s)
        for (index_t i = 0; i < new_tokens; ++i) schedule.push_back({s});
    return schedule;
}

/// Sequence 0 starts alone; the others join one step later each (a prefill beside one-token steps) and leave as
/// they finish: caches of different lengths in every step.
std::vector<std::vector<std::size_t>> staggered(std::size_t sequences, index_t new_tokens) {
    std::vector<std::vector<std::size_t>> schedule;
    for (index_t step = 0; step < new_tokens + index_t(sequences) - 1; ++step) {
        std::vector<std::size_t> active;
        for (std::size_t s = 0; s < sequences; ++s)
            if (step >= index_t(s) && step < index_t(s) + new_tokens) active.push_back(s);
        schedule.push_back(active);
    }
    return schedule;
}

/// max over sequences and steps of the error of `got` against `want`, relative to each step's largest logit.
double decode_error(const Decoded& got, const Decoded& want) {
    double worst = 0.0;
    for (std::size_t s = 0; s < want.step_logits.size(); ++s)
        for (std::size_t i = 0; i < want.step_logits[s].size(); ++i)
            worst = std::max(worst, scaled_error(got.step_logits[s][i].data(), want.step_logits[s][i]));
    return worst;
}

bool bitwise_equal(const Decoded& a, const Decoded& b) {
    return a.tokens == b.tokens && a.step_logits == b.step_logits;
}

}  // namespace

TEST_CASE("TokenLayout: packed sequences, offsets, positions restarting per sequence") {
    const auto l = nn::TokenLayout::packed({3, 1, 2});
    CHECK(l.sequences() == 3);
    CHECK(l.tokens() == 6);
    CHECK(l.offsets() == std::vector<index_t>{0, 3, 4, 6});
    CHECK(l.positions == std::vector<index_t>{0, 1, 2, 0, 0, 1});
    CHECK(l.begin(2) == 4);
    CHECK(l.length(0) == 3);
    CHECK(!l.uniform());
    const auto same = nn::TokenLayout::from_offsets({0, 3, 4, 6});
    CHECK(same.positions == l.positions);
    const auto u = nn::TokenLayout::sequences(2, 3, 5);
    CHECK(u.uniform());
    CHECK(u.offsets() == std::vector<index_t>{0, 3, 6});
    CHECK(u.positions == std::vector<index_t>{5, 6, 7, 5, 6, 7});

    CHECK_THROWS_WITH_AS(nn::TokenLayout::packed({3, 0, 2}), doctest::Contains("sequence 1 has length 0"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(nn::TokenLayout::from_offsets({0, 4, 4}), doctest::Contains("sequence 1 runs from 4 to 4"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(nn::TokenLayout::from_offsets({1, 4}), doctest::Contains("start at 0"), std::invalid_argument);
    CHECK_THROWS_AS(nn::TokenLayout::packed(std::vector<index_t>{}), std::invalid_argument);
}

TEST_CASE("start_decoding refuses a cache past the model's context (max_position_embeddings), with the numbers") {
    // issue 29: hf_generate decoded 4,200 tokens past a context of 4,096
    const nn::Transformer<cpu> model(TinyK2::config);  // MaxPositions<4096>
    CHECK(model.start_decoding(4096).caches.size() == 3);
    CHECK_THROWS_WITH_AS(model.start_decoding(4097),
                         doctest::Contains("a cache of 4097 tokens; the model's context is 4096 positions "
                                           "(max_position_embeddings)"),
                         std::invalid_argument);
    CHECK_THROWS_AS(model.start_decoding(0), std::invalid_argument);
}

TEST_CASE("causal targets never cross a sequence boundary of a packed batch") {
    const std::vector<index_t> ids = {10, 11, 12, 20, 30, 31};
    const auto targets = nn::causal_targets(ids.data(), nn::TokenLayout::packed({3, 1, 2}));
    CHECK(targets == std::vector<index_t>{11, 12, nn::ignore_index, nn::ignore_index, 31, nn::ignore_index});
}

TEST_CASE_TEMPLATE("a module refuses a token layout that does not cover its input", B, MOONMOE_TEST_BACKENDS) {
    nn::MLA<B> attn(TinyK2::config);
    Tensor<float, 2, B> x = random_matrix<B>(5, TinyK2::config.dims.hidden, 1), y(x.shape());
    typename nn::MLA<B>::Cache cache;
    CHECK_THROWS_WITH_AS(attn.forward(x.view(), nn::TokenLayout::packed({2, 2}), y.view(), cache),
                         doctest::Contains("MLA.forward: the token layout covers 4 rows"), std::invalid_argument);
}

TEST_CASE_TEMPLATE(
    "packed tiny Kimi K2 matches transformers run per sequence: logits, losses, gradients, max logits, routing", B,
    MOONMOE_TEST_BACKENDS) {
    check_packed_against_transformers<TinyK2, B>("tiny_k2");
}

TEST_CASE_TEMPLATE(
    "packed tiny DeepSeek-V3 matches transformers run per sequence (expert groups, several dense layers)", B,
    MOONMOE_TEST_BACKENDS) {
    check_packed_against_transformers<TinyV3, B>("tiny_v3");
}

TEST_CASE_TEMPLATE("MHA and MLA: a packed batch equals its sequences run one by one, forward and backward", B,
                   MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    const std::vector<index_t> lengths = {4, 1, 6};
    for (const ModelConfig& cfg : {TinyMHA::config, TinyK2::config}) {
        nn::Transformer<B> model(cfg);
        randomize(model, 31);
        std::vector<index_t> ids;
        for (index_t t = 0; t < 11; ++t) ids.push_back((t * 37 + 5) % cfg.dims.vocab);
        const auto layout = nn::TokenLayout::packed(lengths);

        // each sequence alone: its logits and the gradient of the sum of the per-sequence mean losses
        std::vector<float> alone_logits;
        model.zero_grad();
        for (index_t s = 0; s < layout.sequences(); ++s) {
            typename nn::Transformer<B>::Cache c;
            const auto one = nn::TokenLayout::sequences(1, layout.length(s));
            const M logits = model.forward(ids.data() + layout.begin(s), one, c, nn::Pass::training);
            const std::vector<float> h = to_host(logits);
            alone_logits.insert(alone_logits.end(), h.begin(), h.end());
            const auto targets = nn::causal_targets(ids.data() + layout.begin(s), one);
            M d(logits.shape());
            nn::cross_entropy<B>(logits.view(), targets.data(), d.view());
            model.backward(d.view(), c);
        }
        std::vector<std::vector<float>> alone_grads;
        model.visit_params([&](const ParamRef& p) {
            if (p.grad) alone_grads.push_back(grad_to_host<B>(p));
        });

        model.zero_grad();
        typename nn::Transformer<B>::Cache c;
        const M logits = model.forward(ids.data(), layout, c, nn::Pass::training);
        // a few f32 roundings: the single-token sequence's products against the batch's of 11 rows, on Eigen's GEMM
        // 5.2e-7 to 5.8e-7; where a CPU's measured rules send one row to oneDNN (AMD Zen 4, gemm_engine.hpp) 1.15e-6
        CHECK(scaled_error(to_host(logits).data(), alone_logits) < 2e-6);
        const auto targets = nn::causal_targets(ids.data(), layout);
        M d(logits.shape());
        for (index_t s = 0; s < layout.sequences(); ++s) {
            const index_t t0 = layout.begin(s), n = layout.length(s), V = logits.size(1);
            nn::cross_entropy<B>(rows_of<const float, B>(logits.data(), t0, n, V), targets.data() + t0,
                                 rows_of<float, B>(d.data(), t0, n, V));
        }
        model.backward(d.view(), c);
        std::size_t i = 0;
        model.visit_params([&](const ParamRef& p) {
            if (!p.grad) return;
            CAPTURE(p.name);
            CHECK(scaled_error(grad_to_host<B>(p).data(), alone_grads[i++]) < 1e-5);
        });
    }
}

TEST_CASE_TEMPLATE("MLA and MHA backward on a packed layout against finite differences", B, MOONMOE_TEST_BACKENDS) {
    using M = Tensor<float, 2, B>;
    const auto layout = nn::TokenLayout::packed({3, 1, 5});
    const index_t T = layout.tokens(), hidden = TinyK2::config.dims.hidden;
    auto check_attention = [&](auto& attn) {
        randomize(attn, 41, 0.1f);  // logits of a few units: central differences stay in their quadratic range
        M x = random_matrix<B>(T, hidden, 42);
        const M r = random_matrix<B>(T, hidden, 43);
        typename std::remove_reference_t<decltype(attn)>::Cache cache;
        M y({T, hidden}), dx(x.shape());
        attn.forward(x.view(), layout, y.view(), cache);
        attn.backward(r.view(), cache, dx.view());
        check_module_gradients(attn, x.data(), dx.data(), x.numel(), [&] {
            typename std::remove_reference_t<decltype(attn)>::Cache c;
            M y2({T, hidden});
            attn.forward(x.view(), layout, y2.view(), c);
            return dot(y2, r);
        });
    };
    nn::MLA<B> mla(TinyK2::config);
    check_attention(mla);
    nn::MHA<B> mha(TinyMHA::config);
    check_attention(mha);
}

TEST_CASE_TEMPLATE(
    "batched decoding with caches of different lengths equals decoding each alone, and transformers' generate", B,
    MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
    const Reference gen(data_dir("packed") + "/generate_tiny_k2.safetensors");
    const std::vector<index_t> prompt_ids = gen.i64("prompt_ids"), lengths = gen.i64("prompt_lengths");
    const std::vector<index_t> expected = gen.i64("generated_ids");
    const std::vector<float> hf_logits = gen.f32("step_logits");
    const index_t V = model.config.dims.vocab, new_tokens = gen.shape("generated_ids")[1];
    std::vector<std::vector<index_t>> prompts;
    for (std::size_t s = 0, at = 0; s < lengths.size(); at += std::size_t(lengths[s]), ++s)
        prompts.emplace_back(prompt_ids.begin() + at, prompt_ids.begin() + at + lengths[s]);

    const Decoded alone = greedy(model, prompts, new_tokens, one_at_a_time(prompts.size(), new_tokens));
    // all prompts prefilled in one batch, then every step together
    const Decoded together =
        greedy(model, prompts, new_tokens, std::vector<std::vector<std::size_t>>(std::size_t(new_tokens), {0, 1, 2}));
    const Decoded joined = greedy(model, prompts, new_tokens, staggered(prompts.size(), new_tokens));

    Decoded hf{std::vector<std::vector<index_t>>(prompts.size()),
               std::vector<std::vector<std::vector<float>>>(prompts.size())};
    for (std::size_t s = 0; s < prompts.size(); ++s) {
        hf.tokens[s].assign(expected.begin() + s * new_tokens, expected.begin() + (s + 1) * new_tokens);
        for (index_t i = 0; i < new_tokens; ++i) {
            const auto at = hf_logits.begin() + (index_t(s) * new_tokens + i) * V;
            hf.step_logits[s].emplace_back(at, at + V);
        }
    }
    for (const Decoded* d : {&alone, &together, &joined}) {
        CHECK(d->tokens == hf.tokens);
        CHECK(decode_error(*d, hf) < 1e-5);
    }
    const double e_together = decode_error(together, alone), e_joined = decode_error(joined, alone);
    MESSAGE(std::string(B::name) << ": batched decoding against one at a time: " << e_together << " (bitwise "
                                 << bitwise_equal(together, alone) << "), staggered " << e_joined << " (bitwise "
                                 << bitwise_equal(joined, alone) << ")");
    CHECK(e_together < 4e-6);
    CHECK(e_joined < 4e-6);
}

TEST_CASE_TEMPLATE("an MHA model decodes several sequences at once as it decodes each alone", B,
                   MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model(TinyMHA::config);
    randomize(model, 51);
    const std::vector<std::vector<index_t>> prompts = {{3, 1, 4, 1, 5}, {9}, {2, 6, 5, 3, 5, 8, 9}};
    const Decoded alone = greedy(model, prompts, 5, one_at_a_time(prompts.size(), 5));
    const Decoded joined = greedy(model, prompts, 5, staggered(prompts.size(), 5));
    CHECK(joined.tokens == alone.tokens);
    CHECK(decode_error(joined, alone) < 4e-6);
}

// Every GEMM whose row count differs between batched and one-at-a-time decoding has k >= 256 and n >= 64 here
// (hidden, latent ranks, o_proj's input, expert and dense hidden 256; 64 experts; the other widths >= 64).
using WideK2 = TinyK2::with<Dims<Hidden<256>, Layers<2>, DenseLayers<1>, Vocab<256>, DenseHidden<256>>,
                            Attention<MLA<Heads<4>, QRank<256>, KVRank<256>, NopeDim<64>, RopeDim<16>, VDim<64>>>,
                            MoE<Experts<64>, TopK<2>, Shared<1>, ExpertHidden<256>>>;

// Bitwise only where the CPU's row-independent kernel runs for every row count; cuBLAS promises no kernel choice
// independent of the row count, so elsewhere the two agree within the bound of the tests above. A CPU's measured
// rules may send one row of X W^T to another engine than two (AMD Zen 4: oneDNN for one row, gemm_engine.hpp), so
// on the CPU the bitwise check runs with the library's kernels chosen for every f32 product, and the automatic
// choice is held to the bound.
TEST_CASE_TEMPLATE(
    "batched decoding is bitwise equal to decoding each sequence alone where the row-independent GEMM runs", B,
    MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model(WideK2::config);
    randomize(model, 71, 0.05f);
    const std::vector<std::vector<index_t>> prompts = {{3, 1, 4, 1, 5}, {9}, {2, 6, 5, 3, 5, 8, 9}};
    const Decoded alone = greedy(model, prompts, 4, one_at_a_time(prompts.size(), 4));
    const Decoded joined = greedy(model, prompts, 4, staggered(prompts.size(), 4));
    CHECK(joined.tokens == alone.tokens);
    if (std::is_same_v<B, cpu> && backend::cpu_detail::small_gemm_available()) {
        CHECK(decode_error(joined, alone) < 4e-6);
        struct LibraryChosen {  // set_f32_gemm(library) while alive, the previous choice restored after
            backend::F32Gemm saved = backend::cpu_detail::f32_gemm_choice();
            LibraryChosen() { backend::set_f32_gemm(backend::F32Gemm::library); }
            ~LibraryChosen() { backend::cpu_detail::f32_gemm_choice() = saved; }
        } library;
        const Decoded alone_library = greedy(model, prompts, 4, one_at_a_time(prompts.size(), 4));
        const Decoded joined_library = greedy(model, prompts, 4, staggered(prompts.size(), 4));
        CHECK(bitwise_equal(joined_library, alone_library));
    } else {
        const std::string why = std::is_same_v<B, cpu>
                                    ? "cpu without AVX-512: Eigen's GEMM for every product"
                                    : std::string(B::name) + ": the backend's GEMM for every product";
        MESSAGE(why << ", compared within 4e-6 (bitwise " << bitwise_equal(joined, alone) << ")");
        CHECK(decode_error(joined, alone) < 4e-6);
    }
}

TEST_CASE_TEMPLATE("batched decoding refuses mismatched states, counts and positions", B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model(TinyK2::config);
    randomize(model, 61);
    auto a = model.start_decoding(4), b = model.start_decoding(4);
    std::vector<typename nn::Transformer<B>::DecodeState*> states = {&a, &b};
    const std::vector<index_t> ids = {1, 2, 3};
    const index_t one[1] = {3};
    CHECK_THROWS_WITH_AS(model.decode(ids.data(), one, states), doctest::Contains("1 token counts for 2 decode states"),
                         std::invalid_argument);
    const index_t too_many[2] = {3, 2};
    const std::vector<index_t> five = {1, 2, 3, 4, 5};
    model.decode(five.data(), too_many, states);
    const index_t more[2] = {1, 3};
    CHECK_THROWS_WITH_AS(model.decode(five.data(), more, states),
                         doctest::Contains("sequence 1: 5 tokens exceed its capacity of 4"), std::length_error);
    typename nn::Transformer<B>::DecodeState empty;
    CHECK_THROWS_WITH_AS(model.decode(ids.data(), 1, empty), doctest::Contains("make it with start_decoding"),
                         std::invalid_argument);

    // a layout whose positions do not continue the cache
    nn::MLA<B> attn(TinyK2::config);
    typename nn::MLA<B>::LatentCache cache(8, TinyK2::config.attention);
    cache.length = 2;
    Tensor<float, 2, B> x = random_matrix<B>(2, TinyK2::config.dims.hidden, 62), y(x.shape());
    typename nn::MLA<B>::LatentCache* caches[1] = {&cache};
    CHECK_THROWS_WITH_AS(attn.forward_absorbed(x.view(), nn::TokenLayout::packed({2}), caches, y.view()),
                         doctest::Contains("token 0 of sequence 0 is at position 0, but its cache holds 2 tokens"),
                         std::invalid_argument);
}

}  // namespace unit_nn_packed
