// io/safetensors*.hpp and io/convert.hpp: the writer against bytes produced by the reference implementation (its
// own unit-test vectors, and a file written by safetensors 0.8.0 `save`), round trips, and every malformed-file
// error, each of which must name the file and, where one applies, the tensor.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include <moonmoe/io/convert.hpp>
#include <moonmoe/io/safetensors.hpp>
#include <moonmoe/io/safetensors_writer.hpp>

#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_safetensors {

using namespace moonmoe;
using namespace io_testing;

namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
    std::vector<std::byte> out;
    for (int v : values) out.push_back(std::byte(v));
    return out;
}

std::vector<std::byte> from_hex(const std::string& hex) {
    std::vector<std::byte> out;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(std::byte(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
}

// safetensors 0.8.0 (Python), `save({"b": f32 [1,2,3], "a": bf16 [1,-2], "c": i64 [7], "d8": f8_e4m3fn
// [0,1,-1,448,0.5], "z": f64 [0.25], "aa": f32 [-1,0.5], "m": bool [[True,False]]}, metadata={"format": "pt"})`.
const std::string reference_file_hex =
    "a8010000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c2263223a7b2264747970"
    "65223a22493634222c227368617065223a5b315d2c22646174615f6f666673657473223a5b302c385d7d2c227a223a7b2264"
    "74797065223a22463634222c227368617065223a5b315d2c22646174615f6f666673657473223a5b382c31365d7d2c226161"
    "223a7b226474797065223a22463332222c227368617065223a5b325d2c22646174615f6f666673657473223a5b31362c3234"
    "5d7d2c2262223a7b226474797065223a22463332222c227368617065223a5b335d2c22646174615f6f666673657473223a5b"
    "32342c33365d7d2c2261223a7b226474797065223a2242463136222c227368617065223a5b325d2c22646174615f6f666673"
    "657473223a5b33362c34305d7d2c226438223a7b226474797065223a2246385f45344d33222c227368617065223a5b355d2c"
    "22646174615f6f666673657473223a5b34302c34355d7d2c226d223a7b226474797065223a22424f4f4c222c227368617065"
    "223a5b312c325d2c22646174615f6f666673657473223a5b34352c34375d7d7d0700000000000000000000000000d03f0000"
    "80bf0000003f0000803f0000004000004040803f00c00038b87e300100";

}  // namespace

TEST_CASE("io: safetensors writer reproduces the reference implementation's bytes") {
    // safetensors/src/tensor.rs test_serialization: {"attn.0": F32 [1,2,3] = 0..5}, no metadata.
    SafetensorsWriter one;
    const std::vector<float> values{0, 1, 2, 3, 4, 5};
    one.add_f32("attn.0", {1, 2, 3}, values);
    CHECK(one.serialize() ==
          bytes_of({64,  0,   0,   0,   0,   0,  0,  0,  123, 34, 97,  116, 116, 110, 46,  48,  34,  58,  123, 34,
                    100, 116, 121, 112, 101, 34, 58, 34, 70,  51, 50,  34,  44,  34,  115, 104, 97,  112, 101, 34,
                    58,  91,  49,  44,  50,  44, 51, 93, 44,  34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101,
                    116, 115, 34,  58,  91,  48, 44, 50, 52,  93, 125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
                    0,   0,   0,   64,  0,   0,  64, 64, 0,   0,  128, 64,  0,   0,   160, 64}));

    // test_serialization_forced_alignement: a shorter name, so 7 spaces pad the header to 72 bytes.
    SafetensorsWriter padded;
    padded.add_f32("attn0", {1, 1, 2, 3}, values);
    const auto padded_bytes = padded.serialize();
    CHECK(padded_bytes[0] == std::byte(72));
    CHECK(std::string(reinterpret_cast<const char*>(padded_bytes.data()) + 8 + 65, 7) == "       ");

    // test_empty: no tensors, then only {"framework": "pt"} metadata.
    SafetensorsWriter empty;
    CHECK(empty.serialize() == bytes_of({8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32}));
    empty.metadata("framework", "pt");
    CHECK(empty.serialize() == bytes_of({40,  0,   0,   0,  0,  0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
                                         100, 97,  116, 97, 95, 95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
                                         111, 114, 107, 34, 58, 34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32}));

    // A file written by safetensors 0.8.0: layout by dtype alignment (largest first), then name; added here in
    // another order on purpose.
    SafetensorsWriter mixed;
    mixed.metadata("format", "pt");
    const std::vector<bf16> a{bf16::from_float(1.0f), bf16::from_float(-2.0f)};
    const std::vector<float> b{1, 2, 3}, aa{-1, 0.5f};
    const std::vector<std::int64_t> c{7};
    std::vector<f8_e4m3> d8;
    for (float x : {0.0f, 1.0f, -1.0f, 448.0f, 0.5f}) d8.push_back(f8_e4m3::from_float(x));
    const std::vector<double> z{0.25};
    const bool m[] = {true, false};
    mixed.add_values<bf16>("a", {2}, a);
    mixed.add_values<f8_e4m3>("d8", {5}, d8);
    mixed.add_values<bool>("m", {1, 2}, m);
    mixed.add_f32("b", {3}, b);
    mixed.add_values<std::int64_t>("c", {1}, c);
    mixed.add_f32("aa", {2}, aa);
    mixed.add_values<double>("z", {1}, z);
    CHECK(mixed.serialize() == from_hex(reference_file_hex));
}

TEST_CASE("io: safetensors reader opens a reference file and round-trips every dtype") {
    const auto dir = scratch_dir("safetensors_roundtrip");
    write_file(dir / "reference.safetensors", from_hex(reference_file_hex));
    const SafetensorsFile f(dir / "reference.safetensors");
    CHECK(f.size() == 7);
    CHECK(f.names() == std::vector<std::string>{"a", "aa", "b", "c", "d8", "m", "z"});
    CHECK(f.metadata().at("format") == "pt");
    CHECK(f.header_size() == 0x1a8);
    CHECK(f.at("c").dtype == DType::i64);
    CHECK(f.at("m").shape == std::vector<index_t>{1, 2});
    CHECK(to_f32(f.at("a")) == std::vector<float>{1, -2});
    CHECK(to_f32(f.at("b")) == std::vector<float>{1, 2, 3});
    CHECK(to_f32(f.at("c")) == std::vector<float>{7});
    CHECK(to_f32(f.at("d8")) == std::vector<float>{0, 1, -1, 448, 0.5f});
    CHECK(to_f32(f.at("z")) == std::vector<float>{0.25f});
    CHECK(to_f32(f.at("m")) == std::vector<float>{1, 0});
    CHECK(!f.contains("q"));

    // Every dtype through our writer and reader; values chosen exact in each type.
    SafetensorsWriter w;
    w.metadata("format", "pt");
    w.metadata("note", "round trip");
    const std::vector<float> f32{-1.5f, 0, 3.25f, 1e-3f};
    const std::vector<std::int32_t> i32{-7, 0, 1 << 20};
    const std::vector<std::uint16_t> u16{0, 65535};
    const std::vector<std::int8_t> i8{-128, 127};
    const std::vector<f16> h{f16::from_float(0.5f), f16::from_float(-65504.0f)};
    w.add_f32("w.f32", {2, 2}, f32);
    w.add_values<std::int32_t>("w.i32", {3}, i32);
    w.add_values<std::uint16_t>("w.u16", {2}, u16);
    w.add_values<std::int8_t>("w.i8", {2, 1}, i8);
    w.add_values<f16>("w.f16", {2}, h);
    w.add("w.empty", DType::f32, {0, 4}, {});
    w.add("w.e5m2", DType::f8_e5m2, {2}, bytes_of({0x3C, 0xC0}));  // 1.0, -2.0
    w.write(dir / "all.safetensors");
    const SafetensorsFile g(dir / "all.safetensors");
    CHECK(g.header_size() % 8 == 0);
    CHECK(g.metadata().at("note") == "round trip");
    CHECK(to_f32(g.at("w.f32")) == f32);
    CHECK(to_f32(g.at("w.i32")) == std::vector<float>{-7, 0, 1 << 20});
    CHECK(to_f32(g.at("w.u16")) == std::vector<float>{0, 65535});
    CHECK(to_f32(g.at("w.i8")) == std::vector<float>{-128, 127});
    CHECK(to_f32(g.at("w.f16")) == std::vector<float>{0.5f, -65504.0f});
    CHECK(to_f32(g.at("w.e5m2")) == std::vector<float>{1.0f, -2.0f});
    CHECK(g.at("w.empty").numel() == 0);
    CHECK(g.at("w.empty").shape == std::vector<index_t>{0, 4});
    for (const auto& r : g.records()) {  // every tensor starts aligned to its element size, as the reference lays out
        CAPTURE(r.name);
        CHECK((r.bytes.data() - g.records()[0].bytes.data()) % std::ptrdiff_t(dtype_size(r.dtype)) == 0);
    }
    // writing again replaces the file atomically and leaves no temporary behind
    w.write(dir / "all.safetensors");
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
    CHECK(files == 2);
}

TEST_CASE("io: safetensors writer refuses bad input, naming the tensor or the path") {
    SafetensorsWriter w;
    const std::vector<float> v{1, 2, 3};
    w.add_f32("x", {3}, v);
    check_error([&] { w.add_f32("x", {3}, v); }, {"'x'", "added twice"});
    check_error([&] { w.add_f32("y", {2, 2}, v); }, {"'y'", "F32 [2, 2] needs 16 bytes, got 12"});
    check_error([&] { w.add_f32("__metadata__", {3}, v); }, {"reserved"});
    check_error([&] { w.add("n", DType::f32, {-1}, {}); }, {"'n'", "negative"});
    check_error([&] { w.add_f32(std::string("bad\xff"), {3}, v); }, {"UTF-8"});
    const auto missing = fs::path(MOONMOE_TEST_BINARY_DIR) / "io_scratch" / "no_such_dir" / "x.safetensors";
    check_error([&] { w.write(missing); }, {missing.string(), "cannot create"});
}

TEST_CASE("io: malformed safetensors files are rejected with the file and tensor named") {
    const auto dir = scratch_dir("safetensors_errors");
    int counter = 0;
    // Writes `content` to a new file and checks that opening it fails with a message holding path and `parts`.
    const auto check_bad = [&](const std::string& content, std::initializer_list<std::string_view> parts) {
        const auto path = dir / ("bad" + std::to_string(counter++) + ".safetensors");
        write_file(path, content);
        const std::string message = error_of([&] { SafetensorsFile f(path); });
        CAPTURE(message);
        CHECK(message.find(path.string()) != std::string::npos);
        for (std::string_view part : parts) {
            CAPTURE(part);
            CHECK(message.find(part) != std::string::npos);
        }
    };
    const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    {  // sanity: the good file opens
        write_file(dir / "good.safetensors", raw_safetensors(ok, 8));
        CHECK(SafetensorsFile(dir / "good.safetensors").at("t").numel() == 2);
    }
    check_bad("", {"0 bytes, shorter than the 8-byte header length"});
    check_bad("abc", {"3 bytes, shorter than the 8-byte header length"});
    check_bad(raw_safetensors(ok, 8).substr(0, 20),
              {"header length 54 is larger than the rest of the file (12 bytes)"});
    check_bad(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", {"header length", "larger than the rest"});
    check_bad(raw_safetensors("{\"t\": [1,", 0), {"not valid JSON"});
    check_bad(raw_safetensors("{\"\xc3\x28\": 1}", 0), {"not valid JSON"});  // invalid UTF-8 in a name
    check_bad(raw_safetensors("\xc3\x28", 0), {"must start with '{'"});
    check_bad(raw_safetensors("[1, 2]", 0), {"must start with '{'"});
    check_bad(raw_safetensors(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8), {"'t'", "no 'dtype'"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8), {"'t'", "no 'shape'"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2]}})", 8), {"'t'", "no 'data_offsets'"});
    check_bad(raw_safetensors(R"({"t":5})", 0), {"'t'", "not a JSON object"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", 8),
              {"'t'", "unknown dtype 'F7'"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
              {"'t'", "[-2]", "non-negative integer"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
              {"'t'", "non-negative integer"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8),
              {"'t'", "shape is not an array"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
              {"'t'", "overflows"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), {"'t'", "begin > end"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
              {"'t'", "pair of non-negative integers"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8),
              {"'t'", "pair of non-negative integers"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
              {"'t'", "end beyond the data section (8 bytes)"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
              {"'t'", "holds 8 bytes but F32 [3] needs 12"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                              12),
              {"'t' and 'u' overlap"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("u":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                              16),
              {"4 unused bytes", "before tensor 'u'"});
    check_bad(raw_safetensors(ok, 12), {"4 bytes after the last tensor"});
    check_bad(raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                              8),
              {"tensor 't' appears twice"});
    check_bad(
        raw_safetensors(R"({"__metadata__":{"format":1},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
        {"__metadata__", "'format'", "not a string"});
    check_bad(raw_safetensors(R"({"__metadata__":[],"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
              {"__metadata__ is not a JSON object"});

    const auto missing = dir / "missing.safetensors";
    check_error([&] { SafetensorsFile f(missing); }, {missing.string(), "cannot open"});
    check_error([&] { SafetensorsFile f(dir); }, {dir.string(), "not a regular file"});
}

TEST_CASE("io: a missing tensor names the file and the closest names") {
    const auto dir = scratch_dir("safetensors_closest");
    SafetensorsWriter w;
    const std::vector<float> v{1};
    for (const char* name : {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                             "model.layers.0.mlp.down_proj.weight", "lm_head.weight", "model.norm.weight"})
        w.add_f32(name, {1}, v);
    w.write(dir / "m.safetensors");
    const SafetensorsFile f(dir / "m.safetensors");
    check_error([&] { f.at("model.layers.0.mlp.gate.weight"); },
                {(dir / "m.safetensors").string(), "no tensor 'model.layers.0.mlp.gate.weight'",
                 "closest: 'model.layers.0.mlp.gate_proj.weight'"});
}

TEST_CASE("io: FP8 block dequantisation with partial blocks") {
    // A [3, 5] weight in [2, 2] blocks: scale_inv is [2, 3]; the last row and column blocks are partial.
    std::vector<f8_e4m3> w8;
    std::vector<float> w_values;
    for (int i = 0; i < 15; ++i) {
        const float x = float(i - 7) * 0.5f;
        w8.push_back(f8_e4m3::from_float(x));
        w_values.push_back(x);
    }
    const std::vector<float> scale{1, 2, 4, 8, 16, 32};
    SafetensorsWriter writer;
    writer.add_values<f8_e4m3>("w", {3, 5}, w8);
    writer.add_f32("w_scale_inv", {2, 3}, scale);
    writer.add_f32("bad_scale", {3, 3}, std::vector<float>(9, 1.0f));
    writer.add_f32("w_scale_inv_1x4", {3, 2}, scale);  // non-square blocks: rows of 1, columns of 4
    writer.add_values<f8_e4m3>("v", {15}, w8);
    const auto dir = scratch_dir("fp8_blocks");
    writer.write(dir / "q.safetensors");
    const SafetensorsFile f(dir / "q.safetensors");
    const auto out = dequantize_fp8(f.at("w"), f.at("w_scale_inv"), {2, 2});
    REQUIRE(out.size() == 15);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j) {
            CAPTURE(i);
            CAPTURE(j);
            CHECK(out[std::size_t(i * 5 + j)] ==
                  w_values[std::size_t(i * 5 + j)] * scale[std::size_t((i / 2) * 3 + j / 2)]);
        }
    const auto wide = dequantize_fp8(f.at("w"), f.at("w_scale_inv_1x4"), {1, 4});
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j)
            CHECK(wide[std::size_t(i * 5 + j)] == w_values[std::size_t(i * 5 + j)] * scale[std::size_t(i * 2 + j / 4)]);
    check_error([&] { dequantize_fp8(f.at("w"), f.at("bad_scale"), {2, 2}); },
                {"'bad_scale' is F32 [3, 3]", "'w' [3, 5]", "[2, 2] blocks needs F32 [2, 3]"});
    check_error([&] { dequantize_fp8(f.at("v"), f.at("w_scale_inv"), {2, 2}); }, {"'v'", "2-D"});
    check_error([&] { dequantize_fp8(f.at("w_scale_inv"), f.at("w_scale_inv"), {2, 2}); }, {"not an FP8 weight"});
    std::vector<float> small(3);
    check_error([&] { to_f32(f.at("w"), small); }, {"'w'", "15 elements", "output buffer 3"});
}

}  // namespace unit_io_safetensors
