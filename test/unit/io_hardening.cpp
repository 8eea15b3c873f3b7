// Crafted and malformed inputs an outside review found (issue "Hardening"): each row of the tables below is one
// input and the fragments its error message must contain. Before the fixes these inputs crashed (SIGSEGV,
// heap-buffer-overflow, stack overflow, out-of-bounds reads, UBSan reports) or were silently accepted.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <moonmoe/moonmoe.hpp>

#include "../../examples/example_support.hpp"
#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_hardening {

using namespace moonmoe;
using namespace io_testing;

namespace {

nlohmann::json tiny_config(const char* model = "tiny_k2") {
    return nlohmann::json::parse(read_file(test_data(std::string(model) + "/config.json")));
}

/// A scratch checkpoint: `model`'s config.json as edited by `edit`, and its weights as rewritten by `rewrite`
/// (which gets every record and returns whether to keep it, possibly after adding others to the writer).
template <class Rewrite>
fs::path scratch_checkpoint(const std::string& name, const char* model, const nlohmann::json& config,
                            Rewrite&& rewrite) {
    const fs::path dir = scratch_dir("hardening_" + name);
    write_file(dir / "config.json", config.dump(2));
    SafetensorsFile in(test_data(std::string(model) + "/model.safetensors"));
    SafetensorsWriter out;
    for (const TensorRecord& r : in.records()) {
        std::vector<std::byte> bytes(r.bytes.begin(), r.bytes.end());
        DType dtype = r.dtype;
        if (rewrite(r, dtype, bytes, out)) out.add(r.name, dtype, r.shape, bytes);
    }
    out.write(dir / "model.safetensors");
    return dir;
}

fs::path scratch_checkpoint(const std::string& name, const char* model, const nlohmann::json& config) {
    return scratch_checkpoint(name, model, config, [](auto&&...) { return true; });
}

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

}  // namespace

TEST_CASE("crafted config.json values get an error naming the field and the value") {
    struct Case {
        const char* field;
        nlohmann::json value;
        std::vector<std::string> fragments;
    };
    const std::int64_t two62 = std::int64_t(1) << 62;
    const std::vector<Case> cases = {
        {"topk_group", two62, {"topk_group = 4611686018427387904", "TopGroups must be between 1 and Groups"}},
        // INT64_MAX in a broken rule once went through a double into the message (UBSan; found by fuzz_hf_config).
        {"num_experts_per_tok", INT64_MAX, {"num_experts_per_tok = 9223372036854775807"}},
        {"num_experts_per_tok",
         9,
         {"MoE: TopK must not exceed Experts", "num_experts_per_tok = 9", "n_routed_experts = 8"}},
        {"max_position_embeddings", 0, {"max_position_embeddings = 0", "must be at least 1"}},
        {"rms_norm_eps", 1e-50, {"rms_norm_eps = 1e-50", "NormEps must be positive and finite in float"}},
        {"rms_norm_eps", -1e-6, {"rms_norm_eps = -1e-06"}},
        {"n_group", 3, {"Groups must divide Experts evenly", "n_group = 3", "n_routed_experts = 8"}},
        {"qk_rope_head_dim", 7, {"RopeDim > 0 and even", "qk_rope_head_dim = 7"}},
        {"first_k_dense_replace",
         4,
         {"DenseLayers must be between 0 and Layers", "first_k_dense_replace = 4", "num_hidden_layers = 3"}},
        {"routed_scaling_factor", 1e308 * 10, {"routed_scaling_factor"}},  // 1e309 -> inf in the dump: refused
    };
    for (const Case& c : cases) {
        nlohmann::json config = tiny_config();
        config[c.field] = c.value;
        const std::string text = config.dump();
        CAPTURE(c.field);
        std::vector<std::string_view> parts(c.fragments.begin(), c.fragments.end());
        const std::string message = error_of([&] { parse_hf_config(text, "crafted/config.json"); });
        CAPTURE(message);
        CHECK(message.find("crafted/config.json") != std::string::npos);
        for (std::string_view part : parts) {
            CAPTURE(part);
            CHECK(message.find(part) != std::string::npos);
        }
    }
    // A non-finite number written into the text (JSON has no NaN; 1e999 parses as infinity).
    std::string text = tiny_config().dump();
    text.replace(text.find("\"rope_theta\""), 0, "\"rope_theta\":1e999,");
    check_error([&] { parse_hf_config(text, "inf.json"); }, {"inf.json", "1e999"});
}

