// Saving a model as a Hugging Face checkpoint: what transformers reads back, what we read back, and the bytes.
//
// test/data/saved_tiny/checkpoint is what save_transformer writes for a TinyK2 initialised by init_weights (seed
// and shard size below), sharded into three files with an index; tools/make_saved_reference.py loaded it with
// transformers' DeepseekV3ForCausalLM.from_pretrained and wrote its logits to test/data/saved_tiny/reference
// .safetensors. To regenerate both (after a deliberate change of the format or the initialiser):
//     MOONMOE_SAVE_TINY_TO=test/data/saved_tiny/checkpoint build/test/moonmoe_unit_tests -tc="*saved_tiny*"
//     python tools/make_saved_reference.py
// The first test then guards that our writer still produces exactly those files, so the golden logits apply to
// what the code writes today.
#include "support/io_testing.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"

#include <cstdlib>

#include <moonmoe/moonmoe.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_save {

using namespace moonmoe;
using namespace moonmoe::testing;
using io_testing::read_file;
using io_testing::scratch_dir;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t saved_tiny_seed = 7;
constexpr std::uint64_t saved_tiny_shard_bytes = 200'000;  // ~540 kB of F32 weights: three shards

nn::Transformer<> seeded_tiny_k2() {
    nn::Transformer<> model(TinyK2::config);
    nn::init_weights(model, {.seed = saved_tiny_seed});
    return model;
}

