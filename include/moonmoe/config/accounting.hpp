// moonmoe/config/accounting.hpp: exact constexpr counts for a ModelConfig: parameters (total and activated),
// forward FLOPs per token, and bytes held per rank under a Parallel<> layout.
//
// The parameter formulas count the tensors of the released checkpoints; they reproduce 1,026,408,232,448 for Kimi K2 and
// 671,026,419,200 for DeepSeek-V3. All functions take sizes resolved (no Dynamic left).
#pragma once

#include <stdexcept>

#include "model_config.hpp"

namespace moonmoe {

/// One attention layer's parameters by HF tensor name (0 where the tensor does not exist in this layout).
struct AttentionParams {
    index_t q_a_proj = 0, q_a_layernorm = 0, q_b_proj = 0, q_proj = 0;   // q_proj: MLA without q compression, MHA
    index_t kv_a_proj_with_mqa = 0, kv_a_layernorm = 0, kv_b_proj = 0;  // MLA
    index_t k_proj = 0, v_proj = 0;                                      // MHA
    index_t o_proj = 0;

    constexpr index_t total() const {
        return q_a_proj + q_a_layernorm + q_b_proj + q_proj + kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj +
               k_proj + v_proj + o_proj;
    }
    /// Entries that are matrices (the rest are norm gains).
    constexpr index_t matrices() const { return total() - q_a_layernorm - kv_a_layernorm; }
};

constexpr AttentionParams count_attention(const ModelConfig& c) {
    const auto& a = c.attention;
    const index_t H = c.dims.hidden, h = a.heads, dqk = a.nope_dim + a.rope_dim;
    AttentionParams p;
    if (a.kind == AttentionKind::mla) {
        if (a.q_rank > 0) {
            p.q_a_proj = a.q_rank * H;
            p.q_a_layernorm = a.q_rank;
            p.q_b_proj = h * dqk * a.q_rank;
        } else {
            p.q_proj = h * dqk * H;
        }
        p.kv_a_proj_with_mqa = (a.kv_rank + a.rope_dim) * H;
        p.kv_a_layernorm = a.kv_rank;
        p.kv_b_proj = h * (a.nope_dim + a.v_dim) * a.kv_rank;
    } else {
        p.q_proj = h * dqk * H;
        p.k_proj = a.kv_heads * dqk * H;
        p.v_proj = a.kv_heads * a.v_dim * H;
    }
    p.o_proj = H * h * a.v_dim;
    return p;
}

struct ParameterCounts {
    AttentionParams attention_layer;  ///< one layer, including the q_a / kv_a norms
    index_t attention;                ///< all layers
    index_t layer_norms;              ///< input and post-attention norms of every layer, plus the final norm
    index_t dense_mlp_layer, dense_mlps;
    index_t expert;                   ///< one routed expert: gate, up and down projections
    index_t routed_experts_layer, shared_experts_layer, router_layer;  ///< router: gate weight + correction bias
    index_t routed_experts, shared_experts, routers;                   ///< over all MoE layers
    index_t embedding, lm_head;
    index_t total;
    index_t total_without_embeddings;   ///< without embed_tokens and lm_head
    /// Activated parameters, the published convention: the weights one token's forward multiplies by (TopK routed
    /// and the shared experts, attention, routers, norms, lm_head), without embed_tokens (a table lookup). This is
    /// the count behind DeepSeek-V2-Lite's 2.4B, DeepSeek-V2's 21B, DeepSeek-V3's 37B (arXiv 2412.19437) and Kimi
    /// K2's 32B (Kimi K2 technical report §1): 2.45B, 20.9B, 36.6B and 31.7B here.
    index_t active;
    index_t active_with_embeddings;     ///< active plus embed_tokens
    index_t active_without_embeddings;  ///< active without lm_head as well
};

constexpr ParameterCounts count_parameters(const ModelConfig& c) {
    const index_t H = c.dims.hidden, L = c.dims.layers, D = c.dims.dense_layers, M = c.moe_layers();
    const index_t E = c.moe.experts;
    ParameterCounts p{};
    p.attention_layer = count_attention(c);
    p.attention = L * p.attention_layer.total();
    p.layer_norms = 2 * H * L + H;
    p.dense_mlp_layer = 3 * H * c.dims.dense_hidden;
    p.dense_mlps = D * p.dense_mlp_layer;
    p.expert = 3 * H * c.moe.expert_hidden;
    p.routed_experts_layer = E * p.expert;
    p.shared_experts_layer = c.moe.shared * p.expert;
    p.router_layer = E * H + (c.moe.correction_bias ? E : 0);
    p.routed_experts = M * p.routed_experts_layer;
    p.shared_experts = M * p.shared_experts_layer;
    p.routers = M * p.router_layer;
    p.embedding = c.dims.vocab * H;
    p.lm_head = c.dims.vocab * H;
    const index_t common = p.attention + p.layer_norms + p.dense_mlps + p.shared_experts + p.routers;
    p.total_without_embeddings = common + p.routed_experts;
    p.total = p.total_without_embeddings + p.embedding + p.lm_head;
    p.active_without_embeddings = common + M * c.moe.top_k * p.expert;
    p.active = p.active_without_embeddings + p.lm_head;
    p.active_with_embeddings = p.active + p.embedding;
    return p;
}

/// Forward FLOPs per token, 2 per multiply-add. Matrix products count every weight a token touches; attention
/// scores (q.k and p.v) count the causal average over a sequence of `seq_len`: position i attends to i keys.
/// Element-wise work (norms, activations, softmax, RoPE) is left out: it is O(hidden) per token.
struct FlopCounts {
    index_t attention_projections;  ///< q / kv / o projections, all layers
    index_t attention_scores;       ///< q.k and p.v, all layers
    index_t dense_mlps;
    index_t routed_experts;         ///< TopK experts per MoE layer
    index_t shared_experts;
    index_t routers;
    index_t lm_head;
    index_t forward;                ///< the sum
    index_t forward_backward;       ///< 3 x forward: backward computes an input and a weight gradient per product
};

constexpr FlopCounts count_flops(const ModelConfig& c, index_t seq_len) {
    const auto a = c.attention;
    const index_t H = c.dims.hidden, L = c.dims.layers, D = c.dims.dense_layers, M = c.moe_layers();
    const ParameterCounts p = count_parameters(c);
    FlopCounts f{};
    f.attention_projections = 2 * L * p.attention_layer.matrices();
    // sum over i = 1..s of i keys = s(s+1)/2, per token (s+1)/2; times 2 flops per MAC -> (s+1) per (q.k + p.v) dim
    f.attention_scores = L * a.heads * (a.nope_dim + a.rope_dim + a.v_dim) * (seq_len + 1);
    f.dense_mlps = 2 * D * p.dense_mlp_layer;
    f.routed_experts = 2 * M * c.moe.top_k * p.expert;
    f.shared_experts = 2 * M * p.shared_experts_layer;
    f.routers = 2 * M * c.moe.experts * H;
    f.lm_head = 2 * p.lm_head;
    f.forward = f.attention_projections + f.attention_scores + f.dense_mlps + f.routed_experts + f.shared_experts +
                f.routers + f.lm_head;
    f.forward_backward = 3 * f.forward;
    return f;
}

/// Bytes one rank holds for training: BF16 weights, an FP32 gradient-accumulation buffer, and ZeRO-1 sharded
/// optimizer state (FP32 master copy plus Muon's momentum, or AdamW's two moments). Muon takes every matrix but
/// the embedding and the head (unless NoMuon); AdamW takes the rest; the router's correction bias is FP32 with
/// neither gradient nor optimizer state (it moves by the balancing rule). Non-expert state is sharded over the
/// EP x DP ranks that replicate it, routed-expert state over the DP replicas of the expert shard.
struct RankMemory {
    index_t pipeline_rank;  ///< the most loaded pipeline rank (any of its EP ranks holds the same)
    index_t layers, dense_layers, moe_layers;
    bool embedding, head;
    index_t dp;             ///< data-parallel size used
    index_t expert_params;  ///< routed-expert parameters on this rank (its 1/EP share of each MoE layer)
    index_t replicated_params;  ///< everything else on this rank (replicated over the EP ranks)
    index_t muon_params, adamw_params, bias_params;
    index_t weight_bytes, gradient_bytes, optimizer_bytes;

