// The whole model against Hugging Face transformers (DeepseekV3ForCausalLM, float32, eager attention): logits,
// loss, every parameter gradient, router choices, per-head maximum logits, and greedy decoding with the latent
// KV cache. The references are committed outputs of tools/make_reference.py (versions in versions.json).
//
// Tolerances, as errors relative to each reference tensor's largest magnitude (measured: logits 9.3e-7 / 1.3e-6,
// worst gradient 2.4e-6 / 4.8e-6 for tiny_k2 / tiny_v3): logits 1e-5, the goal (both sides compute in
// f32 but sum in other orders, so they agree to a few ulps of the largest logit, compounded over the layers);
// the loss 1e-6; gradients 2e-5 (backward compounds rounding through every layer in both directions, and sums
// over tokens and experts in other orders: 4x the worst measured).
//
// Every model runs on every backend of the build (the model loaded straight into the backend's memory, results
// brought back with to_host), with the same tolerances: transformers is the reference on each.
#include "support/backends.hpp"
#include "support/reference.hpp"

#include <set>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_hf_reference {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

template <class Model, class B>
void check_against_transformers(const std::string& name) {
    CAPTURE(name);
    const std::string backend = B::name;
    CAPTURE(backend);
    nn::Transformer<B> model = load_transformer<Model, B>(data_dir(name));
    const Reference ref(data_dir(name) + "/reference.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids"), shape = ref.shape("input_ids");
    const auto layout = nn::TokenLayout::sequences(shape[0], shape[1]);

    typename nn::Transformer<B>::Cache cache;
    Tensor<float, 2, B> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    const double logit_error = scaled_error(to_host(logits).data(), ref.f32("logits"));
    MESSAGE(name << " on " << backend << ": logits error " << logit_error);
    CHECK(logit_error < 1e-5);

    // router choices (as sets: HF's top-k is unsorted) and weights, per MoE layer
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        if (model.layers[l].dense) continue;
        const nn::Routing<B>& routing = cache.layers[l].moe.router.routing;
        const struct {
            index_t tokens, k;
            std::vector<index_t> idx;
            std::vector<float> weight;
        } r{routing.tokens, routing.k, to_host(routing.idx), to_host(routing.weight)};
        const std::vector<index_t> idx = ref.i64("topk_idx." + std::to_string(l));
        const std::vector<float> w = ref.f32("topk_weight." + std::to_string(l));
        for (index_t t = 0; t < r.tokens; ++t) {
            std::set<std::pair<index_t, float>> ours, theirs;
            for (index_t j = 0; j < r.k; ++j) {
                ours.insert({r.idx[t * r.k + j], 0.0f});
                theirs.insert({idx[t * r.k + j], 0.0f});
            }
            CHECK(ours == theirs);
            for (index_t j = 0; j < r.k; ++j)
                for (index_t i = 0; i < r.k; ++i)
                    if (idx[t * r.k + i] == r.idx[t * r.k + j])
                        CHECK(r.weight[t * r.k + j] == doctest::Approx(w[t * r.k + i]).epsilon(1e-5));
        }
    }
    // QK-Clip's statistic: the per-head maximum scaled logit
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        const std::vector<float> expected = ref.f32("max_logit." + std::to_string(l));
        const std::vector<float> ours = to_host(model.layers[l].self_attn.max_logit_per_head);
        for (std::size_t h = 0; h < expected.size(); ++h) CHECK(ours[h] == doctest::Approx(expected[h]).epsilon(1e-5));
    }

    const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
    Tensor<float, 2, B> dlogits(logits.shape());
    const float loss = nn::cross_entropy<B>(logits.view(), targets.data(), dlogits.view());
    CHECK(loss == doctest::Approx(ref.f32("loss")[0]).epsilon(1e-6));
    model.backward(dlogits.view(), cache);

    double worst = 0.0;
    std::string worst_name;
    int compared = 0;
    model.visit_params([&](const ParamRef& p) {
        if (!p.grad) {
            CHECK(!ref.file.contains("grad." + p.name));  // the router bias has no gradient in HF either
            return;
        }
        const double e = scaled_error(floats_to_host<B>(p.grad, p.numel()).data(), ref.f32("grad." + p.name));
        ++compared;
        if (e > worst) worst = e, worst_name = p.name;
        CAPTURE(p.name);
        CHECK(e < 2e-5);
    });
    MESSAGE(name << " on " << backend << ": " << compared << " gradients, worst error " << worst << " (" << worst_name
                 << ")");
}

}  // namespace