std::vector<float> weights(nn::Transformer<>& model) {
    std::vector<float> all;
    model.visit_params([&](const ParamRef& p) { all.insert(all.end(), p.value, p.value + p.numel()); });
    return all;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<std::string> entries(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

TEST_CASE("saved_tiny: saving the seeded TinyK2 again gives the committed checkpoint byte for byte") {
    nn::Transformer<> model = seeded_tiny_k2();
    if (const char* to = std::getenv("MOONMOE_SAVE_TINY_TO"))
        save_transformer(to, model, {.max_shard_bytes = saved_tiny_shard_bytes});
    const fs::path dir = scratch_dir("saved_tiny") / "checkpoint";
    save_transformer(dir, model, {.max_shard_bytes = saved_tiny_shard_bytes});
    const fs::path committed = io_testing::test_data("saved_tiny/checkpoint");
    const std::vector<std::string> files = {"config.json", "model-00001-of-00003.safetensors",
                                            "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors",
                                            "model.safetensors.index.json"};
    CHECK(entries(dir) == files);
    CHECK(entries(committed) == files);
    for (const std::string& f : files) {
        CAPTURE(f);
        CHECK(read_file(dir / f) == read_file(committed / f));
    }
}

TEST_CASE("saved_tiny: transformers' DeepseekV3ForCausalLM reads our checkpoint as we do (logits within 1e-5)") {
    nn::Transformer<> model = load_transformer<TinyK2>(io_testing::test_data("saved_tiny/checkpoint"));
    CHECK(bitwise_equal(weights(model), [] {
        nn::Transformer<> seeded = seeded_tiny_k2();
        return weights(seeded);
    }()));
    const Reference ref(data_dir("saved_tiny") + "/reference.safetensors");
    const std::vector<index_t> ids = ref.i64("input_ids"), shape = ref.shape("input_ids");
    nn::Transformer<>::Cache cache;
    const Mat logits = model.forward(ids.data(), nn::TokenLayout::sequences(shape[0], shape[1]), cache);
    const double error = scaled_error(logits.data(), ref.f32("logits"));
    MESSAGE("saved_tiny: logits error against transformers " << error);
    CHECK(error < 1e-5);  // the tolerance of the other logit tests (README, accuracy table)
}

TEST_CASE(
    "load -> train_step -> step -> save -> load gives the trained weights bit for bit, and the optimizer state too") {
    const fs::path root = scratch_dir("save_roundtrip");
    using Opt = moonmoe::Optimizer<Muon<LearningRate<0.02>>, AdamW<LearningRate<0.003>>, WSD<Warmup<1>>>;
    std::vector<index_t> ids(48);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = index_t((i * 37 + 5) % 256);
    const auto layout = nn::TokenLayout::sequences(2, 24);

    auto model = load_transformer(io_testing::test_data("saved_tiny/checkpoint"));  // AnyDeepSeekV3
    optim::Optimizer<Opt> opt(model);
    model.train_step(ids.data(), layout);
    opt.step();
    save_transformer(root / "trained", model);
    save_optimizer_state(root / "optimizer.safetensors", opt);
    auto again = load_transformer(root / "trained");
    CHECK(bitwise_equal(weights(again), weights(model)));
    CHECK(weights(again) != [] {
        nn::Transformer<> seeded = seeded_tiny_k2();
        return weights(seeded);
    }());
    // the loaded file's config.json went through unchanged, its fields moonmoe does not model included
    const auto saved = nlohmann::json::parse(read_file(root / "trained" / "config.json"));
    const auto original = nlohmann::json::parse(read_file(io_testing::test_data("saved_tiny/checkpoint/config.json")));
    CHECK(saved == original);
    CHECK(entries(root / "trained") == std::vector<std::string>{"config.json", "model.safetensors"});  // default shards

    // Training continues identically from the saved model and optimizer state.
    optim::Optimizer<Opt> resumed(again);
    load_optimizer_state(root / "optimizer.safetensors", resumed);
    CHECK(resumed.steps() == 1);
    for (int step = 0; step < 2; ++step) {
        CHECK(model.train_step(ids.data(), layout) == again.train_step(ids.data(), layout));
        opt.step();
        resumed.step();
    }
    CHECK(bitwise_equal(weights(again), weights(model)));
}

TEST_CASE("save_transformer keeps the loaded config.json's other fields and checks its sizes against the model") {
    const fs::path root = scratch_dir("save_config");
    auto model = load_transformer(io_testing::test_data("tiny_v3"));
    save_transformer(root / "v3", model, {.store = DType::bf16});
    auto saved = nlohmann::json::parse(read_file(root / "v3" / "config.json"));
    auto original = nlohmann::json::parse(read_file(io_testing::test_data("tiny_v3/config.json")));
    CHECK(saved["dtype"] == "bfloat16");  // the stored type, in the file's own spelling (transformers 5)
    saved.erase("dtype"), original.erase("dtype");
    CHECK(saved == original);  // transformers_version, bos_token_id, initializer_range, rope_parameters, ...
    const Checkpoint ck(root / "v3");
    CHECK(ck.record("model.layers.2.mlp.gate.weight").dtype == DType::bf16);

    model.hf_config_json = read_file(io_testing::test_data("tiny_k2/config.json"));  // a file of another model
    CHECK_THROWS_WITH_AS(save_transformer(root / "bad", model),
                         doctest::Contains("num_hidden_layers is 3 but the model type fixes Layers<4>"), io_error);
    CHECK_FALSE(fs::exists(root / "bad"));
}

TEST_CASE(
    "config.json written from a type reads back as the same configuration, types transformers cannot hold are "
    "refused") {
    const auto same = [](const ModelConfig& a, const ModelConfig& b) {
        CHECK(a.dims.hidden == b.dims.hidden);
        CHECK(a.dims.layers == b.dims.layers);
        CHECK(a.dims.dense_layers == b.dims.dense_layers);
        CHECK(a.dims.vocab == b.dims.vocab);
        CHECK(a.dims.dense_hidden == b.dims.dense_hidden);
        CHECK(a.dims.norm_eps == b.dims.norm_eps);
        CHECK(a.attention.heads == b.attention.heads);
        CHECK(a.attention.q_rank == b.attention.q_rank);
        CHECK(a.attention.kv_rank == b.attention.kv_rank);
        CHECK(a.attention.nope_dim == b.attention.nope_dim);
        CHECK(a.attention.rope_dim == b.attention.rope_dim);
        CHECK(a.attention.v_dim == b.attention.v_dim);
        CHECK(a.rope.theta == b.rope.theta);
        CHECK(a.rope.max_positions == b.rope.max_positions);
        CHECK(a.rope.interleave == b.rope.interleave);
        CHECK(a.rope.yarn == b.rope.yarn);
        if (a.rope.yarn) {
            CHECK(a.rope.factor == b.rope.factor);
            CHECK(a.rope.original_max_positions == b.rope.original_max_positions);
            CHECK(a.rope.beta_fast == b.rope.beta_fast);
            CHECK(a.rope.beta_slow == b.rope.beta_slow);
            CHECK(a.rope.mscale == b.rope.mscale);
            CHECK(a.rope.mscale_all_dim == b.rope.mscale_all_dim);
        }
        CHECK(a.moe.experts == b.moe.experts);
        CHECK(a.moe.top_k == b.moe.top_k);
        CHECK(a.moe.shared == b.moe.shared);
        CHECK(a.moe.expert_hidden == b.moe.expert_hidden);
        CHECK(a.moe.groups == b.moe.groups);
        CHECK(a.moe.top_groups == b.moe.top_groups);
        CHECK(a.moe.score == b.moe.score);
        CHECK(a.moe.correction_bias == b.moe.correction_bias);
        CHECK(a.moe.norm_top_k == b.moe.norm_top_k);
        CHECK(a.moe.routed_scale == b.moe.routed_scale);
    };
    ModelConfig plain_rope = TinyV3::config, direct_q = TinyK2::config, no_bias = TinyV3::config;
    plain_rope.rope.yarn = false;
    direct_q.attention.q_rank = NoQCompression;
    no_bias.moe.correction_bias = false;
    SUBCASE("TinyK2") { same(hf_config_for(TinyK2::config).model, TinyK2::config); }
    SUBCASE("TinyV3") { same(hf_config_for(TinyV3::config).model, TinyV3::config); }
    SUBCASE("plain RoPE") {
        CHECK(hf_config_json(plain_rope)["rope_scaling"].is_null());
        same(hf_config_for(plain_rope).model, plain_rope);
    }
    SUBCASE("no query compression") {
        CHECK(hf_config_json(direct_q)["q_lora_rank"].is_null());
        same(hf_config_for(direct_q).model, direct_q);
    }
    SUBCASE("no correction bias, expert groups") {
        CHECK(hf_config_json(no_bias)["topk_method"] == "group_limited_greedy");
        same(hf_config_for(no_bias).model, no_bias);
    }
    SUBCASE("Kimi K2 as published") {
        const nlohmann::json j = hf_config_json(KimiK2::config);
        CHECK(j["rope_scaling"]["factor"] == 32.0);
        CHECK(j["topk_method"] == "noaux_tc");
        same(hf_config_for(KimiK2::config).model, KimiK2::config);
    }
    CHECK_THROWS_WITH_AS(hf_config_json(AnyDeepSeekV3::config), doctest::Contains("every size must be known"),
                         config_error);
    ModelConfig softmax = TinyK2::config;
    softmax.moe.score = ScoreFunc::softmax, softmax.moe.correction_bias = false;
    CHECK_THROWS_WITH_AS(hf_config_json(softmax), doctest::Contains("Score<Softmax>"), config_error);
    ModelConfig mha = TinyK2::config;
    mha.attention.kind = AttentionKind::mha;
    CHECK_THROWS_WITH_AS(hf_config_json(mha), doctest::Contains("Attention<MHA<...>>"), config_error);
}

TEST_CASE("a model built from a type saves with config.json from the type, sharded as asked, and loads back exactly") {
    const fs::path root = scratch_dir("save_from_type");
    nn::Transformer<> model(TinyV3::config);
    nn::init_weights(model, {.seed = 99});
    save_transformer(root / "ck", model, {.max_shard_bytes = 100'000});
    const auto index = nlohmann::json::parse(read_file(root / "ck" / "model.safetensors.index.json"));
    std::size_t parameters = 0, tensors = 0, shards = 0;
    model.visit_params([&](const ParamRef& p) {
        parameters += std::size_t(p.numel());
        ++tensors;
        CHECK(index["weight_map"].contains(p.name));
    });
    CHECK(index["weight_map"].size() == tensors);
    CHECK(index["metadata"]["total_parameters"] == parameters);
    CHECK(index["metadata"]["total_size"] == 4 * parameters);
    CHECK(parameters == std::size_t(TinyV3::parameter_count()));
    for (const auto& e : fs::directory_iterator(root / "ck")) {
        if (e.path().extension() != ".safetensors") continue;
        ++shards;
        CHECK(fs::file_size(e.path()) <= 100'000 + 16'384);  // a shard's tensors fit the limit; plus its header
    }
    CHECK(shards > 5);
    auto loaded = load_transformer<TinyV3>(root / "ck");
    CHECK(bitwise_equal(weights(loaded), weights(model)));
    // saving over it replaces the whole checkpoint: one file now, no stale shards or index left behind
    save_transformer(root / "ck", loaded);
    CHECK(entries(root / "ck") == std::vector<std::string>{"config.json", "model.safetensors"});
    auto reloaded = load_transformer<TinyV3>(root / "ck");
    CHECK(bitwise_equal(weights(reloaded), weights(model)));
}

TEST_CASE("save_transformer refuses a part of the model, naming what it holds and how to save a parallel run") {
    const fs::path root = scratch_dir("save_part");
    const ModelConfig c = TinyK2::config;  // 3 layers, the first dense; 8 routed experts
    nn::ModelPart p;
    p.layers = {0, 1};
    p.head = false;
    p.first_expert = 2, p.expert_count = 2;
    nn::Transformer<> part(c, p);
    nn::init_weights(part, {.seed = 1});
    CHECK_THROWS_WITH_AS(save_transformer(root / "ck", part),
                         doctest::Contains("save_transformer was given a part of the model (layers 0-1 of 3, routed "
                                           "experts 2-3 of 8, the embedding, no final norm / lm_head)"),
                         io_error);
    CHECK_THROWS_WITH_AS(save_transformer(root / "ck", part),
                         doctest::Contains("parallel::save_checkpoint(dir, part, groups) on every rank"), io_error);
    CHECK_FALSE(fs::exists(root / "ck"));
    nn::ModelPart q = nn::ModelPart::whole(c);
    q.layers = {2};
    q.embedding = false;
    nn::Transformer<> last(c, q);
    CHECK_THROWS_WITH_AS(save_transformer(root / "ck", last),
                         doctest::Contains("(layer 2 of 3, routed experts 0-7 of 8, no embedding, the final norm and "
                                           "lm_head)"),
                         io_error);
    CHECK(moonmoe::detail::describe_part({{0, 2, 3}, true, true, 4, 1}, TinyV3::config) ==
          "layers 0 and 2-3 of 4, routed experts 4 of 16, the embedding, the final norm and lm_head");
    CHECK_FALSE(fs::exists(root / "ck"));
}

TEST_CASE(
    "save_transformer refuses weights holding a NaN or an infinity, naming the tensor, and allow_non_finite keeps "
    "them") {
    // issue 29: a NaN step, or weights loaded with check_finite = false, were saved back as they were
    const fs::path root = scratch_dir("save_non_finite");
    nn::Transformer<> model(TinyK2::config);
    nn::init_weights(model, {.seed = 1});
    save_transformer(root / "ck", model);  // a good checkpoint is there first, and stays
    const std::string before = read_file(root / "ck" / "model.safetensors");
    float* w = nullptr;
    model.visit_params([&](const ParamRef& p) {
        if (p.name == "model.layers.1.self_attn.o_proj.weight") w = p.value;
    });
    REQUIRE(w != nullptr);
    for (const float bad : {NAN, INFINITY, -INFINITY}) {
        w[5] = bad;
        io_testing::check_error([&] { save_transformer(root / "ck", model); },
                                {(root / "ck").string() + ": tensor 'model.layers.1.self_attn.o_proj.weight' holds",
                                 "at element 5 of", "allow_non_finite", "nothing was written"});
        io_testing::check_error([&] { save_transformer(root / "ck", model, {.store = DType::bf16}); },
                                {"'model.layers.1.self_attn.o_proj.weight' holds"});
        CHECK(read_file(root / "ck" / "model.safetensors") == before);
    }
    w[5] = NAN;
    save_transformer(root / "kept", model, {.allow_non_finite = true});
    CHECK(std::isnan(Checkpoint(root / "kept").read_f32("model.layers.1.self_attn.o_proj.weight", {64, 32})[5]));
}

TEST_CASE("bos_token_id and eos_token_id survive loading and saving, whole or through load_weights") {
    const fs::path root = scratch_dir("save_token_ids");
    const auto original = nlohmann::json::parse(read_file(io_testing::test_data("tiny_k2/config.json")));
    REQUIRE(original.contains("bos_token_id"));
    REQUIRE(original.contains("eos_token_id"));
    const auto check_ids = [&](const fs::path& dir) {
        const auto saved = nlohmann::json::parse(read_file(dir / "config.json"));
        CHECK(saved["bos_token_id"] == original["bos_token_id"]);
        CHECK(saved["eos_token_id"] == original["eos_token_id"]);
        const HFConfig read = read_hf_config(dir / "config.json");
        CHECK(read.bos_token_id == std::optional<index_t>(original["bos_token_id"].get<index_t>()));
        CHECK(read.eos_token_ids == std::vector<index_t>{original["eos_token_id"].get<index_t>()});
    };
    auto whole = load_transformer(io_testing::test_data("tiny_k2"));
    save_transformer(root / "whole", whole);
    check_ids(root / "whole");
    // a model built from its type, its weights then read from the checkpoint: it keeps that config.json too
    nn::Transformer<> typed(TinyK2::config);
    Checkpoint ck(io_testing::test_data("tiny_k2"));
    load_weights(typed, ck);
    save_transformer(root / "typed", typed);
    check_ids(root / "typed");
    // and from the saved one again
    auto again = load_transformer(root / "typed");
    save_transformer(root / "again", again);
    check_ids(root / "again");
}

}  // namespace unit_io_save
