// moonmoe/io/hf_config.hpp: a Hugging Face `config.json` of a DeepSeek-V3-architecture model, as a ModelConfig.
//
// Kimi K2 (model_type "kimi_k2") and DeepSeek-V3 ("deepseek_v3") declare architectures ["DeepseekV3ForCausalLM"];
// DeepSeek-V2 and V2-Lite ("deepseek_v2") ["DeepseekV2ForCausalLM"]; anything else is refused by name. Fields and
// defaults follow transformers' DeepseekV3Config / DeepseekV2Config: a field that decides a size is required; a
// field HF defaults is optional with HF's default (V3: scoring_func sigmoid, topk_method noaux_tc, norm_topk_prob
// true, rope_interleave true; V2: topk_method greedy, norm_topk_prob false, first_k_dense_replace 0,
// routed_scaling_factor 1; both: rms_norm_eps 1e-6, moe_layer_freq 1). RoPE is read in both spellings:
//   transformers 4.x: "rope_theta": 50000.0, "rope_scaling": {"type" or "rope_type": "yarn", "factor": ..., ...}
//   transformers 5.x: "rope_parameters": {"rope_type": "yarn" | "default", "rope_theta": ..., "factor": ..., ...}
// with v5's precedence (a non-empty rope_scaling wins over rope_parameters; a theta inside the dict wins over a
// top-level rope_theta). Features moonmoe does not model (tied embeddings, attention or MLP bias, other
// activations, MoE only every k-th layer, non-YaRN scaling, untruncated YaRN ranges) are errors, never silently
// ignored; so are V2 fields that transformers' DeepseekV2 modeling ignores but DeepSeek's own code does not
// (scoring_func other than softmax, norm_topk_prob true, rope_interleave false).
//
// DeepseekV2ForCausalLM as transformers 5.23 computes it (models/deepseek_v2/modeling_deepseek_v2.py) differs from
// V3 only in the router: softmax scores, no correction bias, weights never normalised, and group_limited_greedy
// scores a group by its largest expert score and zeroes the dropped groups' scores (GroupScore<GroupMax>); its RoPE
// (complex rotation of interleaved pairs) and softmax scale (qk_head_dim^-1/2 mscale(factor, mscale_all_dim)^2)
// equal V3's with rope_interleave true.
//
// resolve() then merges a file with a model type: every value the type fixes must equal the file's (an io_error
// names the config.json field and both values), and every Dynamic one (sizes, reals, flags, AnyScore,
// AnyGroupScore, AnyScaling) is taken from it.
#pragma once

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../config/model_config.hpp"
#include "../config/presets.hpp"
#include "../tensor/dtype.hpp"
#include "detail/json.hpp"
#include "detail/read_file.hpp"
#include "error.hpp"

namespace moonmoe {

/// The transformers model class a config.json is for.
enum class HFArchitecture { deepseek_v3, deepseek_v2 };

/// What a DeepSeek-V3-architecture config.json says, beyond and including the ModelConfig.
struct HFConfig {
    std::string source;  ///< the file (or name) every error message starts with
    std::vector<std::string>
        architectures;       ///< contains "DeepseekV3ForCausalLM" or "DeepseekV2ForCausalLM" (or is empty)
    std::string model_type;  ///< "kimi_k2", "deepseek_v3", "deepseek_v2", ...
    HFArchitecture architecture = HFArchitecture::deepseek_v3;
    /// Sizes and numerics as the file states them; parallel, optimizer and backend are AnyDeepSeekV3's defaults.
    ModelConfig model;
    std::string topk_method;        ///< "noaux_tc" (correction bias), "greedy", "group_limited_greedy"
    index_t mtp_layers = 0;         ///< num_nextn_predict_layers: MTP modules stored as layers L, L+1, ...
    double attention_factor = 1.0;  ///< cos/sin multiplier HF derives from the YaRN fields (1.0 for K2, V3)
    std::optional<std::array<index_t, 2>> fp8_block;  ///< quantization_config.weight_block_size of an FP8 checkpoint
    std::optional<index_t> bos_token_id;
    std::vector<index_t> eos_token_ids;   ///< eos_token_id, an integer or a list
    std::string torch_dtype;              ///< "torch_dtype" (v4) or "dtype" (v5), "" if absent
    bool rope_parameters_format = false;  ///< RoPE came from transformers 5's rope_parameters
    nlohmann::json json;                  ///< the whole document, for fields not carried above
};

namespace detail {

inline std::string describe_json(const nlohmann::json& v) {
    const std::string text = json_excerpt(v);
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer " + text;
    if (v.is_number_float()) return "number " + text;
    return std::string(v.type_name()) + (v.is_null() ? "" : " " + text);
}

/// Typed access to the fields of one JSON object; every message names the source and the (dotted) field.
class ConfigFields {
public:
    ConfigFields(const nlohmann::json& object, const std::string& source, std::string prefix = "")
        : j_(object), source_(source), prefix_(std::move(prefix)) {}

