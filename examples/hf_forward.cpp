// hf_forward: a Hugging Face DeepSeek-V3-architecture checkpoint and token ids in, logits out.
//
//   hf_forward <checkpoint dir> <logits.safetensors> <token id>...
// Runs the ids as one sequence through the model (f32), writes a tensor `logits` [tokens, vocab] and prints the
// five most likely next tokens. See example_support.hpp to compile it for a static model type.
// example-test: @SOURCE_DIR@/test/data/tiny_k2 @BINARY_DIR@/hf_forward_logits.safetensors 1 5 9 200 3
#include <algorithm>
#include <cmath>
#include <numeric>

#include "example_support.hpp"

int main(int argc, char** argv) try {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s <checkpoint dir> <logits.safetensors> <token id>...\n", argv[0]);
        return 2;
    }
    const std::vector<moonmoe::index_t> ids = example::token_ids(argc, argv, 3);
    moonmoe::nn::Transformer<> model = moonmoe::load_transformer<example::Model>(argv[1], example::load_options);
    example::describe(model, argv[1]);

    const moonmoe::index_t T = moonmoe::index_t(ids.size()), V = model.config.dims.vocab;
    moonmoe::nn::Transformer<>::Cache cache;
    moonmoe::Tensor<float, 2> logits = model.forward(ids.data(), moonmoe::nn::TokenLayout::sequences(1, T), cache);
    const moonmoe::NamedTensor out[] = {{"logits", {T, V}, std::span<const float>(logits.data(), std::size_t(T * V))}};
    moonmoe::write_tensors(argv[2], out);
    std::printf("wrote logits [%lld, %lld] to %s\n", (long long)T, (long long)V, argv[2]);

    const float* last = logits.data() + (T - 1) * V;
    std::vector<moonmoe::index_t> order(static_cast<std::size_t>(V));
    std::iota(order.begin(), order.end(), moonmoe::index_t{0});
    std::partial_sort(order.begin(), order.begin() + std::min<moonmoe::index_t>(5, V), order.end(),
                      [last](moonmoe::index_t a, moonmoe::index_t b) { return last[a] > last[b]; });
    const float m = last[order[0]];
    double z = 0.0;
    for (moonmoe::index_t v = 0; v < V; ++v) z += std::exp(double(last[v] - m));
    std::printf("most likely next tokens after position %lld:\n", (long long)(T - 1));
    for (moonmoe::index_t i = 0; i < std::min<moonmoe::index_t>(5, V); ++i)
        std::printf("  %8lld  p = %.4f  logit %.4f\n", (long long)order[i], std::exp(double(last[order[i]] - m)) / z,
                    last[order[i]]);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "hf_forward: %s\n", e.what());
    return 1;
}
