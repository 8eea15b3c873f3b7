// The activation-memory policies (config/activations.hpp) as the modules run them, on every backend of the build:
//   - selective recomputation and bf16 storage give the same bits as keeping everything in f32 (logits, loss and
//     every gradient: the same operations in the same order on the same values), under Precision<F32> and <BF16>;
//   - the caches of a whole forward hold exactly the bytes the accounting counts for the policy (layer_activations
//     and head_activations, hand-derived in config_accounting.cpp), which are fewer;
//   - FP8 storage of the MLP inputs changes the gradients by a small, nonzero relative error (the table in
//     docs/activation_memory.md is what this test prints).
// Models: tiny Kimi K2 and tiny DeepSeek-V3 with their checkpoints (test/data/tiny_k2, tiny_v3), and random tiny
// models with MHA and with MLA without query compression.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_nn_activations {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

using TinyMHA = TinyK2::with<Attention<MHA<Heads<4>, KVHeads<2>, HeadDim<8>, RopeDim<4>>>>;
using TinyNoQ =
    TinyK2::with<Attention<MLA<Heads<4>, QRank<NoQCompression>, KVRank<16>, NopeDim<8>, RopeDim<4>, VDim<8>>>>;

enum class Tiny { k2, v3, mha, no_q };
constexpr Tiny all_models[] = {Tiny::k2, Tiny::v3, Tiny::mha, Tiny::no_q};
std::string model_name(Tiny t) {
    return t == Tiny::k2    ? "tiny K2"
           : t == Tiny::v3  ? "tiny V3"
           : t == Tiny::mha ? "tiny MHA"
                            : "tiny MLA without q_rank";
}

template <class Model, class B>
nn::Transformer<B> load_or_random(const char* dir, NumberFormat compute) {
    if (dir) {
        if (compute == NumberFormat::bf16)
            return load_transformer<typename Model::template with<Precision<BF16>>, B>(data_dir(dir));
        return load_transformer<Model, B>(data_dir(dir));
    }
    ModelConfig c = Model::config;
    c.precision.compute = compute;
    nn::Transformer<B> m(c);
    randomize(m, 7);
    m.refresh_working_weights();
    return m;
}

template <class B>
nn::Transformer<B> make(Tiny t, NumberFormat compute) {
    switch (t) {
    case Tiny::k2: return load_or_random<TinyK2, B>("tiny_k2", compute);
    case Tiny::v3: return load_or_random<TinyV3, B>("tiny_v3", compute);
    case Tiny::mha: return load_or_random<TinyMHA, B>(nullptr, compute);
    case Tiny::no_q: break;
    }
    return load_or_random<TinyNoQ, B>(nullptr, compute);
}

struct Run {
    std::vector<float> logits;
    float loss = 0;
    std::vector<std::string> names;
    std::vector<std::vector<float>> grads;
    index_t cache_bytes = 0;
};

constexpr index_t sequences = 2, length = 16, tokens = sequences * length;

template <class B>
Run run(nn::Transformer<B>& model, const ActivationsConfig& a) {
    model.set_activations(a);
    model.zero_grad();
    std::vector<index_t> ids(tokens);
    for (index_t i = 0; i < tokens; ++i) ids[std::size_t(i)] = (i * 37 + 11) % model.config.dims.vocab;
    const auto layout = nn::TokenLayout::sequences(sequences, length);
    typename nn::Transformer<B>::Cache cache;
    Tensor<float, 2, B> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
    Run r;
    r.cache_bytes = index_t(cache.bytes());
    const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
    Tensor<float, 2, B> dlogits(logits.shape());
    r.loss = nn::cross_entropy<B>(logits.view(), targets.data(), dlogits.view());
    r.logits = to_host(logits);
    model.backward(dlogits.view(), cache);
    model.visit_params([&](const ParamRef& p) {
        if (!p.grad) return;
        r.names.push_back(p.name);
        r.grads.push_back(floats_to_host<B>(p.grad, p.numel()));
    });
    return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// What a whole model's cache holds under `c`'s policy by the accounting: its layers, and the head without the
/// loss gradient (the caller keeps dlogits).
index_t accounted_bytes(const ModelConfig& c) {
    const ActivationsConfig& s = c.activations;
    index_t n = head_activations(c, tokens).bytes(s) - 4 * tokens * c.dims.vocab;
    for (index_t l = 0; l < c.dims.layers; ++l) n += layer_activations(c, l < c.dims.dense_layers, tokens).bytes(s);
    return n;
}

/// ||a - b|| / ||b||; -1 when b is 0 (a parameter no token reached).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0, n = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        n += double(b[i]) * b[i];
    }
    return n > 0 ? std::sqrt(d / n) : -1.0;
}

}  // namespace

