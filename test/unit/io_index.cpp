// io/safetensors_index.hpp: the weight map of model.safetensors.index.json, its shard-name rules, and malformed
// index texts as a table of inputs and the message fragments each must produce. Sharded scratch checkpoints are
// built in the binary dir from test/data/tiny_v3_sharded.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <moonmoe/io/checkpoint.hpp>
#include <moonmoe/io/safetensors_index.hpp>

#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_index {

using namespace moonmoe;
using namespace io_testing;

namespace {

/// A writable copy of tiny_v3_sharded in the binary dir.
fs::path sharded_copy(const std::string& scratch_name) {
    const auto dir = scratch_dir(scratch_name);
    for (const auto& e : fs::directory_iterator(test_data("tiny_v3_sharded"))) {
        fs::copy_file(e.path(), dir / e.path().filename());
        fs::permissions(dir / e.path().filename(), fs::perms::owner_read | fs::perms::owner_write,
                        fs::perm_options::add);  // the committed files may be read-only
    }
    return dir;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// `levels` nested arrays around `inner`.
std::string nested(std::size_t levels, const std::string& inner = "0") {
    return std::string(levels, '[') + inner + std::string(levels, ']');
}

}  // namespace

TEST_CASE("io index: shard names like ./model-00001-of-00003.safetensors load like plain ones") {
    // transformers joins each weight_map value onto the directory, so "./" names load there; mix both spellings
    // of the same shard so that they must also be recognised as one file.
    const auto dir = sharded_copy("index_dot_slash");
    auto index = nlohmann::json::parse(read_file(dir / "model.safetensors.index.json"));
    bool plain = false;
    for (auto& [name, file] : index["weight_map"].items()) {
        if (!plain) file = "./" + file.get<std::string>();
        plain = !plain;
    }
    write_file(dir / "model.safetensors.index.json", index.dump(2));

    Checkpoint ck(dir);
    CHECK(ck.files().size() == 3);
    for (const std::string& file : ck.files()) CHECK(fs::path(file).parent_path() == dir);
    const SafetensorsFile single(test_data("tiny_v3/model.safetensors"));
    CHECK(ck.names() == single.names());
    for (const auto& r : single.records()) {
        CAPTURE(r.name);
        CHECK(same_bits(ck.read_f32(r.name, r.shape), to_f32(r)));
    }
    CHECK(ck.unused().empty());
}

TEST_CASE("io index: parse_safetensors_index maps tensors to plain shard file names") {
    const WeightMap map = parse_safetensors_index(R"({
        "metadata": {"total_size": 12, "nested": {"weight_map": {"ignored": "/etc/passwd"}}},
        "weight_map": {
            "b.weight": "./model-00002-of-00002.safetensors",
            "a.weight": "model-00001-of-00002.safetensors",
            "c.weight": ".//./model-00002-of-00002.safetensors",
            "d [x] {y}": "model ü.safetensors"
        }})",
                                                  "index.json");
    CHECK(map == WeightMap{{"a.weight", "model-00001-of-00002.safetensors"},
                           {"b.weight", "model-00002-of-00002.safetensors"},
                           {"c.weight", "model-00002-of-00002.safetensors"},
                           {"d [x] {y}", "model ü.safetensors"}});

    // Brackets inside strings (escaped quotes too) do not count towards the nesting limit.
    const std::string deep_name = "\\\"" + std::string(500, '[') + std::string(500, '{');
    const WeightMap one = parse_safetensors_index(R"({"weight_map": {")" + deep_name + R"(": "m.safetensors"}})", "i");
    CHECK(one.size() == 1);
    CHECK(one.begin()->first == "\"" + std::string(500, '[') + std::string(500, '{'));

    // 128 levels are allowed (the top-level object is the first), 129 are not.
    const auto with_metadata = [](std::size_t levels) {
        return R"({"metadata": )" + nested(levels - 1) + R"(, "weight_map": {"a": "m.safetensors"}})";
    };
    CHECK(parse_safetensors_index(with_metadata(128), "i").size() == 1);
    check_error([&] { parse_safetensors_index(with_metadata(129), "i"); }, {"i: nests deeper than 128 levels"});
}

