// io/hf_config.hpp resolve(): a routing or RoPE value that a model type fixes must equal config.json's (an error
// names the field and both values, as for sizes); Dynamic ones (and AnyScore, AnyGroupScore, AnyScaling) are taken
// from the file. And DeepseekV2ForCausalLM config.json files: the released DeepSeek-V2-Lite and DeepSeek-V2 values
// read into the V2 router (softmax, no correction bias, no normalisation, groups by their largest score), and the
// V2 fields transformers ignores but DeepSeek's own code does not are refused.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <moonmoe/config.hpp>
#include <moonmoe/io/hf_config.hpp>

#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_hf_config_static {

using namespace moonmoe;
using namespace io_testing;
using nlohmann::json;

namespace {

// deepseek-ai/DeepSeek-V2-Lite config.json as released (transformers 4.x layout; auto_map left out).
const char* const deepseek_v2_lite_config = R"({
  "architectures": ["DeepseekV2ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
  "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048,
  "initializer_range": 0.02, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
  "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1,
  "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1", "use_cache": true, "v_head_dim": 128, "vocab_size": 102400
})";

using DeepSeekV2Lite = Model<
    Dims<Hidden<2048>, Layers<27>, DenseLayers<1>, Vocab<102400>, DenseHidden<10944>>,
    Attention<MLA<Heads<16>, QRank<NoQCompression>, KVRank<512>>>,
    RoPE<Theta<10000>, MaxPositions<163840>,
         YaRN<Factor<40>, OriginalMaxPositions<4096>, BetaFast<32>, BetaSlow<1>, MScale<0.707>, MScaleAllDim<0.707>>>,
    MoE<Experts<64>, TopK<6>, Shared<2>, ExpertHidden<1408>, Score<Softmax>, RoutedScale<1.0>>>;

HFConfig parse_json(const json& j, const std::string& source = "config.json") {
    return parse_hf_config(j.dump(), source);
}

json tiny_k2_json() { return json::parse(read_file(test_data("tiny_k2/config.json"))); }

}  // namespace

TEST_CASE("io: a routing or RoPE value the type fixes must equal config.json's, the error names field and values") {
    // TinyK2 against the generated tiny_k2/config.json (transformers 5 layout) with one value changed at a time.
    const std::vector<std::pair<std::function<void(json&)>, std::string>> table = {
        {[](json& j) { j["rms_norm_eps"] = 1e-5; }, "rms_norm_eps is 1e-05 but the model type fixes NormEps<1e-06>"},
        {[](json& j) { j["rope_parameters"]["rope_theta"] = 10000.0; },
         "rope_theta is 10000 but the model type fixes Theta<50000>"},
        {[](json& j) { j["rope_interleave"] = false; },
         "rope_interleave is false but the model type fixes Interleave<true>"},
        {[](json& j) { j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 50000.0}}; },
         "rope_parameters.rope_type is 'default' (or absent) but the model type fixes YaRN<...>"},
        {[](json& j) { j["rope_parameters"]["factor"] = 40.0; },
         "rope_parameters.factor is 40 but the model type fixes Factor<32>"},
        {[](json& j) { j["rope_parameters"]["original_max_position_embeddings"] = 256; },
         "rope_parameters.original_max_position_embeddings is 256 but the model type fixes OriginalMaxPositions<128>"},
        {[](json& j) { j["rope_parameters"]["beta_fast"] = 32.0; },
         "rope_parameters.beta_fast is 32 but the model type fixes BetaFast<1>"},
        {[](json& j) { j["rope_parameters"]["beta_slow"] = 0.5; },
         "rope_parameters.beta_slow is 0.5 but the model type fixes BetaSlow<1>"},
        {[](json& j) { j["rope_parameters"]["mscale"] = 0.707, j["rope_parameters"]["mscale_all_dim"] = 0.707; },
         "rope_parameters.mscale is 0.707 but the model type fixes MScale<1>"},
        {[](json& j) { j["rope_parameters"]["mscale_all_dim"] = 0.707; },
         "rope_parameters.mscale_all_dim is 0.707 but the model type fixes MScaleAllDim<1>"},
        {[](json& j) { j["scoring_func"] = "softmax"; },
         "scoring_func is 'softmax' but the model type fixes Score<Sigmoid>"},
        {[](json& j) { j["topk_method"] = "greedy"; },
         "topk_method is 'greedy' (without e_score_correction_bias) but the model type fixes CorrectionBias<true>"},
        {[](json& j) { j["norm_topk_prob"] = false; },
         "norm_topk_prob is false but the model type fixes NormTopK<true>"},
        {[](json& j) { j["routed_scaling_factor"] = 2.5; },
         "routed_scaling_factor is 2.5 but the model type fixes RoutedScale<2.827>"},
    };
    check_same_config(resolve(TinyK2::config, parse_json(tiny_k2_json())), TinyK2::config);
    for (const auto& [change, message] : table) {
        CAPTURE(message);
        json j = tiny_k2_json();
        change(j);
        const HFConfig file = parse_json(j, "tiny_k2/config.json");
        check_error([&] { resolve(TinyK2::config, file); }, {"tiny_k2/config.json: " + message});
    }
    // The 4.x layout names the rope_scaling dict; a type without scaling against a YaRN file.
    json legacy = tiny_k2_json();
    json rope = legacy["rope_parameters"];
    legacy.erase("rope_parameters");
    legacy["rope_theta"] = rope["rope_theta"];
    rope.erase("rope_theta");
    rope.erase("rope_type");
    legacy["rope_scaling"] = rope;
    legacy["rope_scaling"]["factor"] = 16.0;
    check_error([&] { resolve(TinyK2::config, parse_json(legacy)); },
                {"rope_scaling.factor is 16 but the model type fixes Factor<32>"});
    check_error(
        [&] { resolve(TinyK2::with<RoPE<Theta<50000>, MaxPositions<4096>, NoScaling>>::config, parse_json(legacy)); },
        {"rope_scaling.type is 'yarn' but the model type fixes NoScaling"});
}