    const nlohmann::json* find(std::string_view key) const {
        auto it = j_.find(key);
        return it == j_.end() ? nullptr : &*it;
    }
    bool has(std::string_view key) const {  // present and not null
        const auto* v = find(key);
        return v && !v->is_null();
    }
    [[noreturn]] void fail(std::string_view key, const std::string& what) const {
        throw io_error(source_ + ": " + name(key) + " " + what);
    }

    const nlohmann::json& required(std::string_view key) const {
        const auto* v = find(key);
        if (!v) throw io_error(source_ + ": missing field " + name(key));
        return *v;
    }
    index_t size(std::string_view key) const { return as_size(key, required(key)); }
    std::optional<index_t> optional_size(std::string_view key) const {
        return has(key) ? std::optional<index_t>(as_size(key, *find(key))) : std::nullopt;
    }
    index_t size_or(std::string_view key, index_t fallback) const { return optional_size(key).value_or(fallback); }
    double number(std::string_view key) const { return as_number(key, required(key)); }
    double number_or(std::string_view key, double fallback) const {
        return has(key) ? as_number(key, *find(key)) : fallback;
    }
    std::optional<double> optional_number(std::string_view key) const {
        return has(key) ? std::optional<double>(as_number(key, *find(key))) : std::nullopt;
    }
    bool flag_or(std::string_view key, bool fallback) const {
        if (!has(key)) return fallback;
        const auto& v = *find(key);
        if (!v.is_boolean()) fail(key, "must be a boolean, found " + describe_json(v));
        return v.get<bool>();
    }
    std::string text_or(std::string_view key, std::string fallback) const {
        if (!has(key)) return fallback;
        const auto& v = *find(key);
        if (!v.is_string()) fail(key, "must be a string, found " + describe_json(v));
        return v.get<std::string>();
    }
    std::string name(std::string_view key) const { return prefix_ + std::string(key); }

