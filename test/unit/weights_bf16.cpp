// Precision<BF16, Weights<BF16>>: the matrices the products read are stored in bf16 alone (Kimi K2 technical
// report §2.4.2: BF16 parameters, FP32 gradient buffers), on every backend of the build.
//
// The reference is Precision<BF16> (f32 masters with bf16 working copies), which hf_reference_bf16.cpp holds to
// transformers' own bf16 run: a model loaded from a BF16 checkpoint has masters that are bf16 values, so the two
// policies read the same bf16 operands and must agree bit for bit, in the forward, in every gradient, and over
// optimizer steps (the optimizer brings Weights<BF16>'s f32 masters). What Weights<BF16> changes is memory: no
// f32 copy of the matrices until an optimizer steps them, and none while a BF16 checkpoint loads.
#include "support/backends.hpp"
#include "support/io_testing.hpp"
#include "support/reference.hpp"

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/io/optimizer_state.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/optim.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_weights_bf16 {

using namespace moonmoe;
using namespace moonmoe::testing;
using namespace io_testing;

namespace {

using Masters = TinyK2::with<Precision<BF16>>;
using Stored16 = TinyK2::with<Precision<BF16, Weights<BF16>>>;
static_assert(Stored16::config.precision == PrecisionConfig{NumberFormat::bf16, NumberFormat::bf16});
static_assert(Masters::config.precision.weights == NumberFormat::f32);

/// The projections, the experts and lm_head; not the router's gate (read in f32, as transformers reads it)
bool stored_in_bf16(const ParamRef& p) {
    const bool router = p.name.ends_with(".mlp.gate.weight");
    return !router &&
           (p.kind == ParamKind::matrix || p.kind == ParamKind::expert_matrix || p.kind == ParamKind::output_head);
}

/// A parameter's stored values widened to f32 on the host: value16 where the parameter is bf16, else value.
template <class B>
std::vector<float> stored(const ParamRef& p) {
    if (!p.stored_bf16) return floats_to_host<B>(p.value, p.numel());
    const std::vector<bf16> v = to_host(View<const bf16, 1, B>(p.value16, {p.numel()}));
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].to_float();
    return out;
}

/// The stored values of every parameter (only_bf16: of those stored in bf16).
template <class B>
std::map<std::string, std::vector<float>> values_of(nn::Transformer<B>& m, bool only_bf16 = false) {
    std::map<std::string, std::vector<float>> out;
    m.visit_params([&](const ParamRef& p) {
        if (p.stored_bf16 || !only_bf16) out[p.name] = stored<B>(p);
    });
    return out;
}

/// What the products read: the bf16 values where there are any (the parameter, or Precision<BF16>'s working copy
/// of its master), else the f32 ones.
template <class B>
std::map<std::string, std::vector<float>> read_values(nn::Transformer<B>& m) {
    std::map<std::string, std::vector<float>> out;
    m.visit_params([&](ParamRef p) {
        p.stored_bf16 = p.value16 != nullptr;
        out[p.name] = stored<B>(p);
    });
    return out;
}

const std::vector<index_t> ids = {3, 17, 42, 7, 99, 5, 61, 23, 88, 14, 2, 9, 77, 31, 50, 64, 12, 8, 95, 40};
const auto layout = nn::TokenLayout::sequences(2, 10);

}  // namespace

TEST_CASE_TEMPLATE("Weights<BF16>: matrices held in bf16 alone, a BF16 checkpoint loads with no f32 copy", B,
                   MOONMOE_TEST_BACKENDS) {
    auto& stats = backend::Memory<B>::stats();
    const std::size_t before = stats.current.load();
    stats.reset_peak();
    nn::Transformer<B> model = load_transformer<Stored16, B>(data_dir("tiny_k2_bf16"));
    const std::size_t held = stats.current.load() - before, peak = stats.peak.load() - before;

    index_t bf16_elements = 0, largest = 0, f32_elements = 0;
    model.visit_params([&](const ParamRef& p) {
        CAPTURE(p.name);
        CHECK(p.stored_bf16 == stored_in_bf16(p));
        if (p.stored_bf16) {
            CHECK(p.value == nullptr);  // no f32 copy: a master exists only in an optimizer that steps it
            CHECK(p.value16 != nullptr);
            bf16_elements += p.numel(), largest = std::max(largest, p.numel());
        } else {
            CHECK(p.value != nullptr);
            CHECK(p.value16 == nullptr);
            f32_elements += p.numel();
        }
    });
    CHECK(bf16_elements > 10 * f32_elements / 100);

    // Precision<BF16> holds every matrix twice (f32 master, bf16 working copy): 4 bytes per element more
    const std::size_t before_masters = stats.current.load();
    nn::Transformer<B> with_masters = load_transformer<Masters, B>(data_dir("tiny_k2_bf16"));
    const std::size_t held_masters = stats.current.load() - before_masters;
    MESSAGE(std::string(B::name) << ": tiny K2 from BF16 files: Weights<BF16> holds " << held
                                 << " bytes (peak while loading " << peak << "), Precision<BF16> " << held_masters);
    CHECK(held_masters - held == std::size_t(4 * bf16_elements));
    // the load staged nothing in f32 on the backend (bf16 tensors are copied as they are)
    CHECK(peak == held);

    // the stored values are the file's, bit for bit: the masters of Precision<BF16> hold them exactly
    const auto a = values_of(model), b = values_of(with_masters);
    CHECK(a == b);
}

