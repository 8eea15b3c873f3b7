// hf_forward: a Hugging Face DeepSeek-V3-architecture checkpoint and token sequences in, logits out.
//
//   hf_forward [--backend cpu|cuda] <checkpoint dir> <logits.safetensors> <token id>... [, <token id>...]...
// Runs the sequences (separated by ',') packed in one batch through the model (f32): attention stays within each
// sequence and positions restart at 0, so each gets the logits it would get alone. Writes `logits`
// [total tokens, vocab] (sequence 0's rows first) and `sequence_lengths` [sequences] (as float32), and prints the
// five most likely next tokens after each sequence. See example_support.hpp to compile it for a static model type.
// example-test: @SOURCE_DIR@/test/data/tiny_k2 @BINARY_DIR@/hf_forward_logits.safetensors 1 5 9 200 3 , 7 7 , 42
#include <algorithm>
#include <cmath>
#include <numeric>

#include "example_support.hpp"

namespace {

void usage(std::FILE* to, const char* argv0) {
    std::fprintf(
        to,
        "usage: %s [--backend cpu|cuda] <checkpoint dir> <logits.safetensors> <token id>... [, <token id>...]...\n"
        "Runs one or more token sequences, packed in one batch, through a Hugging Face DeepSeek-V3-architecture\n"
        "checkpoint; writes `logits` [total tokens, vocab] and `sequence_lengths` to the safetensors file and\n"
        "prints the five most likely next tokens after each sequence.\n%s%s",
        argv0, example::sequences_help, example::backend_help);
}

void print_top5(const float* last, moonmoe::index_t V) {
    std::vector<moonmoe::index_t> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), moonmoe::index_t{0});
    const moonmoe::index_t k = std::min<moonmoe::index_t>(5, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [last](moonmoe::index_t a, moonmoe::index_t b) { return last[a] > last[b]; });
    const float m = last[order[0]];
    double z = 0.0;
    for (moonmoe::index_t v = 0; v < V; ++v) z += std::exp(double(last[v] - m));
    for (moonmoe::index_t i = 0; i < k; ++i)
        std::printf("  %8lld  p = %.4f  logit %.4f\n", (long long)order[i], std::exp(double(last[order[i]] - m)) / z,
                    last[order[i]]);
}

template <class B>
int run(char** argv, const example::Sequences& seqs);

}  // namespace

int main(int argc, char** argv) try {
    if (example::help_requested(argc, argv)) return usage(stdout, argv[0]), 0;
    const example::Backend backend = example::take_backend(argc, argv, "hf_forward");
    if (argc < 4) return usage(stderr, argv[0]), 2;
    const example::Sequences seqs = example::token_sequences(argc, argv, 3);
    return example::with_backend(backend, [&]<class B>() { return run<B>(argv, seqs); });
} catch (const std::exception& e) {
    std::fprintf(stderr, "hf_forward: %s\n", e.what());
    return 1;
}

namespace {

template <class B>
int run(char** argv, const example::Sequences& seqs) {
    moonmoe::nn::Transformer<B> model = moonmoe::load_transformer<example::Model, B>(argv[1], example::load_options);
    example::describe(model, argv[1]);

    const moonmoe::nn::TokenLayout layout = seqs.layout();
    const moonmoe::index_t T = layout.tokens(), V = model.config.dims.vocab;
    typename moonmoe::nn::Transformer<B>::Cache cache;
    // the logits on the host, to write and to rank (on the GPU, the one copy back of this example)
    const std::vector<float> logits = moonmoe::to_host(model.forward(seqs.ids.data(), layout, cache));
    const std::vector<float> lengths(seqs.lengths.begin(), seqs.lengths.end());
    const moonmoe::NamedTensor out[] = {{"logits", {T, V}, std::span<const float>(logits.data(), std::size_t(T * V))},
                                        {"sequence_lengths", {seqs.count()}, std::span<const float>(lengths)}};
    moonmoe::write_tensors(argv[2], out);
    std::printf("wrote logits [%lld, %lld] of %lld sequence%s to %s\n", (long long)T, (long long)V,
                (long long)seqs.count(), seqs.count() > 1 ? "s" : "", argv[2]);

    for (moonmoe::index_t s = 0; s < layout.sequences(); ++s) {
        std::printf("sequence %lld (%lld token%s): most likely next tokens after position %lld:\n", (long long)s,
                    (long long)layout.length(s), layout.length(s) > 1 ? "s" : "", (long long)(layout.length(s) - 1));
        print_top5(logits.data() + (layout.end(s) - 1) * V, V);
    }
    return 0;
}

}  // namespace
