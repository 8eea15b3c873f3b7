// moonmoe/io/hf_config_writer.hpp: the config.json of a DeepseekV3ForCausalLM with a given ModelConfig, so that a
// model declared as a type can be saved as a checkpoint that transformers and load_transformer read.
//
// The fields are those io/hf_config.hpp reads, with transformers' DeepseekV3Config names. RoPE is written in the
// spelling of the published Kimi K2 and DeepSeek-V3 files (top-level rope_theta, rope_scaling {"type": "yarn",
// ...} or null), which transformers 4 reads as it is and transformers 5 converts to rope_parameters. The router
// is written as DeepseekV3 routes: sigmoid scores, topk_method "noaux_tc" with the correction bias, or without it
// "greedy" (one group) or "group_limited_greedy". A configuration DeepseekV3ForCausalLM cannot express (MHA
// attention, softmax scores) is refused, naming the argument: transformers would load such a file with other
// semantics and silently compute something else.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "../config/model_config.hpp"
#include "error.hpp"
#include "hf_config.hpp"

namespace moonmoe {

/// config.json fields for `c`, whose sizes must all be known; `initializer_range` is recorded for transformers'
/// initialisation of weights a checkpoint lacks (nn/init.hpp draws with the same value).
inline nlohmann::json hf_config_json(const ModelConfig& c, double initializer_range = 0.02) {
    const std::string what = "config.json for this model: ";
    if (!c.is_static()) throw config_error(what + "every size must be known (resolve Dynamic sizes first)");
    if (c.attention.kind != AttentionKind::mla)
        throw config_error(what +
                           "DeepseekV3ForCausalLM has Multi-head Latent Attention; a model with Attention<MHA<...>> "
                           "has no Hugging Face DeepseekV3 checkpoint form");
    if (c.moe.score != ScoreFunc::sigmoid)
        throw config_error(what +
                           "DeepseekV3ForCausalLM scores experts with a sigmoid; a model with Score<Softmax> "
                           "would be routed differently by transformers");
    validate(c);
    nlohmann::json j;
    j["architectures"] = {"DeepseekV3ForCausalLM"};
    j["model_type"] = "deepseek_v3";
    j["vocab_size"] = c.dims.vocab;
    j["hidden_size"] = c.dims.hidden;
    j["intermediate_size"] = c.dims.dense_hidden;
    j["num_hidden_layers"] = c.dims.layers;
    j["first_k_dense_replace"] = c.dims.dense_layers;
    j["rms_norm_eps"] = c.dims.norm_eps;
    j["hidden_act"] = "silu";
    j["tie_word_embeddings"] = false;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = initializer_range;
    j["use_cache"] = true;
    j["num_nextn_predict_layers"] = 0;

    j["num_attention_heads"] = c.attention.heads;
    j["num_key_value_heads"] = c.attention.heads;
    j["q_lora_rank"] =
        c.attention.q_rank == NoQCompression ? nlohmann::json(nullptr) : nlohmann::json(c.attention.q_rank);
    j["kv_lora_rank"] = c.attention.kv_rank;
    j["qk_nope_head_dim"] = c.attention.nope_dim;
    j["qk_rope_head_dim"] = c.attention.rope_dim;
    j["v_head_dim"] = c.attention.v_dim;

    const RopeConfig& r = c.rope;
    j["max_position_embeddings"] = r.max_positions;
    j["rope_theta"] = r.theta;
    j["rope_interleave"] = r.interleave;
    if (r.yarn)
        j["rope_scaling"] = {{"type", "yarn"},
                             {"factor", r.factor},
                             {"original_max_position_embeddings", r.original_max_positions},
                             {"beta_fast", r.beta_fast},
                             {"beta_slow", r.beta_slow},
                             {"mscale", r.mscale},
                             {"mscale_all_dim", r.mscale_all_dim}};
    else
        j["rope_scaling"] = nullptr;

    const MoEConfig& m = c.moe;
    j["n_routed_experts"] = m.experts;
    j["num_experts_per_tok"] = m.top_k;
    j["n_shared_experts"] = m.shared;
    j["moe_intermediate_size"] = m.expert_hidden;
    j["n_group"] = m.groups;
    j["topk_group"] = m.top_groups;
    j["routed_scaling_factor"] = m.routed_scale;
    j["norm_topk_prob"] = m.norm_top_k;
    j["scoring_func"] = "sigmoid";
    j["topk_method"] = m.correction_bias ? "noaux_tc" : m.groups > 1 ? "group_limited_greedy" : "greedy";
    j["torch_dtype"] = "float32";
    return j;
}

/// The HFConfig of the config.json above, parsed back by parse_hf_config (so it is checked as a loaded file is).
inline HFConfig hf_config_for(const ModelConfig& c, double initializer_range = 0.02) {
    return parse_hf_config(hf_config_json(c, initializer_range).dump(), "config.json for this model");
}

}  // namespace moonmoe
