// MuonClip training on every backend of the build (Backend<cpu>; Backend<cuda> too in the emulated CUDA build and on
// a GPU): three steps of the composed optimizer, with tau low enough that heads clip, must leave every parameter
// where the CPU's steps leave it. The transformers goldens (logits, loss, gradients, maxima, greedy decoding) run on
// every backend in hf_reference.cpp / hf_reference_v2.cpp / nn_packed.cpp, Muon and QK-Clip against torch in optim.cpp.
#include "support/backends.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/optim.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_model_backends {

using namespace moonmoe::testing;
namespace mm = moonmoe;

namespace {

using mm::index_t;

/// Every parameter of a model, on the host, in visit order.
template <class B>
std::vector<std::vector<float>> all_values(mm::nn::Transformer<B>& model) {
    std::vector<std::vector<float>> out;
    model.visit_params([&](const mm::ParamRef& p) { out.push_back(floats_to_host<B>(p.value, p.numel())); });
    return out;
}

}  // namespace

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
    for (std::size_t i = 0; i < values.size(); ++i)
        worst = std::max(worst, scaled_error(values[i].data(), ref_values[i]));
    MESSAGE("after three steps on " << std::string(B::name) << ": worst parameter difference " << worst);
    CHECK(worst < 1e-4);
}

}  // namespace unit_model_backends
