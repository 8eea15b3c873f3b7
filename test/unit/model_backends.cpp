// The whole model, written once and run on every backend of the build (Backend<cpu>; Backend<cuda> too in the
// emulated CUDA build and on a GPU): the transformers goldens of hf_reference.cpp (logits, loss, every gradient,
// per-head maximum logits) for a model loaded straight into the backend's memory, greedy decoding with the latent
// cache, and MuonClip training steps, which must equal the CPU's.
//
// Tolerances are hf_reference.cpp's (relative to each reference tensor's largest magnitude: logits 1e-5, loss
// 1e-6, gradients 2e-5); the other backends sum in other orders, which these bounds already allow for.
#include "support/backends.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/optim.hpp>

using namespace moonmoe::testing;
namespace mm = moonmoe;

namespace {

using mm::index_t;

template <class B>
std::vector<float> param_to_host(const float* p, index_t n) {
    std::vector<float> out(static_cast<std::size_t>(n));
    mm::backend::Memory<B>::to_host(out.data(), p, out.size() * sizeof(float));
    return out;
}

template <class Model, class B>
void check_goldens(const std::string& name) {
    CAPTURE(name);
    const std::string backend = B::name;
    CAPTURE(backend);
    mm::nn::Transformer<B> model = mm::load_transformer<Model, B>(data_dir(name));
    const Reference ref(data_dir(name) + "/reference.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids"), shape = ref.shape("input_ids");
    const auto layout = mm::nn::TokenLayout::sequences(shape[0], shape[1]);

    typename mm::nn::Transformer<B>::Cache cache;
    mm::Tensor<float, 2, B> logits = model.forward(ids.data(), layout, cache);
    const std::vector<float> host_logits = mm::to_host(logits);
    CHECK(scaled_error(host_logits.data(), ref.f32("logits")) < 1e-5);

    for (std::size_t l = 0; l < model.layers.size(); ++l) {
        const std::vector<float> expected = ref.f32("max_logit." + std::to_string(l));
        const std::vector<float> ours = mm::to_host(model.layers[l].self_attn.max_logit_per_head);
        for (std::size_t h = 0; h < expected.size(); ++h) CHECK(ours[h] == doctest::Approx(expected[h]).epsilon(1e-5));
    }

    const std::vector<index_t> targets = mm::nn::causal_targets(ids.data(), layout);
    mm::Tensor<float, 2, B> dlogits(logits.shape());
    const float loss = mm::nn::cross_entropy<B>(logits.view(), targets.data(), dlogits.view());
    CHECK(loss == doctest::Approx(ref.f32("loss")[0]).epsilon(1e-6));
    model.backward(dlogits.view(), cache);

    int compared = 0;
    double worst = 0.0;
    model.visit_params([&](const mm::ParamRef& p) {
        if (!p.grad) return;
        const std::vector<float> g = param_to_host<B>(p.grad, p.numel());
        worst = std::max(worst, scaled_error(g.data(), ref.f32("grad." + p.name)));
        ++compared;
    });
    MESSAGE(name << " on " << backend << ": " << compared << " gradients, worst error " << worst);
    CHECK(compared > 10);
    CHECK(worst < 2e-5);
}

/// Every parameter of a model, on the host, in visit order.
template <class B>
std::vector<std::vector<float>> all_values(mm::nn::Transformer<B>& model) {
    std::vector<std::vector<float>> out;
    model.visit_params([&](const mm::ParamRef& p) { out.push_back(param_to_host<B>(p.value, p.numel())); });
    return out;
}

}  // namespace

TEST_CASE_TEMPLATE("on every backend, tiny K2 and V3 loaded into the backend match transformers", B, MOONMOE_TEST_BACKENDS) {
    check_goldens<mm::TinyK2, B>("tiny_k2");
    check_goldens<mm::TinyV3, B>("tiny_v3");
}

TEST_CASE_TEMPLATE("on every backend, greedy decoding with the latent cache matches transformers", B, MOONMOE_TEST_BACKENDS) {
    mm::nn::Transformer<B> model = mm::load_transformer<mm::TinyK2, B>(data_dir("tiny_k2"));
    const Reference gen(data_dir("tiny_k2") + "/generate.safetensors");
    const std::vector<index_t> prompt = gen.i64("prompt_ids"), expected = gen.i64("generated_ids");
    const std::vector<float> step_logits = gen.f32("step_logits");
    const index_t V = model.config.dims.vocab, steps = index_t(expected.size() - prompt.size());
    auto state = model.start_decoding(64);
    std::vector<float> logits = mm::to_host(model.decode(prompt.data(), index_t(prompt.size()), state));
    std::vector<index_t> seq = prompt;
    for (index_t s = 0; s < steps; ++s) {
        const float* last = logits.data() + logits.size() - std::size_t(V);
        CHECK(scaled_error(last, std::vector<float>(step_logits.begin() + s * V, step_logits.begin() + (s + 1) * V)) < 1e-5);
        const index_t next = index_t(std::max_element(last, last + V) - last);
        seq.push_back(next);
        logits = mm::to_host(model.decode(&next, 1, state));
    }
    CHECK(seq == expected);
}

TEST_CASE_TEMPLATE("on every backend, three MuonClip steps equal the CPU's", B, MOONMOE_TEST_BACKENDS) {
    using Opt = mm::Optimizer<mm::Muon<mm::LearningRate<0.02>>, mm::AdamW<mm::LearningRate<0.003>>, mm::QKClip<1>>;
    mm::nn::Transformer<mm::cpu> reference = mm::load_transformer<mm::TinyK2, mm::cpu>(data_dir("tiny_k2"));
    mm::nn::Transformer<B> model = mm::load_transformer<mm::TinyK2, B>(data_dir("tiny_k2"));
    mm::optim::Optimizer<Opt, mm::cpu> ref_opt(reference);
    mm::optim::Optimizer<Opt, B> opt(model);
    const std::vector<index_t> ids = {1, 5, 9, 2, 7, 3, 8, 4, 6, 1, 2, 3};
    const auto layout = mm::nn::TokenLayout::sequences(2, 6);
    for (int step = 0; step < 3; ++step) {
        const float ref_loss = reference.train_step(ids.data(), layout);
        const float loss = model.train_step(ids.data(), layout);
        CHECK(loss == doctest::Approx(ref_loss).epsilon(1e-5));
        const auto ref_report = ref_opt.step();
        const auto report = opt.step();
        CHECK(report.clip.total() == ref_report.clip.total());  // tau = 1 clips heads on both
    }
    const auto ref_values = all_values(reference), values = all_values(model);
    REQUIRE(ref_values.size() == values.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < values.size(); ++i) worst = std::max(worst, scaled_error(values[i].data(), ref_values[i]));
    MESSAGE("after three steps on " << std::string(B::name) << ": worst parameter difference " << worst);
    CHECK(worst < 1e-4);
}