    constexpr index_t params() const { return expert_params + replicated_params; }
    constexpr index_t total_bytes() const { return weight_bytes + gradient_bytes + optimizer_bytes; }
};

namespace detail {
constexpr index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }
}  // namespace detail

constexpr RankMemory rank_memory(const ModelConfig& c, index_t pipeline_rank, index_t dp) {
    const ParallelConfig& par = c.parallel;
    const index_t H = c.dims.hidden, L = c.dims.layers, D = c.dims.dense_layers;
    const ParameterCounts p = count_parameters(c);
    RankMemory r{};
    r.pipeline_rank = pipeline_rank;
    r.dp = par.dp != Dynamic ? par.dp : dp;
    if (r.dp == Dynamic || r.dp < 1)
        throw std::invalid_argument("rank_memory: the data-parallel size is Dynamic or below 1; pass DP >= 1");
    for (index_t chunk = pipeline_rank; chunk < par.chunks(); chunk += par.pp) {
        const index_t first = first_layer_of_chunk(par, L, chunk), n = layers_in_chunk(par, L, chunk);
        const index_t dense = first >= D ? 0 : (first + n <= D ? n : D - first);
        r.layers += n;
        r.dense_layers += dense;
        r.moe_layers += n - dense;
    }
    r.embedding = pipeline_rank == 0;
    r.head = pipeline_rank == (par.chunks() - 1) % par.pp;

    const index_t attention_matrices = p.attention_layer.matrices();
    const index_t attention_norms = p.attention_layer.total() - attention_matrices;
    const index_t router_weight = c.moe.experts * H, router_bias = p.router_layer - router_weight;
    r.expert_params = r.moe_layers * (p.routed_experts_layer / par.ep);
    r.bias_params = r.moe_layers * router_bias;
    const index_t replicated_muon = r.layers * attention_matrices + r.dense_layers * p.dense_mlp_layer +
                                    r.moe_layers * (p.shared_experts_layer + router_weight);
    const index_t adamw = r.layers * (attention_norms + 2 * H) + (r.embedding ? p.embedding : 0) +
                          (r.head ? p.lm_head + H : 0);
    r.replicated_params = replicated_muon + adamw + r.bias_params;
    r.muon_params = c.optimizer.muon.enabled ? replicated_muon + r.expert_params : 0;
    r.adamw_params = adamw + (c.optimizer.muon.enabled ? 0 : replicated_muon + r.expert_params);

    const index_t trained = replicated_muon + r.expert_params + adamw;
    r.weight_bytes = 2 * trained + 4 * r.bias_params;
    r.gradient_bytes = 4 * trained;
    const index_t matrix_state = c.optimizer.muon.enabled ? 8 : 12;  // Muon: master + momentum; AdamW: + 2 moments
    r.optimizer_bytes = detail::ceil_div(matrix_state * replicated_muon + 12 * adamw, par.ep * r.dp) +
                        detail::ceil_div(matrix_state * r.expert_params, r.dp);
    return r;
}

/// The pipeline rank holding the most bytes (ties: the lowest rank).
constexpr RankMemory most_loaded_rank(const ModelConfig& c, index_t dp = Dynamic) {
    RankMemory best = rank_memory(c, 0, dp);
    for (index_t rank = 1; rank < c.parallel.pp; ++rank) {
        RankMemory r = rank_memory(c, rank, dp);
        if (r.total_bytes() > best.total_bytes()) best = r;
    }
    return best;
}

}  // namespace moonmoe
