// test/support/io_testing.hpp: scratch files, error-message checks and field-by-field config comparison for the
// io tests. Scratch files go under MOONMOE_TEST_BINARY_DIR, never into the source tree.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <moonmoe/config.hpp>

namespace io_testing {

namespace fs = std::filesystem;

/// A fresh, empty directory for one test case: <binary dir>/io_scratch/<name>.
inline fs::path scratch_dir(const std::string& name) {
    const fs::path dir = fs::path(MOONMOE_TEST_BINARY_DIR) / "io_scratch" / name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

/// A committed test data path: <source dir>/test/data/<rel>.
inline fs::path test_data(const std::string& rel) { return fs::path(MOONMOE_TEST_SOURCE_DIR) / "data" / rel; }

inline void write_file(const fs::path& path, std::string_view bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(out.good());
}
inline void write_file(const fs::path& path, const std::vector<std::byte>& bytes) {
    write_file(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}
inline std::string read_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// A safetensors file from a literal header and `data_bytes` bytes of data (0, 1, 2, ... mod 256).
inline std::string raw_safetensors(std::string_view header, std::size_t data_bytes) {
    std::string out(8, '\0');
    const std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    out += header;
    for (std::size_t i = 0; i < data_bytes; ++i) out += char(i % 256);
    return out;
}

/// The what() of the exception `f` throws, or "<no exception>".
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "<no exception>";
}

/// Checks that `f` throws and that its message contains every one of `parts`.
template <class F>
void check_error(F&& f, std::initializer_list<std::string_view> parts) {
    const std::string message = error_of(f);
    CAPTURE(message);
    for (std::string_view part : parts) {
        CAPTURE(part);
        CHECK(message.find(part) != std::string::npos);
    }
}

/// Every field of the model description (dims, attention, RoPE, MoE) equal; exact, including the doubles.
inline void check_same_model(const moonmoe::ModelConfig& a, const moonmoe::ModelConfig& b) {
#define IO_TESTING_SAME(field)                                                                                         \
    do {                                                                                                               \
        INFO(#field);                                                                                                  \
        CHECK(a.field == b.field);                                                                                     \
    } while (0)
    IO_TESTING_SAME(dims.hidden);
    IO_TESTING_SAME(dims.layers);
    IO_TESTING_SAME(dims.dense_layers);
    IO_TESTING_SAME(dims.vocab);
    IO_TESTING_SAME(dims.dense_hidden);
    IO_TESTING_SAME(dims.norm_eps);
    IO_TESTING_SAME(attention.kind);
    IO_TESTING_SAME(attention.heads);
    IO_TESTING_SAME(attention.kv_heads);
    IO_TESTING_SAME(attention.q_rank);
    IO_TESTING_SAME(attention.kv_rank);
    IO_TESTING_SAME(attention.nope_dim);
    IO_TESTING_SAME(attention.rope_dim);
    IO_TESTING_SAME(attention.v_dim);
    IO_TESTING_SAME(rope.theta);
    IO_TESTING_SAME(rope.max_positions);
    IO_TESTING_SAME(rope.interleave);
    IO_TESTING_SAME(rope.yarn);
    IO_TESTING_SAME(rope.factor);
    IO_TESTING_SAME(rope.original_max_positions);
    IO_TESTING_SAME(rope.beta_fast);
    IO_TESTING_SAME(rope.beta_slow);
    IO_TESTING_SAME(rope.mscale);
    IO_TESTING_SAME(rope.mscale_all_dim);
    IO_TESTING_SAME(moe.experts);
    IO_TESTING_SAME(moe.top_k);
    IO_TESTING_SAME(moe.shared);
    IO_TESTING_SAME(moe.expert_hidden);
    IO_TESTING_SAME(moe.groups);
    IO_TESTING_SAME(moe.top_groups);
    IO_TESTING_SAME(moe.score);
    IO_TESTING_SAME(moe.correction_bias);
    IO_TESTING_SAME(moe.norm_top_k);
    IO_TESTING_SAME(moe.routed_scale);
}

/// check_same_model plus the parts a config.json does not carry (optimizer, parallel layout, backend).
inline void check_same_config(const moonmoe::ModelConfig& a, const moonmoe::ModelConfig& b) {
    check_same_model(a, b);
    IO_TESTING_SAME(optimizer.muon.enabled);
    IO_TESTING_SAME(optimizer.muon.learning_rate);
    IO_TESTING_SAME(optimizer.adamw.learning_rate);
    IO_TESTING_SAME(optimizer.qk_clip.enabled);
    IO_TESTING_SAME(optimizer.qk_clip.tau);
    IO_TESTING_SAME(parallel.pp);
    IO_TESTING_SAME(parallel.ep);
    IO_TESTING_SAME(parallel.dp);
    IO_TESTING_SAME(parallel.virtual_stages);
    IO_TESTING_SAME(parallel.micro_batches);
    IO_TESTING_SAME(parallel.split);
    IO_TESTING_SAME(backend);
#undef IO_TESTING_SAME
}

}  // namespace io_testing
