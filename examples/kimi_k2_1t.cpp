// kimi_k2_1t: the full Kimi K2 model as a type, next to DeepSeek-V3: what it holds, what a token costs, and what
// one rank of K2's Parallel<16, 16, DP> training layout keeps in memory. Everything printed is computed at compile
// time from the type; nothing of the 1T parameters is allocated.
// example-test:
#include <cstdio>
#include <string>

#include <moonmoe/moonmoe.hpp>

namespace {

using moonmoe::index_t;

// K2 pre-trained at a 4096-token context (report §2.5).
constexpr index_t kSeqLen = 4096;

// Everything the example prints is a constant expression: the counts below are evaluated by the compiler.
constexpr auto k2 = moonmoe::KimiK2::parameters();
constexpr auto v3 = moonmoe::DeepSeekV3::parameters();
constexpr auto k2_flops = moonmoe::KimiK2::flops_per_token(kSeqLen);
constexpr auto v3_flops = moonmoe::DeepSeekV3::flops_per_token(kSeqLen);
static_assert(k2.total == 1'026'408'232'448 && v3.total == 671'026'419'200);

std::string grouped(index_t v) {
    std::string digits = std::to_string(v < 0 ? -v : v), out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return v < 0 ? "-" + out : out;
}

void row(const char* what, index_t a, index_t b) {
    std::printf("  %-44s %22s %22s\n", what, grouped(a).c_str(), grouped(b).c_str());
}
void rowf(const char* what, const char* unit, double a, double b) {
    std::printf("  %-44s %18.2f %-3s %18.2f %-3s\n", what, a, unit, b, unit);
}
void heading(const char* title) {
    std::printf("\n%s\n  %-44s %22s %22s\n", title, "", "Kimi K2", "DeepSeek-V3");
}

template <class Model>
void print_pipeline(const char* name) {
    constexpr auto& par = Model::config.parallel;
    constexpr index_t layers = Model::config.dims.layers;
    std::printf("\n%s on Parallel<PP=%ld, EP=%ld, DP>, %ld virtual stages per pipeline rank (%ld chunks):\n", name,
                long(par.pp), long(par.ep), long(par.virtual_stages), long(par.chunks()));
    std::printf("  layers per chunk, in pipeline order:");
    for (index_t c = 0; c < par.chunks(); ++c) std::printf(" %ld", long(moonmoe::layers_in_chunk(par, layers, c)));
    std::printf("\n  layers per pipeline rank (its %ld chunks):", long(par.virtual_stages));
    for (index_t r = 0; r < par.pp; ++r) {
        index_t n = 0;
        for (index_t c = r; c < par.chunks(); c += par.pp) n += moonmoe::layers_in_chunk(par, layers, c);
        std::printf(" %ld", long(n));
    }
    std::printf("\n  interleaved 1F1B bubble (PP-1)/(V*m):");
    for (index_t m : {16, 32, 64, 128})
        std::printf("  m=%ld: %.1f%%", long(m), 100.0 * moonmoe::bubble_fraction(par, m));
    std::printf("\n");
}

template <class Model>
void print_memory(const char* name) {
    std::printf("\n%s, bytes held by the most loaded rank (BF16 weights, FP32 gradient buffer, ZeRO-1 %s state):\n",
                name, Model::config.optimizer.muon.enabled ? "Muon + AdamW" : "AdamW");
    std::printf("  %6s %6s %8s %12s %10s %10s %10s %10s %10s\n", "DP", "GPUs", "rank", "layers", "params",
                "weights", "grads", "optimizer", "total");
    for (index_t dp : {1, 2, 8, 32}) {
        const moonmoe::RankMemory m = Model::memory_per_rank(dp);
        std::printf("  %6ld %6ld %8ld %5ld (%ld MoE) %8.2f B %7.2f GB %7.2f GB %7.2f GB %7.2f GB\n", long(dp),
                    long(dp * Model::config.parallel.model_parallel_ranks()), long(m.pipeline_rank), long(m.layers),
                    long(m.moe_layers), m.params() / 1e9, m.weight_bytes / 1e9, m.gradient_bytes / 1e9,
                    m.optimizer_bytes / 1e9, m.total_bytes() / 1e9);
    }
}

}  // namespace

int main() {
    std::printf("moonmoe %d.%d.%d: Kimi K2 as a C++ type (no weights allocated; all figures are constexpr)\n",
                MOONMOE_VERSION_MAJOR, MOONMOE_VERSION_MINOR, MOONMOE_VERSION_PATCH);

    heading("Parameters per component");
    row("embed_tokens", k2.embedding, v3.embedding);
    row("attention (MLA) per layer, incl. latent norms", k2.attention_layer.total(), v3.attention_layer.total());
    row("  q_a_proj", k2.attention_layer.q_a_proj, v3.attention_layer.q_a_proj);
    row("  q_b_proj", k2.attention_layer.q_b_proj, v3.attention_layer.q_b_proj);
    row("  kv_a_proj_with_mqa", k2.attention_layer.kv_a_proj_with_mqa, v3.attention_layer.kv_a_proj_with_mqa);
    row("  kv_b_proj", k2.attention_layer.kv_b_proj, v3.attention_layer.kv_b_proj);
    row("  o_proj", k2.attention_layer.o_proj, v3.attention_layer.o_proj);
    row("attention, all layers", k2.attention, v3.attention);
    row("dense MLPs (first layers)", k2.dense_mlps, v3.dense_mlps);
    row("routed experts per MoE layer", k2.routed_experts_layer, v3.routed_experts_layer);
    row("routed experts, all MoE layers", k2.routed_experts, v3.routed_experts);
    row("shared experts, all MoE layers", k2.shared_experts, v3.shared_experts);
    row("routers (gate + correction bias), all", k2.routers, v3.routers);
    row("RMSNorm gains (2 per layer + final)", k2.layer_norms, v3.layer_norms);
    row("lm_head", k2.lm_head, v3.lm_head);
    row("TOTAL", k2.total, v3.total);
    row("total without embed_tokens and lm_head", k2.total_without_embeddings, v3.total_without_embeddings);
    row("ACTIVATED per token (TopK + shared experts)", k2.active, v3.active);
    row("activated without the input embedding", k2.active_without_input_embedding,
        v3.active_without_input_embedding);
    row("activated without embed_tokens and lm_head", k2.active_without_embeddings, v3.active_without_embeddings);
    std::printf("  The K2 report quotes 1.04T total / 32.6B activated (DeepSeek-V3: 671B / 37B). Counting the released\n"
                "  config.json gives 1.026T / 32.9B: the report's convention is not disclosed (one extra MTP-style\n"
                "  module would make 1.04T, but K2 ships none), so the exact counts above are what the weights hold.\n");

    heading("Forward FLOPs per token at sequence length 4096");
    row("attention projections", k2_flops.attention_projections, v3_flops.attention_projections);
    row("attention scores (q.k, p.v; causal)", k2_flops.attention_scores, v3_flops.attention_scores);
    row("dense MLPs", k2_flops.dense_mlps, v3_flops.dense_mlps);
    row("routed experts (TopK per layer)", k2_flops.routed_experts, v3_flops.routed_experts);
    row("shared experts", k2_flops.shared_experts, v3_flops.shared_experts);
    row("routers", k2_flops.routers, v3_flops.routers);
    row("lm_head", k2_flops.lm_head, v3_flops.lm_head);
    row("forward", k2_flops.forward, v3_flops.forward);
    row("forward + backward (3x forward)", k2_flops.forward_backward, v3_flops.forward_backward);
    rowf("forward + backward per 67M-token K2 batch", "EF", k2_flops.forward_backward * 67.0e6 / 1e18,
         v3_flops.forward_backward * 67.0e6 / 1e18);

    print_pipeline<moonmoe::KimiK2>("Kimi K2");
    print_pipeline<moonmoe::DeepSeekV3>("DeepSeek-V3");

    constexpr auto& par = moonmoe::KimiK2::config.parallel;
    const double six_bytes = 6.0 * double(k2.total);
    std::printf("\nWhere the report's \"about 6 TB over 256 GPUs, about 30 GB per GPU\" comes from:\n");
    std::printf("  BF16 weights (2 B) + FP32 gradient buffer (4 B) = 6 B per parameter x %s = %.2f TB,\n",
                grouped(k2.total).c_str(), six_bytes / 1e12);
    std::printf("  over the PP x EP = %ld x %ld = %ld ranks of one model replica: %.1f GB per rank on average.\n",
                long(par.pp), long(par.ep), long(par.model_parallel_ranks()),
                six_bytes / double(par.model_parallel_ranks()) / 1e9);
    const auto busiest = moonmoe::KimiK2::memory_per_rank(1024);
    std::printf("  The most loaded rank holds %ld MoE layers (%.2f B parameters): %.1f GB of weights and gradients;\n"
                "  with ZeRO-1 over many replicas the optimizer state shrinks to %.2f GB at DP = 1024 (%.1f GB in all).\n",
                long(busiest.moe_layers), busiest.params() / 1e9,
                (busiest.weight_bytes + busiest.gradient_bytes) / 1e9, busiest.optimizer_bytes / 1e9,
                busiest.total_bytes() / 1e9);

    print_memory<moonmoe::KimiK2>("Kimi K2");
    print_memory<moonmoe::DeepSeekV3>("DeepSeek-V3");
    return 0;
}