TEST_CASE("sizes whose products overflow or exceed memory are refused before anything is allocated") {
    const std::int64_t two62 = std::int64_t(1) << 62;
    SUBCASE("hidden_size 2^62 with vocab_size 1 (once a zero-byte allocation written through)") {
        for (std::int64_t hidden : {two62, two62 + 1}) {
            nlohmann::json config = tiny_config();
            config["hidden_size"] = hidden;
            config["vocab_size"] = 1;
            const fs::path dir = scratch_checkpoint("hidden_2_62", "tiny_k2", config);
            check_error([&] { load_transformer<AnyDeepSeekV3>(dir); },
                        {"config.json", "hidden_size " + std::to_string(hidden)});
        }
    }
    SUBCASE("a product of fields beyond 64 bits names the fields") {
        nlohmann::json config = tiny_config();
        config["num_attention_heads"] = config["num_key_value_heads"] = two62;
        config["kv_lora_rank"] = 1024;
        const fs::path dir = scratch_checkpoint("heads_2_62", "tiny_k2", config);
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir); },
                    {"num_attention_heads 4611686018427387904", "more elements than fit in 64 bits"});
    }
    SUBCASE("a sum of fields beyond 64 bits (found by fuzz/hf_config)") {
        for (const char* field : {"qk_nope_head_dim", "kv_lora_rank", "v_head_dim"}) {
            nlohmann::json config = tiny_config();
            config[field] = std::numeric_limits<std::int64_t>::max();
            CAPTURE(field);
            check_error([&] { check_memory_budget(parse_hf_config(config.dump()).model, "c.json", 1e9); },
                        {"c.json", field, "overflows 64 bits"});
        }
        nlohmann::json config = tiny_config();
        config["num_hidden_layers"] = two62;
        check_error([&] { check_memory_budget(parse_hf_config(config.dump()).model, "c.json", 1e9); },
                    {"e+", "parameters", "memory_limit"});
    }
    SUBCASE("ten million layers") {
        nlohmann::json config = tiny_config();
        config["num_hidden_layers"] = 10'000'000;
        const fs::path dir = scratch_checkpoint("layers_1e7", "tiny_k2", config);
        // The budget is checked against a limit here so the test does not depend on this machine's memory.
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir, LoadOptions{.memory_limit = 8e9}); },
                    {"the model needs", "TB", "memory_limit", "num_hidden_layers"});
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir); }, {"the model needs", "available"});
    }
    SUBCASE("the estimate is exact for the tiny model, and a limit below it refuses it") {
        const MemoryEstimate m =
            estimate_model_memory(parse_hf_config(read_file(test_data("tiny_k2/config.json"))).model, "x");
        nn::Transformer<> model = load_transformer<AnyDeepSeekV3>(test_data("tiny_k2"));
        double parameters = 0;
        model.visit_params([&](const ParamRef& p) { parameters += double(p.numel()); });
        CHECK(m.parameters == parameters);
        check_error([&] { load_transformer<AnyDeepSeekV3>(test_data("tiny_k2"), LoadOptions{.memory_limit = 1e5}); },
                    {"more than the", "memory_limit"});
    }
    SUBCASE("tensors and shapes refuse overflowing extents") {
        check_error([] { Tensor<float, 2> t({two62, 4}); }, {"[4611686018427387904, 4]", "64 bits"});
        check_error([] { Tensor<float, 1> t({two62}); }, {"Tensor [4611686018427387904]", "64-bit size"});
        CHECK_FALSE(checked_product(std::vector<index_t>{two62, 2}).has_value());
        CHECK(checked_product(std::vector<index_t>{two62, 1}).value() == two62);
        TensorRecord r{"w", DType::f32, {two62, two62}, {}};
        check_error([&] { (void)r.numel(); }, {"'w'", "overflows"});
    }
}

