// hf_generate: greedy decoding with the latent KV cache (absorbed MLA: 576 values per token per layer for K2).
//
//   hf_generate <checkpoint dir> <new tokens> <prompt token id>...
// The prompt is prefilled through the absorbed form, then one token at a time; every token is printed as it comes.
// Stops early at an end-of-sequence id from config.json. See example_support.hpp for a static model type.
// example-test: @SOURCE_DIR@/test/data/tiny_k2 8 3 17 42 99 7
#include <algorithm>
#include <chrono>

#include "example_support.hpp"

int main(int argc, char** argv) try {
    if (argc < 4) {
        std::fprintf(stderr, "usage: %s <checkpoint dir> <new tokens> <prompt token id>...\n", argv[0]);
        return 2;
    }
    const long long steps = std::atoll(argv[2]);
    if (steps < 1) throw std::invalid_argument(std::string("new tokens '") + argv[2] + "' must be a positive integer");
    const std::vector<moonmoe::index_t> prompt = example::token_ids(argc, argv, 3);
    moonmoe::Checkpoint ck(argv[1]);
    const std::vector<moonmoe::index_t> eos = ck.config().eos_token_ids;
    const moonmoe::ModelConfig config = moonmoe::resolve(example::Model::config, ck.config());
    moonmoe::check_memory_budget(config, ck.config().source);
    moonmoe::nn::Transformer<> model(config);
    moonmoe::load_weights(model, ck, example::load_options);
    example::describe(model, argv[1]);

    const moonmoe::index_t V = model.config.dims.vocab;
    auto state = model.start_decoding(moonmoe::index_t(prompt.size()) + steps);
    const auto start = std::chrono::steady_clock::now();
    moonmoe::Tensor<float, 2> logits = model.decode(prompt.data(), moonmoe::index_t(prompt.size()), state);
    std::printf("prompt:");
    for (moonmoe::index_t t : prompt) std::printf(" %lld", (long long)t);
    std::printf("\ngenerated:");
    long long produced = 0;
    for (; produced < steps; ++produced) {
        const float* last = logits.data() + (logits.size(0) - 1) * V;
        const moonmoe::index_t next = moonmoe::index_t(std::max_element(last, last + V) - last);
        std::printf(" %lld", (long long)next);
        std::fflush(stdout);
        if (std::find(eos.begin(), eos.end(), next) != eos.end()) {
            ++produced;
            std::printf(" (end of sequence)");
            break;
        }
        if (produced + 1 < steps) logits = model.decode(&next, 1, state);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const moonmoe::ModelConfig& c = model.config;
    std::printf("\n%lld tokens in %.3f s; latent cache: %lld tokens x %lld layers x %lld values (f32)\n", produced,
                seconds, (long long)state.length(), (long long)c.dims.layers,
                (long long)(c.attention.kv_rank + c.attention.rope_dim));
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "hf_generate: %s\n", e.what());
    return 1;
}