    index_t as_size(std::string_view key, const nlohmann::json& v) const {
        if (!v.is_number_integer() && !v.is_number_unsigned())
            fail(key, "must be an integer, found " + describe_json(v));
        if (v.is_number_unsigned() ? v.get<std::uint64_t>() > std::uint64_t(INT64_MAX) : v.get<std::int64_t>() < 0)
            fail(key, "must be a non-negative integer, found " + v.dump());
        return v.get<index_t>();
    }
    double as_number(std::string_view key, const nlohmann::json& v) const {
        if (!v.is_number()) fail(key, "must be a number, found " + describe_json(v));
        const double x = v.get<double>();
        if (!std::isfinite(x)) fail(key, "must be a finite number, found " + describe_json(v));
        return x;
    }

private:
    const nlohmann::json& j_;
    const std::string& source_;
    std::string prefix_;
};

inline void read_architecture(const ConfigFields& f, const nlohmann::json& j, HFConfig& out) {
    out.model_type = f.text_or("model_type", "");
    if (f.has("architectures")) {
        const auto& a = j["architectures"];
        if (!a.is_array()) f.fail("architectures", "must be a list of strings, found " + describe_json(a));
        for (const auto& name : a) {
            if (!name.is_string()) f.fail("architectures", "must be a list of strings, found " + describe_json(a));
            out.architectures.push_back(name.get<std::string>());
        }
        for (const auto& name : out.architectures) {
            if (name == "DeepseekV3ForCausalLM" || name == "DeepseekV2ForCausalLM") {
                const bool v3 = name == "DeepseekV3ForCausalLM";
                out.architecture = v3 ? HFArchitecture::deepseek_v3 : HFArchitecture::deepseek_v2;
                // transformers builds the config class model_type names: a llama model type beside a DeepSeek
                // architecture is a file of another model, or an edited one
                const bool fits =
                    out.model_type.empty() || (v3 ? out.model_type == "deepseek_v3" || out.model_type == "kimi_k2"
                                                  : out.model_type == "deepseek_v2");
                if (!fits)
                    f.fail("model_type", "is " + detail::quoted(out.model_type) + ", but architectures names " + name +
                                             ", whose model types are " +
                                             (v3 ? "'deepseek_v3' and 'kimi_k2'" : "'deepseek_v2'"));
                return;
            }
        }
        throw io_error(out.source + ": architectures is " + detail::json_excerpt(a, 200) +
                       "; moonmoe reads DeepseekV3ForCausalLM (Kimi K2, DeepSeek-V3) and DeepseekV2ForCausalLM "
                       "(DeepSeek-V2) checkpoints");
    }
    if (out.model_type == "deepseek_v2") {
        out.architecture = HFArchitecture::deepseek_v2;
        return;
    }
    if (out.model_type != "deepseek_v3" && out.model_type != "kimi_k2")
        throw io_error(out.source + ": no architectures and model_type " + detail::quoted(out.model_type) +
                       "; moonmoe reads DeepseekV3ForCausalLM and DeepseekV2ForCausalLM checkpoints (model_type "
                       "deepseek_v3, kimi_k2 or deepseek_v2)");
}

inline void read_unsupported_features(const ConfigFields& f, HFArchitecture arch) {
    if (arch == HFArchitecture::deepseek_v2 && f.flag_or("mlp_bias", false))
        f.fail("mlp_bias", "is true; DeepSeek-V2's MLPs and experts have no bias");
    if (const auto act = f.text_or("hidden_act", "silu"); act != "silu")
        f.fail("hidden_act",
               "is " + detail::quoted(act) + "; the DeepSeek-V3 MLPs and experts are SwiGLU and need 'silu'");
    if (f.flag_or("attention_bias", false))
        f.fail("attention_bias", "is true; DeepSeek-V3 attention projections have no bias");
    if (f.flag_or("tie_word_embeddings", false))
        f.fail("tie_word_embeddings",
               "is true; DeepSeek-V3 keeps lm_head separate from embed_tokens, and so does "
               "moonmoe's model");
    if (const index_t freq = f.size_or("moe_layer_freq", 1); freq != 1)
        f.fail("moe_layer_freq", "is " + std::to_string(freq) +
                                     "; moonmoe puts an MoE block in every layer from "
                                     "first_k_dense_replace on (moe_layer_freq 1)");
}

/// rope_theta / rope_scaling (v4) or rope_parameters (v5) into `rope`; returns HF's cos/sin attention factor.
inline double read_rope(const ConfigFields& f, const nlohmann::json& j, HFConfig& out) {
    RopeConfig& rope = out.model.rope;
    rope.max_positions = f.size("max_position_embeddings");
    rope.interleave = f.flag_or("rope_interleave", true);
    if (out.architecture == HFArchitecture::deepseek_v2 && !rope.interleave)
        f.fail("rope_interleave",
               "is false; DeepseekV2ForCausalLM always rotates interleaved pairs (transformers' "
               "apply_rotary_emb ignores the field)");

    const bool has_scaling = f.has("rope_scaling") && !j["rope_scaling"].empty();
    const char* dict_key = has_scaling ? "rope_scaling" : f.has("rope_parameters") ? "rope_parameters" : nullptr;
    out.rope_parameters_format = dict_key && std::string_view(dict_key) == "rope_parameters";
    static const nlohmann::json empty = nlohmann::json::object();
    const nlohmann::json& dict = dict_key ? j[dict_key] : empty;
    if (!dict.is_object()) f.fail(dict_key, "must be an object or null, found " + describe_json(dict));
    const ConfigFields d(dict, out.source, std::string(dict_key ? dict_key : "rope_scaling") + ".");
    for (const char* layer_type : {"full_attention", "sliding_attention"})
        if (d.has(layer_type)) d.fail(layer_type, "is a per-layer-type RoPE; DeepSeek-V3 uses one RoPE for all layers");

    if (d.has("rope_theta")) rope.theta = d.number("rope_theta");
    else if (f.has("rope_theta"))
        rope.theta = f.number("rope_theta");
    else
        throw io_error(out.source + ": missing field rope_theta (top level or inside rope_parameters)");

    const std::string type = d.text_or("rope_type", d.text_or("type", "default"));
    if (type == "default") {
        rope.yarn = false;
        rope.factor = 1.0, rope.original_max_positions = 0;
        rope.beta_fast = rope.beta_slow = rope.mscale = rope.mscale_all_dim = 0.0;
        return 1.0;
    }
    if (type != "yarn")
        d.fail("rope_type", "is " + detail::quoted(type) + "; moonmoe supports 'yarn' and 'default' RoPE");
    if (!d.flag_or("truncate", true))
        d.fail("truncate", "is false; moonmoe's YaRN rounds the correction range to whole dimensions (truncate true)");
    rope.yarn = true;
    rope.factor = d.number("factor");
    // v5 lets a top-level original_max_position_embeddings win; v4 reads the one inside the dict. Refuse a file
    // on which the two disagree, and fall back to max_position_embeddings as both do.
    const auto inner = d.optional_size("original_max_position_embeddings");
    const auto outer = f.optional_size("original_max_position_embeddings");
    if (inner && outer && *inner != *outer)
        f.fail("original_max_position_embeddings",
               "is " + std::to_string(*outer) + " at the top level but " + std::to_string(*inner) + " in " + dict_key);
    rope.original_max_positions = inner ? *inner : outer ? *outer : rope.max_positions;
    rope.beta_fast = d.number_or("beta_fast", 32.0);  // HF: `get("beta_fast") or 32`
    rope.beta_slow = d.number_or("beta_slow", 1.0);
    if (rope.beta_fast == 0.0) rope.beta_fast = 32.0;
    if (rope.beta_slow == 0.0) rope.beta_slow = 1.0;
    rope.mscale = d.number_or("mscale", 0.0);  // absent: no softmax multiplier, as HF's get("mscale_all_dim", 0)
    rope.mscale_all_dim = d.number_or("mscale_all_dim", 0.0);

    // HF's cos/sin factor: explicit attention_factor, else mscale ratio when both are set, else mscale(factor, 1).
    double hf_factor = yarn_mscale(rope.factor, 1.0);
    if (const auto explicit_factor = d.optional_number("attention_factor")) hf_factor = *explicit_factor;
    else if (rope.mscale != 0.0 && rope.mscale_all_dim != 0.0)
        hf_factor = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim);
    const double ours = rope_attention_factor(rope);
    if (std::abs(hf_factor - ours) > 1e-12 * std::abs(hf_factor))
        throw io_error(out.source + ": " + dict_key + " gives a cos/sin attention factor of " +
                       std::to_string(hf_factor) +
                       " in transformers, but moonmoe computes mscale(factor, mscale) / mscale(factor, "
                       "mscale_all_dim) = " +
                       std::to_string(ours) + "; state mscale and mscale_all_dim explicitly");
    return hf_factor;
}

inline void read_moe(const ConfigFields& f, HFConfig& out) {
    MoEConfig& moe = out.model.moe;
    const bool v2 = out.architecture == HFArchitecture::deepseek_v2;
    moe.experts = f.size("n_routed_experts");
    moe.top_k = f.size("num_experts_per_tok");
    moe.shared = f.size("n_shared_experts");
    moe.expert_hidden = f.size("moe_intermediate_size");
    moe.routed_scale = v2 ? f.number_or("routed_scaling_factor", 1.0) : f.number("routed_scaling_factor");
    moe.norm_top_k = f.flag_or("norm_topk_prob", !v2);
    const std::string score = f.text_or("scoring_func", v2 ? "softmax" : "sigmoid");
    if (score != "sigmoid" && score != "softmax")
        f.fail("scoring_func", "is " + detail::quoted(score) + "; expected 'sigmoid' or 'softmax'");
    moe.score = score == "sigmoid" ? ScoreFunc::sigmoid : ScoreFunc::softmax;
    out.topk_method = f.text_or("topk_method", v2 ? "greedy" : "noaux_tc");
    if (v2) {
        // transformers' DeepseekV2TopkRouter: softmax, top-k of the scores (group-limited or not), times
        // routed_scaling_factor; it reads neither scoring_func nor norm_topk_prob. DeepSeek's own V2 code would
        // normalise (and then not scale) with norm_topk_prob true: such a file means two things, so it is refused.
        if (moe.score != ScoreFunc::softmax)
            f.fail("scoring_func",
                   "is " + detail::quoted(score) + "; DeepseekV2ForCausalLM scores experts with softmax");
        if (moe.norm_top_k)
            f.fail("norm_topk_prob",
                   "is true; transformers' DeepseekV2ForCausalLM never normalises the top-k weights "
                   "(DeepSeek's own V2 code would, and then skip routed_scaling_factor)");
        if (out.topk_method != "greedy" && out.topk_method != "group_limited_greedy")
            f.fail("topk_method", "is " + detail::quoted(out.topk_method) +
                                      "; DeepseekV2ForCausalLM routes by 'greedy' or 'group_limited_greedy'");
        moe.correction_bias = false;
        moe.group_score = GroupScoreFunc::max;
    } else {
        moe.group_score = GroupScoreFunc::top_two_sum;
        if (out.topk_method != "noaux_tc" && out.topk_method != "group_limited_greedy" && out.topk_method != "greedy")
            f.fail("topk_method", "is " + detail::quoted(out.topk_method) +
                                      "; expected 'noaux_tc', 'greedy' or 'group_limited_greedy'");
        moe.correction_bias = out.topk_method == "noaux_tc";
    }
    if (out.topk_method == "greedy") {  // top-k over all experts: no group limit (n_group may be absent or null)
        moe.groups = moe.top_groups = 1;
    } else {
        moe.groups = f.size("n_group");
        moe.top_groups = f.size("topk_group");
    }
}

/// Real fields that a model type uses -1.0 for (Dynamic) must not take that value from a file, where it would read
/// as "not fixed" and pass the rules.
inline void refuse_dynamic_sentinels(const HFConfig& out) {
    const ModelConfig& m = out.model;
    const auto check = [&](double v, const std::string& field) {
        if (is_dynamic(v)) throw io_error(out.source + ": " + field + " is -1, which is not a valid value");
    };
    const std::string dict = out.rope_parameters_format ? "rope_parameters." : "rope_scaling.";
    check(m.dims.norm_eps, "rms_norm_eps");
    check(m.moe.routed_scale, "routed_scaling_factor");
    check(m.rope.theta, "rope_theta");
    if (m.rope.yarn) {
        check(m.rope.factor, dict + "factor");
        check(m.rope.beta_fast, dict + "beta_fast");
        check(m.rope.beta_slow, dict + "beta_slow");
        check(m.rope.mscale, dict + "mscale");
        check(m.rope.mscale_all_dim, dict + "mscale_all_dim");
    }
}

inline void read_quantization(const ConfigFields& f, const nlohmann::json& j, HFConfig& out) {
    if (!f.has("quantization_config")) return;
    const auto& q = j["quantization_config"];
    if (!q.is_object()) f.fail("quantization_config", "must be an object, found " + describe_json(q));
    const ConfigFields qf(q, out.source, "quantization_config.");
    if (const auto method = qf.text_or("quant_method", ""); method != "fp8")
        qf.fail("quant_method",
                "is " + detail::quoted(method) + "; moonmoe reads block-FP8 ('fp8') or unquantised checkpoints");
    if (const auto fmt = qf.text_or("fmt", "e4m3"); fmt != "e4m3")
        qf.fail("fmt", "is " + detail::quoted(fmt) + "; moonmoe's FP8 weights are e4m3");
    std::array<index_t, 2> block = default_fp8_block;
    if (qf.has("weight_block_size")) {
        const auto& b = q["weight_block_size"];
        if (!b.is_array() || b.size() != 2)
            qf.fail("weight_block_size", "must be [rows, cols], found " + describe_json(b));
        block = {qf.as_size("weight_block_size", b[0]), qf.as_size("weight_block_size", b[1])};
        if (block[0] == 0 || block[1] == 0)
            qf.fail("weight_block_size", "must be positive, found " + detail::json_excerpt(b));
    }
    out.fp8_block = block;
}

inline void read_tokens(const ConfigFields& f, const nlohmann::json& j, HFConfig& out) {
    out.bos_token_id = f.optional_size("bos_token_id");
    if (f.has("eos_token_id")) {
        const auto& e = j["eos_token_id"];
        if (e.is_array())
            for (const auto& id : e) out.eos_token_ids.push_back(f.as_size("eos_token_id", id));
        else
            out.eos_token_ids.push_back(f.size("eos_token_id"));
    }
    out.torch_dtype = f.text_or("torch_dtype", f.text_or("dtype", ""));
}

}  // namespace detail