TEST_CASE("FP8 block sizes near INT64_MAX cannot make an empty scale pass") {
    const std::int64_t huge = std::numeric_limits<std::int64_t>::max() - 1;
    const std::vector<index_t> weight_shape{96, 64};
    const auto s = fp8_scale_shape(weight_shape, {huge, huge});
    CHECK(s[0] == 1);
    CHECK(s[1] == 1);
    CHECK(fp8_scale_shape(weight_shape, {16, 16}) == std::array<index_t, 2>{6, 4});

    nlohmann::json config = tiny_config("tiny_k2_fp8");
    config["quantization_config"]["weight_block_size"] = {huge, huge};
    const fs::path dir = scratch_checkpoint("fp8_huge_block", "tiny_k2_fp8", config);
    check_error([&] { load_transformer<AnyDeepSeekV3>(dir); }, {"_scale_inv", "needs F32 [1, 1]"});

    // An empty scale beside a non-empty weight: a shape error, never a read.
    const std::vector<std::byte> codes(16, std::byte{0x38});
    const TensorRecord weight{"w", DType::f8_e4m3, {4, 4}, codes};
    const TensorRecord empty_scale{"w_scale_inv", DType::f32, {0, 0}, {}};
    check_error([&] { dequantize_fp8(weight, empty_scale, {2, 2}); }, {"'w_scale_inv'", "needs F32 [2, 2]"});
}

TEST_CASE("a non-finite FP8 block scale is named as the scale, whatever check_finite says") {
    // issue 29: a NaN in weight_scale_inv was reported (with check_finite) as a NaN in the weight
    const std::vector<std::byte> codes(16, std::byte{0x38});  // E4M3 1.0
    const TensorRecord weight{"w", DType::f8_e4m3, {4, 4}, codes};
    for (const float bad : {NAN, INFINITY}) {
        const std::vector<float> scales = {1.0f, 2.0f, bad, 0.5f};
        const TensorRecord scale{"w_scale_inv", DType::f32, {2, 2}, std::as_bytes(std::span(scales))};
        check_error([&] { dequantize_fp8(weight, scale, {2, 2}); },
                    {"tensor 'w_scale_inv' holds", "at [1, 0]", "block of FP8 weight 'w'", "must be finite"});
    }
    const std::vector<float> good = {1.0f, 2.0f, 4.0f, 0.5f};
    const TensorRecord scale{"w_scale_inv", DType::f32, {2, 2}, std::as_bytes(std::span(good))};
    CHECK(dequantize_fp8(weight, scale, {2, 2})[15] == 0.5f);
}

TEST_CASE("to_f32 of an empty tensor does not touch memory") {
    const TensorRecord empty{"e", DType::f32, {0, 3}, {}};
    CHECK(to_f32(empty).empty());
    const TensorRecord empty_bf16{"e", DType::bf16, {0}, {}};
    CHECK(to_f32(empty_bf16).empty());
}

