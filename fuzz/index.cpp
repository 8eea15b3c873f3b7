// fuzz/index.cpp: fuzz_index, the sharded checkpoint's model.safetensors.index.json on arbitrary text (libFuzzer
// signature; fuzz/run.sh builds and runs it under ASan + UBSan).
//
// Input: the text of an index. parse_safetensors_index(text), then the promise Checkpoint relies on to stay inside
// the checkpoint directory: every shard name it returns is a plain, non-empty file name (no '/', '\\' or NUL, not
// "." or ".."). Seeds: fuzz/corpus/index (tiny_v3_sharded's index and variants, from fuzz/make_corpus.py);
// dictionary: fuzz/dict/index.dict.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <moonmoe/io/safetensors_index.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using moonmoe_fuzz::fuzz_require;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    moonmoe_fuzz::expect_documented_errors([&] {
        const moonmoe::WeightMap map = moonmoe::parse_safetensors_index(text, "fuzz/model.safetensors.index.json");
        fuzz_require(!map.empty(), "an accepted weight_map lists a tensor");
        for (const auto& [tensor, file] : map) {
            fuzz_require(!file.empty() && file != "." && file != "..", "a shard name names a file");
            fuzz_require(file.find_first_of(std::string_view("/\\\0", 3)) == std::string::npos,
                         "a shard name has no separator or NUL");
        }
    });
    return 0;
}