/// Parses the text of a config.json; `source` names it in every error message.
inline HFConfig parse_hf_config(std::string_view text, std::string source = "config.json") {
    HFConfig out;
    out.source = std::move(source);
    if (const auto at = detail::json_too_deep(text))
        throw io_error(out.source + ": nests deeper than " + std::to_string(detail::max_json_depth) +
                       " levels (at byte " + std::to_string(*at) + "); a config.json is a flat object");
    if (const auto nul = detail::json_nul_byte(text))
        throw io_error(out.source + ": has a NUL byte at offset " + std::to_string(*nul) + " of " +
                       std::to_string(text.size()) + "; a JSON config holds none (is the file truncated or padded?)");
    try {
        out.json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        throw io_error(out.source + ": not valid JSON: " + e.what());
    }
    const nlohmann::json& j = out.json;
    if (!j.is_object()) throw io_error(out.source + ": not a JSON object");
    const detail::ConfigFields f(j, out.source);

    detail::read_architecture(f, j, out);
    detail::read_unsupported_features(f, out.architecture);
    out.model = AnyDeepSeekV3::config;  // parallel, optimizer, backend: defaults; everything else from the file
    out.model.moe.from_file = {};
    out.model.rope.from_file = {};
    DimsConfig& dims = out.model.dims;
    dims.hidden = f.size("hidden_size");
    dims.layers = f.size("num_hidden_layers");
    dims.dense_layers = out.architecture == HFArchitecture::deepseek_v2 ? f.size_or("first_k_dense_replace", 0)
                                                                        : f.size("first_k_dense_replace");
    dims.vocab = f.size("vocab_size");
    dims.dense_hidden = f.size("intermediate_size");
    dims.norm_eps = f.number_or("rms_norm_eps", 1e-6);

    AttentionConfig& att = out.model.attention;
    att.kind = AttentionKind::mla;
    att.heads = att.kv_heads = f.size("num_attention_heads");
    if (const auto kv = f.optional_size("num_key_value_heads"); kv && *kv != att.heads)
        f.fail("num_key_value_heads", "is " + std::to_string(*kv) + " but MLA shares one latent across all " +
                                          std::to_string(att.heads) + " heads (num_attention_heads)");
    f.required("q_lora_rank");  // null is meaningful (no query compression), absent is not
    att.q_rank = f.optional_size("q_lora_rank").value_or(NoQCompression);
    att.kv_rank = f.size("kv_lora_rank");
    att.nope_dim = f.size("qk_nope_head_dim");
    att.rope_dim = f.size("qk_rope_head_dim");
    att.v_dim = f.size("v_head_dim");

    out.attention_factor = detail::read_rope(f, j, out);
    detail::read_moe(f, out);
    out.mtp_layers = f.size_or("num_nextn_predict_layers", 0);
    detail::read_quantization(f, j, out);
    detail::read_tokens(f, j, out);
    detail::refuse_dynamic_sentinels(out);
    try {
        validate(out.model, FieldNames::config_json);
    } catch (const config_error& e) {
        throw config_error(out.source + ": " + e.what());
    }
    return out;
}

