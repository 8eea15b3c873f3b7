// The bf16 compute policy (Precision<BF16>) against transformers run in bfloat16: the tiny Kimi K2 model with bf16
// weights (test/data/tiny_k2_bf16/), its logits, loss and every gradient, on every backend of the build. The
// reference is tools/make_bf16_model_reference.py's (test/data/bf16/model_tiny_k2.safetensors): transformers'
// DeepseekV3ForCausalLM loaded with dtype=bfloat16 and sdpa attention. Decoding with the latent cache is held to the
// same bounds.
//
// bf16 computations round differently in detail (transformers' RMSNorm rounds twice where moonmoe's rounds once,
// its combine of the experts rounds after each expert, an f32 sum in another order lands on the other side of a
// rounding boundary), and each rounding difference grows through the layers, so two bf16 runs are about as far
// from each other as each is from f32. The yardstick is therefore transformers' own distance between its f32 and
// its bf16 runs (distance.* in the reference, per tensor), with relative Frobenius distances ||a - b|| / ||b||:
//   accuracy  ours (bf16) vs f32 <= 1.5 x the yardstick for the logits, 2 x for each gradient: moonmoe's bf16 is
//             about as accurate as transformers' (measured on the CPU: logits 0.84 x, gradients 0.58-1.58 x).
//             f32 is moonmoe's own f32 run, which matches transformers' f32 to 1e-5 (hf_reference.cpp).
//   bf16      ours vs f32 >= 0.3 x for the logits: the computation does round (an f32 one would be at 0)
//   agreement ours vs transformers' bf16 <= 2 x for the logits, 2.5 x per gradient (measured 1.31 x, at most 1.85 x:
//             about sqrt(2), two independent roundings); the loss within 3 x |f32 - bf16|.
// A stale or wrongly rounded weight, a product left in f32 or an activation rounded twice as coarsely would all
// move these by far more than the margins.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/optim.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_hf_reference_bf16 {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

using TinyK2BF16 = TinyK2::with<Precision<BF16>>;

struct Run {
    std::vector<float> logits;
    float loss = 0;
    std::map<std::string, std::vector<float>> grads;
};

template <class Model, class B>
Run run(const std::vector<index_t>& ids) {
    nn::Transformer<B> model = load_transformer<Model, B>(data_dir("tiny_k2_bf16"));
    const auto layout = nn::TokenLayout::sequences(2, index_t(ids.size()) / 2);
    typename nn::Transformer<B>::Cache cache;
    Tensor<float, 2, B> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
    Tensor<float, 2, B> dlogits(logits.shape());
    Run r;
    r.loss = nn::cross_entropy<B>(logits.view(), targets.data(), dlogits.view());
    r.logits = to_host(logits);
    model.backward(dlogits.view(), cache);
    model.visit_params([&](const ParamRef& p) {
        if (p.grad) r.grads[p.name] = floats_to_host<B>(p.grad, p.numel());
    });
    return r;
}

}  // namespace

TEST_CASE_TEMPLATE("Precision<BF16>: tiny Kimi K2 matches transformers in bfloat16, logits, loss and every gradient", B,
                   MOONMOE_TEST_BACKENDS) {
    const std::string backend = B::name;
    CAPTURE(backend);
    static_assert(TinyK2BF16::config.precision.compute == NumberFormat::bf16);
    const Reference ref(data_dir("bf16") + "/model_tiny_k2.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids");
    const Run ours = run<TinyK2BF16, B>(ids), f32 = run<TinyK2, B>(ids);

    // logits: transformers' bf16 run, and the f32 truth (ours, which matches transformers' f32 to 1e-5)
    const std::vector<float> logits = ref.f32("bf16.logits");
    const double yard = ref.f32("distance.logits")[0];
    const double agree = relative_distance(ours.logits, logits), error = relative_distance(ours.logits, f32.logits);
    MESSAGE(backend << ": logits, relative to transformers' own f32-vs-bf16 distance " << yard << ": ours vs theirs "
                    << agree / yard << ", ours vs f32 " << error / yard);
    CHECK(agree <= 2.0 * yard);
    CHECK(error <= 1.5 * yard);
    CHECK(error >= 0.3 * yard);

    const double loss_yard = ref.f32("distance.loss")[0], loss = ref.f32("bf16.loss")[0];
    MESSAGE(backend << ": loss ours bf16 " << ours.loss << ", f32 " << f32.loss << ", transformers' bf16 " << loss
                    << " (their f32 - bf16 distance " << loss_yard << ")");
    CHECK(std::abs(ours.loss - loss) <= 3.0 * loss_yard);

    double worst_agree = 0.0, worst_error = 0.0, least_error = 1e9;
    for (const auto& [name, g] : ours.grads) {
        CAPTURE(name);
        const double y = ref.f32("distance.grad." + name)[0];
        const double a = relative_distance(g, ref.f32("bf16.grad." + name)) / y,
                     e = relative_distance(g, f32.grads.at(name)) / y;
        worst_agree = std::max(worst_agree, a), worst_error = std::max(worst_error, e),
        least_error = std::min(least_error, e);
        CHECK(a <= 2.5);
        CHECK(e <= 2.0);
    }
    MESSAGE(
        backend << ": " << ours.grads.size() << " gradients, relative to transformers' f32-vs-bf16 distance: ours vs "
                << "theirs at most " << worst_agree << ", ours vs f32 from " << least_error << " to " << worst_error);

    // decoding with the latent cache (absorbed MLA, its per-head products in bf16 too), token by token: the same
    // logits within the same yardstick
    nn::Transformer<B> model = load_transformer<TinyK2BF16, B>(data_dir("tiny_k2_bf16"));
    std::vector<float> decoded;
    for (index_t s = 0; s < 2; ++s) {
        auto state = model.start_decoding(10);
        for (index_t t = 0; t < 10; ++t) {
            const std::vector<float> step = to_host(model.decode(&ids[std::size_t(s * 10 + t)], 1, state));
            decoded.insert(decoded.end(), step.begin(), step.end());
        }
    }
    const double decode_agree = relative_distance(decoded, logits),
                 decode_error = relative_distance(decoded, f32.logits);
    MESSAGE(backend << ": decoding one token at a time: vs theirs " << decode_agree / yard << ", vs f32 "
                    << decode_error / yard);
    CHECK(decode_agree <= 2.0 * yard);
    CHECK(decode_error <= 1.5 * yard);
    CHECK(decode_error >= 0.3 * yard);
}

