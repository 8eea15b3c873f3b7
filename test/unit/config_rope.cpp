// YaRN numbers against HF `_compute_yarn_parameters`, and the constexpr math they
// rest on against libm.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include <moonmoe/config.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_config_rope {

using namespace moonmoe;

TEST_CASE("constexpr log, sqrt, cos, floor and ceil agree with libm") {
    for (double x : {1e-12, 1e-3, 0.1, 0.5, 0.70710678, 1.0, 1.5, 2.0, 6.283185307179586, 32.0, 40.0, 50000.0,
                     651.8986469044033, 1e9, 1e300}) {
        CAPTURE(x);
        CHECK(detail::clog(x) == doctest::Approx(std::log(x)).epsilon(1e-15));
        CHECK(detail::csqrt(x) == doctest::Approx(std::sqrt(x)).epsilon(1e-15));
    }
    for (double x : {-7.5, -1.0, -0.2, 0.0, 0.3, 1.0, 3.14159, 10.0, 100.0, 1000.5})
        CHECK(detail::ccos(x) == doctest::Approx(std::cos(x)).epsilon(1e-12));
    for (double x : {-2.5, -2.0, -0.1, 0.0, 0.1, 19.1646, 22.5134, 23.0})
        CHECK((detail::cfloor(x) == std::floor(x) && detail::cceil(x) == std::ceil(x)));
}

TEST_CASE("YaRN correction range: K2 is a hard switch at 19/20, DeepSeek-V3 blends 10..23") {
    constexpr YarnRange k2 = yarn_correction_range(KimiK2::config.rope, 64);
    static_assert(k2.low == 19 && k2.high == 20);
    CHECK(yarn_correction_dim(KimiK2::config.rope, 64, 1.0) == doctest::Approx(19.1646).epsilon(1e-5));
    constexpr YarnRange v3 = yarn_correction_range(DeepSeekV3::config.rope, 64);
    static_assert(v3.low == 10 && v3.high == 23);
    CHECK(yarn_correction_dim(DeepSeekV3::config.rope, 64, 32.0) == doctest::Approx(10.4722).epsilon(1e-5));
    CHECK(yarn_correction_dim(DeepSeekV3::config.rope, 64, 1.0) == doctest::Approx(22.5134).epsilon(1e-5));
    // The pitfall of old transformers: max_position_embeddings instead of the original length gives 29/30 for K2.
    RopeConfig wrong = KimiK2::config.rope;
    wrong.original_max_positions = 131072;
    CHECK(yarn_correction_range(wrong, 64).low == 29);
    CHECK(yarn_correction_range(wrong, 64).high == 30);
}

TEST_CASE("YaRN correction range: a theta a hair above 1 gives a clamped range, not an out-of-range conversion") {
    // log(theta) ~ 2.2e-16 puts the correction dimensions near 1e20 (past INT64_MAX): the conversion to index_t was
    // undefined (INT64_MIN on x86, so low came out negative); cfloor of such values was undefined too.
    RopeConfig r = KimiK2::config.rope;
    r.theta = std::nextafter(1.0, 2.0);
    r.original_max_positions = index_t(1) << 62;
    r.beta_fast = r.beta_slow = 1.0;
    const YarnRange range = yarn_correction_range(r, 1024);
    CHECK(range.low == index_t(1) << 53);
    CHECK(range.high == 1023);
    r.original_max_positions = 1;  // the logarithm goes negative: both ends clamp low
    CHECK(yarn_correction_range(r, 1024).low == 0);
    for (double x : {1e20, -1e20, 4503599627370496.5, -9.3e18, std::numeric_limits<double>::infinity()})
        CHECK((detail::cfloor(x) == std::floor(x) && detail::cceil(x) == std::ceil(x)));
}

TEST_CASE("softmax scale carries mscale(factor, mscale_all_dim) squared") {
    CHECK(yarn_mscale(32.0, 1.0) == doctest::Approx(1.3465736).epsilon(1e-7));
    CHECK(softmax_scale(KimiK2::config.rope, 192) == doctest::Approx(0.13086080).epsilon(1e-7));
    CHECK(softmax_scale(DeepSeekV3::config.rope, 192) == doctest::Approx(0.13523378).epsilon(1e-7));
    using K2_0905 = KimiK2::with<KimiK2::rope::with<YaRN<Factor<64.0>>>>;
    CHECK(softmax_scale(K2_0905::config.rope, 192) == doctest::Approx(0.14467963).epsilon(1e-7));
    CHECK(softmax_scale(RoPE<NoScaling>::value, 192) == doctest::Approx(0.07216878).epsilon(1e-7));
    CHECK(rope_attention_factor(KimiK2::config.rope) == 1.0);
    CHECK(rope_attention_factor(DeepSeekV3::config.rope) == 1.0);
    CHECK(yarn_mscale(1.0, 1.0) == 1.0);
}

}  // namespace unit_config_rope
