// moonmoe/config/accounting.hpp: exact constexpr counts for a ModelConfig: parameters (total and activated),
// forward FLOPs per token, the activations a backward needs under an activation policy (Activations<...>, its
// run-time form ActivationsConfig; activation_steps lists the K2 report's five), and bytes held per rank
// under a Parallel<> layout (states, and the activations of the micro-batches its pipeline schedule keeps in flight).
//
// The parameter formulas count the tensors of the released checkpoints; they reproduce 1,026,408,232,448 for Kimi K2
// and 671,026,419,200 for DeepSeek-V3. All functions take sizes resolved (no Dynamic left).
#pragma once

#include <stdexcept>

#include "model_config.hpp"

namespace moonmoe {

/// One attention layer's parameters by HF tensor name (0 where the tensor does not exist in this layout).
struct AttentionParams {
    index_t q_a_proj = 0, q_a_layernorm = 0, q_b_proj = 0, q_proj = 0;  // q_proj: MLA without q compression, MHA
    index_t kv_a_proj_with_mqa = 0, kv_a_layernorm = 0, kv_b_proj = 0;  // MLA
    index_t k_proj = 0, v_proj = 0;                                     // MHA
    index_t o_proj = 0;

    constexpr index_t total() const {
        return q_a_proj + q_a_layernorm + q_b_proj + q_proj + kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj + k_proj +
               v_proj + o_proj;
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
    index_t expert;  ///< one routed expert: gate, up and down projections
    index_t routed_experts_layer, shared_experts_layer, router_layer;  ///< router: gate weight + correction bias
    index_t routed_experts, shared_experts, routers;                   ///< over all MoE layers
    index_t embedding, lm_head;
    index_t total;
    index_t total_without_embeddings;  ///< without embed_tokens and lm_head
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
    index_t routed_experts;  ///< TopK experts per MoE layer
    index_t shared_experts;
    index_t routers;
    index_t lm_head;
    index_t forward;           ///< the sum
    index_t forward_backward;  ///< 3 x forward: backward computes an input and a weight gradient per product
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

// ---- activations ----

/// Under offload the GPU holds three (micro-batch, chunk) units: the one being computed, the last forward's being
/// offloaded and the next backward's being prefetched (K2 report §2.4.3: "we offload the forward activations of the
/// previous micro-batch while prefetching the backward activations of the next").
inline constexpr index_t activation_resident_units = 3;

/// What a kept tensor is, which decides its storage under each policy.
enum class Kept : unsigned char {
    value,          ///< a value the compute policy rounds: ActivationsConfig::value_bytes() per element
    norm_output,    ///< an RMSNorm's output (or a copy of it): recomputed under `recompute_norms`
    up_projection,  ///< q_b_proj's or kv_b_proj's output: recomputed under `recompute_up_projections`
    mlp_input,      ///< an MoE up-projection's or SwiGLU's input: FP8 under `fp8_mlp_inputs`
    f32,            ///< f32 under every policy: 1/rms, log-sum-exp, the router's scores and weights, dlogits
    index,          ///< index_t: positions and routing indices
};

struct KeptTensor {
    const char* name = "";
    index_t rows = 0, cols = 0;
    Kept kind = Kept::value;

    constexpr index_t elements() const { return rows * cols; }
    /// Its bytes under the activation policy `a` (Model<..., Activations<...>>::config.activations).
    constexpr index_t bytes(const ActivationsConfig& a) const {
        const index_t n = elements(), value = a.value_bytes() * n;
        switch (kind) {
        case Kept::f32: return 4 * n;
        case Kept::index: return index_t(sizeof(index_t)) * n;
        case Kept::norm_output: return a.recompute_norms ? 0 : value;
        case Kept::up_projection: return a.recompute_up_projections ? 0 : value;
        case Kept::mlp_input: return a.fp8_mlp_inputs ? n + 4 * rows * ((cols + 127) / 128) : value;
        case Kept::value: break;
        }
        return value;
    }
};

/// The tensors a module keeps from forward to backward, in the order its caches hold them.
struct KeptTensors {
    static constexpr int capacity = 32;
    KeptTensor tensors[capacity]{};
    int count = 0;

    constexpr void add(const char* name, index_t rows, index_t cols, Kept kind) {
        if (count == capacity) throw std::logic_error("KeptTensors: more tensors than its capacity");
        tensors[count++] = {name, rows, cols, kind};
    }
    constexpr index_t bytes(const ActivationsConfig& a) const {
        index_t sum = 0;
        for (int i = 0; i < count; ++i) sum += tensors[i].bytes(a);
        return sum;
    }
    constexpr const KeptTensor* begin() const { return tensors; }
    constexpr const KeptTensor* end() const { return tensors + count; }
};

/// What one decoder layer keeps for backward from a micro-batch of `tokens` tokens, tensor by tensor, as its caches
/// hold them (nn/decoder_layer.hpp, mla.hpp or mha.hpp, swiglu.hpp, moe.hpp, router.hpp; with EP > 1 the MoE's
/// dispatcher exchanges over the expert group and its cache keeps the received rows). Routed experts count the (token,
/// expert) pairs they receive: tokens x TopK, exact on one rank and, with EP > 1, under balanced routing (each of the
/// EP ranks sends every rank 1/EP of its tokens x TopK pairs). Host-side bookkeeping (the token layout, segment
/// offsets) and the optional sequence-wise balance loss's gradient (Router::balance_loss, not part of the model's loss)
/// are not counted.
constexpr KeptTensors layer_activations(const ModelConfig& c, bool dense, index_t tokens) {
    const AttentionConfig& a = c.attention;
    const index_t T = tokens, H = c.dims.hidden;
    KeptTensors k;
    k.add("h (input_layernorm input)", T, H, Kept::value);
    k.add("rstd1", T, 1, Kept::f32);
    k.add("h1 (post_attention_layernorm input)", T, H, Kept::value);
    k.add("rstd2", T, 1, Kept::f32);
    k.add("attn.x (input_layernorm output)", T, H, Kept::norm_output);
    if (a.kind == AttentionKind::mla) {
        if (a.q_rank > 0) {
            k.add("attn.cq (q_a_proj output)", T, a.q_rank, Kept::value);
            k.add("attn.cqn (q_a_layernorm output)", T, a.q_rank, Kept::norm_output);
            k.add("attn.cq_rstd", T, 1, Kept::f32);
        }
        k.add("attn.c (latent)", T, a.kv_rank, Kept::value);
        k.add("attn.cn (kv_a_layernorm output)", T, a.kv_rank, Kept::norm_output);
        k.add("attn.c_rstd", T, 1, Kept::f32);
        k.add("attn.q", T, a.heads * (a.nope_dim + a.rope_dim), a.q_rank > 0 ? Kept::up_projection : Kept::value);
        k.add("attn.kv (kv_b_proj output)", T, a.heads * (a.nope_dim + a.v_dim), Kept::up_projection);
        k.add("attn.kpe", T, a.rope_dim, Kept::value);
    } else {
        k.add("attn.q", T, a.heads * (a.nope_dim + a.rope_dim), Kept::value);
        k.add("attn.k", T, a.kv_heads * (a.nope_dim + a.rope_dim), Kept::value);
        k.add("attn.v", T, a.kv_heads * a.v_dim, Kept::value);
    }
    k.add("attn.o (o_proj input)", T, a.heads * a.v_dim, Kept::value);
    k.add("attn.lse", T * a.heads, 1, Kept::f32);
    // the positions are the layout's, uploaded once for every layer of a forward (TokenLayout::device_positions)
    if (dense) {
        k.add("mlp.x (post_attention_layernorm output)", T, H, Kept::norm_output);
        k.add("mlp.g", T, c.dims.dense_hidden, Kept::mlp_input);
        k.add("mlp.u", T, c.dims.dense_hidden, Kept::mlp_input);
        return k;
    }
    const MoEConfig& m = c.moe;
    const index_t K = m.top_k, pairs = T * K;
    k.add("router.u (post_attention_layernorm output)", T, H, Kept::norm_output);
    k.add("router.scores", T, m.experts, Kept::f32);
    k.add("router.idx", T, K, Kept::index);
    k.add("router.weight", T, K, Kept::f32);
    k.add("plan.row_slot", pairs, 1, Kept::index);
    k.add("plan.slot_row", T, K, Kept::index);
    if (c.parallel.ep > 1) {  // the rows received from the expert group, and their reorders
        k.add("exchange.to_expert_major", pairs, 1, Kept::index);
        k.add("exchange.to_source_major", pairs, 1, Kept::index);
        k.add("experts.x (dispatched rows)", pairs, H, Kept::mlp_input);
    }
    k.add("experts.g", pairs, m.expert_hidden, Kept::mlp_input);
    k.add("experts.u", pairs, m.expert_hidden, Kept::mlp_input);
    if (m.shared > 0) {
        k.add("shared.x (post_attention_layernorm output)", T, H, Kept::norm_output);
        k.add("shared.g", T, m.shared * m.expert_hidden, Kept::mlp_input);
        k.add("shared.u", T, m.shared * m.expert_hidden, Kept::mlp_input);
    }
    return k;
}

/// What the last pipeline stage keeps besides its layers (parallel/pipeline.hpp): the final norm's input, output and
/// 1/rms, and the loss's gradient with respect to the logits (computed in forward, f32). The embedding keeps none.
constexpr KeptTensors head_activations(const ModelConfig& c, index_t tokens) {
    const index_t T = tokens, H = c.dims.hidden;
    KeptTensors k;
    k.add("h_last (final norm input)", T, H, Kept::value);
    k.add("h_normed (final norm output)", T, H, Kept::norm_output);
    k.add("rstd", T, 1, Kept::f32);
    k.add("dlogits", T, c.dims.vocab, Kept::f32);
    return k;
}

namespace detail {
constexpr index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

/// Dense layers among chunk `chunk`'s (the first DenseLayers layers of the model are dense).
constexpr index_t dense_layers_in_chunk(const ModelConfig& c, index_t chunk) {
    if (chunk >= c.dims.dense_layers) return 0;  // every chunk before it holds a layer at least
    const index_t first = first_layer_of_chunk(c.parallel, c.dims.layers, chunk);
    const index_t n = layers_in_chunk(c.parallel, c.dims.layers, chunk), D = c.dims.dense_layers;
    return first >= D ? 0 : (first + n <= D ? n : D - first);
}
}  // namespace detail

/// The most (micro-batch, chunk) units a pipeline rank holds at once, and the most bytes.
struct InFlight {
    index_t units = 0;
    index_t bytes = 0;
};

/// Walks pipeline rank `rank`'s interleaved 1F1B schedule (parallel/schedule.hpp's, from the same
/// interleaved_warmup and interleaved_chunk): a forward of chunk v adds unit_bytes(v), a backward frees it.
/// Rank 0 holds the most units, PP (V + 1) - 1 (+ extra warm-up): Megatron's 1 + (PP - 1) / (PP V) micro-batches'
/// worth of each layer (Korthikanti et al. 2022, arXiv 2205.05198; megatron/training/theoretical_memory_usage.py).
template <class UnitBytes>
constexpr InFlight pipeline_in_flight(index_t pp, index_t v, index_t micro_batches, index_t extra, index_t rank,
                                      UnitBytes unit_bytes) {
    const index_t total = micro_batches * v, warmup = interleaved_warmup(pp, v, rank, micro_batches, extra);
    InFlight now, peak;
    const auto forward = [&](index_t k) {
        now.units += 1;
        now.bytes += unit_bytes(interleaved_chunk(pp, v, k));
        peak.units = now.units > peak.units ? now.units : peak.units;
        peak.bytes = now.bytes > peak.bytes ? now.bytes : peak.bytes;
    };
    for (index_t k = 0; k < warmup; ++k) forward(k);
    for (index_t k = 0; k + warmup < total; ++k) {  // steady state; the cool-down only frees
        forward(k + warmup);
        now.units -= 1;
        now.bytes -= unit_bytes(v - 1 - interleaved_chunk(pp, v, k));
    }
    return peak;
}

/// What the activations of a training step depend on besides the model.
struct ActivationSetup {
    index_t seq_len = 4096;
    index_t micro_batch = 1;  ///< sequences per micro-batch
    ActivationsConfig activations = activation_steps::keep_f32;
    index_t extra_warmup = 0;  ///< K2's extra warm-up forwards (parallel::PipelineShape::extra_warmup)
    /// Per step; Dynamic: the type's MicroBatches, else a step long enough for every rank's steady state (a longer
    /// one holds no more).
    index_t micro_batches = Dynamic;

    constexpr index_t tokens() const { return seq_len * micro_batch; }
    constexpr index_t steps(const ParallelConfig& p) const {
        if (micro_batches != Dynamic) return micro_batches;
        if (p.micro_batches != Dynamic) return p.micro_batches;
        const index_t group = p.pp * p.virtual_stages;
        const index_t warmup = (p.virtual_stages + 1) * p.pp + extra_warmup;  // at least rank 0's
        return p.pp * (detail::ceil_div(warmup + 1, group) + 2);
    }
};

/// Activation bytes one micro-batch leaves on each chunk: its layers', and the head's on the last chunk.
struct ChunkActivations {
    const ModelConfig& config;
    index_t dense_layer, moe_layer, head;  ///< bytes

    constexpr ChunkActivations(const ModelConfig& c, const ActivationSetup& a)
        : config(c),
          dense_layer(layer_activations(c, true, a.tokens()).bytes(a.activations)),
          moe_layer(layer_activations(c, false, a.tokens()).bytes(a.activations)),
          head(head_activations(c, a.tokens()).bytes(a.activations)) {}

    constexpr index_t operator()(index_t chunk) const {
        const index_t n = layers_in_chunk(config.parallel, config.dims.layers, chunk);
        const index_t dense = detail::dense_layers_in_chunk(config, chunk);
        return dense * dense_layer + (n - dense) * moe_layer + (chunk == config.parallel.chunks() - 1 ? head : 0);
    }
};

/// Activations on pipeline rank `rank`: the peak of its schedule, or under offload the resident units (at most
/// activation_resident_units of the rank's largest chunk).
constexpr InFlight rank_activations(const ModelConfig& c, index_t rank, const ActivationSetup& a) {
    const ParallelConfig& p = c.parallel;
    const ChunkActivations chunk_bytes(c, a);
    const auto unit_bytes = [&](index_t v) { return chunk_bytes(v * p.pp + rank); };
    const InFlight peak = pipeline_in_flight(p.pp, p.virtual_stages, a.steps(p), a.extra_warmup, rank, unit_bytes);
    if (!a.activations.offload) return peak;
    index_t largest = 0;
    for (index_t v = 0; v < p.virtual_stages; ++v) largest = unit_bytes(v) > largest ? unit_bytes(v) : largest;
    const index_t resident = peak.units < activation_resident_units ? peak.units : activation_resident_units;
    return {peak.units, resident * largest};
}

/// Bytes one rank holds for training: BF16 weights, an FP32 gradient-accumulation buffer, and ZeRO-1 sharded
/// optimizer state (FP32 master copy plus Muon's momentum, or AdamW's two moments). Muon takes every matrix but
/// the embedding and the head (unless NoMuon); AdamW takes the rest; the router's correction bias is FP32 with
/// neither gradient nor optimizer state (it moves by the balancing rule). Non-expert state is sharded over the
/// EP x DP ranks that replicate it, routed-expert state over the DP replicas of the expert shard. With an
/// ActivationSetup, also the activations at the peak of the rank's pipeline schedule (rank_activations).
struct RankMemory {
    index_t pipeline_rank;  ///< the most loaded pipeline rank (any of its EP ranks holds the same)
    index_t layers, dense_layers, moe_layers;
    bool embedding, head;
    index_t dp;                 ///< data-parallel size used
    index_t expert_params;      ///< routed-expert parameters on this rank (its 1/EP share of each MoE layer)
    index_t replicated_params;  ///< everything else on this rank (replicated over the EP ranks)
    index_t muon_params, adamw_params, bias_params;
    index_t weight_bytes, gradient_bytes, optimizer_bytes;
    index_t in_flight = 0;         ///< (micro-batch, chunk) units at the schedule's peak; 0 without activations
    index_t activation_bytes = 0;  ///< on the GPU at the peak; 0 without activations

    constexpr index_t params() const { return expert_params + replicated_params; }
    /// Weights, gradients and optimizer state: the report's "states" (§2.4.2).
    constexpr index_t state_bytes() const { return weight_bytes + gradient_bytes + optimizer_bytes; }
    constexpr index_t total_bytes() const { return state_bytes() + activation_bytes; }
};

constexpr RankMemory rank_memory(const ModelConfig& c, index_t pipeline_rank, index_t dp) {
    const ParallelConfig& par = c.parallel;
    const index_t H = c.dims.hidden, L = c.dims.layers;
    const ParameterCounts p = count_parameters(c);
    RankMemory r{};
    r.pipeline_rank = pipeline_rank;
    r.dp = par.dp != Dynamic ? par.dp : dp;
    if (r.dp == Dynamic || r.dp < 1)
        throw std::invalid_argument("rank_memory: the data-parallel size is Dynamic or below 1; pass DP >= 1");
    for (index_t chunk = pipeline_rank; chunk < par.chunks(); chunk += par.pp) {
        const index_t n = layers_in_chunk(par, L, chunk), dense = detail::dense_layers_in_chunk(c, chunk);
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
    const index_t adamw =
        r.layers * (attention_norms + 2 * H) + (r.embedding ? p.embedding : 0) + (r.head ? p.lm_head + H : 0);
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

/// rank_memory plus the activations of `a` on that rank.
constexpr RankMemory rank_memory(const ModelConfig& c, index_t pipeline_rank, index_t dp, const ActivationSetup& a) {
    RankMemory r = rank_memory(c, pipeline_rank, dp);
    const InFlight act = rank_activations(c, pipeline_rank, a);
    r.in_flight = act.units;
    r.activation_bytes = act.bytes;
    return r;
}

namespace detail {
template <class MemoryOf>
constexpr RankMemory most_loaded(index_t pp, MemoryOf memory_of) {
    RankMemory best = memory_of(0);
    for (index_t rank = 1; rank < pp; ++rank) {
        const RankMemory r = memory_of(rank);
        if (r.total_bytes() > best.total_bytes()) best = r;
    }
    return best;
}
}  // namespace detail

/// The pipeline rank holding the most bytes (ties: the lowest rank)...
constexpr RankMemory most_loaded_rank(const ModelConfig& c, index_t dp = Dynamic) {
    return detail::most_loaded(c.parallel.pp, [&](index_t rank) { return rank_memory(c, rank, dp); });
}
/// ...activations included.
constexpr RankMemory most_loaded_rank(const ModelConfig& c, index_t dp, const ActivationSetup& a) {
    return detail::most_loaded(c.parallel.pp, [&](index_t rank) { return rank_memory(c, rank, dp, a); });
}

}  // namespace moonmoe