TEST_CASE("io index: malformed index texts are refused with what is wrong named") {
    struct Case {
        std::string text;
        std::vector<std::string> fragments;
    };
    const auto entry = [](const std::string& file_json) {
        return R"({"metadata": {}, "weight_map": {"model.norm.weight": )" + file_json + "}}";
    };
    const std::string shard = "shard ";
    const std::string not_in_dir = " of tensor 'model.norm.weight' is not a file in the checkpoint directory: ";
    const std::vector<Case> cases{
        {"", {"not valid JSON"}},
        {"{", {"not valid JSON"}},
        {R"({"weight_map": {"a": "m.safetensors"},})", {"not valid JSON"}},
        {"[]", {"no \"weight_map\" object"}},
        {R"({"metadata": {"total_size": 1}})", {"no \"weight_map\" object"}},
        {R"({"weight_map": ["m.safetensors"]})", {"\"weight_map\" is array, not an object"}},
        {R"({"weight_map": "m.safetensors"})", {"\"weight_map\" is string, not an object"}},
        {R"({"weight_map": {}})", {"\"weight_map\" is empty"}},
        {entry("3"), {"weight_map entry of tensor 'model.norm.weight' is number, not a shard file name"}},
        {entry("null"), {"weight_map entry of tensor 'model.norm.weight' is null"}},
        {entry(R"(["m.safetensors"])"), {"tensor 'model.norm.weight' is array"}},
        {entry(R"("")"), {shard + "''" + not_in_dir + "the name is empty"}},
        {entry(R"("/abs/model.safetensors")"),
         {shard + "'/abs/model.safetensors'" + not_in_dir + "it is an absolute path"}},
        {entry(R"("../model.safetensors")"), {"'../model.safetensors'" + not_in_dir + "it goes up with '..'"}},
        {entry(R"("./../model.safetensors")"), {"it goes up with '..'"}},
        {entry(R"("..")"), {"it goes up with '..'"}},
        {entry(R"("sub/model.safetensors")"), {"'sub/model.safetensors'" + not_in_dir + "it is in a subdirectory"}},
        {entry(R"("./sub/./model.safetensors")"), {"it is in a subdirectory"}},
        {entry(R"("model.safetensors/")"), {"it names a directory"}},
        {entry(R"("./")"), {"it names a directory"}},
        {entry(R"(".")"), {"it names the directory itself"}},
        {entry(R"(".//.")"), {"it names the directory itself"}},
        {entry(R"("m\u0000.safetensors")"), {R"('m\x00.safetensors')", "the name contains a NUL byte"}},
        {entry(R"("sub\\model.safetensors")"), {"the name contains a backslash"}},
        {R"({"weight_map": {"a": "m.safetensors", "a": "n.safetensors"}})", {"tensor 'a' appears twice in weight_map"}},
        {R"({"weight_map": {"a": "m.safetensors"}, "weight_map": {"b": "m.safetensors"}})",
         {"\"weight_map\" appears twice"}},
        {R"({"weight_map": {"line\nbreak": 1}})", {R"(tensor 'line\x0abreak' is number)"}},
        {nested(129), {"nests deeper than 128 levels (at byte 128)"}},
        // valid JSON, a NUL byte and garbage (issue 29: nlohmann's lexer ended the input at the NUL)
        {std::string(R"({"weight_map": {"a": "m.safetensors"}})") + std::string(1, '\0') + "garbage",
         {"has a NUL byte at offset 38"}},
        {std::string(100'000, '{'), {"nests deeper than 128 levels"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.text.substr(0, 200));
        const std::string message = error_of([&] { parse_safetensors_index(c.text, "dir/index.json"); });
        CAPTURE(message);
        CHECK(message.starts_with("dir/index.json: "));
        for (const std::string& fragment : c.fragments) {
            CAPTURE(fragment);
            CHECK(message.find(fragment) != std::string::npos);
        }
    }
}

TEST_CASE("io index: an index nested 100,000 levels deep is refused by its depth, not by a stack overflow") {
    const auto dir = sharded_copy("index_deep");
    const auto index = dir / "model.safetensors.index.json";
    for (const std::string& text :
         {nested(100'000), R"({"weight_map": {"a": )" + nested(100'000, R"("m.safetensors")") + "}}",
          R"({"metadata": )" + nested(100'000) + R"(, "weight_map": {}})"}) {
        write_file(index, text);
        check_error([&] { Checkpoint c(dir); }, {index.string(), "nests deeper than 128 levels"});
    }
}

}  // namespace unit_io_index