TEST_CASE("io: Dynamic routing and RoPE values, AnyScore and AnyScaling are read from config.json") {
    json j = tiny_k2_json();
    j["rms_norm_eps"] = 1e-5;
    j["rope_interleave"] = false;
    j["rope_parameters"] = {
        {"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},  {"original_max_position_embeddings", 256},
        {"beta_fast", 32.0},   {"beta_slow", 1.0},      {"mscale", 0.707}, {"mscale_all_dim", 0.707}};
    j["scoring_func"] = "softmax";
    j["topk_method"] = "greedy";
    j["norm_topk_prob"] = false;
    j["routed_scaling_factor"] = 1.5;
    const HFConfig file = parse_json(j);
    using Open = TinyK2::with<TinyK2::dims::with<NormEps<Dynamic>>,
                              RoPE<Theta<Dynamic>, MaxPositions<4096>, Interleave<Dynamic>, AnyScaling>,
                              TinyK2::moe::with<Score<AnyScore>, CorrectionBias<Dynamic>, NormTopK<Dynamic>,
                                                RoutedScale<Dynamic>, GroupScore<AnyGroupScore>>>;
    static_assert(!Open::is_static);  // whether the router has a bias (a parameter) is open
    static_assert(is_dynamic(Open::config.rope.theta) && Open::config.rope.from_file.scaling);
    const ModelConfig r = resolve(Open::config, file);
    check_same_model(r, file.model);
    CHECK(r.is_static());
    CHECK(!r.moe.from_file.correction_bias);
    CHECK(!r.rope.from_file.scaling);
    CHECK(r.moe.score == ScoreFunc::softmax);
    CHECK(!r.moe.correction_bias);
    CHECK(r.moe.routed_scale == 1.5);
    CHECK(r.rope.theta == 10000.0);
    CHECK(r.rope.mscale == 0.707);
    CHECK(r.dims.norm_eps == 1e-5);
    // A score that the type leaves open, with no other router argument: the flags follow it and are open too.
    static_assert(MoE<Score<AnyScore>>::value.from_file.correction_bias &&
                  MoE<Score<AnyScore>>::value.from_file.norm_top_k);
    // -1 is how a type says Dynamic; a file that says it is refused rather than read as "open".
    json minus = tiny_k2_json();
    minus["routed_scaling_factor"] = -1.0;
    check_error([&] { parse_json(minus, "m/config.json"); }, {"m/config.json: routed_scaling_factor is -1"});
}

TEST_CASE("io: DeepSeek-V2-Lite config.json reads into V2's router and resolves against its obvious declaration") {
    const HFConfig hf = parse_hf_config(deepseek_v2_lite_config, "DeepSeek-V2-Lite/config.json");
    CHECK(hf.architecture == HFArchitecture::deepseek_v2);
    CHECK(hf.model_type == "deepseek_v2");
    CHECK(hf.topk_method == "greedy");
    check_same_model(hf.model, DeepSeekV2Lite::config);
    CHECK(hf.model.moe.group_score == GroupScoreFunc::max);
    CHECK(hf.attention_factor == 1.0);
    const ModelConfig r = resolve(DeepSeekV2Lite::config, hf);
    check_same_config(r, DeepSeekV2Lite::config);
    CHECK(count_parameters(r).total == 15'706'484'224);
    CHECK(count_parameters(resolve(AnyDeepSeekV3::config, hf)).total == 15'706'484'224);
    // A V3-style (sigmoid) type does not take it.
    using Sigmoid2Lite = DeepSeekV2Lite::with<DeepSeekV2Lite::moe::with<Score<Sigmoid>>>;
    check_error([&] { resolve(Sigmoid2Lite::config, hf); },
                {"DeepSeek-V2-Lite/config.json: scoring_func is 'softmax' but the model type fixes Score<Sigmoid>"});

    // DeepSeek-V2: group_limited_greedy over 8 groups, top 3, routed scale 16.
    json v2 = json::parse(deepseek_v2_lite_config);
    v2.update(json{{"hidden_size", 5120},
                   {"num_hidden_layers", 60},
                   {"intermediate_size", 12288},
                   {"moe_intermediate_size", 1536},
                   {"n_routed_experts", 160},
                   {"num_attention_heads", 128},
                   {"num_key_value_heads", 128},
                   {"q_lora_rank", 1536},
                   {"n_group", 8},
                   {"topk_group", 3},
                   {"topk_method", "group_limited_greedy"},
                   {"routed_scaling_factor", 16.0}});
    const HFConfig big = parse_json(v2);
    CHECK(big.model.moe.groups == 8);
    CHECK(big.model.moe.top_groups == 3);
    CHECK(big.model.moe.group_score == GroupScoreFunc::max);
    CHECK(!big.model.moe.correction_bias);
    CHECK(count_parameters(big.model).total == 235'741'434'880);

    // transformers' DeepseekV2Config defaults: topk_method greedy, norm_topk_prob false, scoring softmax,
    // first_k_dense_replace 0, routed_scaling_factor 1; no architectures but model_type deepseek_v2.
    json defaults = json::parse(deepseek_v2_lite_config);
    for (const char* key : {"topk_method", "norm_topk_prob", "scoring_func", "first_k_dense_replace",
                            "routed_scaling_factor", "n_group", "topk_group", "architectures"})
        defaults.erase(key);
    const HFConfig d = parse_json(defaults);
    CHECK(d.architecture == HFArchitecture::deepseek_v2);
    CHECK(d.model.moe.score == ScoreFunc::softmax);
    CHECK(!d.model.moe.norm_top_k);
    CHECK(!d.model.moe.correction_bias);
    CHECK(d.model.dims.dense_layers == 0);
    CHECK(d.model.moe.routed_scale == 1.0);
    CHECK(d.model.moe.groups == 1);
}

TEST_CASE("io: DeepseekV2 config.json fields that transformers ignores but DeepSeek's code does not are refused") {
    const json lite = json::parse(deepseek_v2_lite_config);
    const auto refused = [&](const char* key, json value, std::initializer_list<std::string_view> parts) {
        json j = lite;
        j[key] = std::move(value);
        check_error([&] { parse_json(j, "v2/config.json"); }, parts);
    };
    refused("scoring_func", "sigmoid", {"v2/config.json: scoring_func is 'sigmoid'", "softmax"});
    refused("norm_topk_prob", true, {"v2/config.json: norm_topk_prob is true", "never normalises"});
    refused("topk_method", "noaux_tc",
            {"v2/config.json: topk_method is 'noaux_tc'", "'greedy' or 'group_limited_greedy'"});
    refused("rope_interleave", false, {"v2/config.json: rope_interleave is false", "interleaved pairs"});
    refused("mlp_bias", true, {"v2/config.json: mlp_bias is true"});
    refused("architectures", json::array({"DeepseekV4ForCausalLM"}),
            {"architectures is [\"DeepseekV4ForCausalLM\"]", "DeepseekV2ForCausalLM"});
    json grouped = lite;
    grouped["topk_method"] = "group_limited_greedy";
    grouped.erase("n_group");
    check_error([&] { parse_json(grouped, "v2/config.json"); }, {"v2/config.json: missing field n_group"});
}

TEST_CASE("io: the generated tiny DeepSeek-V2 configs (transformers 5.23) read as written") {
    const HFConfig lite = read_hf_config(test_data("tiny_v2_lite/config.json"));
    CHECK(lite.architecture == HFArchitecture::deepseek_v2);
    CHECK(lite.model.attention.q_rank == NoQCompression);
    CHECK(lite.model.moe.groups == 1);
    CHECK(lite.attention_factor == 1.0);
    const HFConfig v2 = read_hf_config(test_data("tiny_v2/config.json"));
    CHECK(v2.topk_method == "group_limited_greedy");
    CHECK(v2.model.moe.group_score == GroupScoreFunc::max);
    CHECK(v2.model.moe.routed_scale == 3.0);
    CHECK(v2.attention_factor == doctest::Approx(1.085726399).epsilon(1e-9));  // mscale(40, 1) / mscale(40, 0.707)
}

}  // namespace unit_io_hf_config_static