TEST_CASE("malformed safetensors headers: a table of inputs and the messages they get") {
    const std::string valid = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    struct Case {
        const char* what;
        std::string header;
        std::vector<std::string> fragments;  // empty: must load
    };
    std::string deep_shape = R"({"t":{"dtype":"F32","shape":)" + nested(100'000) + R"(,"data_offsets":[0,8]}})";
    std::string deep_meta = R"({"__metadata__":)" + std::string(100'000, '{') + std::string(100'000, '}') + "}";
    const std::vector<Case> cases = {
        {"valid", valid, {}},
        {"space padding (what the reference writes)", valid + "      ", {}},
        {"NUL and garbage after the header",
         valid + std::string(1, '\0') + "garbage",
         {"NUL byte at offset " + std::to_string(8 + valid.size())}},
        {"NUL padding", valid + std::string(5, '\0'), {"NUL byte", "padded with spaces only"}},
        {"UTF-8 byte-order mark", "\xEF\xBB\xBF" + valid, {"byte-order mark"}},
        {"leading space", " " + valid, {"must start with '{'"}},
        {"a field twice in one entry",
         R"({"t":{"dtype":"F16","dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
         {"tensor 't'", "field 'dtype' appears twice"}},
        {"shape twice",
         R"({"t":{"dtype":"F32","shape":[4],"shape":[2],"data_offsets":[0,8]}})",
         {"field 'shape' appears twice"}},
        {"a metadata key twice",
         R"({"__metadata__":{"a":"1","a":"2"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
         {"__metadata__", "field 'a' appears twice"}},
        {"100k-deep shape", deep_shape, {"nests deeper than 128"}},
        {"100k-deep metadata", deep_meta, {"nests deeper than 128"}},
        {"a NUL inside a name",
         R"({"a\u0000b":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
         {"tensor 'a\\x00b'", "needs 12"}},
        {"an empty name", R"({"":{"dtype":"X","shape":[2],"data_offsets":[0,8]}})", {"tensor ''", "unknown dtype 'X'"}},
        {"a quote in a name", R"({"it's":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", {"tensor 'it\\'s'"}},
        // issue 29: metadata is not a tensor; a shape of no elements that overflows on the way (numel() threw later)
        {"__metadata__ twice",
         R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
         {"the __metadata__ object appears twice"}},
        {"[2^62, 2, 0]",
         R"({"t":{"dtype":"F32","shape":[4611686018427387904,2,0],"data_offsets":[0,0]},"u":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
         {"tensor 't'", "shape [4611686018427387904,2,0] overflows"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        const std::string file = raw_safetensors(c.header, 8);
        const auto bytes = std::as_bytes(std::span(file.data(), file.size()));
        if (c.fragments.empty()) {
            CHECK(detail::parse_safetensors(bytes, "x.safetensors").records.size() == 1);
            continue;
        }
        const std::string message = error_of([&] { detail::parse_safetensors(bytes, "x.safetensors"); });
        CAPTURE(message);
        CHECK(message.size() < 600);
        for (const std::string& part : c.fragments) {
            CAPTURE(part);
            CHECK(message.find(part) != std::string::npos);
        }
    }
}

TEST_CASE("names in messages are quoted, escaped and bounded") {
    CHECK(detail::quoted("") == "''");
    CHECK(detail::quoted(std::string("a\0b", 3)) == "'a\\x00b'");
    CHECK(detail::quoted("it's") == "'it\\'s'");
    const std::string megabyte(1 << 20, 'x');
    const std::string q = detail::quoted(megabyte);
    CHECK(q.size() < 200);
    CHECK(q.find("(1048576 bytes)") != std::string::npos);

    // A megabyte name asked of a real file: bounded message, no quadratic edit distance over it.
    const fs::path dir = scratch_dir("hardening_long_name");
    write_file(dir / "m.safetensors", raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8));
    SafetensorsFile f(dir / "m.safetensors");
    const std::string message = error_of([&] { f.at(megabyte); });
    CHECK(message.size() < 400);
    CHECK(message.find("(1048576 bytes)") != std::string::npos);
}

TEST_CASE("checkpoint contents that do not fit config.json are refused, not silently used") {
    SUBCASE("a _scale_inv beside a weight that is not FP8") {
        const fs::path dir =
            scratch_checkpoint("scale_beside_f32", "tiny_k2", tiny_config(),
                               [](const TensorRecord& r, DType&, std::vector<std::byte>&, SafetensorsWriter& out) {
                                   if (r.name == "model.layers.0.mlp.up_proj.weight") {
                                       const std::vector<float> one(24, 1.0f);
                                       out.add_f32(r.name + "_scale_inv", {6, 4}, one);
                                   }
                                   return true;
                               });
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir); }, {"'model.layers.0.mlp.up_proj.weight'", "not FP8",
                                                                    "'model.layers.0.mlp.up_proj.weight_scale_inv'"});
    }
    SUBCASE("a _scale_inv of a _scale_inv (fuzz_checkpoint's finding: loaded, the tensor ignored)") {
        const std::string weight = "model.layers.0.self_attn.q_a_proj.weight";
        const fs::path dir =
            scratch_checkpoint("scale_of_scale", "tiny_k2_fp8", tiny_config("tiny_k2_fp8"),
                               [&](const TensorRecord& r, DType&, std::vector<std::byte>&, SafetensorsWriter& out) {
                                   if (r.name == weight + "_scale_inv") {
                                       const std::vector<float> one(8, 1.0f);
                                       out.add_f32(r.name + "_scale_inv", {2, 4}, one);
                                   }
                                   return true;
                               });
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir); },
                    {"tensors the model has no parameter for", "'" + weight + "_scale_inv_scale_inv'"});
    }
    SUBCASE("F8_E5M2 weights in an E4M3 checkpoint (NaN logits before)") {
        const fs::path dir = scratch_checkpoint("e5m2", "tiny_k2_fp8", tiny_config("tiny_k2_fp8"),
                                                [](const TensorRecord& r, DType& dtype, auto&&...) {
                                                    if (r.dtype == DType::f8_e4m3) dtype = DType::f8_e5m2;
                                                    return true;
                                                });
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir); }, {"is F8_E5M2", "E4M3"});
    }
    SUBCASE("a layer that num_hidden_layers leaves out is not taken for an MTP module") {
        nlohmann::json config = tiny_config();
        config["num_hidden_layers"] = 2;
        config["num_nextn_predict_layers"] = 1;
        const fs::path dir = scratch_checkpoint("dropped_layer", "tiny_k2", config);
        check_error([&] { load_transformer<AnyDeepSeekV3>(dir); },
                    {"layer 2", "no MTP tensors", "num_hidden_layers 2 is smaller than the checkpoint"});
    }
    SUBCASE("a real MTP layer (with eh_proj) is still skipped as transformers skips it") {
        nlohmann::json config = tiny_config();
        config["num_nextn_predict_layers"] = 1;
        const fs::path dir =
            scratch_checkpoint("mtp_layer", "tiny_k2", config,
                               [](const TensorRecord& r, DType&, std::vector<std::byte>&, SafetensorsWriter& out) {
                                   if (r.name == "lm_head.weight") {
                                       const std::vector<float> w(64 * 128, 0.5f), g(64, 1.0f);
                                       out.add_f32("model.layers.3.eh_proj.weight", {64, 128}, w);
                                       out.add_f32("model.layers.3.enorm.weight", {64}, g);
                                       out.add_f32("model.layers.3.hnorm.weight", {64}, g);
                                   }
                                   return true;
                               });
        CHECK_NOTHROW(load_transformer<AnyDeepSeekV3>(dir));
    }
    SUBCASE("NaN and Inf weights are named when the loader is asked to check") {
        for (float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
            const fs::path dir =
                scratch_checkpoint("nan_weight", "tiny_k2", tiny_config(),
                                   [&](const TensorRecord& r, DType&, std::vector<std::byte>& bytes, auto&&) {
                                       if (r.name == "model.layers.1.self_attn.o_proj.weight")
                                           std::memcpy(bytes.data() + 4 * (2 * r.shape[1] + 5), &bad, 4);
                                       return true;
                                   });
            CHECK_NOTHROW(load_transformer<AnyDeepSeekV3>(dir));  // off by default in the library
            check_error([&] { load_transformer<AnyDeepSeekV3>(dir, LoadOptions{.check_finite = true}); },
                        {"'model.layers.1.self_attn.o_proj.weight'", std::isnan(bad) ? "NaN" : "infinity", "[2, 5]"});
            check_error([&] { load_transformer<AnyDeepSeekV3>(dir, example::load_options); }, {"o_proj"});
        }
    }
}

TEST_CASE("token ids out of range are reported as given, not clamped") {
    const char* argv[] = {"prog", "1", "99999999999999999999999"};
    check_error([&] { example::token_ids(3, const_cast<char**>(argv), 1); },
                {"'99999999999999999999999'", "outside the vocabulary"});
    const char* negative[] = {"prog", "-3"};
    check_error([&] { example::token_ids(2, const_cast<char**>(negative), 1); }, {"'-3'", "non-negative"});

    nn::Transformer<> model = load_transformer<AnyDeepSeekV3>(test_data("tiny_k2"));
    const std::vector<index_t> ids{1, std::int64_t(1) << 40};
    check_error([&] { model.train_step(ids.data(), nn::TokenLayout::sequences(1, 2)); },
                {"token id 1099511627776", "[0, 256)"});
}

}  // namespace unit_io_hardening
