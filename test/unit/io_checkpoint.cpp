// io/checkpoint.hpp against the checkpoints made by tools/make_reference.py (torch 2.15, transformers 5.23,
// safetensors 0.8): FP8 dequantisation equals DeepSeek's weight_dequant as computed by torch, BF16 widening equals
// torch's .float(), a sharded checkpoint equals the single-file one. Error cases are built in the binary dir.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <moonmoe/config.hpp>
#include <moonmoe/io/checkpoint.hpp>

#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_checkpoint {

using namespace moonmoe;
using namespace io_testing;

namespace {

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A copy of a test-data checkpoint directory in the binary dir, for tests that break it.
fs::path copy_of(const std::string& data_dir, const std::string& scratch_name) {
    const auto dir = scratch_dir(scratch_name);
    fs::copy(test_data(data_dir), dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
    for (const auto& e : fs::directory_iterator(dir))  // the committed files may be read-only
        fs::permissions(e.path(), fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
    return dir;
}

/// Rewrites `file` with `keep(name)` tensors only, plus extra tensors `add` may put in the writer.
template <class Keep, class Add>
void rewrite(const fs::path& file, Keep keep, Add add) {
    SafetensorsWriter w;
    {
        const SafetensorsFile in(file);
        for (const auto& [k, v] : in.metadata()) w.metadata(k, v);
        for (const auto& r : in.records())
            if (keep(r.name)) w.add(r.name, r.dtype, r.shape, r.bytes);
    }
    add(w);
    w.write(file);
}

}  // namespace

TEST_CASE("io: tiny_k2_fp8 dequantises to exactly torch's weight_dequant (dequantized.safetensors)") {
    Checkpoint ck(test_data("tiny_k2_fp8"));
    REQUIRE(ck.config().fp8_block.has_value());
    CHECK(*ck.config().fp8_block == std::array<index_t, 2>{16, 16});
    const SafetensorsFile expected(test_data("tiny_k2_fp8/dequantized.safetensors"));
    REQUIRE(expected.size() > 0);
    for (const auto& r : expected.records()) {
        CAPTURE(r.name);
        REQUIRE(ck.record(r.name).dtype == DType::f8_e4m3);
        CHECK(bitwise_equal(ck.read_f32(r.name, r.shape), to_f32(r)));
    }
    // Everything else is unquantised; reading it leaves nothing unused (the _scale_inv companions count as read).
    CHECK(!ck.unused().empty());
    for (const std::string& name : ck.unused())
        if (!name.ends_with("_scale_inv")) ck.read_f32(name, ck.record(name).shape);
    CHECK(ck.unused().empty());
}

TEST_CASE("io: tiny_k2_bf16 widens to exactly torch's .float() (as_f32.safetensors)") {
    Checkpoint ck(test_data("tiny_k2_bf16"));
    const SafetensorsFile expected(test_data("tiny_k2_bf16/as_f32.safetensors"));
    CHECK(ck.names() == expected.names());
    for (const auto& r : expected.records()) {
        CAPTURE(r.name);
        CHECK(bitwise_equal(ck.read_f32(r.name, r.shape), to_f32(r)));
    }
    CHECK(ck.unused().empty());
    CHECK(ck.files() == std::vector<std::string>{(test_data("tiny_k2_bf16") / "model.safetensors").string()});
}

TEST_CASE("io: tiny_v3_sharded gives exactly the tensors of tiny_v3/model.safetensors") {
    Checkpoint sharded(test_data("tiny_v3_sharded"));
    CHECK(sharded.files().size() == 3);
    const SafetensorsFile single(test_data("tiny_v3/model.safetensors"));
    CHECK(sharded.names() == single.names());
    for (const auto& r : single.records()) {
        CAPTURE(r.name);
        CHECK(sharded.record(r.name).dtype == r.dtype);
        CHECK(bitwise_equal(sharded.read_f32(r.name, r.shape), to_f32(r)));
    }
    CHECK(sharded.unused().empty());
    check_same_config(resolve(TinyV3::config, sharded.config()), TinyV3::config);
}

TEST_CASE("io: checkpoint read errors name the tensor, the shapes and the directory") {
    Checkpoint ck(test_data("tiny_k2"));
    const std::string dir = test_data("tiny_k2").string();
    check_error([&] { ck.read_f32("model.layers.0.mlp.gate.weight", {8, 64}); },
                {dir, "no tensor 'model.layers.0.mlp.gate.weight'", "closest: "});
    check_error([&] { ck.read_f32("model.layers.0.mlp.gate_proj.weight", {64, 96}); },
                {"tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64], expected [64, 96]"});
    check_error([&] { ck.read_f32("model.norm.weight", {64, 1}); },
                {"'model.norm.weight' has shape [64], expected [64, 1]"});
    std::vector<float> small(3);
    const index_t shape[] = {64};
    check_error([&] { ck.read_f32("model.norm.weight", shape, small); }, {"64 elements", "output buffer 3"});
    CHECK(ck.unused().size() == ck.names().size());  // failed reads count for nothing
    ck.mark_used("lm_head.weight");
    CHECK(ck.unused().size() == ck.names().size() - 1);

    check_error([] { Checkpoint c(fs::path(MOONMOE_TEST_BINARY_DIR) / "io_scratch" / "nowhere"); },
                {"not a checkpoint directory"});
    const auto empty = scratch_dir("checkpoint_empty");
    check_error([&] { Checkpoint c(empty); }, {(empty / "config.json").string(), "cannot open"});
    fs::copy_file(test_data("tiny_k2/config.json"), empty / "config.json");
    check_error([&] { Checkpoint c(empty); }, {empty.string(), "no model.safetensors or model.safetensors.index.json"});
}

TEST_CASE("io: broken checkpoint files are refused with the file named") {
    const auto dir = copy_of("tiny_k2", "checkpoint_truncated");
    const auto model = dir / "model.safetensors";
    const std::string whole = read_file(model);

    write_file(model, whole.substr(0, whole.size() / 2));  // cut in half: the header survives, the data does not
    check_error([&] { Checkpoint c(dir); }, {model.string(), "end beyond the data section"});

    write_file(model, whole.substr(0, 8 + 100));  // the header itself cut
    check_error([&] { Checkpoint c(dir); }, {model.string(), "is larger than the rest of the file"});

    std::string garbage = whole;
    for (std::size_t i = 8; i < 40; ++i) garbage[i] = '#';
    write_file(model, garbage);
    check_error([&] { Checkpoint c(dir); }, {model.string(), "must start with '{'"});
    garbage = whole;
    garbage[40] = '#';  // inside the JSON
    write_file(model, garbage);
    check_error([&] { Checkpoint c(dir); }, {model.string(), "not valid JSON"});

    std::string too_long = whole;
    const std::uint64_t n = whole.size();
    std::memcpy(too_long.data(), &n, 8);
    write_file(model, too_long);
    check_error([&] { Checkpoint c(dir); }, {model.string(), "header length " + std::to_string(n)});

    write_file(model, "short");
    check_error([&] { Checkpoint c(dir); }, {model.string(), "shorter than the 8-byte header length"});
}

TEST_CASE("io: unused() reports extra tensors, a non-float tensor is not a weight") {
    const auto dir = copy_of("tiny_k2", "checkpoint_extra");
    const std::vector<std::int64_t> ids{1, 2, 3};
    const std::vector<float> extra{0.5f};
    rewrite(
        dir / "model.safetensors", [](const std::string&) { return true; },
        [&](SafetensorsWriter& w) {
            w.add_values<std::int64_t>("model.position_ids", {3}, ids);
            w.add_f32("model.layers.0.self_attn.rotary_emb.inv_freq", {1}, extra);
        });
    Checkpoint ck(dir);
    const SafetensorsFile original(test_data("tiny_k2/model.safetensors"));
    for (const auto& r : original.records()) ck.read_f32(r.name, r.shape);
    CHECK(ck.unused() ==
          std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq", "model.position_ids"});
    check_error([&] { ck.read_f32("model.position_ids", {3}); },
                {(dir / "model.safetensors").string(), "'model.position_ids' is I64", "floating-point"});
}

TEST_CASE("io: a missing _scale_inv companion, shard or sharded tensor is named") {
    {
        const auto dir = copy_of("tiny_k2_fp8", "checkpoint_no_scale");
        const std::string weight = "model.layers.0.self_attn.q_a_proj.weight";
        rewrite(
            dir / "model.safetensors", [&](const std::string& name) { return name != weight + "_scale_inv"; },
            [](SafetensorsWriter&) {});
        Checkpoint ck(dir);
        check_error([&] { ck.read_f32(weight, ck.record(weight).shape); },
                    {"'" + weight + "' is F8_E4M3", "no '" + weight + "_scale_inv'"});
    }
    {
        const auto dir = copy_of("tiny_k2_fp8", "checkpoint_bad_scale");
        const std::string weight = "model.layers.0.self_attn.q_a_proj.weight";
        const std::vector<float> ones(4, 1.0f);
        rewrite(
            dir / "model.safetensors", [&](const std::string& name) { return name != weight + "_scale_inv"; },
            [&](SafetensorsWriter& w) { w.add_f32(weight + "_scale_inv", {2, 2}, ones); });
        Checkpoint ck(dir);
        check_error([&] { ck.read_f32(weight, ck.record(weight).shape); },
                    {(dir / "model.safetensors").string(), weight + "_scale_inv' is F32 [2, 2]", "needs F32 [2, 4]"});
    }
    {
        const auto dir = copy_of("tiny_v3_sharded", "checkpoint_missing_shard");
        fs::remove(dir / "model-00002-of-00003.safetensors");
        check_error([&] { Checkpoint c(dir); }, {(dir / "model.safetensors.index.json").string(),
                                                 "shard 'model-00002-of-00003.safetensors'", "missing"});
    }
    {
        const auto dir = copy_of("tiny_v3_sharded", "checkpoint_index_lies");
        auto index = nlohmann::json::parse(read_file(dir / "model.safetensors.index.json"));
        index["weight_map"]["model.layers.9.mlp.gate.weight"] = "model-00001-of-00003.safetensors";
        write_file(dir / "model.safetensors.index.json", index.dump(2));
        check_error([&] { Checkpoint c(dir); },
                    {"maps tensor 'model.layers.9.mlp.gate.weight' to shard 'model-00001-of-00003.safetensors', which "
                     "does not hold it"});
        index["weight_map"].erase("model.layers.9.mlp.gate.weight");
        index["weight_map"].erase("lm_head.weight");
        write_file(dir / "model.safetensors.index.json", index.dump(2));
        check_error([&] { Checkpoint c(dir); }, {"holds tensor 'lm_head.weight'", "does not list"});
        index["weight_map"]["lm_head.weight"] = "../model-00001-of-00003.safetensors";
        write_file(dir / "model.safetensors.index.json", index.dump(2));
        check_error([&] { Checkpoint c(dir); }, {"is not a file in"});
        write_file(dir / "model.safetensors.index.json", "{\"metadata\": {}}");
        check_error([&] { Checkpoint c(dir); }, {"no \"weight_map\" object"});
    }
}

TEST_CASE("io: write_checkpoint saves f32 tensors back under the same names, exactly or rounded like torch") {
    Checkpoint source(test_data("tiny_k2_fp8"));
    std::vector<std::vector<float>> values;
    std::vector<NamedTensor> tensors;
    std::vector<std::string> names;
    for (const std::string& name : source.names())
        if (!name.ends_with("_scale_inv")) names.push_back(name);
    values.reserve(names.size());
    for (const std::string& name : names) {
        const auto& shape = source.record(name).shape;
        values.push_back(source.read_f32(name, shape));
        tensors.push_back({name, shape, values.back()});
    }
    const auto dir = scratch_dir("checkpoint_written");
    write_checkpoint(dir / "f32", source.config(), tensors);
    write_checkpoint(dir / "bf16", source.config(), tensors, DType::bf16);

    Checkpoint f32(dir / "f32");
    CHECK(f32.names() == names);
    CHECK(!f32.config().fp8_block.has_value());  // the weights are no longer FP8
    CHECK(f32.config().torch_dtype == "float32");
    check_same_config(resolve(TinyK2::config, f32.config()), TinyK2::config);
    CHECK(SafetensorsFile(dir / "f32" / "model.safetensors").metadata().at("format") == "pt");
    Checkpoint bf(dir / "bf16");
    CHECK(bf.config().torch_dtype == "bfloat16");
    for (std::size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i]);
        const auto& shape = tensors[i].shape;
        CHECK(bitwise_equal(f32.read_f32(names[i], shape), values[i]));
        CHECK(bf.record(names[i]).dtype == DType::bf16);
        std::vector<float> rounded;
        for (float x : values[i]) rounded.push_back(bf16::from_float(x).to_float());
        CHECK(bitwise_equal(bf.read_f32(names[i], shape), rounded));
    }
    CHECK(f32.unused().empty());
    check_error([&] { write_tensors(dir / "x.safetensors", tensors, DType::i32); }, {"cannot store tensors as I32"});
    std::vector<NamedTensor> bad{{"w", {2, 2}, values[0]}};
    check_error([&] { write_tensors(dir / "x.safetensors", bad); },
                {(dir / "x.safetensors").string(), "'w'", "needs 16 bytes"});
}

TEST_CASE("io: Shards::as_needed opens a shard when a tensor in it is first read, and needs no other") {
    const auto dir = copy_of("tiny_v3_sharded", "checkpoint_as_needed");
    fs::remove(dir / "model-00002-of-00003.safetensors");  // layers 1-2 (tiny_v3_sharded's second shard)
    check_error([&] { Checkpoint c(dir); }, {"shard 'model-00002-of-00003.safetensors'", "missing"});
    Checkpoint ck(dir, Checkpoint::Shards::as_needed);
    CHECK(ck.files().empty());
    CHECK(ck.contains("model.layers.2.mlp.experts.0.up_proj.weight"));  // the index answers without the shard
    const SafetensorsFile single(test_data("tiny_v3/model.safetensors"));
    const TensorRecord& head = single.at("lm_head.weight");
    CHECK(ck.read_f32("lm_head.weight", head.shape) == to_f32(head));
    CHECK(ck.files() == std::vector<std::string>{(dir / "model-00001-of-00003.safetensors").string()});
    const TensorRecord& up = single.at("model.layers.3.mlp.experts.0.up_proj.weight");
    CHECK(ck.read_f32(up.name, up.shape) == to_f32(up));
    CHECK(ck.files().size() == 2);
    check_error([&] { ck.read_f32("model.layers.2.mlp.experts.0.up_proj.weight", up.shape); },
                {(dir / "model.safetensors.index.json").string(), "shard 'model-00002-of-00003.safetensors'",
                 "of tensor 'model.layers.2.mlp.experts.0.up_proj.weight'", "missing"});
    CHECK(ck.files().size() == 2);
    CHECK(ck.unused().size() == single.size() - 2);

    // a shard that disagrees with the index is refused when it is opened
    const auto lies = copy_of("tiny_v3_sharded", "checkpoint_as_needed_lies");
    auto index = nlohmann::json::parse(read_file(lies / "model.safetensors.index.json"));
    index["weight_map"].erase("lm_head.weight");
    write_file(lies / "model.safetensors.index.json", index.dump(2));
    Checkpoint ok(lies, Checkpoint::Shards::as_needed);
    CHECK(ok.read_f32(up.name, up.shape) == to_f32(up));  // shard 3 is as the index says
    const TensorRecord& embed = single.at("model.embed_tokens.weight");
    check_error([&] { ok.read_f32(embed.name, embed.shape); }, {"holds tensor 'lm_head.weight'", "does not list"});
    CHECK(ok.files().size() == 1);  // the refused shard is not kept open
}

}  // namespace unit_io_checkpoint