TEST_CASE_TEMPLATE(
    "Precision<BF16>: the products read bf16 working copies, refreshed by the optimizer step and by "
    "QK-Clip",
    B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = load_transformer<TinyK2BF16, B>(data_dir("tiny_k2_bf16"));
    const Reference ref(data_dir("bf16") + "/model_tiny_k2.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids");
    const auto layout = nn::TokenLayout::sequences(2, 10);
    const auto logits_of = [&] {
        typename nn::Transformer<B>::Cache cache;
        return to_host(model.forward(ids.data(), layout, cache));
    };
    // every working copy is the master rounded to nearest even
    const auto check_copies = [&] {
        int copies = 0;
        const auto same = [&](const auto& master, const auto& copy) {
            const std::vector<float> m = to_host(master);
            const std::vector<bf16> c = to_host(copy);
            REQUIRE(m.size() == c.size());
            std::size_t bad = 0;
            for (std::size_t i = 0; i < m.size(); ++i) bad += c[i].bits != bf16::from_float(m[i]).bits;
            CHECK(bad == 0);
            ++copies;
        };
        for (auto& layer : model.layers) {
            for (nn::Linear<B>* l : layer.self_attn.linears()) same(l->weight.value, l->weight.value16);
            if (layer.dense) {
                for (nn::Linear<B>* l : {&layer.mlp.gate_proj, &layer.mlp.up_proj, &layer.mlp.down_proj})
                    same(l->weight.value, l->weight.value16);
            } else {
                const auto& e = layer.moe.experts;
                same(e.gate_proj.value, e.gate_proj.value16);
                same(e.up_proj.value, e.up_proj.value16);
                same(e.down_proj.value, e.down_proj.value16);
                const auto& s = layer.moe.shared_experts;
                for (const nn::Linear<B>* l : {&s.gate_proj, &s.up_proj, &s.down_proj})
                    same(l->weight.value, l->weight.value16);
            }
        }
        same(model.lm_head.weight.value, model.lm_head.weight.value16);
        return copies;
    };
    CHECK(check_copies() == 3 * 5 + 3 + 2 * 6 + 1);

    // a master changed behind the model's back is not seen until refresh_working_weights()
    const std::vector<float> before = logits_of();
    backend::Ops<B>::fill(model.layers[0].self_attn.o_proj.weight.value.view(), 0.0f);
    CHECK(logits_of() == before);
    model.refresh_working_weights();
    CHECK(logits_of() != before);

    // an optimizer step (Muon with QK-Clip at a tau that clips) leaves every copy equal to its updated master
    nn::Transformer<B> trained = load_transformer<TinyK2BF16, B>(data_dir("tiny_k2_bf16"));
    optim::Optimizer<moonmoe::Optimizer<Muon<>, QKClip<1.0>>, B> opt{trained};
    trained.train_step(ids.data(), layout);
    const optim::StepReport r = opt.step();
    CHECK(r.clip.total() > 0);
    std::swap(model, trained);
    CHECK(check_copies() == 3 * 5 + 3 + 2 * 6 + 1);
}

}  // namespace unit_hf_reference_bf16
