// io/hf_config.hpp: config.json of Kimi-K2-Instruct and DeepSeek-V3 (the released values, written in the
// transformers 4.x layout of the released files) equal the presets field by field; the transformers 5 layout
// (rope_parameters) reads the same; the generated tiny configs resolve against TinyK2 / TinyV3; every refusal
// names the file and the field.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include <moonmoe/config.hpp>
#include <moonmoe/io/hf_config.hpp>

#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_hf_config {

using namespace moonmoe;
using namespace io_testing;
using nlohmann::json;

namespace {

// moonshotai/Kimi-K2-Instruct config.json (key order and auto_map as released).
const char* const kimi_k2_config = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "auto_map": {
    "AutoConfig": "configuration_deepseek.DeepseekV3Config",
    "AutoModel": "modeling_deepseek.DeepseekV3Model",
    "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"
  },
  "aux_loss_alpha": 0.001,
  "bos_token_id": 163584,
  "eos_token_id": 163585,
  "first_k_dense_replace": 1,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 131072,
  "model_type": "kimi_k2",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 1,
  "n_routed_experts": 384,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 64,
  "num_nextn_predict_layers": 0,
  "pretraining_tp": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_theta": 50000.0,
  "routed_scaling_factor": 2.827,
  "rope_scaling": {
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "factor": 32.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 1,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.48.3",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 163840
})";

// deepseek-ai/DeepSeek-V3 config.json.
const char* const deepseek_v3_config = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 40,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

HFConfig parse(const json& j, const std::string& source = "config.json") { return parse_hf_config(j.dump(), source); }

/// K2's config in the transformers 5 layout: rope_theta and rope_scaling folded into rope_parameters.
json kimi_k2_v5() {
    json j = json::parse(kimi_k2_config);
    json rope = j["rope_scaling"];
    rope["rope_type"] = "yarn";
    rope["rope_theta"] = j["rope_theta"];
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j.erase("torch_dtype");
    j["rope_parameters"] = rope;
    j["dtype"] = "bfloat16";
    return j;
}

}  // namespace

TEST_CASE("io: Kimi-K2-Instruct config.json equals the KimiK2 preset in every field") {
    const HFConfig hf = parse_hf_config(kimi_k2_config, "Kimi-K2-Instruct/config.json");
    check_same_model(hf.model, KimiK2::config);
    CHECK(hf.model_type == "kimi_k2");
    CHECK(hf.architectures == std::vector<std::string>{"DeepseekV3ForCausalLM"});
    CHECK(hf.topk_method == "noaux_tc");
    CHECK(hf.mtp_layers == 0);
    CHECK(hf.attention_factor == 1.0);
    REQUIRE(hf.fp8_block.has_value());
    CHECK(*hf.fp8_block == std::array<index_t, 2>{128, 128});
    CHECK(hf.bos_token_id == 163584);
    CHECK(hf.eos_token_ids == std::vector<index_t>{163585});
    CHECK(hf.torch_dtype == "bfloat16");
    CHECK(!hf.rope_parameters_format);
    CHECK(hf.json["aux_loss_alpha"] == 0.001);  // fields the struct does not carry stay reachable

    check_same_config(resolve(KimiK2::config, hf), KimiK2::config);
    // Every size Dynamic: all taken from the file; the parallel layout stays the type's.
    const ModelConfig any = resolve(AnyDeepSeekV3::config, hf);
    check_same_model(any, KimiK2::config);
    CHECK(any.parallel.pp == 1);
    CHECK(any.is_static());
    CHECK(count_parameters(any).total == KimiK2::parameter_count());
}

