// fuzz/safetensors.cpp: fuzz_safetensors, the safetensors reader on arbitrary bytes (libFuzzer signature, so any
// engine with a libFuzzer driver can run it; fuzz/run.sh builds and runs it under ASan + UBSan).
//
// Input: 2 bytes giving the FP8 block size [B0, B1] (block_dim below: 0-223 as they are, powers of two up to 2^23
// and the int64 extremes, each one byte change away), then the bytes of a .safetensors file. The file goes to
// detail::parse_safetensors (what SafetensorsFile runs on its memory map); every record it accepts is then used as
// a loader would: numel(), to_f32() and, for an F8 record with a `<name>_scale_inv` companion, dequantize_fp8() in
// the given blocks (both only up to 1 << 20 elements, to stay fast). Seeds: fuzz/corpus/safetensors (small files
// cut from test/data by fuzz/make_corpus.py); dictionary: fuzz/dict/safetensors.dict.
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <moonmoe/io/convert.hpp>
#include <moonmoe/io/safetensors.hpp>

#include "fuzz_common.hpp"

namespace {

constexpr moonmoe::index_t max_decoded = moonmoe::index_t(1) << 20;

/// One block dimension from one byte: the sizes checkpoints use, larger powers of two, and the overflow edges.
std::int64_t block_dim(std::uint8_t b) {
    constexpr std::int64_t max = INT64_MAX, min = INT64_MIN;
    constexpr std::int64_t edges[16] = {max,       max - 1,         min,          min + 1, -1,          INT32_MAX,
                                        1LL << 31, 1LL << 32,       1LL << 62,    max / 2, max / 2 + 1, (1LL << 62) + 1,
                                        max / 3,   (1LL << 32) + 1, -(1LL << 31), 0};
    if (b < 0xE0) return b;
    if (b < 0xF0) return std::int64_t(1) << (b - 0xE0 + 8);
    return edges[b - 0xF0];
}

bool is_fp8(moonmoe::DType t) { return t == moonmoe::DType::f8_e4m3 || t == moonmoe::DType::f8_e5m2; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace moonmoe;
    using moonmoe_fuzz::expect_documented_errors;
    using moonmoe_fuzz::fuzz_require;
    if (size < 2) return 0;
    const std::array<index_t, 2> block{block_dim(data[0]), block_dim(data[1])};
    const auto file = std::as_bytes(std::span(data + 2, size - 2));

    expect_documented_errors([&] {
        const detail::SafetensorsHeader header = detail::parse_safetensors(file, "fuzz.safetensors");
        for (const TensorRecord& r : header.records) {
            fuzz_require(r.bytes.data() >= file.data() && r.bytes.data() + r.bytes.size() <= file.data() + file.size(),
                         "a record's bytes lie inside the file");
            index_t n = 0;
            expect_documented_errors([&] { n = r.numel(); });
            fuzz_require(n >= 0 && std::uint64_t(n) * dtype_size(r.dtype) == r.bytes.size(),
                         "an accepted record holds numel * dtype_size bytes");
            if (n <= max_decoded)
                expect_documented_errors([&] { fuzz_require(to_f32(r).size() == std::size_t(n), "to_f32 size"); });
            if (!is_fp8(r.dtype) || n > max_decoded) continue;
            const std::string scale_name = r.name + "_scale_inv";
            for (const TensorRecord& s : header.records)
                if (s.name == scale_name)
                    expect_documented_errors([&] {
                        fuzz_require(dequantize_fp8(r, s, block).size() == std::size_t(n), "dequantize_fp8 size");
                    });
        }
    });
    return 0;
}
