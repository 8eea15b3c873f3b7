// fuzz/hf_config.cpp: fuzz_hf_config, config.json parsing on arbitrary text (libFuzzer signature; fuzz/run.sh builds
// and runs it under ASan + UBSan).
//
// Input: the text of a config.json. parse_hf_config(text) as Checkpoint does, then resolve() against
// AnyDeepSeekV3 (every size taken from the file, as load_transformer<AnyDeepSeekV3> does) and against KimiK2 (every
// size fixed, so most inputs exercise the mismatch messages). A config that resolves must pass validate(), and its
// parameter memory is then estimated and checked against 1 GiB as load_transformer does before allocating, and the
// RoPE numbers the model's constructor derives from it (YaRN range, attention factor, softmax scale) are computed.
// Seeds:
// fuzz/corpus/hf_config (the tiny test checkpoints', Kimi-K2-Instruct's and DeepSeek-V3's config.json and variants,
// from fuzz/make_corpus.py); dictionary: fuzz/dict/hf_config.dict (every field name the parser reads).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <moonmoe/config/presets.hpp>
#include <moonmoe/config/rope.hpp>
#include <moonmoe/io/hf_config.hpp>
#include <moonmoe/io/memory_budget.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace moonmoe;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    moonmoe_fuzz::expect_documented_errors([&] {
        const HFConfig file = parse_hf_config(text, "fuzz/config.json");
        std::optional<ModelConfig> resolved;
        moonmoe_fuzz::expect_documented_errors([&] { resolved = resolve(AnyDeepSeekV3::config, file); });
        if (resolved) {
            bool valid = true;
            try {
                validate(*resolved);
            } catch (const config_error&) {
                valid = false;
            }
            moonmoe_fuzz::fuzz_require(valid, "a configuration resolve() returns passes validate()");
            // What load_transformer does next, before allocating: every parameter tensor's size from the fields.
            bool fits = false;
            moonmoe_fuzz::expect_documented_errors([&] {
                (void)check_memory_budget(*resolved, file.source, /*limit=*/double(1 << 30), /*optimizer=*/true);
                fits = true;
            });
            // What RoPE and attention compute in their constructors, from the file's numbers alone, for a model
            // that load_transformer would go on to build (one within the budget).
            if (fits) {
                const index_t rope_dim = resolved->attention.rope_dim;
                if (resolved->rope.yarn) (void)yarn_correction_range(resolved->rope, rope_dim);
                (void)rope_attention_factor(resolved->rope);
                (void)softmax_scale(resolved->rope, resolved->attention.qk_head_dim());
            }
        }
        moonmoe_fuzz::expect_documented_errors([&] { (void)resolve(KimiK2::config, file); });
    });
    return 0;
}
