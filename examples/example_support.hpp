// Shared by the Hugging Face examples: the model type they are compiled for, and argument parsing.
//
// The examples read every size from config.json (a Dynamic model type). To compile one for your own static type
// instead, so that the checkpoint is checked against it (a disagreeing size is an error naming the field):
//   g++ -std=c++20 -O3 -fopenmp -I<moonmoe>/include -isystem /usr/include/eigen3
//       -DMOONMOE_EXAMPLE_MODEL=moonmoe::KimiK2 examples/hf_forward.cpp -o hf_forward
// or with CMake: target_compile_definitions(hf_forward PRIVATE MOONMOE_EXAMPLE_MODEL=moonmoe::KimiK2).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include <moonmoe/moonmoe.hpp>

#ifndef MOONMOE_EXAMPLE_MODEL
#define MOONMOE_EXAMPLE_MODEL moonmoe::AnyDeepSeekV3
#endif

namespace example {

using Model = MOONMOE_EXAMPLE_MODEL;

/// The examples refuse NaN / Inf weights (naming the first such tensor) and a model larger than the memory
/// available.
inline const moonmoe::LoadOptions load_options{.memory_limit = std::nullopt, .with_optimizer_state = false,
                                               .check_finite = true};

/// Token ids from argv[first..argc); each must be a non-negative integer.
inline std::vector<moonmoe::index_t> token_ids(int argc, char** argv, int first) {
    std::vector<moonmoe::index_t> ids;
    for (int i = first; i < argc; ++i) {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(argv[i], &end, 10);
        if (*argv[i] == '\0' || *end != '\0' || v < 0)
            throw std::invalid_argument(std::string("token id '") + argv[i] + "' is not a non-negative integer");
        if (errno == ERANGE)  // strtoll clamps to LLONG_MAX: report the id as given, not the clamped value
            throw std::out_of_range(std::string("token id '") + argv[i] + "' is outside the vocabulary (too large)");
        ids.push_back(v);
    }
    if (ids.empty()) throw std::invalid_argument("no token ids given");
    return ids;
}

inline void describe(const moonmoe::nn::Transformer<>& model, const char* dir) {
    const moonmoe::ModelConfig& c = model.config;
    std::printf("%s: %lld layers (%lld dense), hidden %lld, %lld heads, %lld experts (top-%lld, %lld shared), "
                "vocab %lld, %lld parameters\n",
                dir, (long long)c.dims.layers, (long long)c.dims.dense_layers, (long long)c.dims.hidden,
                (long long)c.attention.heads, (long long)c.moe.experts, (long long)c.moe.top_k,
                (long long)c.moe.shared, (long long)c.dims.vocab, (long long)moonmoe::count_parameters(c).total);
}

}  // namespace example
