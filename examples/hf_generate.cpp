// hf_generate: greedy decoding of one or more prompts at once with the latent KV cache (absorbed MLA: 576 values
// per token per layer for K2).
//
//   hf_generate [--backend cpu|cuda] <checkpoint dir> <new tokens> <prompt token id>... [, <prompt token id>...]...
// Every prompt (prompts separated by ',') gets its own cache; all are prefilled in one batch, then decoded together
// one token per step, each attending only to its own cache, so each generates what it would generate alone. Each
// step's tokens are printed as they come; a sequence stops at an end-of-sequence id from config.json or after
// <new tokens>. See example_support.hpp for a static model type.
// example-test: @SOURCE_DIR@/test/data/tiny_k2 8 3 17 42 99 7 , 5 , 11 12 13
#include <algorithm>
#include <chrono>

#include "example_support.hpp"

namespace {

void usage(std::FILE* to, const char* argv0) {
    std::fprintf(to,
                 "usage: %s [--backend cpu|cuda] <checkpoint dir> <new tokens> <prompt token id>... [, <prompt token "
                 "id>...]...\n"
                 "Greedy decoding of one or more prompts at once, each with its own latent KV cache; stops a sequence\n"
                 "at an end-of-sequence id from config.json or after <new tokens> tokens.\n%s%s",
                 argv0, example::sequences_help, example::backend_help);
}

template <class B>
int run(const char* dir, long long steps, const example::Sequences& prompts) {
    using moonmoe::index_t;
    moonmoe::Checkpoint ck(dir);
    const std::vector<index_t> eos = ck.config().eos_token_ids;
    const moonmoe::ModelConfig config = moonmoe::resolve(example::Model::config, ck.config());
    moonmoe::check_memory_budget(config, ck.config().source);
    moonmoe::nn::Transformer<B> model(config);
    moonmoe::load_weights(model, ck, example::load_options);
    example::describe(model, dir);

    const index_t V = model.config.dims.vocab, N = prompts.count();
    // prompt + new tokens within the context, checked before any addition can overflow or a cache is allocated
    const index_t context = model.config.rope.max_positions;
    for (index_t s = 0; s < N; ++s)
        if (const index_t len = prompts.lengths[std::size_t(s)]; len > context || steps > context - len)
            throw std::invalid_argument(
                "prompt " + std::to_string(s) + " has " + std::to_string(len) + " tokens and " + std::to_string(steps) +
                " new tokens were asked for: more than the model's context of " + std::to_string(context) +
                " positions (max_position_embeddings in " + std::string(dir) + "/config.json); ask for at most " +
                std::to_string(std::max<index_t>(0, context - len)) + " new tokens");
    std::vector<typename moonmoe::nn::Transformer<B>::DecodeState> states;
    for (index_t len : prompts.lengths) states.push_back(model.start_decoding(len + steps));
    std::vector<std::vector<index_t>> generated(static_cast<std::size_t>(N));
    std::vector<bool> ended(static_cast<std::size_t>(N), false);
    std::printf("%lld prompt%s (", (long long)N, N > 1 ? "s" : "");
    for (index_t s = 0; s < N; ++s) std::printf("%s%lld", s ? ", " : "", (long long)prompts.lengths[std::size_t(s)]);
    std::printf(" tokens), prefilled in one batch\n");

    const auto start = std::chrono::steady_clock::now();
    // step 0 prefills every prompt; later steps feed each unfinished sequence its last token
    std::vector<index_t> active(static_cast<std::size_t>(N)), counts = prompts.lengths, ids = prompts.ids;
    const moonmoe::nn::TokenLayout prompt_layout = prompts.layout();
    for (index_t s = 0; s < N; ++s) active[std::size_t(s)] = s;
    long long produced = 0;
    for (long long step = 1; !active.empty(); ++step) {
        std::vector<typename moonmoe::nn::Transformer<B>::DecodeState*> batch;
        for (index_t s : active) batch.push_back(&states[std::size_t(s)]);
        // this step's logits on the host for the greedy choice (on the GPU, the one copy back per step)
        const std::vector<float> logits = moonmoe::to_host(model.decode(ids.data(), counts, batch));
        const std::vector<index_t> fed = counts;
        std::vector<index_t> still;
        ids.clear();
        std::printf("step %lld:", step);
        index_t row = -1;
        for (std::size_t i = 0; i < active.size(); ++i) {
            const index_t s = active[i];
            row += fed[i];  // the last row of sequence s in this step
            const float* last = logits.data() + row * V;
            const index_t next = index_t(std::max_element(last, last + V) - last);
            generated[std::size_t(s)].push_back(next);
            ++produced;
            const bool eos_hit = std::find(eos.begin(), eos.end(), next) != eos.end();
            std::printf("  [%lld] %lld%s", (long long)s, (long long)next, eos_hit ? " (end of sequence)" : "");
            if (eos_hit || index_t(generated[std::size_t(s)].size()) == steps) continue;
            still.push_back(s), ids.push_back(next);
        }
        std::printf("\n");
        std::fflush(stdout);
        active = still;
        counts.assign(active.size(), 1);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    index_t cached = 0;
    for (index_t s = 0; s < N; ++s) {
        std::printf("sequence %lld:", (long long)s);
        for (index_t i = prompt_layout.begin(s); i < prompt_layout.end(s); ++i)
            std::printf(" %lld", (long long)prompts.ids[std::size_t(i)]);
        std::printf(" |");
        for (index_t t : generated[std::size_t(s)]) std::printf(" %lld", (long long)t);
        std::printf("\n");
        cached += states[std::size_t(s)].length();
    }
    const moonmoe::ModelConfig& c = model.config;
    std::printf("%lld tokens in %.3f s; latent caches: %lld tokens x %lld layers x %lld values (f32)\n", produced,
                seconds, (long long)cached, (long long)c.dims.layers,
                (long long)(c.attention.kv_rank + c.attention.rope_dim));
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    if (example::help_requested(argc, argv)) return usage(stdout, argv[0]), 0;
    const example::Backend backend = example::take_backend(argc, argv, "hf_generate");
    if (argc < 4) return usage(stderr, argv[0]), 2;
    char* end = nullptr;
    const long long steps = std::strtoll(argv[2], &end, 10);
    if (*end != '\0' || steps < 1)
        throw std::invalid_argument(std::string("new tokens '") + argv[2] + "' must be a positive integer");
    const example::Sequences prompts = example::token_sequences(argc, argv, 3);
    return example::with_backend(backend, [&]<class B>() { return run<B>(argv[1], steps, prompts); });
} catch (const std::exception& e) {
    std::fprintf(stderr, "hf_generate: %s\n", e.what());
    return 1;
}
