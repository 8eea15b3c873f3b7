// Named arguments, defaults, `with`, and the configuration rules checked at run time by validate().
#include <doctest/doctest.h>

#include <string>
#include <type_traits>

#include <moonmoe/config.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_config_model {

using namespace moonmoe;

namespace {
bool same_shape(const ModelConfig& a, const ModelConfig& b) {
    return a.dims.hidden == b.dims.hidden && a.dims.layers == b.dims.layers && a.dims.vocab == b.dims.vocab &&
           a.attention.heads == b.attention.heads && a.attention.q_rank == b.attention.q_rank &&
           a.moe.experts == b.moe.experts && a.moe.top_k == b.moe.top_k && a.moe.groups == b.moe.groups &&
           a.moe.routed_scale == b.moe.routed_scale && a.rope.theta == b.rope.theta && a.parallel.pp == b.parallel.pp;
}
std::string validation_message(const ModelConfig& c) {
    try {
        validate(c);
    } catch (const config_error& e) {
        return e.what();
    }
    return {};
}
}  // namespace

TEST_CASE("components and arguments are order-independent and default to Kimi K2") {
    using A = Model<MoE<TopK<2>, Experts<16>>, Dims<Layers<4>, Hidden<256>>, Parallel<2, 4, 1>>;
    using B = Model<Parallel<2, 4, 1>, Dims<Hidden<256>, Layers<4>>, MoE<Experts<16>, TopK<2>>>;
    CHECK(same_shape(A::config, B::config));
    CHECK(A::config.dims.hidden == 256);
    CHECK(A::config.moe.top_k == 2);
    CHECK(A::config.dims.vocab == 163840);       // K2 default
    CHECK(A::config.attention.kv_rank == 512);   // K2 default
    CHECK(A::config.moe.routed_scale == 2.827);  // K2 default
    CHECK(same_shape(Model<>::with<Parallel<16, 16, Dynamic, VirtualStages<2>>>::config, KimiK2::config));
    CHECK(std::is_same_v<KimiK2::backend, cpu>);
    CHECK(std::is_same_v<KimiK2::with<Backend<cuda>>::backend, cuda>);
}