TEST_CASE_TEMPLATE("Weights<BF16> computes what Precision<BF16> computes, bit for bit: logits, loss, gradients", B,
                   MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> m16 = load_transformer<Stored16, B>(data_dir("tiny_k2_bf16"));
    nn::Transformer<B> m32 = load_transformer<Masters, B>(data_dir("tiny_k2_bf16"));
    typename nn::Transformer<B>::Cache c16, c32;
    const std::vector<float> l16 = to_host(m16.forward(ids.data(), layout, c16));
    const std::vector<float> l32 = to_host(m32.forward(ids.data(), layout, c32));
    CHECK(l16 == l32);
    CHECK(m16.train_step(ids.data(), layout) == m32.train_step(ids.data(), layout));
    CHECK(gradients_of<B>(m16) == gradients_of<B>(m32));

    // decoding with the latent cache reads the bf16 kv_b_proj directly too
    auto s16 = m16.start_decoding(4), s32 = m32.start_decoding(4);
    for (index_t t = 0; t < 4; ++t)
        CHECK(to_host(m16.decode(&ids[std::size_t(t)], 1, s16)) == to_host(m32.decode(&ids[std::size_t(t)], 1, s32)));
}

TEST_CASE_TEMPLATE(
    "Weights<BF16> trains as Precision<BF16> does: the optimizer's f32 masters, MuonClip steps equal "
    "bit for bit",
    B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> m16 = load_transformer<Stored16, B>(data_dir("tiny_k2_bf16"));
    nn::Transformer<B> m32 = load_transformer<Masters, B>(data_dir("tiny_k2_bf16"));
    using Opt = moonmoe::Optimizer<Muon<>, QKClip<1.0>>;  // a tau that clips
    optim::Optimizer<Opt, B> o16{m16}, o32{m32};
    for (const auto& s : o16.slots()) {  // every stepped bf16 parameter has its f32 master in the optimizer
        CAPTURE(s.param.name);
        CHECK(s.master.empty() == !s.param.stored_bf16);
        if (s.param.stored_bf16) CHECK(s.param.value == s.master.data());
    }
    m16.visit_params([&](const ParamRef& p) {  // and the model still holds none
        if (p.stored_bf16) CHECK(p.value == nullptr);
    });
    index_t clipped = 0;
    for (int step = 0; step < 3; ++step) {
        CAPTURE(step);
        CHECK(m16.train_step(ids.data(), layout) == m32.train_step(ids.data(), layout));
        const optim::StepReport r16 = o16.step(), r32 = o32.step();
        CHECK(r16.clip.heads_clipped == r32.clip.heads_clipped);
        clipped += r16.clip.total();
        CHECK(read_values(m16) == read_values(m32));  // the bf16 weights: the masters rounded, as the working copies
    }
    CHECK(clipped > 0);
    // the masters themselves agree too, and the bf16 weights are them rounded to nearest even
    std::map<std::string, std::vector<float>> masters16, masters32;
    for (const auto& s : o16.slots()) masters16[s.param.name] = floats_to_host<B>(s.param.value, s.param.numel());
    for (const auto& s : o32.slots()) masters32[s.param.name] = floats_to_host<B>(s.param.value, s.param.numel());
    CHECK(masters16 == masters32);
    std::size_t unrounded = 0;
    for (const auto& s : o16.slots()) {
        if (!s.param.stored_bf16) continue;
        const std::vector<float> w = stored<B>(s.param), m = floats_to_host<B>(s.param.value, s.param.numel());
        for (std::size_t i = 0; i < w.size(); ++i) unrounded += w[i] != bf16::from_float(m[i]).to_float();
    }
    CHECK(unrounded == 0);
}

TEST_CASE_TEMPLATE("Weights<BF16>: saved as BF16 bit for bit, as F32 widened exactly, loaded back the same", B,
                   MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = load_transformer<Stored16, B>(data_dir("tiny_k2_bf16"));
    const auto values = values_of(model);
    const fs::path dir = scratch_dir(std::string("weights_bf16_save_") + B::name);
    for (const DType store : {DType::bf16, DType::f32}) {
        CAPTURE(dtype_name(store));
        SaveOptions options;
        options.store = store;
        save_transformer(dir, model, options);
        nn::Transformer<B> again = load_transformer<Stored16, B>(dir);
        // every bf16 weight back as it was; BF16 files round the f32 parameters too (the router's f32 bias)
        const bool only_bf16 = store == DType::bf16;
        CHECK(values_of(again, only_bf16) == values_of(model, only_bf16));
        Checkpoint ck(dir);
        const auto shape = ck.record("lm_head.weight").shape;  // compare one file tensor with the parameter
        CHECK(ck.record("lm_head.weight").dtype == store);
        CHECK(ck.read_f32("lm_head.weight", std::span<const index_t>(shape)) == values.at("lm_head.weight"));
    }
    // and an f32 model reads what the bf16 one saved as F32: the same values
    nn::Transformer<B> wide = load_transformer<TinyK2, B>(dir);
    CHECK(values_of(wide) == values);
}