/// Reads and parses a config.json file.
inline HFConfig read_hf_config(const std::filesystem::path& file) {
    constexpr std::size_t max_config_bytes = std::size_t(64) << 20;  // a config.json is a few kB
    return parse_hf_config(detail::read_small_file(file, max_config_bytes), file.string());
}

namespace detail {

/// The shortest decimal that reads back as `v` ("2.827", "1e-06", "50000").
inline std::string format_real(double v) {
    char buf[32];
    for (int precision = 6; precision <= 17; ++precision) {
        std::snprintf(buf, sizeof buf, "%.*g", precision, v);
        if (std::strtod(buf, nullptr) == v) break;
    }
    return buf;
}

inline const char* score_name(ScoreFunc s) { return s == ScoreFunc::sigmoid ? "Sigmoid" : "Softmax"; }
inline const char* group_score_name(GroupScoreFunc g) { return g == GroupScoreFunc::max ? "GroupMax" : "TopTwoSum"; }

}  // namespace detail

/// The configuration of a model type loaded from `file`: every value the type fixes must equal the file's (an
/// io_error names the config.json field, the file's value and the type's argument otherwise); Dynamic ones are
/// taken from it. The result passes validate() (config_error, prefixed with the file, otherwise).
inline ModelConfig resolve(const ModelConfig& type_config, const HFConfig& file) {
    if (type_config.attention.kind != AttentionKind::mla)
        throw io_error(file.source + ": the model type has MHA attention, but a DeepseekV3 checkpoint has MLA");
    ModelConfig out = type_config;
    const ModelConfig& f = file.model;
    const ModelConfig& t = type_config;
    const auto mismatch = [&](const std::string& field, const std::string& given, const std::string& fixed) {
        throw io_error(file.source + ": " + field + " is " + given + " but the model type fixes " + fixed);
    };
    const auto take = [&](index_t& slot, index_t fixed, index_t given, const char* field, const char* argument) {
        if (fixed != Dynamic && fixed != given) {
            const bool null_rank = std::string_view(field) == "q_lora_rank" && given == NoQCompression;
            std::string type_argument = argument;  // appended piece by piece: g++ 12 -O3 warns on "<" + string
            type_argument.append("<").append(std::to_string(fixed)).append(">");
            mismatch(field, null_rank ? "null" : std::to_string(given), type_argument);
        }
        slot = given;
    };
    const auto take_real = [&](double& slot, double fixed, double given, const std::string& field,
                               const char* argument) {
        if (!is_dynamic(fixed) && fixed != given)
            mismatch(field, detail::format_real(given), std::string(argument) + "<" + detail::format_real(fixed) + ">");
        slot = given;
    };
    const auto take_flag = [&](bool& slot, bool from_file, bool fixed, bool given, const std::string& field,
                               const std::string& given_text, const char* argument) {
        if (!from_file && fixed != given)
            mismatch(field, given_text, std::string(argument) + (fixed ? "<true>" : "<false>"));
        slot = given;
    };
    const auto boolean = [](bool b) { return std::string(b ? "true" : "false"); };

    take(out.dims.hidden, t.dims.hidden, f.dims.hidden, "hidden_size", "Hidden");
    take(out.dims.layers, t.dims.layers, f.dims.layers, "num_hidden_layers", "Layers");
    take(out.dims.dense_layers, t.dims.dense_layers, f.dims.dense_layers, "first_k_dense_replace", "DenseLayers");
    take(out.dims.vocab, t.dims.vocab, f.dims.vocab, "vocab_size", "Vocab");
    take(out.dims.dense_hidden, t.dims.dense_hidden, f.dims.dense_hidden, "intermediate_size", "DenseHidden");
    take(out.attention.heads, t.attention.heads, f.attention.heads, "num_attention_heads", "Heads");
    take(out.attention.q_rank, t.attention.q_rank, f.attention.q_rank, "q_lora_rank", "QRank");
    take(out.attention.kv_rank, t.attention.kv_rank, f.attention.kv_rank, "kv_lora_rank", "KVRank");
    take(out.attention.nope_dim, t.attention.nope_dim, f.attention.nope_dim, "qk_nope_head_dim", "NopeDim");
    take(out.attention.rope_dim, t.attention.rope_dim, f.attention.rope_dim, "qk_rope_head_dim", "RopeDim");
    take(out.attention.v_dim, t.attention.v_dim, f.attention.v_dim, "v_head_dim", "VDim");
    take(out.moe.experts, t.moe.experts, f.moe.experts, "n_routed_experts", "Experts");
    take(out.moe.top_k, t.moe.top_k, f.moe.top_k, "num_experts_per_tok", "TopK");
    take(out.moe.shared, t.moe.shared, f.moe.shared, "n_shared_experts", "Shared");
    take(out.moe.expert_hidden, t.moe.expert_hidden, f.moe.expert_hidden, "moe_intermediate_size", "ExpertHidden");
    take(out.moe.groups, t.moe.groups, f.moe.groups, "n_group", "Groups");
    take(out.moe.top_groups, t.moe.top_groups, f.moe.top_groups, "topk_group", "TopGroups");
    out.attention.kv_heads = out.attention.heads;
    take(out.rope.max_positions, t.rope.max_positions, f.rope.max_positions, "max_position_embeddings", "MaxPositions");
    take_real(out.dims.norm_eps, t.dims.norm_eps, f.dims.norm_eps, "rms_norm_eps", "NormEps");

    // Routing. The file's choices are named by the fields that carry them.
    const std::string method = detail::quoted(file.topk_method);
    if (!t.moe.from_file.score && t.moe.score != f.moe.score)
        mismatch("scoring_func", f.moe.score == ScoreFunc::sigmoid ? "'sigmoid'" : "'softmax'",
                 std::string("Score<") + detail::score_name(t.moe.score) + ">");
    out.moe.score = f.moe.score;
    take_flag(out.moe.correction_bias, t.moe.from_file.correction_bias, t.moe.correction_bias, f.moe.correction_bias,
              "topk_method", method + (f.moe.correction_bias ? " (with" : " (without") + " e_score_correction_bias)",
              "CorrectionBias");
    take_flag(out.moe.norm_top_k, t.moe.from_file.norm_top_k, t.moe.norm_top_k, f.moe.norm_top_k, "norm_topk_prob",
              boolean(f.moe.norm_top_k), "NormTopK");
    take_real(out.moe.routed_scale, t.moe.routed_scale, f.moe.routed_scale, "routed_scaling_factor", "RoutedScale");
    // How groups are scored matters only where groups limit the choice.
    const bool group_limited = out.moe.groups > 1 && out.moe.top_groups < out.moe.groups;
    if (group_limited && !t.moe.from_file.group_score && t.moe.group_score != f.moe.group_score)
        mismatch("topk_method",
                 method + (f.moe.group_score == GroupScoreFunc::max
                               ? " (groups scored by their largest score, DeepseekV2ForCausalLM)"
                               : " (groups scored by their two largest scores, DeepseekV3ForCausalLM)"),
                 std::string("GroupScore<") + detail::group_score_name(t.moe.group_score) + ">");
    out.moe.group_score = f.moe.group_score;

    // RoPE.
    take_real(out.rope.theta, t.rope.theta, f.rope.theta, "rope_theta", "Theta");
    take_flag(out.rope.interleave, t.rope.from_file.interleave, t.rope.interleave, f.rope.interleave, "rope_interleave",
              boolean(f.rope.interleave), "Interleave");
    const std::string dict = file.rope_parameters_format ? "rope_parameters." : "rope_scaling.";
    if (!t.rope.from_file.scaling) {
        if (t.rope.yarn != f.rope.yarn)
            mismatch(dict + (file.rope_parameters_format ? "rope_type" : "type"),
                     f.rope.yarn ? "'yarn'" : "'default' (or absent)", t.rope.yarn ? "YaRN<...>" : "NoScaling");
        if (f.rope.yarn) {
            take_real(out.rope.factor, t.rope.factor, f.rope.factor, dict + "factor", "Factor");
            take(out.rope.original_max_positions, t.rope.original_max_positions, f.rope.original_max_positions,
                 (dict + "original_max_position_embeddings").c_str(), "OriginalMaxPositions");
            take_real(out.rope.beta_fast, t.rope.beta_fast, f.rope.beta_fast, dict + "beta_fast", "BetaFast");
            take_real(out.rope.beta_slow, t.rope.beta_slow, f.rope.beta_slow, dict + "beta_slow", "BetaSlow");
            take_real(out.rope.mscale, t.rope.mscale, f.rope.mscale, dict + "mscale", "MScale");
            take_real(out.rope.mscale_all_dim, t.rope.mscale_all_dim, f.rope.mscale_all_dim, dict + "mscale_all_dim",
                      "MScaleAllDim");
        }
    }
    const index_t max_positions = out.rope.max_positions;
    const double theta = out.rope.theta;
    const bool interleave = out.rope.interleave;
    out.rope = f.rope;  // the scaling numbers (equal to the type's where it fixes them)
    out.rope.max_positions = max_positions, out.rope.theta = theta, out.rope.interleave = interleave;
    out.rope.from_file = {};
    out.moe.from_file = {};
    try {
        validate(out, FieldNames::config_json);
    } catch (const config_error& e) {
        throw config_error(file.source + ": " + e.what());
    }
    return out;
}

}  // namespace moonmoe
