// hf_train_step: one forward and backward of the causal-LM loss (labels = the ids, shifted, as transformers does)
// over one or more sequences packed in one batch.
//
//   hf_train_step [--backend cpu|cuda] <checkpoint dir> <gradients.safetensors> <token id>... [, <token id>...]...
// Sequences are separated by ','. The loss is the mean over every target of the batch (each token's target is the
// next token of its own sequence; a sequence's last token has none), as transformers computes the loss of a packed
// batch. Writes `loss` and the gradient of every parameter under its Hugging Face name. See example_support.hpp for
// a static model type.
// example-test: @SOURCE_DIR@/test/data/tiny_v3_sharded @BINARY_DIR@/hf_train_step_grads.safetensors 4 8 15 16 23 42 , 7
// 9 11
#include <chrono>

#include "example_support.hpp"

namespace {

void usage(std::FILE* to, const char* argv0) {
    std::fprintf(
        to,
        "usage: %s [--backend cpu|cuda] <checkpoint dir> <gradients.safetensors> <token id>... [, <token id>...]...\n"
        "One forward and backward of the causal-LM loss over one or more sequences packed in one batch; writes\n"
        "`loss` and every parameter's gradient under its Hugging Face name. At least one sequence needs two\n"
        "tokens (a token's target is the next token of its sequence).\n%s%s",
        argv0, example::sequences_help, example::backend_help);
}

}  // namespace

int main(int argc, char** argv) try {
    if (example::help_requested(argc, argv)) return usage(stdout, argv[0]), 0;
    const example::Backend backend = example::take_backend(argc, argv, "hf_train_step");
    if (argc < 4) return usage(stderr, argv[0]), 2;
    const example::Sequences seqs = example::token_sequences(argc, argv, 3);
    const moonmoe::index_t targets = moonmoe::index_t(seqs.ids.size()) - seqs.count();
    if (targets == 0)
        throw std::invalid_argument(
            "no sequence has two tokens, so there is no target to learn (a token's target is "
            "the next token of its sequence)");
    return example::with_backend(backend, [&]<class B>() {
        // loaded straight to the backend (on the GPU: no host copy of the whole model)
        moonmoe::nn::Transformer<B> model =
            moonmoe::load_transformer<example::Model, B>(argv[1], example::load_options);
        example::describe(model, argv[1]);
        const auto start = std::chrono::steady_clock::now();
        const float loss = model.train_step(seqs.ids.data(), seqs.layout());  // the loss reaches the host: a sync
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const moonmoe::NamedTensor extra[] = {{"loss", {1}, std::span<const float>(&loss, 1)}};
        moonmoe::save_parameters(argv[2], model, moonmoe::Saved::gradients, extra);
        std::printf(
            "loss %.6f over %lld targets in %lld sequence%s (forward + backward %.3f s); gradients written to "
            "%s\n",
            loss, (long long)targets, (long long)seqs.count(), seqs.count() > 1 ? "s" : "", seconds, argv[2]);
        return 0;
    });
} catch (const std::exception& e) {
    std::fprintf(stderr, "hf_train_step: %s\n", e.what());
    return 1;
}
