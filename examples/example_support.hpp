// Shared by the Hugging Face examples: the model type they are compiled for, and argument parsing (several token
// sequences per command line, separated by commas).
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

/// The token sequences given on a command line, packed one after another.
struct Sequences {
    std::vector<moonmoe::index_t> ids;      ///< every sequence's ids, sequence 0 first
    std::vector<moonmoe::index_t> lengths;  ///< one per sequence
    moonmoe::index_t count() const { return moonmoe::index_t(lengths.size()); }
    moonmoe::nn::TokenLayout layout() const { return moonmoe::nn::TokenLayout::packed(lengths); }
};

/// How the examples read token sequences: ids are non-negative integers separated by spaces, sequences are
/// separated by commas, standing alone or attached to an id (`1 5 9 , 200 3`, `1 5 9, 200 3` and "1 5 9,200 3" are
/// the same two sequences).
inline constexpr const char* sequences_help =
    "Token ids are non-negative integers; a ',' (alone or attached to an id) starts the next sequence:\n"
    "  1 5 9 , 200 3   and   1 5 9, 200 3   are two sequences, of 3 and 2 tokens.\n";

/// Sequences from argv[first..argc), as sequences_help describes.
inline Sequences token_sequences(int argc, char** argv, int first) {
    Sequences out;
    std::vector<std::vector<std::string>> parts(1);
    for (int i = first; i < argc; ++i) {
        std::string word;
        auto flush = [&] {
            if (!word.empty()) parts.back().push_back(word), word.clear();
        };
        for (const char* c = argv[i]; *c; ++c) {
            if (*c == ',') flush(), parts.emplace_back();
            else if (*c == ' ' || *c == '\t') flush();
            else word += *c;
        }
        flush();
    }
    if (parts.size() == 1 && parts[0].empty()) throw std::invalid_argument("no token ids given");
    for (std::size_t s = 0; s < parts.size(); ++s) {
        if (parts[s].empty())
            throw std::invalid_argument("sequence " + std::to_string(s) + " of " + std::to_string(parts.size()) +
                                        " is empty (a ',' at the start or end, or two in a row)");
        for (const std::string& w : parts[s]) {
            char* end = nullptr;
            errno = 0;
            const long long v = std::strtoll(w.c_str(), &end, 10);
            if (*end != '\0' || v < 0)
                throw std::invalid_argument("token id '" + w + "' of sequence " + std::to_string(s) +
                                            " is not a non-negative integer");
            if (errno == ERANGE)  // strtoll clamps to LLONG_MAX: report the id as given, not the clamped value
                throw std::out_of_range("token id '" + w + "' is outside the vocabulary (too large)");
            out.ids.push_back(v);
        }
        out.lengths.push_back(moonmoe::index_t(parts[s].size()));
    }
    return out;
}

/// Every id of token_sequences(), the sequences one after another.
inline std::vector<moonmoe::index_t> token_ids(int argc, char** argv, int first) {
    return token_sequences(argc, argv, first).ids;
}

/// True when an argument asks for help (--help or -h): the example then prints its usage and exits 0.
inline bool help_requested(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
    return false;
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