TEST_CASE("io: DeepSeek-V3 config.json equals the DeepSeekV3 preset in every field") {
    const HFConfig hf = parse_hf_config(deepseek_v3_config, "DeepSeek-V3/config.json");
    check_same_model(hf.model, DeepSeekV3::config);
    CHECK(hf.model_type == "deepseek_v3");
    CHECK(hf.mtp_layers == 1);
    CHECK(hf.bos_token_id == 0);
    CHECK(hf.eos_token_ids == std::vector<index_t>{1});
    check_same_config(resolve(DeepSeekV3::config, hf), DeepSeekV3::config);
    CHECK(count_parameters(resolve(AnyDeepSeekV3::config, hf)).total == 671'026'419'200);
    // A V3 file does not fit the K2 type: the first fixed size that differs is named with its argument.
    check_error([&] { resolve(KimiK2::config, hf); },
                {"DeepSeek-V3/config.json: first_k_dense_replace is 3 but the model type fixes DenseLayers<1>"});
}

TEST_CASE("io: the transformers 5 layout (rope_parameters) reads the same as the 4.x layout") {
    const HFConfig v5 = parse(kimi_k2_v5());
    CHECK(v5.rope_parameters_format);
    CHECK(v5.torch_dtype == "bfloat16");
    check_same_model(v5.model, KimiK2::config);
    check_same_config(resolve(KimiK2::config, v5), KimiK2::config);

    // Precedence as in transformers 5: a non-empty rope_scaling wins over rope_parameters, and a theta inside the
    // dict wins over the top-level one.
    json both = kimi_k2_v5();
    both["rope_scaling"] = json::parse(kimi_k2_config)["rope_scaling"];
    both["rope_scaling"]["factor"] = 64.0;
    both["rope_theta"] = 1.0e6;
    const HFConfig hf = parse(both);
    CHECK(hf.model.rope.factor == 64.0);
    CHECK(hf.model.rope.theta == 1.0e6);  // rope_scaling has no theta: the top-level one
    json inner = kimi_k2_v5();
    inner["rope_theta"] = 1.0e6;
    CHECK(parse(inner).model.rope.theta == 50000.0);

    // "default" rope_type: plain RoPE, with the NoScaling values.
    json plain = kimi_k2_v5();
    plain["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
    const HFConfig p = parse(plain);
    CHECK(!p.model.rope.yarn);
    CHECK(p.model.rope.theta == 10000.0);
    CHECK(p.model.rope.factor == RoPE<NoScaling>::value.factor);
    CHECK(p.attention_factor == 1.0);
    json null_scaling = json::parse(kimi_k2_config);
    null_scaling["rope_scaling"] = nullptr;
    CHECK(!parse(null_scaling).model.rope.yarn);

    // YaRN defaults of HF: beta_fast 32, beta_slow 1; original_max_position_embeddings from the top level or,
    // failing both, max_position_embeddings.
    json defaults = kimi_k2_v5();
    for (const char* key : {"beta_fast", "beta_slow", "original_max_position_embeddings"})
        defaults["rope_parameters"].erase(key);
    const HFConfig d = parse(defaults);
    CHECK(d.model.rope.beta_fast == 32.0);
    CHECK(d.model.rope.beta_slow == 1.0);
    CHECK(d.model.rope.original_max_positions == 131072);
    defaults["original_max_position_embeddings"] = 4096;
    CHECK(parse(defaults).model.rope.original_max_positions == 4096);
}

TEST_CASE("io: optional config fields take transformers' defaults") {
    json j = json::parse(kimi_k2_config);
    for (const char* key :
         {"scoring_func", "topk_method", "norm_topk_prob", "rms_norm_eps", "moe_layer_freq", "num_key_value_heads",
          "tie_word_embeddings", "attention_bias", "hidden_act", "quantization_config", "num_nextn_predict_layers",
          "bos_token_id", "eos_token_id", "architectures"})
        j.erase(key);
    const HFConfig hf = parse(j);
    check_same_model(hf.model, KimiK2::config);
    CHECK(!hf.fp8_block.has_value());
    CHECK(!hf.bos_token_id.has_value());
    CHECK(hf.eos_token_ids.empty());

    json variants = json::parse(kimi_k2_config);
    variants["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite style: no query compression
    variants["eos_token_id"] = {163585, 163586};
    variants["scoring_func"] = "softmax";
    variants["topk_method"] = "greedy";
    variants["quantization_config"].erase("weight_block_size");
    const HFConfig v = parse(variants, "v2lite/config.json");
    CHECK(v.model.attention.q_rank == NoQCompression);
    CHECK(v.eos_token_ids == std::vector<index_t>{163585, 163586});
    CHECK(v.model.moe.score == ScoreFunc::softmax);
    CHECK(!v.model.moe.correction_bias);
    CHECK(*v.fp8_block == default_fp8_block);
    check_error([&] { resolve(KimiK2::config, v); },
                {"v2lite/config.json: q_lora_rank is null but the model type fixes QRank<1536>"});
    // The file's router is softmax without a correction bias: the type must say so (the preset spells
    // CorrectionBias<true> out, and an explicit argument wins over the default that follows Score).
    using K2WithoutQueryCompression = KimiK2::with<Attention<MLA<Heads<64>, QRank<NoQCompression>>>,
                                                   KimiK2::moe::with<Score<Softmax>, CorrectionBias<false>>>;
    CHECK(resolve(K2WithoutQueryCompression::config, v).attention.q_rank == NoQCompression);
}

TEST_CASE("io: config.json errors name the file, the field, and what was expected and found") {
    const auto check_refused = [](json j, std::initializer_list<std::string_view> parts) {
        check_error([&] { parse(j, "some/dir/config.json"); }, parts);
        check_error([&] { parse(j, "some/dir/config.json"); }, {"some/dir/config.json: "});
    };
    const json k2 = json::parse(kimi_k2_config);
    auto without = [&](const char* key) {
        json j = k2;
        j.erase(key);
        return j;
    };
    auto with = [&](const char* key, json value) {
        json j = k2;
        j[key] = std::move(value);
        return j;
    };
    for (const char* key :
         {"hidden_size", "num_hidden_layers", "first_k_dense_replace", "vocab_size", "intermediate_size",
          "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
          "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "n_group",
          "topk_group", "routed_scaling_factor", "max_position_embeddings"}) {
        CAPTURE(key);
        check_refused(without(key), {std::string("missing field ") + key});
    }
    check_refused(without("rope_theta"), {"missing field rope_theta"});
    check_refused(with("hidden_size", "7168"), {"hidden_size must be an integer, found string \"7168\""});
    check_refused(with("hidden_size", 7168.5), {"hidden_size must be an integer, found number 7168.5"});
    check_refused(with("num_hidden_layers", -61), {"num_hidden_layers must be a non-negative integer, found -61"});
    check_refused(with("n_routed_experts", nullptr), {"n_routed_experts must be an integer, found null"});
    check_refused(with("routed_scaling_factor", "2.827"), {"routed_scaling_factor must be a number, found string"});
    check_refused(with("norm_topk_prob", 1), {"norm_topk_prob must be a boolean, found integer 1"});
    check_refused(with("architectures", json::array({"LlamaForCausalLM"})),
                  {"architectures is [\"LlamaForCausalLM\"]", "DeepseekV3ForCausalLM"});
    check_refused(with("architectures", "DeepseekV3ForCausalLM"), {"architectures must be a list of strings"});
    {
        json j = without("architectures");
        j["model_type"] = "llama";
        check_refused(j, {"model_type 'llama'"});
    }
    // a model type of another model beside DeepSeek's architecture (issue 29: it loaded, the model type ignored)
    check_refused(with("model_type", "llama"), {"model_type is 'llama', but architectures names DeepseekV3ForCausalLM",
                                                "'deepseek_v3' and 'kimi_k2'"});
    check_refused(with("model_type", "deepseek_v2"), {"model_type is 'deepseek_v2'"});
    {  // raw bytes that are not UTF-8, quoted by the parser's message, are escaped (issue 29)
        const std::string message = error_of([&] { parse_hf_config("{\"a\": \xff\xfe}", "c/config.json"); });
        CHECK(message.find("c/config.json: not valid JSON") != std::string::npos);
        CHECK(message.find("\\xff") != std::string::npos);
        CHECK(message.find('\xff') == std::string::npos);
        CHECK(moonmoe::detail::printable("k\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n\x01\xc0\xaf\xed\xa0\x80") ==
              "k\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n\\x01\\xc0\\xaf\\xed\\xa0\\x80");
    }
    {  // valid JSON, a NUL byte and garbage (issue 29: nlohmann's lexer ends at the NUL, and the garbage passed)
        const std::string text = k2.dump() + std::string(1, '\0') + "garbage";
        check_error([&] { parse_hf_config(text, "some/dir/config.json"); },
                    {"some/dir/config.json: has a NUL byte at offset " + std::to_string(k2.dump().size())});
    }
    check_refused(with("moe_layer_freq", 2), {"moe_layer_freq is 2"});
    check_refused(with("hidden_act", "gelu"), {"hidden_act is 'gelu'", "silu"});
    check_refused(with("tie_word_embeddings", true), {"tie_word_embeddings is true"});
    check_refused(with("attention_bias", true), {"attention_bias is true"});
    check_refused(with("num_key_value_heads", 8), {"num_key_value_heads is 8", "64 heads"});
    check_refused(with("scoring_func", "relu"), {"scoring_func is 'relu'"});
    check_refused(with("topk_method", "random"), {"topk_method is 'random'"});
    {
        json j = k2;
        j["rope_scaling"]["type"] = "linear";
        check_refused(j, {"rope_scaling.rope_type is 'linear'"});
        j = k2;
        j["rope_scaling"]["factor"] = "32";
        check_refused(j, {"rope_scaling.factor must be a number, found string"});
        j = k2;
        j["rope_scaling"].erase("factor");
        check_refused(j, {"missing field rope_scaling.factor"});
        j = k2;
        j["rope_scaling"]["truncate"] = false;
        check_refused(j, {"rope_scaling.truncate is false"});
        j = k2;
        j["rope_scaling"].erase("mscale");  // HF would then scale cos/sin by mscale(32) = 1.35: not representable
        j["rope_scaling"].erase("mscale_all_dim");
        check_refused(j, {"cos/sin attention factor of 1.346574", "mscale and mscale_all_dim"});
        j = k2;
        j["original_max_position_embeddings"] = 8192;
        check_refused(j, {"original_max_position_embeddings is 8192 at the top level but 4096 in rope_scaling"});
        j = k2;
        j["quantization_config"]["quant_method"] = "compressed-tensors";
        check_refused(j, {"quantization_config.quant_method is 'compressed-tensors'"});
        j = k2;
        j["quantization_config"]["weight_block_size"] = {128};
        check_refused(j, {"quantization_config.weight_block_size must be [rows, cols]"});
        j = kimi_k2_v5();
        j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
        check_refused(j, {"rope_parameters.full_attention is a per-layer-type RoPE"});
    }
    check_error([] { parse_hf_config("{\"hidden_size\": ", "cfg.json"); }, {"cfg.json: not valid JSON"});
    check_error([] { parse_hf_config("[1]", "cfg.json"); }, {"cfg.json: not a JSON object"});
    // Rules of the configuration layer, prefixed with the file.
    const std::string broken = error_of([&] { parse(with("num_experts_per_tok", 500), "some/dir/config.json"); });
    CHECK(broken.find("some/dir/config.json: invalid model configuration") != std::string::npos);
    CHECK(broken.find("TopK must not exceed Experts") != std::string::npos);
    CHECK_THROWS_AS(parse(with("num_experts_per_tok", 500)), config_error);
    const auto missing = fs::path(MOONMOE_TEST_BINARY_DIR) / "io_scratch" / "nowhere" / "config.json";
    check_error([&] { read_hf_config(missing); }, {missing.string(), "cannot open"});
}

TEST_CASE("io: a static size that disagrees with config.json is a load error naming field and argument") {
    const HFConfig k2 = parse_hf_config(kimi_k2_config, "k2/config.json");
    check_error([&] { resolve(TinyK2::config, k2); },
                {"k2/config.json: hidden_size is 7168 but the model type fixes Hidden<64>"});
    using K2Heads32 = KimiK2::with<Attention<MLA<Heads<32>>>>;
    check_error([&] { resolve(K2Heads32::config, k2); },
                {"num_attention_heads is 64 but the model type fixes Heads<32>"});
    using K2Experts256 = KimiK2::with<MoE<Experts<256>, Groups<1>, TopGroups<1>>>;
    check_error([&] { resolve(K2Experts256::config, k2); },
                {"n_routed_experts is 384 but the model type fixes Experts<256>"});
    using K2ShortContext = KimiK2::with<RoPE<MaxPositions<4096>>>;
    check_error([&] { resolve(K2ShortContext::config, k2); },
                {"max_position_embeddings is 131072 but the model type fixes MaxPositions<4096>"});
    using K2MHA = KimiK2::with<Attention<MHA<>>>;
    check_error([&] { resolve(K2MHA::config, k2); }, {"k2/config.json", "MHA"});
    // Routing and RoPE values are fixed by the type as sizes are (io_hf_config_static.cpp has the whole table).
    using K2NoYarn = KimiK2::with<RoPE<NoScaling>>;
    check_error([&] { resolve(K2NoYarn::config, k2); },
                {"k2/config.json: rope_scaling.type is 'yarn' but the model type fixes NoScaling"});
}

TEST_CASE("io: the generated tiny configs (transformers 5.23) resolve against TinyK2 and TinyV3") {
    const HFConfig k2 = read_hf_config(test_data("tiny_k2/config.json"));
    CHECK(k2.rope_parameters_format);
    CHECK(k2.model_type == "deepseek_v3");
    CHECK(!k2.fp8_block.has_value());
    check_same_model(k2.model, TinyK2::config);
    check_same_config(resolve(TinyK2::config, k2), TinyK2::config);

    const HFConfig v3 = read_hf_config(test_data("tiny_v3/config.json"));
    check_same_model(v3.model, TinyV3::config);
    check_same_config(resolve(TinyV3::config, v3), TinyV3::config);
    check_error([&] { resolve(TinyK2::config, v3); },
                {"tiny_v3/config.json: num_hidden_layers is 4 but the model type fixes Layers<3>"});

    for (const char* dir : {"tiny_k2_bf16", "tiny_k2_fp8"}) {
        CAPTURE(dir);
        const HFConfig c = read_hf_config(test_data(std::string(dir) + "/config.json"));
        check_same_config(resolve(TinyK2::config, c), TinyK2::config);
    }
    const HFConfig fp8 = read_hf_config(test_data("tiny_k2_fp8/config.json"));
    REQUIRE(fp8.fp8_block.has_value());
    CHECK(*fp8.fp8_block == std::array<index_t, 2>{16, 16});
    check_same_config(resolve(TinyV3::config, read_hf_config(test_data("tiny_v3_sharded/config.json"))),
                      TinyV3::config);
}

}  // namespace unit_io_hf_config
