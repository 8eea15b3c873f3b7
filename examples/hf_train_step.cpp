// hf_train_step: one forward and backward of the causal-LM loss (labels = the ids, shifted, as transformers does).
//
//   hf_train_step <checkpoint dir> <gradients.safetensors> <token id>...
// Writes `loss` and the gradient of every parameter under its Hugging Face name. See example_support.hpp for a
// static model type.
// example-test: @SOURCE_DIR@/test/data/tiny_v3_sharded @BINARY_DIR@/hf_train_step_grads.safetensors 4 8 15 16 23 42
#include <chrono>

#include "example_support.hpp"

int main(int argc, char** argv) try {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s <checkpoint dir> <gradients.safetensors> <token id> <token id>...\n", argv[0]);
        return 2;
    }
    const std::vector<moonmoe::index_t> ids = example::token_ids(argc, argv, 3);
    moonmoe::nn::Transformer<> model = moonmoe::load_transformer<example::Model>(argv[1], example::load_options);
    example::describe(model, argv[1]);
    const auto start = std::chrono::steady_clock::now();
    const float loss = model.train_step(ids.data(), moonmoe::nn::TokenLayout::sequences(1, moonmoe::index_t(ids.size())));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const moonmoe::NamedTensor extra[] = {{"loss", {1}, std::span<const float>(&loss, 1)}};
    moonmoe::save_parameters(argv[2], model, moonmoe::Saved::gradients, extra);
    std::printf("loss %.6f over %zu tokens (forward + backward %.3f s); gradients written to %s\n", loss,
                ids.size() - 1, seconds, argv[2]);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "hf_train_step: %s\n", e.what());
    return 1;
}