TEST_CASE_TEMPLATE("tiny Kimi K2 matches transformers: logits, loss, gradients, routing, max logits", B,
                   MOONMOE_TEST_BACKENDS) {
    check_against_transformers<TinyK2, B>("tiny_k2");
}

TEST_CASE_TEMPLATE("tiny DeepSeek-V3 matches transformers (expert groups, several dense layers, blended YaRN)", B,
                   MOONMOE_TEST_BACKENDS) {
    check_against_transformers<TinyV3, B>("tiny_v3");
}

TEST_CASE_TEMPLATE("a Dynamic model type reads its sizes from config.json", B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = load_transformer<AnyDeepSeekV3, B>(data_dir("tiny_v3_sharded"));
    CHECK(model.config.dims.layers == 4);
    CHECK(model.config.moe.groups == 4);
    const Reference ref(data_dir("tiny_v3") + "/reference.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids");
    typename nn::Transformer<B>::Cache cache;
    const Tensor<float, 2, B> logits = model.forward(ids.data(), nn::TokenLayout::sequences(2, 10), cache);
    CHECK(scaled_error(to_host(logits).data(), ref.f32("logits")) < 1e-5);
}

TEST_CASE("a static size that disagrees with config.json is an error naming the field") {
    CHECK_THROWS_WITH_AS(load_transformer<TinyV3>(data_dir("tiny_k2")), doctest::Contains("num_hidden_layers"),
                         std::exception);
}

TEST_CASE_TEMPLATE("absorbed MLA with the latent cache equals the naive form, and greedy decoding matches transformers",
                   B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
    const Reference gen(data_dir("tiny_k2") + "/generate.safetensors");
    const std::vector<index_t> prompt = gen.i64("prompt_ids"), expected = gen.i64("generated_ids");
    const std::vector<float> step_logits = gen.f32("step_logits");
    const index_t V = model.config.dims.vocab, steps = index_t(expected.size() - prompt.size());

    // naive full forward over the whole generated sequence, for comparison
    typename nn::Transformer<B>::Cache cache;
    const std::vector<float> full =
        to_host(model.forward(expected.data(), nn::TokenLayout::sequences(1, index_t(expected.size())), cache));

    auto state = model.start_decoding(64);
    // prefill through the absorbed form
    std::vector<float> logits = to_host(model.decode(prompt.data(), index_t(prompt.size()), state));
    std::vector<index_t> seq = prompt;
    for (index_t s = 0; s < steps; ++s) {
        const float* last = logits.data() + logits.size() - std::size_t(V);
        const index_t pos = index_t(seq.size()) - 1;
        // decode == naive forward at the same position, and == transformers' logits of this step
        CHECK(scaled_error(last, std::vector<float>(full.data() + pos * V, full.data() + (pos + 1) * V)) < 1e-5);
        CHECK(scaled_error(last, std::vector<float>(step_logits.begin() + s * V, step_logits.begin() + (s + 1) * V)) <
              1e-5);
        const index_t next = index_t(std::max_element(last, last + V) - last);
        seq.push_back(next);
        logits = to_host(model.decode(&next, 1, state));
    }
    CHECK(seq == expected);
    CHECK(state.length() == index_t(expected.size()));
}

}  // namespace unit_hf_reference
