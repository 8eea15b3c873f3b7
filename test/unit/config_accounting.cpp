// Parameter and FLOP accounting against the exact integers (counted from the released
// config.json files) and the publicly quoted totals of other DeepSeek-V3-architecture models; activation memory
// against hand counts, Korthikanti et al.'s per-layer formula, the schedule the pipeline runs, and the bytes the
// modules' caches allocate.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include <moonmoe/config.hpp>
#include <moonmoe/parallel/expert_parallel.hpp>
#include <moonmoe/parallel/schedule.hpp>

#include "support/nn_testing.hpp"
#include "support/self_world.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_config_accounting {

using namespace moonmoe;

TEST_CASE("Kimi K2 parameter counts match the released checkpoints' exact counts") {
    constexpr ParameterCounts p = KimiK2::parameters();
    CHECK(p.attention_layer.q_a_proj == 11'010'048);
    CHECK(p.attention_layer.q_b_proj == 18'874'368);
    CHECK(p.attention_layer.kv_a_proj_with_mqa == 4'128'768);
    CHECK(p.attention_layer.kv_b_proj == 8'388'608);
    CHECK(p.attention_layer.o_proj == 58'720'256);
    CHECK(p.attention_layer.total() == 101'124'096);
    CHECK(p.attention == 6'168'569'856);
    CHECK(p.layer_norms == 881'664);
    CHECK(p.dense_mlps == 396'361'728);
    CHECK(p.expert == 44'040'192);
    CHECK(p.routed_experts_layer == 16'911'433'728);
    CHECK(p.shared_experts_layer == 44'040'192);
    CHECK(p.router_layer == 2'752'896);
    CHECK(p.routed_experts == 1'014'686'023'680);
    CHECK(p.embedding == 1'174'405'120);
    CHECK(p.lm_head == 1'174'405'120);
    CHECK(p.total == 1'026'408'232'448);
    CHECK(p.total_without_embeddings == 1'024'059'422'208);
    CHECK(p.active == 31'687'095'808);
    CHECK(p.active_with_embeddings == 32'861'500'928);
    CHECK(p.active_without_embeddings == 30'512'690'688);
}

TEST_CASE("DeepSeek-V3 parameter counts match the released checkpoints' exact counts") {
    constexpr ParameterCounts p = DeepSeekV3::parameters();
    CHECK(p.attention_layer.q_a_proj == 11'010'048);
    CHECK(p.attention_layer.q_b_proj == 37'748'736);
    CHECK(p.attention_layer.kv_a_proj_with_mqa == 4'128'768);
    CHECK(p.attention_layer.kv_b_proj == 16'777'216);
    CHECK(p.attention_layer.o_proj == 117'440'512);
    CHECK(p.attention_layer.total() == 187'107'328);
    CHECK(p.attention == 11'413'547'008);
    CHECK(p.layer_norms == 881'664);
    CHECK(p.dense_mlps == 3 * 396'361'728LL);
    CHECK(p.routed_experts_layer == 11'274'289'152);
    CHECK(p.shared_experts_layer == 44'040'192);
    CHECK(p.router_layer == 1'835'264);
    CHECK(p.routed_experts == 653'908'770'816);
    CHECK(p.embedding == 926'679'040);
    CHECK(p.total == 671'026'419'200);
    CHECK(p.total_without_embeddings == 669'173'061'120);
    CHECK(p.active == 36'625'618'432);
    CHECK(p.active_with_embeddings == 37'552'297'472);
    CHECK(p.active_without_embeddings == 35'698'939'392);
}

TEST_CASE("ik_llama.cpp's K2 count is ours plus its split attn_k_b / attn_v_b copies of kv_b_proj") {
    // [IKL]: 1.027 T in all, 1024.571 B in the repeating layers, with 61 x 8,388,608 extra parameters.
    constexpr ParameterCounts p = KimiK2::parameters();
    CHECK(p.total + 61 * p.attention_layer.kv_b_proj == 1'026'919'937'536);
    CHECK(p.total_without_embeddings + 61 * p.attention_layer.kv_b_proj == 1'024'571'127'296);
}

// Models without query compression (q_lora_rank null), declared the obvious way: Score<Softmax> alone gives
// DeepSeek-V2-Lite's router (no correction bias). Exact integers: an independent count of transformers 5.23's
// DeepseekV2ForCausalLM on the meta device (test/static/deepseek_v2.cpp says how).
using DeepSeekV2Lite =
    Model<Dims<Hidden<2048>, Layers<27>, DenseLayers<1>, Vocab<102400>, DenseHidden<10944>>,
          Attention<MLA<Heads<16>, QRank<NoQCompression>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
          MoE<Experts<64>, TopK<6>, Shared<2>, ExpertHidden<1408>, Score<Softmax>, RoutedScale<1.0>>>;
using DeepSeekV2 = Model<Dims<Hidden<5120>, Layers<60>, DenseLayers<1>, Vocab<102400>, DenseHidden<12288>>,
                         Attention<MLA<Heads<128>, QRank<1536>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
                         MoE<Experts<160>, TopK<6>, Shared<2>, ExpertHidden<1536>, Groups<8>, TopGroups<3>,
                             Score<Softmax>, RoutedScale<16.0>>>;
using Moonlight16B =
    Model<Dims<Hidden<2048>, Layers<27>, DenseLayers<1>, Vocab<163840>, DenseHidden<11264>>,
          Attention<MLA<Heads<16>, QRank<NoQCompression>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
          MoE<Experts<64>, TopK<6>, Shared<2>, ExpertHidden<1408>, RoutedScale<2.446>>>;

TEST_CASE("direct q_proj layouts: DeepSeek-V2-Lite 15.7B exactly and Moonlight-16B-A3B totals") {
    constexpr ParameterCounts lite = DeepSeekV2Lite::parameters();
    CHECK(lite.attention_layer.q_proj == 16 * 192 * 2048);
    CHECK(lite.attention_layer.q_a_proj == 0);
    CHECK(lite.attention_layer.q_a_layernorm == 0);
    CHECK(lite.router_layer == 64 * 2048);  // no correction bias with softmax scoring
    CHECK(lite.total == 15'706'484'224);    // "15.7B"
    constexpr ParameterCounts moon = Moonlight16B::parameters();
    CHECK(moon.router_layer == 64 * 2048 + 64);  // sigmoid: the correction bias by default
    CHECK(moon.total == doctest::Approx(16e9).epsilon(0.5 / 16));
}

TEST_CASE("activated parameters follow the published convention: without embed_tokens, with lm_head") {
    // Published figures: DeepSeek-V2-Lite 2.4B and V2 21B (arXiv 2405.04434), DeepSeek-V3 37B (arXiv 2412.19437),
    // Kimi K2 32B (Kimi K2 technical report §1). Each is within one unit of its last digit of the headline count,
    // and the headline is the nearest of the three conventions to it (V2-Lite's 2.45B reads as 2.4B truncated).
    struct Row {
        const char* model;
        ParameterCounts p;
        double published, unit;
        index_t exact;  // independent count (test/static/deepseek_v2.cpp)
    };
    const Row rows[] = {
        {"DeepSeek-V2-Lite", DeepSeekV2Lite::parameters(), 2.4e9, 1e8, 2'451'435'008},
        {"DeepSeek-V2", DeepSeekV2::parameters(), 21e9, 1e9, 20'851'512'320},
        {"DeepSeek-V3", DeepSeekV3::parameters(), 37e9, 1e9, 36'625'618'432},
        {"Kimi K2", KimiK2::parameters(), 32e9, 1e9, 31'687'095'808},
    };
    for (const Row& r : rows) {
        CAPTURE(r.model);
        CHECK(r.p.active == r.exact);
        CHECK(r.p.active == r.p.active_without_embeddings + r.p.lm_head);
        CHECK(r.p.active_with_embeddings == r.p.active + r.p.embedding);
        CHECK(std::abs(double(r.p.active) - r.published) < r.unit);
        for (index_t other : {r.p.active_with_embeddings, r.p.active_without_embeddings})
            CHECK(std::abs(double(r.p.active) - r.published) < std::abs(double(other) - r.published));
    }
    CHECK(DeepSeekV2Lite::activated_parameter_count() == 2'451'435'008);
}

TEST_CASE("MHA parameter count is 4 projections (grouped-query keys and values)") {
    using Gqa = Model<Dims<Hidden<1024>, Layers<2>, DenseLayers<2>, Vocab<100>, DenseHidden<4096>>,
                      Attention<MHA<Heads<16>, KVHeads<4>, HeadDim<64>>>>;
    constexpr AttentionParams a = Gqa::parameters().attention_layer;
    CHECK(a.q_proj == 1024 * 16 * 64);
    CHECK(a.k_proj == 1024 * 4 * 64);
    CHECK(a.v_proj == 1024 * 4 * 64);
    CHECK(a.o_proj == 16 * 64 * 1024);
    CHECK(a.kv_b_proj == 0);
    CHECK(Gqa::config.attention.rope_dim == 64);
    CHECK(Gqa::config.attention.nope_dim == 0);
    // no MoE layers: total = embeddings + attention + norms + dense MLPs
    CHECK(Gqa::parameter_count() == 2 * 100 * 1024 + 2 * a.total() + (2 * 2 + 1) * 1024 + 2 * 3 * 1024 * 4096);
}

TEST_CASE("forward FLOPs per token: 2 per weight touched plus causal attention") {
    constexpr index_t s = 4096;
    constexpr FlopCounts f = KimiK2::flops_per_token(s);
    constexpr ParameterCounts p = KimiK2::parameters();
    // Every activated matrix weight but the input embedding is one multiply-add per token.
    const index_t matrix_weights = p.active - p.layer_norms - 61 * (1536 + 512) - 60 * 384;
    CHECK(f.forward - f.attention_scores == 2 * matrix_weights);
    // q.k over 192 dims and p.v over 128 dims, 64 heads, 61 layers, (s+1)/2 keys on average.
    CHECK(f.attention_scores == 61LL * 64 * 2 * (192 + 128) * (s + 1) / 2);
    CHECK(f.forward_backward == 3 * f.forward);
    // The usual 6N estimate of training FLOPs per token (N activated, no embedding) within 10%.
    CHECK(double(f.forward_backward) == doctest::Approx(6.0 * double(p.active)).epsilon(0.10));
}

// ---- activation memory ----

namespace storage = activation_steps;

TEST_CASE("activations of a tiny K2 layer, by hand, under each storage policy") {
    // TinyK2: hidden 64, 4 heads, q_rank 32, kv_rank 16, nope 8, rope 4, v 8; 8 experts, top-2, 1 shared, expert
    // hidden 16; dense hidden 96. One micro-batch of 8 tokens; index_t is 8 bytes.
    //
    // Common to both layers (floats): h 8x64 = 512, h1 512, rstd1 + rstd2 16, attn.x 512, cq 8x32 = 256, cqn 256,
    // cq_rstd 8, c 8x16 = 128, cn 128, c_rstd 8, q 8x4x12 = 384, kv 8x4x16 = 512, kpe 8x4 = 32, o 8x4x8 = 256,
    // lse 8x4 = 32: 3552 floats, 64 of them f32 statistics. (The positions are the token layout's, uploaded once
    // for all the layers: no layer keeps them.)
    // Dense MLP: mlp.x 512, g and u 8x96 = 768 each: 2048 floats.
    //   (a) (3552 + 2048) x 4 = 22400
    //   (b) 64 x 4 + (5600 - 64) x 2 = 11328
    //   (c) (b) without x, cqn, cn, q, kv, mlp.x = 512 + 256 + 128 + 384 + 512 + 512 = 2304 values: 11328 - 4608 = 6720
    //   (d) g, u in FP8: 768 + 4 x 8 x ceil(96 / 128) = 800 bytes each instead of 1536: 6720 - 3072 + 1600 = 5248
    // MoE MLP: router.u 512, scores 8x8 = 64 (f32), weight 8x2 = 16 (f32), experts.g and .u (8 x 2 pairs) x 16 =
    // 256 each, shared.x 512, shared.g and .u 8x16 = 128 each: 1872 floats; idx 16, row_slot 16, slot_row 16
    // indices.
    //   (a) (3552 + 1872) x 4 + 48 x 8 = 22080
    //   (b) (64 + 80) x 4 + (5424 - 144) x 2 + 384 = 11520
    //   (c) without x, cqn, cn, q, kv, router.u, shared.x = 2816 values: 11520 - 5632 = 5888
    //   (d) experts.g, .u: 256 + 4 x 16 = 320 each (512 bf16); shared.g, .u: 128 + 4 x 8 = 160 each (256):
    //       5888 - 1536 + 960 = 5312
    // With EP > 1 the MoE layer also keeps the dispatched rows experts.x 16 x 64 (mlp_input) and the two reorders
    // (16 indices each): (a) + 4096 + 256, (b) + 2048 + 256, (c) + 2048 + 256, (d) + 1024 + 4 x 16 + 256.
    const ModelConfig c = TinyK2::config;
    const KeptTensors dense = layer_activations(c, true, 8), moe = layer_activations(c, false, 8);
    CHECK(dense.bytes(storage::keep_f32) == 22400);
    CHECK(dense.bytes(storage::keep_bf16) == 11328);
    CHECK(dense.bytes(storage::recompute) == 6720);
    CHECK(dense.bytes(storage::fp8) == 5248);
    CHECK(moe.bytes(storage::keep_f32) == 22080);
    CHECK(moe.bytes(storage::keep_bf16) == 11520);
    CHECK(moe.bytes(storage::recompute) == 5888);
    CHECK(moe.bytes(storage::fp8) == 5312);
    CHECK(moe.bytes(storage::offload) == moe.bytes(storage::fp8));  // offload moves bytes, it keeps the same ones
    ModelConfig ep = c;
    ep.parallel.ep = 2;
    const KeptTensors ep_moe = layer_activations(ep, false, 8);
    CHECK(ep_moe.bytes(storage::keep_f32) == 22080 + 4096 + 256);
    CHECK(ep_moe.bytes(storage::keep_bf16) == 11520 + 2048 + 256);
    CHECK(ep_moe.bytes(storage::recompute) == 5888 + 2048 + 256);
    CHECK(ep_moe.bytes(storage::fp8) == 5312 + 1088 + 256);
}

TEST_CASE("each storage policy saves exactly what it says, at K2's and V3's widths") {
    // Differences written from the configuration, not from the tensor list.
    struct Row {
        const char* model;
        ModelConfig c;
    };
    for (const Row& r : {Row{"Kimi K2", KimiK2::config}, Row{"DeepSeek-V3", DeepSeekV3::config}}) {
        CAPTURE(r.model);
        const ModelConfig& c = r.c;
        const AttentionConfig& a = c.attention;
        const index_t T = 4096, H = c.dims.hidden, K = c.moe.top_k, I = c.moe.expert_hidden, S = c.moe.shared;
        const index_t dqk = a.nope_dim + a.rope_dim;
        for (const bool dense : {true, false}) {
            CAPTURE(dense);
            const KeptTensors k = layer_activations(c, dense, T);
            // (a) - (b): 2 bytes saved on every value bf16 rounds: every float but 1/rms, log-sum-exp and the
            // router's scores and weights
            index_t values = T * (2 * H + H + 2 * a.q_rank + 2 * a.kv_rank + a.heads * dqk +
                                  a.heads * (a.nope_dim + a.v_dim) + a.rope_dim + a.heads * a.v_dim);
            if (dense) values += T * (H + 2 * c.dims.dense_hidden);
            else
                values += T * H + T * K * (H + 2 * I) + T * (H + 2 * S * I);  // router.u, experts (EP 16), shared
            CHECK(k.bytes(storage::keep_f32) - k.bytes(storage::keep_bf16) == 2 * values);
            // (b) - (c): 2 bytes per element of the norm outputs and the MLA up-projections' outputs
            const index_t norms = T * (H + a.q_rank + a.kv_rank) + (dense ? T * H : 2 * T * H);
            const index_t up = T * a.heads * (dqk + a.nope_dim + a.v_dim);
            CHECK(k.bytes(storage::keep_bf16) - k.bytes(storage::recompute) == 2 * (norms + up));
            // (c) - (d): the MLP inputs from 2 bytes to 1 byte plus 4 per 128 columns of a row
            const auto fp8_saving = [](index_t rows, index_t cols) {
                return rows * cols - 4 * rows * ((cols + 127) / 128);
            };
            const index_t saved = dense ? 2 * fp8_saving(T, c.dims.dense_hidden)
                                        : 2 * fp8_saving(T * K, I) + fp8_saving(T * K, H) + 2 * fp8_saving(T, S * I);
            CHECK(k.bytes(storage::recompute) - k.bytes(storage::fp8) == saved);
        }
    }
}

TEST_CASE("an MHA layer with a dense MLP keeps Korthikanti et al.'s selective-recomputation bytes") {
    // Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, with selective recomputation: 34 sbh bytes per layer for
    // 16-bit activations and a 4h MLP, which Megatron's estimator generalises to sbh (18 + 4 ffn / h)
    // (theoretical_memory_usage.py). Its terms: layer norms' inputs 4sbh, QKV input 2sbh, Q and K 4sbh, V 2sbh,
    // o_proj input 2sbh, the MLP's input 2sbh, the hidden pair 4 sb ffn (GeLU's input and output; SwiGLU's gate
    // and up outputs here), two dropout masks 2sbh (these models have no dropout). The modules keep besides: 1/rms of
    // the two norms and a log-sum-exp per head (flash-style attention, no s x s tensor).
    const index_t s = 2048, b = 2;
    using Gpt = Model<Dims<Hidden<1024>, Layers<2>, DenseLayers<2>, Vocab<100>, DenseHidden<4096>>,
                      Attention<MHA<Heads<16>, KVHeads<16>, HeadDim<64>>>>;
    using Swi = Gpt::with<Dims<Hidden<1024>, Layers<2>, DenseLayers<2>, Vocab<100>, DenseHidden<2816>>>;
    for (const ModelConfig& c : {Gpt::config, Swi::config}) {
        const index_t h = c.dims.hidden, ffn = c.dims.dense_hidden, heads = c.attention.heads;
        CAPTURE(ffn);
        REQUIRE(heads * (c.attention.nope_dim + c.attention.rope_dim) == h);
        REQUIRE(heads * c.attention.v_dim == h);
        const index_t megatron = s * b * h * 18 + 4 * s * b * ffn, dropout_masks = 2 * s * b * h;
        const index_t statistics = 4 * s * b * (2 + heads);
        CHECK(layer_activations(c, true, s * b).bytes(storage::keep_bf16) == megatron - dropout_masks + statistics);
        if (ffn == 4 * h) CHECK(megatron == 34 * s * b * h);
    }
}

/// Runs rank `rank`'s schedule as parallel::interleaved_1f1b lists it, each (micro-batch, chunk) held from its
/// forward to its backward, chunk v weighing w(v): the most units and bytes held at once.
template <class W>
InFlight simulate(const parallel::PipelineShape& shape, index_t rank, W w) {
    std::map<std::pair<index_t, index_t>, index_t> held;
    InFlight now, peak;
    for (const parallel::Step& step : parallel::interleaved_1f1b(shape, rank)) {
        const std::pair<index_t, index_t> key{step.micro_batch, step.chunk};
        if (step.pass == parallel::Pass::forward) {
            REQUIRE(held.count(key) == 0);
            held[key] = w(step.chunk);
            now.units += 1, now.bytes += w(step.chunk);
            peak.units = std::max(peak.units, now.units), peak.bytes = std::max(peak.bytes, now.bytes);
        } else {
            REQUIRE(held.count(key) == 1);  // the backward frees what its own forward kept
            now.units -= 1, now.bytes -= held[key];
            held.erase(key);
        }
    }
    CHECK(held.empty());
    return peak;
}

TEST_CASE("micro-batches in flight: the accounting's walk equals the schedule the pipeline runs") {
    const auto w = [](index_t v) { return 1 + 7 * v * v + (v % 2) * 1000; };  // every chunk a different weight
    int shapes = 0;
    for (index_t pp = 1; pp <= 6; ++pp)
        for (index_t v = 1; v <= 4; ++v)
            for (index_t m = pp; m <= 4 * pp + 3; ++m) {
                if (v > 1 && m % pp != 0) continue;
                for (index_t extra = 0; extra <= 2; ++extra) {
                    ++shapes;
                    for (index_t rank = 0; rank < pp; ++rank) {
                        CAPTURE(pp);
                        CAPTURE(v);
                        CAPTURE(m);
                        CAPTURE(extra);
                        CAPTURE(rank);
                        const InFlight expected = simulate({pp, v, m, extra}, rank, w);
                        const InFlight walked = pipeline_in_flight(pp, v, m, extra, rank, w);
                        CHECK(walked.units == expected.units);
                        CHECK(walked.bytes == expected.bytes);
                    }
                }
            }
    CHECK(shapes > 300);
}

TEST_CASE("the first pipeline rank holds Megatron's 1 + (PP - 1) / (PP V) micro-batches of each layer") {
    // Korthikanti et al. 2022: with 1F1B the first stage holds PP micro-batches; interleaved, Megatron's
    // estimator multiplies by 1 + (PP - 1) / (PP V) (theoretical_memory_usage.py, compute_activation_memory).
    const auto one = [](index_t) { return index_t{1}; };
    for (index_t pp = 1; pp <= 16; ++pp)
        for (index_t v = 1; v <= 5; ++v) {
            CAPTURE(pp);
            CAPTURE(v);
            const ParallelConfig p{pp, 1, 1, v, SplitKind::even, 0, 0, Dynamic};
            const index_t m = ActivationSetup{}.steps(p);
            const index_t first = pipeline_in_flight(pp, v, m, 0, 0, one).units;
            // each unit is one chunk: L / (PP V) layers of the rank's L / PP
            if (v == 1) CHECK(first == pp);
            else
                CHECK(double(first) / double(v) == doctest::Approx(pp * (1.0 + double(pp - 1) / double(pp * v))));
            for (index_t rank = 1; rank < pp; ++rank) CHECK(pipeline_in_flight(pp, v, m, 0, rank, one).units < first);
            CHECK(pipeline_in_flight(pp, v, m, 1, 0, one).units == first + 1);  // K2's extra warm-up forward
            // a longer step holds no more, whatever the chunks weigh
            const auto w = [](index_t c) { return 3 + c * c; };
            for (index_t rank = 0; rank < pp; ++rank)
                for (index_t more : {pp, 5 * pp})
                    CHECK(pipeline_in_flight(pp, v, m + more, 1, rank, w).bytes ==
                          pipeline_in_flight(pp, v, m, 1, rank, w).bytes);
        }
}

TEST_CASE("Kimi K2 on Parallel<16, 16, 32>: states, activations and the most loaded rank") {
    constexpr ModelConfig c = KimiK2::config;
    constexpr ActivationSetup k2{.seq_len = 4096, .micro_batch = 1, .activations = storage::fp8, .extra_warmup = 1};
    // Rank 0 holds chunks 0 and 16 (1 dense layer, 2 MoE layers): 2 (16 - 1) + 16 warm-up forwards, the extra one
    // and the one in steady state = 48 units; rank 2 holds 2 + 2 MoE layers and 44 units, the most bytes.
    constexpr RankMemory first = rank_memory(c, 0, 32, k2), busiest = most_loaded_rank(c, 32, k2);
    static_assert(first.in_flight == 48);
    CHECK(busiest.pipeline_rank == 2);
    CHECK(busiest.in_flight == 44);
    CHECK(busiest.moe_layers == 4);
    // units: forwards 0-15 chunk 0, 16-31 chunk 1, 32-43 chunk 0: 28 + 16 units of two MoE layers each
    CHECK(busiest.activation_bytes == 88 * layer_activations(c, false, 4096).bytes(storage::fp8));
    CHECK(busiest.state_bytes() == rank_memory(c, 2, 32).total_bytes());
    CHECK(busiest.total_bytes() == busiest.state_bytes() + busiest.activation_bytes);
    // offload: three units of the rank's largest chunk on the GPU
    ActivationSetup offloaded = k2;
    offloaded.activations = storage::offload;
    CHECK(rank_memory(c, 2, 32, offloaded).activation_bytes ==
          3 * 2 * layer_activations(c, false, 4096).bytes(storage::fp8));
    // without activations nothing changes
    CHECK(most_loaded_rank(c, 32).total_bytes() == KimiK2::memory_per_rank(32).total_bytes());
    CHECK(KimiK2::memory_per_rank(32).activation_bytes == 0);
}

// ---- the caches the modules fill, against the accounting ----

/// A tensor of a cache: where, how many elements, whether float, whether an f32 container, its bytes.
struct Held {
    const void* data;
    index_t numel;
    bool is_float;
    bool f32;
    index_t bytes;
};
template <class T, int R>
Held held(const Tensor<T, R>& t) {
    return {t.data(), t.numel(), std::is_same_v<T, float>, std::is_same_v<T, float>, index_t(t.bytes())};
}
Held held(const nn::KeptMatrix<cpu>& m) {
    using F = nn::KeptFormat;
    const index_t bytes = index_t(m.bytes());
    if (m.format == F::f32) return {m.f32.data(), m.f32.numel(), true, true, bytes};
    if (m.format == F::bf16) return {m.b16.data(), m.b16.numel(), true, false, bytes};
    return {m.fp8.codes.data(), m.fp8.codes.numel(), true, false, bytes};
}

/// The tensors of a decoder layer's caches, in the order of layer_activations.
std::vector<Held> cache_tensors(const nn::DecoderLayer<cpu>::Cache& c, bool expert_group, bool latent, bool dense) {
    std::vector<Held> out = {held(c.h), held(c.rstd1), held(c.h1), held(c.rstd2)};
    if (latent) {
        const auto& a = c.attn;
        out.push_back(held(a.x));
        if (!a.cq.empty())
            for (Held h : {held(a.cq), held(a.cqn), held(a.cq_rstd)}) out.push_back(h);
        for (Held h :
             {held(a.c), held(a.cn), held(a.c_rstd), held(a.q), held(a.kv), held(a.kpe), held(a.o), held(a.lse)})
            out.push_back(h);
    } else {
        const auto& a = c.mha;
        for (Held h : {held(a.x), held(a.q), held(a.k), held(a.v), held(a.o), held(a.lse)}) out.push_back(h);
    }
    if (dense) {
        for (Held h : {held(c.mlp.x), held(c.mlp.g), held(c.mlp.u)}) out.push_back(h);
        return out;
    }
    const auto& router = c.moe.router;
    for (Held h : {held(router.u), held(router.scores), held(router.routing.idx), held(router.routing.weight)})
        out.push_back(h);
    const auto& shared = c.moe.shared;
    if (expert_group) {
        const auto& m = c.moe;
        for (Held h : {held(m.plan.row_slot), held(m.plan.slot_row), held(m.plan.exchange.to_expert_major),
                       held(m.plan.exchange.to_source_major), held(m.x), held(m.g), held(m.u)})
            out.push_back(h);
    } else {
        for (Held h : {held(c.moe.plan.row_slot), held(c.moe.plan.slot_row), held(c.moe.g), held(c.moe.u)})
            out.push_back(h);
    }
    for (Held h : {held(shared.x), held(shared.g), held(shared.u)}) out.push_back(h);
    return out;
}

bool all_bf16(const Held& h) {
    const auto* f = static_cast<const float*>(h.data);
    for (index_t i = 0; i < h.numel; ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, f + i, 4);
        if (bits & 0xffffu) return false;
    }
    return true;
}

/// One forward of layer `index` of `c` on `tokens` tokens (two sequences); checks the bytes it allocated for backward,
/// tensor by tensor, against layer_activations under c's activation policy (c.activations), and under the
/// bf16 compute policy which f32 containers hold bf16 values.
void check_layer_caches(ModelConfig c, index_t index, bool expert_group, NumberFormat compute) {
    const index_t T = 12, H = c.dims.hidden;
    const bool dense = index < c.dims.dense_layers, latent = c.attention.kind == AttentionKind::mla;
    CAPTURE(index);
    CAPTURE(expert_group);
    CAPTURE(latent);
    CAPTURE(format_name(compute));
    CAPTURE(c.activations.recompute_norms);
    CAPTURE(c.activations.recompute_up_projections);
    CAPTURE(format_name(c.activations.storage));
    CAPTURE(c.activations.fp8_mlp_inputs);
    c.precision.compute = compute;
    const ActivationsConfig& policy = c.activations;
    testing::SelfWorld group;
    nn::DecoderLayer<cpu> layer(
        c, index, 0, -1, expert_group ? std::make_shared<parallel::ExpertParallelDispatcher<cpu>>(group) : nullptr);
    testing::randomize(layer, 5);
    layer.refresh_working();
    Tensor<float, 2> x = testing::random_matrix(T, H, 6), y({T, H});
    nn::round_to(compute, x.view());  // a layer's input is a bf16 value under the bf16 policy
    const auto layout = nn::TokenLayout::sequences(2, T / 2);
    const auto positions = layout.device_positions<cpu>();  // the layout's, uploaded once for all the layers
    nn::DecoderLayer<cpu>::Cache cache;
    if (expert_group && !dense) {  // the exchange's staging buffer, kept by the dispatcher for the next steps
        nn::DecoderLayer<cpu>::Cache warm_up;
        layer.forward(x.view(), layout, y.view(), warm_up);
    }
    const auto& memory = backend::Memory<cpu>::stats();
    const std::size_t before = memory.current.load();
    layer.forward(x.view(), layout, y.view(), cache);
    const index_t allocated = index_t(memory.current.load() - before);

    if (expert_group) c.parallel.ep = 2;  // the accounting of EP > 1: all pairs land on this one-rank group
    const KeptTensors expected = layer_activations(c, dense, T);
    CHECK(allocated == expected.bytes(policy));
    CHECK(index_t(cache.bytes()) == allocated);
    const std::vector<Held> held = cache_tensors(cache, expert_group && !dense, latent, dense);
    REQUIRE(index_t(held.size()) == expected.count);
    index_t sum = 0;
    for (int i = 0; i < expected.count; ++i) {
        const KeptTensor& k = expected.tensors[i];
        const Held& h = held[std::size_t(i)];
        CAPTURE(k.name);
        CHECK(h.bytes == k.bytes(policy));  // 0: recomputed
        CHECK(h.numel == (k.bytes(policy) == 0 ? 0 : k.elements()));
        CHECK(h.is_float == (k.kind != Kept::index));
        sum += h.bytes;
        if (compute != NumberFormat::bf16 || k.kind == Kept::index || !h.f32) continue;
        // (b)'s 2-byte values are exactly those the bf16 policy rounds; the f32 ones are not bf16 values
        CHECK(all_bf16(h) == (k.kind != Kept::f32));
    }
    CHECK(sum == allocated);
}

/// c with the activation policy `a`.
ModelConfig with_activations(ModelConfig c, const ActivationsConfig& a) {
    c.activations = a;
    return c;
}

TEST_CASE("the bytes a forward allocates for backward are layer_activations' under keep_f32, tensor by tensor") {
    using TinyMHA = TinyK2::with<Attention<MHA<Heads<4>, KVHeads<2>, HeadDim<8>, RopeDim<4>>>>;
    using TinyNoQ =
        TinyK2::with<Attention<MLA<Heads<4>, QRank<NoQCompression>, KVRank<16>, NopeDim<8>, RopeDim<4>, VDim<8>>>>;
    for (NumberFormat compute : {NumberFormat::f32, NumberFormat::bf16}) {
        for (index_t index : {0, 1}) {
            check_layer_caches(TinyK2::config, index, false, compute);
            check_layer_caches(TinyMHA::config, index, false, compute);
        }
        check_layer_caches(TinyNoQ::config, 1, false, compute);
        check_layer_caches(TinyK2::config, 1, true, compute);
        check_layer_caches(TinyV3::config, 3, true, compute);
    }
}

TEST_CASE("under every activation policy the caches hold layer_activations' bytes of that policy") {
    using TinyMHA = TinyK2::with<Attention<MHA<Heads<4>, KVHeads<2>, HeadDim<8>, RopeDim<4>>>>;
    using TinyNoQ =
        TinyK2::with<Attention<MLA<Heads<4>, QRank<NoQCompression>, KVRank<16>, NopeDim<8>, RopeDim<4>, VDim<8>>>>;
    const ActivationsConfig policies[] = {
        Activations<Recompute<NormOutputs>>::value,
        Activations<Recompute<UpProjections>>::value,
        Activations<Recompute<KimiK2Selection>>::value,
        Activations<MlpInputs<FP8>>::value,
        Activations<Recompute<KimiK2Selection>, MlpInputs<FP8>>::value,
        Activations<Storage<BF16>>::value,
        KimiK2Activations::value,
    };
    for (const ActivationsConfig& a : policies) {
        for (NumberFormat compute : {NumberFormat::f32, NumberFormat::bf16}) {
            if (!a.valid({compute, NumberFormat::f32})) continue;
            for (index_t index : {0, 1}) {
                check_layer_caches(with_activations(TinyK2::config, a), index, false, compute);
                check_layer_caches(with_activations(TinyMHA::config, a), index, false, compute);
            }
            check_layer_caches(with_activations(TinyNoQ::config, a), 1, false, compute);
            check_layer_caches(with_activations(TinyK2::config, a), 1, true, compute);
            check_layer_caches(with_activations(TinyV3::config, a), 3, true, compute);
        }
    }
}

TEST_CASE("the model type's activation policy is one of the report's steps, by its name") {
    using BF = TinyK2::with<Precision<BF16>>;
    CHECK(TinyK2::config.activations == storage::keep_f32);
    CHECK(std::string(activation_step_name(TinyK2::config.activations)) == "(a) f32 (the modules)");
    CHECK(BF::with<Activations<Storage<BF16>>>::config.activations == storage::keep_bf16);
    CHECK(BF::with<Activations<Storage<BF16>, Recompute<KimiK2Selection>>>::config.activations == storage::recompute);
    CHECK(BF::with<KimiK2Activations>::config.activations == storage::fp8);
    CHECK(std::string(activation_step_name(BF::with<KimiK2Activations>::config.activations)) == "(d) + fp8 MLP inputs");
    // any order; the two named parts are K2's selection
    CHECK(BF::with<Activations<Recompute<NormOutputs, UpProjections>, MlpInputs<FP8>, Storage<BF16>>>::config
              .activations == storage::fp8);
    // a combination that is no step is named as such and counts what it says
    using Mixed = TinyK2::with<Activations<Recompute<UpProjections>>>;
    CHECK(std::string(activation_step_name(Mixed::config.activations)) == "Activations<...>");
    CHECK(Mixed::config.activations.value_bytes() == 4);
    // the tiny K2's layers by hand (the test above): (d) for the K2 policy
    static_assert(BF::with<KimiK2Activations>::layer_activation_bytes(true, 8) == 5248);
    static_assert(BF::with<KimiK2Activations>::layer_activation_bytes(false, 8) == 5312);
    static_assert(TinyK2::layer_activation_bytes(false, 8) == 22080);
    // bf16 storage needs bf16 compute: refused at run time as the type refuses it at compile time
    ModelConfig c = TinyK2::config;
    c.activations.storage = NumberFormat::bf16;
    CHECK_THROWS_WITH_AS(nn::DecoderLayer<cpu>(c, 0),
                         "activations: Storage<BF16> keeps the bf16 values of Precision<BF16>, and the compute format "
                         "is f32 (storing its values in bf16 would round them)",
                         config_error);
}

}  // namespace unit_config_accounting