TEST_CASE("with<> replaces whole components, and components have with<> for single values") {
    using Small = KimiK2::with<KimiK2::dims::with<Layers<4>>, Parallel<2, 8, 1>>;
    CHECK(Small::config.dims.layers == 4);
    CHECK(Small::config.dims.hidden == 7168);
    CHECK(Small::config.parallel.ep == 8);
    CHECK(Small::config.moe.experts == 384);
    CHECK(Small::parameter_count() == 4 * (101'124'096LL + 2 * 7168) + 396'361'728LL +
                                          3 * (16'911'433'728LL + 44'040'192LL + 2'752'896LL) + 2 * 1'174'405'120LL +
                                          7168);
}

TEST_CASE("a Dynamic model is not static, its config resolves and validates at run time") {
    static_assert(!AnyDeepSeekV3::is_static);
    static_assert(KimiK2::is_static && TinyK2::is_static && TinyV3::is_static);
    CHECK(validation_message(AnyDeepSeekV3::config).empty());  // open rules pass until sizes are known
    ModelConfig resolved = AnyDeepSeekV3::config;
    resolved.dims = KimiK2::config.dims;
    resolved.attention = KimiK2::config.attention;
    resolved.moe = KimiK2::config.moe;
    resolved.rope = KimiK2::config.rope;
    CHECK(resolved.is_static());
    CHECK(count_parameters(resolved).total == 1'026'408'232'448);
    CHECK(validation_message(resolved).empty());
}

TEST_CASE("validate() names every broken rule") {
    ModelConfig c = TinyV3::config;
    CHECK(validation_message(c).empty());

    SUBCASE("top-k above the expert count") {
        c.moe.top_k = 17;
        CHECK(validation_message(c).find("MoE: TopK must not exceed Experts") != std::string::npos);
    }
    SUBCASE("groups that do not divide the experts") {
        c.moe.groups = 3;
        CHECK(validation_message(c).find("MoE: Groups must divide Experts evenly") != std::string::npos);
    }
    SUBCASE("top groups above groups") {
        c.moe.top_groups = 5;
        CHECK(validation_message(c).find("MoE: TopGroups must be between 1 and Groups") != std::string::npos);
    }
    SUBCASE("top-k beyond the experts of the kept groups") {
        c.moe.top_k = 9;  // 2 groups of 4 kept
        CHECK(validation_message(c).find("MoE: TopK must not exceed the experts of TopGroups") != std::string::npos);
    }
    SUBCASE("experts over EP ranks") {
        c.parallel.ep = 3;
        CHECK(validation_message(c).find("Parallel: Experts must be divisible by EP") != std::string::npos);
    }
    SUBCASE("odd RoPE dim") {
        c.attention.rope_dim = 7;
        CHECK(validation_message(c).find("Attention: head dims do not fit") != std::string::npos);
    }
    SUBCASE("more dense layers than layers") {
        c.dims.dense_layers = 5;
        CHECK(validation_message(c).find("Dims: DenseLayers must be between 0 and Layers") != std::string::npos);
    }
    SUBCASE("an even split that does not divide") {
        c.parallel.pp = 3;
        c.parallel.split = SplitKind::even;
        CHECK(validation_message(c).find("EvenSplit needs Layers to be a multiple") != std::string::npos);
    }
    SUBCASE("more chunks than layers") {
        c.parallel.pp = 5;
        CHECK(validation_message(c).find("Layers must be at least PP * VirtualStages") != std::string::npos);
    }
    SUBCASE("two rules at once, one line each") {
        c.moe.top_k = 0;
        c.optimizer.qk_clip.tau = -1.0;
        const std::string m = validation_message(c);
        CHECK(m.find("sizes must be positive") != std::string::npos);
        CHECK(m.find("QKClip: tau must be positive") != std::string::npos);
    }
}

TEST_CASE("optimizer defaults are the K2 recipe") {
    constexpr OptimizerConfig o = KimiK2::config.optimizer;
    CHECK(o.muon.enabled);
    CHECK(o.muon.momentum == 0.95);
    CHECK(o.muon.nesterov);
    CHECK(o.muon.ns_steps == 5);
    CHECK(o.muon.scale == UpdateScaleKind::match_adamw_rms);
    CHECK(o.muon.scale_factor == 0.2);
    CHECK(o.muon.weight_decay == 0.1);
    CHECK(o.qk_clip.enabled);
    CHECK(o.qk_clip.tau == 100.0);
    CHECK(o.qk_clip.scope == ClipScope::per_head);
    CHECK(std::is_same_v<KimiK2::optimizer::coefficients, KellerQuintic>);
    CHECK(KellerQuintic::table[0].a == 3.4445);
    CHECK(!DeepSeekV3::config.optimizer.muon.enabled);
    CHECK(!DeepSeekV3::config.optimizer.qk_clip.enabled);
    using Custom = Optimizer<QKClip<30.0, Scope<PerLayer>, ClipAlpha<0.25>>,
                             Muon<Nesterov<false>, Coefficients<PolarExpress>, UpdateScale<ShapeScale>>>;
    CHECK(Custom::value.qk_clip.tau == 30.0);
    CHECK(Custom::value.qk_clip.scope == ClipScope::per_layer);
    CHECK(Custom::value.qk_clip.alpha == 0.25);
    CHECK(!Custom::value.muon.nesterov);
    CHECK(Custom::value.muon.scale == UpdateScaleKind::shape);
    CHECK(std::is_same_v<Custom::coefficients, PolarExpress>);
}

TEST_CASE("WSD: linear warm-up, constant, cosine to the final rate") {
    constexpr ScheduleConfig s = WSD<Warmup<10>, Stable<20>, Decay<100>, FinalLR<0.1>>::value;
    CHECK(s.multiplier(0) == doctest::Approx(0.1));
    CHECK(s.multiplier(9) == doctest::Approx(1.0));
    CHECK(s.multiplier(10) == 1.0);
    CHECK(s.multiplier(29) == 1.0);
    CHECK(s.multiplier(30) == doctest::Approx(1.0));
    CHECK(s.multiplier(80) == doctest::Approx(0.55));  // halfway through the cosine: (1 + 0.1) / 2
    CHECK(s.multiplier(130) == doctest::Approx(0.1));
    CHECK(s.multiplier(10'000) == doctest::Approx(0.1));
    // K2: 2e-4 after 500 warm-up steps, to 2e-5 at the end.
    constexpr ScheduleConfig k2 = KimiK2::config.optimizer.schedule;
    CHECK(k2.warmup == 500);
    CHECK(k2.multiplier(k2.warmup + k2.stable + k2.decay) == doctest::Approx(0.1));
}

TEST_CASE("training recipes: Kimi K2 technical report §2.5 and DeepSeek-V3 (arXiv 2412.19437 §4.2)") {
    // K2: 500 warm-up steps, 2e-4 until 10T tokens, cosine to 2e-5 over 5.5T tokens, 67M tokens per step.
    constexpr OptimizerConfig k2 = KimiK2::config.optimizer;
    CHECK(k2.schedule.warmup == 500);
    CHECK(k2.schedule.warmup + k2.schedule.stable == 149'254);  // 10e12 / 67e6 = 149,253.7
    CHECK(k2.schedule.decay == 82'090);                         // 5.5e12 / 67e6 = 82,089.6
    CHECK(k2.schedule.final_fraction == doctest::Approx(0.1));
    CHECK(k2.muon.learning_rate == 2e-4);
    CHECK(k2.muon.weight_decay == 0.1);
    CHECK(k2.schedule.multiplier(0) * k2.muon.learning_rate == doctest::Approx(4e-7));  // step 1 of the warm-up
    // The report is silent on the balancing rate; K2 keeps DeepSeek-V3's router, so gamma is V3's 0.001.
    CHECK(k2.bias_update_rate == 0.001);
    CHECK(Optimizer<>::value.bias_update_rate == 0.001);  // the defaults are K2's recipe
    CHECK(Optimizer<BiasUpdateRate<0.0>>::value.bias_update_rate == 0.0);

    // DeepSeek-V3: AdamW 0.9 / 0.95, weight decay 0.1, 2.2e-4 after 2K warm-up steps until 10T tokens, cosine to
    // 2.2e-5 over 4.3T tokens, batch 15360 x 4096 tokens; gamma 0.001.
    constexpr OptimizerConfig v3 = DeepSeekV3::config.optimizer;
    CHECK(!v3.muon.enabled);
    CHECK(v3.adamw.beta1 == 0.9);
    CHECK(v3.adamw.beta2 == 0.95);
    CHECK(v3.adamw.weight_decay == 0.1);
    CHECK(v3.adamw.learning_rate == 2.2e-4);
    CHECK(v3.schedule.warmup == 2000);
    CHECK(v3.schedule.warmup + v3.schedule.stable == 158'946);  // 10e12 / 62,914,560
    CHECK(v3.schedule.decay == 68'347);                         // 4.3e12 / 62,914,560
    CHECK(v3.schedule.final_fraction == doctest::Approx(0.1));
    CHECK(v3.bias_update_rate == 0.001);
    const long long end = v3.schedule.warmup + v3.schedule.stable + v3.schedule.decay;
    CHECK(v3.schedule.multiplier(end) * v3.adamw.learning_rate == doctest::Approx(2.2e-5));

    ModelConfig broken = KimiK2::config;
    broken.optimizer.bias_update_rate = -1e-3;
    CHECK(validation_message(broken).find("BiasUpdateRate must be >= 0") != std::string::npos);
}

}  // namespace unit_config_model