TEST_CASE_TEMPLATE("recomputation and bf16 storage give the bits of keeping everything in f32, in fewer bytes", B,
                   MOONMOE_TEST_BACKENDS) {
    const ActivationsConfig recompute_norms = Activations<Recompute<NormOutputs>>::value;
    const ActivationsConfig recompute_up = Activations<Recompute<UpProjections>>::value;
    const ActivationsConfig recompute_k2 = Activations<Recompute<KimiK2Selection>>::value;
    const ActivationsConfig bf16 = Activations<Storage<BF16>>::value;
    const ActivationsConfig k2_exact = Activations<Recompute<KimiK2Selection>, Storage<BF16>>::value;
    for (const Tiny t : all_models) {
        for (const NumberFormat compute : {NumberFormat::f32, NumberFormat::bf16}) {
            CAPTURE(model_name(t));
            CAPTURE(std::string(format_name(compute)));
            nn::Transformer<B> model = make<B>(t, compute);
            const Run keep = run(model, ActivationsConfig{});
            CHECK(keep.cache_bytes == accounted_bytes(model.config));
            std::vector<ActivationsConfig> policies = {recompute_norms, recompute_up, recompute_k2};
            if (compute == NumberFormat::bf16) policies.insert(policies.end(), {bf16, k2_exact});
            for (const ActivationsConfig& a : policies) {
                CAPTURE(a.recompute_norms);
                CAPTURE(a.recompute_up_projections);
                CAPTURE(std::string(format_name(a.storage)));
                const Run r = run(model, a);
                CHECK(r.cache_bytes == accounted_bytes(model.config));
                // fewer bytes, unless the policy recomputes what this model does not have (MLA without q_rank has
                // a q up-projection only through kv_b_proj; MHA has none)
                if (!(t == Tiny::mha && a == recompute_up)) CHECK(r.cache_bytes < keep.cache_bytes);
                CHECK(same_bits(r.logits, keep.logits));
                CHECK(std::memcmp(&r.loss, &keep.loss, sizeof(float)) == 0);
                REQUIRE(r.grads.size() == keep.grads.size());
                for (std::size_t i = 0; i < r.grads.size(); ++i) {
                    CAPTURE(r.names[i]);
                    CHECK(same_bits(r.grads[i], keep.grads[i]));
                }
            }
        }
    }
}

TEST_CASE_TEMPLATE("FP8 storage of the MLP inputs: a small, nonzero gradient error, in the accounting's bytes", B,
                   MOONMOE_TEST_BACKENDS) {
    // Against the same policy without FP8: relative Frobenius error per gradient tensor (those any token reached).
    struct Bound {
        NumberFormat compute;
        ActivationsConfig without, with;
    };
    const Bound cases[] = {
        {NumberFormat::f32, Activations<>::value, Activations<MlpInputs<FP8>>::value},
        {NumberFormat::bf16, Activations<Recompute<KimiK2Selection>, Storage<BF16>>::value, KimiK2Activations::value},
    };
    for (const Tiny t : all_models) {
        for (const Bound& c : cases) {
            CAPTURE(model_name(t));
            CAPTURE(std::string(format_name(c.compute)));
            nn::Transformer<B> model = make<B>(t, c.compute);
            const Run ref = run(model, c.without), r = run(model, c.with);
            CHECK(r.cache_bytes == accounted_bytes(model.config));
            CHECK(r.cache_bytes < ref.cache_bytes);
            // storage only: the forward computes on the exact values
            CHECK(same_bits(r.logits, ref.logits));
            std::vector<double> errors;
            std::string worst_name;
            double worst = 0.0;
            for (std::size_t i = 0; i < r.grads.size(); ++i) {
                const double e = relative_error(r.grads[i], ref.grads[i]);
                if (e < 0) continue;
                errors.push_back(e);
                if (e > worst) worst = e, worst_name = r.names[i];
            }
            REQUIRE(errors.size() > 10);
            std::sort(errors.begin(), errors.end());
            const double median = errors[errors.size() / 2];
            MESSAGE(std::string(B::name) << ", " << model_name(t) << ", " << std::string(format_name(c.compute))
                                         << " compute: gradient error of FP8 MLP inputs, median " << median
                                         << ", worst " << worst << " (" << worst_name << ") over " << errors.size()
                                         << " tensors");
            // measured (docs/activation_memory.md): medians 0.026-0.033, worst 0.046-0.081. The quantization's own
            // relative error is 0.026 on normal values; an unquantized store would give 0, a coarser format more.
            CHECK(median > 0.015);
            CHECK(median < 0.05);
            CHECK(worst < 0.12);
        }
    }
}

TEST_CASE("a backward whose input was neither kept nor handed over is refused") {
    ModelConfig c = TinyK2::config;
    nn::SwiGLU<cpu> mlp(8, 16);
    mlp.set_activations(c.activations, nn::KeepInput::no);
    Tensor<float, 2> x = random_matrix(3, 8, 1), y({3, 8}), dx({3, 8});
    nn::SwiGLU<cpu>::Cache cache;
    mlp.forward(x.view(), y.view(), cache);
    CHECK(cache.x.empty());
    CHECK_THROWS_WITH_AS(mlp.backward(y.view(), cache, dx.view()),
                         "SwiGLU.backward: the input was not kept (keep_input is false): pass the forward's input",
                         std::logic_error);
    nn::SwiGLU<cpu>::Cache none;
    CHECK_THROWS_WITH_AS(mlp.backward(y.view(), none, dx.view(), nn::Accumulate::no, x.view()),
                         "backward: SwiGLU's gate(x) was not kept by the forward (run forward before backward, once "
                         "per backward)",
                         std::logic_error);
}

}  // namespace unit_nn_activations
