// Parameter and FLOP accounting against the exact integers (counted from the released
// config.json files) and the publicly quoted totals of other DeepSeek-V3-architecture models.
#include <doctest/doctest.h>

#include <cmath>

#include <moonmoe/config.hpp>

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
using DeepSeekV2Lite = Model<
    Dims<Hidden<2048>, Layers<27>, DenseLayers<1>, Vocab<102400>, DenseHidden<10944>>,
    Attention<MLA<Heads<16>, QRank<NoQCompression>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
    MoE<Experts<64>, TopK<6>, Shared<2>, ExpertHidden<1408>, Score<Softmax>, RoutedScale<1.0>>>;
using DeepSeekV2 = Model<
    Dims<Hidden<5120>, Layers<60>, DenseLayers<1>, Vocab<102400>, DenseHidden<12288>>,
    Attention<MLA<Heads<128>, QRank<1536>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
    MoE<Experts<160>, TopK<6>, Shared<2>, ExpertHidden<1536>, Groups<8>, TopGroups<3>, Score<Softmax>,
        RoutedScale<16.0>>>;
using Moonlight16B = Model<
    Dims<Hidden<2048>, Layers<27>, DenseLayers<1>, Vocab<163840>, DenseHidden<11264>>,
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

}  // namespace unit_config_accounting