TEST_CASE_TEMPLATE(
    "Weights<BF16>: init_weights draws the f32 values and rounds them, an f32 checkpoint is rounded "
    "on loading",
    B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> m16(Stored16::config), m32(Masters::config);
    nn::init_weights(m16);
    nn::init_weights(m32);
    std::size_t checked = 0;
    std::map<std::string, std::vector<float>> working;  // Precision<BF16>'s working copies: the masters rounded
    m32.visit_params([&](const ParamRef& p) {
        if (!p.value16) return;
        const std::vector<bf16> v = to_host(View<const bf16, 1, B>(p.value16, {p.numel()}));
        std::vector<float>& w = working[p.name];
        for (bf16 x : v) w.push_back(x.to_float());
    });
    m16.visit_params([&](const ParamRef& p) {
        if (!p.stored_bf16) return;
        CHECK(stored<B>(p) == working.at(p.name));
        ++checked;
    });
    CHECK(checked == working.size());

    // the f32 tiny checkpoint: each weight rounded to nearest even, as Precision<BF16>'s working copies are
    nn::Transformer<B> from_f32 = load_transformer<Stored16, B>(data_dir("tiny_k2"));
    nn::Transformer<B> ref = load_transformer<Masters, B>(data_dir("tiny_k2"));
    std::size_t mismatched = 0;
    std::map<std::string, std::vector<bf16>> ref16;
    ref.visit_params([&](const ParamRef& p) {
        if (p.value16) ref16[p.name] = to_host(View<const bf16, 1, B>(p.value16, {p.numel()}));
    });
    from_f32.visit_params([&](const ParamRef& p) {
        if (!p.stored_bf16) return;
        const std::vector<bf16> v = to_host(View<const bf16, 1, B>(p.value16, {p.numel()}));
        const std::vector<bf16>& r = ref16.at(p.name);
        for (std::size_t i = 0; i < v.size(); ++i) mismatched += v[i].bits != r[i].bits;
    });
    CHECK(mismatched == 0);
}

TEST_CASE_TEMPLATE(
    "Weights<BF16>: a run resumed from its checkpoint and optimizer state (with the masters) continues bit for "
    "bit, and a bf16 checkpoint holds its bf16 weights exactly",
    B, MOONMOE_TEST_BACKENDS) {
    using Opt = moonmoe::Optimizer<Muon<>, QKClip<1.0>>;
    nn::Transformer<B> model = load_transformer<Stored16, B>(data_dir("tiny_k2_bf16"));
    optim::Optimizer<Opt, B> opt{model};
    for (int step = 0; step < 2; ++step) {
        model.train_step(ids.data(), layout);
        opt.step();
    }
    const fs::path dir = scratch_dir(std::string("weights_bf16_resume_") + B::name);
    // A bf16 checkpoint (store = BF16) holds the bf16 weights exactly...
    SaveOptions bf16_file;
    bf16_file.store = DType::bf16;
    save_transformer(dir / "model_bf16", model, bf16_file);
    nn::Transformer<B> from_bf16 = load_transformer<Stored16, B>(dir / "model_bf16");
    CHECK(values_of(from_bf16, true) == values_of(model, true));
    // ...but rounds what the model holds in f32 (norm gains, the embedding, the router), so an exact resume saves as
    // the model holds its tensors: the default F32 store (bf16 weights widened exactly). Resuming from the bf16 file
    // parted from the uninterrupted run on the H200 (one q_b_proj element by 3e-8 after two steps, docs/gpu_status.md).
    save_transformer(dir / "model", model);
    save_optimizer_state(dir / "optimizer.safetensors", opt);

    nn::Transformer<B> resumed = load_transformer<Stored16, B>(dir / "model");
    CHECK(values_of(resumed) == values_of(model));
    optim::Optimizer<Opt, B> resumed_opt{resumed};
    load_optimizer_state(dir / "optimizer.safetensors", resumed_opt);
    CHECK(resumed_opt.steps() == 2);
    for (int step = 0; step < 2; ++step) {
        CHECK(resumed.train_step(ids.data(), layout) == model.train_step(ids.data(), layout));
        opt.step();
        resumed_opt.step();
        CHECK(values_of(resumed) == values_of(model));
    }
}

TEST_CASE("Weights<BF16> under f32 compute is refused at run time, naming both formats") {
    ModelConfig c = TinyK2::config;
    c.precision.weights = NumberFormat::bf16;
    check_error([&] { nn::Transformer<> m(c); }, {"weights stored in bf16", "compute format is f32"});
}

}  // namespace unit_weights_bf16
