// DeepSeek-V2 checkpoints (DeepseekV2ForCausalLM) against transformers' own DeepseekV2 modeling (float32, eager):
// logits, loss, every parameter gradient, router choices and weights, per-head maximum logits. The references are
// committed outputs of tools/make_v2_reference.py: tiny_v2_lite (V2-Lite's shape: no query compression, greedy
// softmax routing, weights not normalised, YaRN mscale = mscale_all_dim = 0.707) and tiny_v2 (V2's: query
// compression, group_limited_greedy with a group scored by its largest expert, routed scale 3, cos/sin scaled by
// mscale(40, 1) / mscale(40, 0.707)). Tolerances are those of README's accuracy table (logits 1e-5, gradients
// 2e-5, loss 1e-6, router weights and max logits 1e-5), on every backend of the build.
#include "support/backends.hpp"
#include "support/reference.hpp"

#include <set>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_hf_reference_v2 {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

// The two tiny models declared as a user would declare DeepSeek-V2 and V2-Lite: Score<Softmax> brings V2's
// routing defaults (no correction bias, weights not normalised, groups scored by their largest expert).
using TinyV2Lite = Model<
    Dims<Hidden<64>, Layers<3>, DenseLayers<1>, Vocab<256>, DenseHidden<96>>,
    Attention<MLA<Heads<4>, QRank<NoQCompression>, KVRank<16>, NopeDim<8>, RopeDim<8>, VDim<8>>>,
    RoPE<Theta<10000>, MaxPositions<4096>,
         YaRN<Factor<40>, OriginalMaxPositions<256>, BetaFast<32>, BetaSlow<1>, MScale<0.707>, MScaleAllDim<0.707>>>,
    MoE<Experts<8>, TopK<3>, Shared<2>, ExpertHidden<16>, Score<Softmax>, RoutedScale<1.0>>, Parallel<1, 1, 1>>;
using TinyV2 = Model<
    Dims<Hidden<64>, Layers<4>, DenseLayers<1>, Vocab<256>, DenseHidden<96>>,
    Attention<MLA<Heads<4>, QRank<32>, KVRank<16>, NopeDim<8>, RopeDim<8>, VDim<8>>>,
    RoPE<Theta<10000>, MaxPositions<4096>,
         YaRN<Factor<40>, OriginalMaxPositions<256>, BetaFast<32>, BetaSlow<1>, MScale<1.0>, MScaleAllDim<0.707>>>,
    MoE<Experts<16>, TopK<4>, Shared<1>, ExpertHidden<16>, Groups<4>, TopGroups<2>, Score<Softmax>, RoutedScale<3.0>>,
    Parallel<1, 1, 1>>;

static_assert(!TinyV2Lite::config.moe.correction_bias && !TinyV2Lite::config.moe.norm_top_k);
static_assert(TinyV2::config.moe.group_score == GroupScoreFunc::max);
// The weights save_pretrained wrote (tools/make_v2_reference.py prints the same counts).
static_assert(TinyV2Lite::parameter_count() == 140'272);
static_assert(TinyV2::parameter_count() == 246'528);

template <class B>
void check_against_transformers(nn::Transformer<B>& model, const std::string& name) {
    CAPTURE(name);
    const std::string backend = B::name;
    CAPTURE(backend);
    const Reference ref(data_dir(name) + "/reference.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids"), shape = ref.shape("input_ids");
    const auto layout = nn::TokenLayout::sequences(shape[0], shape[1]);

    typename nn::Transformer<B>::Cache cache;
    Tensor<float, 2, B> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    const double logit_error = scaled_error(to_host(logits).data(), ref.f32("logits"));
    MESSAGE(name << " on " << backend << ": logits error " << logit_error);
    CHECK(logit_error < 1e-5);

    int moe_layers = 0;
    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        if (model.layers[l].dense) continue;
        ++moe_layers;
        const nn::Routing<B>& routing = cache.layers[l].moe.router.routing;
        const struct {
            index_t tokens, k;
            std::vector<index_t> idx;
            std::vector<float> weight;
        } r{routing.tokens, routing.k, to_host(routing.idx), to_host(routing.weight)};
        const std::vector<index_t> idx = ref.i64("topk_idx." + std::to_string(l));
        const std::vector<float> w = ref.f32("topk_weight." + std::to_string(l));
        for (index_t t = 0; t < r.tokens; ++t) {
            std::set<index_t> ours, theirs;  // as sets: HF's top-k is unsorted
            for (index_t j = 0; j < r.k; ++j) ours.insert(r.idx[t * r.k + j]), theirs.insert(idx[t * r.k + j]);
            CHECK(ours == theirs);
            for (index_t j = 0; j < r.k; ++j)
                for (index_t i = 0; i < r.k; ++i)
                    if (idx[t * r.k + i] == r.idx[t * r.k + j])
                        CHECK(r.weight[t * r.k + j] == doctest::Approx(w[t * r.k + i]).epsilon(1e-5));
        }
    }
    CHECK(moe_layers == model.config.dims.layers - model.config.dims.dense_layers);
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
        CAPTURE(p.name);
        REQUIRE(p.grad);  // no correction bias: every V2 parameter has a gradient
        const double e = scaled_error(floats_to_host<B>(p.grad, p.numel()).data(), ref.f32("grad." + p.name));
        ++compared;
        if (e > worst) worst = e, worst_name = p.name;
        CHECK(e < 2e-5);
    });
    CHECK(compared == int(ref.file.size()) - 3 - moe_layers * 2 - int(model.layers.size()));
    MESSAGE(name << " on " << backend << ": " << compared << " gradients, worst error " << worst << " (" << worst_name
                 << ")");
}

}  // namespace

TEST_CASE_TEMPLATE("tiny DeepSeek-V2-Lite (greedy softmax routing, no q compression) matches transformers' DeepseekV2",
                   B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> any = load_transformer<AnyDeepSeekV3, B>(data_dir("tiny_v2_lite"));
    CHECK(any.config.moe.score == ScoreFunc::softmax);
    CHECK(!any.config.moe.correction_bias);
    check_against_transformers(any, "tiny_v2_lite");
    nn::Transformer<B> typed = load_transformer<TinyV2Lite, B>(data_dir("tiny_v2_lite"));
    check_against_transformers(typed, "tiny_v2_lite");
}

TEST_CASE_TEMPLATE(
    "tiny DeepSeek-V2 (group_limited_greedy, q compression, cos/sin mscale) matches transformers' DeepseekV2", B,
    MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> any = load_transformer<AnyDeepSeekV3, B>(data_dir("tiny_v2"));
    CHECK(any.config.moe.group_score == GroupScoreFunc::max);
    check_against_transformers(any, "tiny_v2");
    nn::Transformer<B> typed = load_transformer<TinyV2, B>(data_dir("tiny_v2"));
    check_against_transformers(typed, "tiny_v2");
}

TEST_CASE("a V3-style group rule does not load a DeepSeek-V2 checkpoint: the mismatch names topk_method") {
    using V3Rule = TinyV2::with<TinyV2::moe::with<GroupScore<TopTwoSum>>>;
    CHECK_THROWS_WITH_AS(load_transformer<V3Rule>(data_dir("tiny_v2")),
                         doctest::Contains("topk_method is 'group_limited_greedy' (groups scored by their largest "
                                           "score, DeepseekV2ForCausalLM) but the model type fixes "
                                           "GroupScore<TopTwoSum>"),
                         io_error);
}

}  // namespace unit_hf_reference_v2
