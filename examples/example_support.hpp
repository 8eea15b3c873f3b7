// Shared by the Hugging Face examples: the model type they are compiled for, and argument parsing (several token
// sequences per command line, separated by commas).
//
// The examples read every size from config.json (a Dynamic model type). To compile one for your own static type
// instead, so that the checkpoint is checked against it (a disagreeing size is an error naming the field):
//   g++ -std=c++20 -O3 -fopenmp -I<moonmoe>/include -isystem /usr/include/eigen3
//       -DMOONMOE_EXAMPLE_MODEL=moonmoe::KimiK2 examples/hf_forward.cpp -o hf_forward
// or with CMake: target_compile_definitions(hf_forward PRIVATE MOONMOE_EXAMPLE_MODEL=moonmoe::KimiK2).
//
// Backends: every example takes `--backend cpu|cuda` (default cpu) and runs the same code on either; the model is
// loaded straight to the chosen backend. `--backend cuda` needs the example compiled by nvcc: CMake builds each one
// also as <name>_cuda with -DMOONMOE_BUILD_CUDA=ON, or by hand
//   nvcc -std=c++20 -O2 -arch=sm_90 -x cu -I<moonmoe>/include -isystem /usr/include/eigen3 examples/hf_forward.cpp
//       -lcublas -o hf_forward_cuda
// A binary built by the C++ compiler alone refuses `--backend cuda` with a message saying so (unless it was built
// on the emulated CUDA backend, see below).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <moonmoe/moonmoe.hpp>
// nvcc: the real CUDA backend. A host compile with Thrust's OpenMP device system (-fopenmp
// -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem <cuda>/include/cccl -isystem <cuda>/include): the CUDA
// backend emulated on the host (backend/cuda/memory.hpp), so `--backend cuda` runs the same code there, without a GPU.
#if defined(__CUDACC__) || defined(THRUST_DEVICE_SYSTEM)
#include <moonmoe/backend/cuda.hpp>
#define MOONMOE_EXAMPLE_HAS_CUDA 1
#else
#define MOONMOE_EXAMPLE_HAS_CUDA 0
#endif

#ifndef MOONMOE_EXAMPLE_MODEL
#define MOONMOE_EXAMPLE_MODEL moonmoe::AnyDeepSeekV3
#endif

namespace example {

using Model = MOONMOE_EXAMPLE_MODEL;

/// The examples refuse NaN / Inf weights (naming the first such tensor) and a model larger than the memory
/// available.
inline const moonmoe::LoadOptions load_options{
    .memory_limit = std::nullopt, .with_optimizer_state = false, .check_finite = true};

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
            else if (*c == ' ' || *c == '\t')
                flush();
            else
                word += *c;
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

/// The backend an example runs on.
enum class Backend { cpu, cuda };

inline constexpr const char* backend_help =
    "--backend cpu|cuda   where the model runs (default cpu); cuda needs the example built by nvcc (<name>_cuda)\n";

/// Reads `--backend cpu|cuda` (or `--backend=...`) anywhere on the command line and removes it from argv (argc
/// shrinks), so the example's own arguments keep their positions. A value other than cpu or cuda is an error, and so
/// is cuda in a binary the C++ compiler built (no CUDA in it): the message says how to build one that has it.
inline Backend take_backend(int& argc, char** argv, const char* example) {
    Backend b = Backend::cpu;
    int out = 1;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i], value;
        if (a == "--backend") {
            if (i + 1 >= argc) throw std::invalid_argument("--backend needs a value: cpu or cuda");
            value = argv[++i];
        } else if (a.rfind("--backend=", 0) == 0) {
            value = a.substr(10);
        } else {
            argv[out++] = argv[i];
            continue;
        }
        if (value == "cpu") b = Backend::cpu;
        else if (value == "cuda")
            b = Backend::cuda;
        else
            throw std::invalid_argument("--backend '" + value + "': use cpu or cuda");
    }
    argc = out;
    argv[argc] = nullptr;
    if (b == Backend::cuda && !MOONMOE_EXAMPLE_HAS_CUDA)
        throw std::runtime_error(std::string("--backend cuda: this ") + example +
                                 " was built without CUDA (by the C++ compiler alone). Build the CUDA examples with "
                                 "nvcc: configure with -DMOONMOE_BUILD_CUDA=ON, build " +
                                 example +
                                 "_cuda and run "
                                 "build/examples/" +
                                 example + "_cuda --backend cuda (see examples/example_support.hpp)");
    return b;
}

/// Calls run.template operator()<moonmoe::cpu>() or <moonmoe::cuda>(), as chosen (take_backend has refused cuda
/// where this binary has no CUDA).
template <class Run>
int with_backend(Backend b, Run&& run) {
#if MOONMOE_EXAMPLE_HAS_CUDA
    if (b == Backend::cuda) return run.template operator()<moonmoe::cuda>();
#endif
    (void)b;
    return run.template operator()<moonmoe::cpu>();
}

/// True when an argument asks for help (--help or -h): the example then prints its usage and exits 0.
inline bool help_requested(int argc, char** argv) {
    for (int i = 1; i < argc; ++i)
        if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") return true;
    return false;
}

template <class B>
void describe(const moonmoe::nn::Transformer<B>& model, const char* dir) {
    const moonmoe::ModelConfig& c = model.config;
    std::printf(
        "%s%s: %lld layers (%lld dense), hidden %lld, %lld heads, %lld experts (top-%lld, %lld shared), "
        "vocab %lld, %lld parameters\n",
        dir, std::is_same_v<B, moonmoe::cpu> ? "" : " (on the CUDA backend)", (long long)c.dims.layers,
        (long long)c.dims.dense_layers, (long long)c.dims.hidden, (long long)c.attention.heads,
        (long long)c.moe.experts, (long long)c.moe.top_k, (long long)c.moe.shared, (long long)c.dims.vocab,
        (long long)moonmoe::count_parameters(c).total);
}

}  // namespace example
