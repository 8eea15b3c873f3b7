// tensor/dtype.hpp: DType spellings, and bf16 / f16 / f8_e4m3 conversions against oracles built here from the
// formats' definitions (sign, exponent, mantissa), against known torch values, and, for f8, against a transcription
// of torch 2.15's c10 fp8e4m3fn_from_fp32_value, which rounds its subnormals with a float addition instead of
// integer arithmetic.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <moonmoe/tensor/dtype.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_dtype {

using namespace moonmoe;

namespace {

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }

// A finite value of a binary format with `e_bits` exponent bits (bias 2^(e_bits-1) - 1) and `m_bits` mantissa bits,
// computed as (-1)^s * 2^(e - bias) * (1 + m / 2^m_bits), or 2^(1 - bias) * m / 2^m_bits for e == 0.
double format_value(unsigned code, int e_bits, int m_bits) {
    const unsigned sign = code >> (e_bits + m_bits), e = (code >> m_bits) & ((1u << e_bits) - 1),
                   m = code & ((1u << m_bits) - 1);
    const int bias = (1 << (e_bits - 1)) - 1;
    const double magnitude = e == 0 ? std::ldexp(double(m), 1 - bias - m_bits)
                                    : std::ldexp(double((1u << m_bits) + m), int(e) - bias - m_bits);
    return sign ? -magnitude : magnitude;
}

bool same_float(float a, float b) { return bits(a) == bits(b); }  // tells -0 from +0

// torch 2.15 c10::detail::fp8e4m3fn_from_fp32_value, transcribed (torch/headeronly/util/Float8_e4m3fn.h).
std::uint8_t torch_fp8_from_fp32(float f) {
    const std::uint32_t fp8_max = 1087u << 20, denorm_mask = 141u << 23;
    std::uint32_t f_bits = bits(f);
    const std::uint32_t sign = f_bits & 0x80000000u;
    f_bits ^= sign;
    std::uint8_t result;
    if (f_bits >= fp8_max) {
        result = f_bits > 0x7F800000u ? 0x7F : 0x7E;
    } else if (f_bits < (121u << 23)) {
        f_bits = bits(from_bits(f_bits) + from_bits(denorm_mask));
        result = std::uint8_t(f_bits - denorm_mask);
    } else {
        const std::uint8_t mant_odd = (f_bits >> 20) & 1;
        f_bits += (std::uint32_t(7 - 127) << 23) + 0x7FFFF;
        f_bits += mant_odd;
        result = std::uint8_t(f_bits >> 20);
        if (result == 0x7F) result = 0x7E;
    }
    return std::uint8_t(result | (sign >> 24));
}

// Nearest even rounding checked at every boundary between two adjacent codes `lo` < `hi` (both finite, same sign
// bit clear): the midpoint goes to the even code, one float ulp either side to the nearer one; likewise negated.
template <class T, class Code>
void check_boundary(Code lo, Code hi, Code sign_bit) {
    const double a = T{lo}.to_float(), b = T{hi}.to_float();
    const float mid = float((a + b) / 2);
    REQUIRE(double(mid) == (a + b) / 2);  // midpoints of these narrow formats are exact in float
    const Code even = (lo & 1) == 0 ? lo : hi;
    CAPTURE(lo);
    CHECK(T::from_float(float(a)).bits == lo);
    CHECK(T::from_float(mid).bits == even);
    CHECK(T::from_float(std::nextafter(mid, 0.0f)).bits == lo);
    CHECK(T::from_float(std::nextafter(mid, INFINITY)).bits == hi);
    CHECK(T::from_float(-mid).bits == Code(even | sign_bit));
    CHECK(T::from_float(-std::nextafter(mid, INFINITY)).bits == Code(hi | sign_bit));
}

}  // namespace

TEST_CASE("io: DType sizes, safetensors spellings and parsing") {
    CHECK(dtype_size(DType::f64) == 8);
    CHECK(dtype_size(DType::bf16) == 2);
    CHECK(dtype_size(DType::f8_e4m3) == 1);
    CHECK(dtype_size(DType::i64) == 8);
    CHECK(dtype_size(DType::boolean) == 1);
    CHECK(dtype_name(DType::f8_e4m3) == "F8_E4M3");
    CHECK(dtype_name(DType::boolean) == "BOOL");
    CHECK(dtype_name(DType::bf16) == "BF16");
    for (DType t : all_dtypes) {
        CAPTURE(dtype_name(t));
        CHECK(parse_dtype(dtype_name(t)) == t);
        CHECK(dtype_size(t) >= 1);
    }
    CHECK(!parse_dtype("bf16").has_value());  // the format is case-sensitive
    CHECK(!parse_dtype("F8_E4M3FN").has_value());
    CHECK(!parse_dtype("").has_value());
    CHECK(is_floating(DType::f8_e4m3));
    CHECK(!is_floating(DType::i64));
    static_assert(dtype_of<float> == DType::f32 && dtype_of<bf16> == DType::bf16 &&
                  dtype_of<std::int64_t> == DType::i64);
    static_assert(parse_dtype("F32") == DType::f32);
}

TEST_CASE("io: conversions are constexpr and match known values") {
    static_assert(f8_e4m3{0x7E}.to_float() == 448.0f);
    static_assert(f8_e4m3{0x01}.to_float() == 0x1p-9f);
    static_assert(f8_e4m3{0x08}.to_float() == 0x1p-6f);
    static_assert(f8_e4m3{0x38}.to_float() == 1.0f);
    static_assert(f8_e4m3{0xFE}.to_float() == -448.0f);
    static_assert(bf16{0x3F80}.to_float() == 1.0f);
    static_assert(bf16{0xC000}.to_float() == -2.0f);
    static_assert(f16{0x3C00}.to_float() == 1.0f);
    static_assert(f16{0x7BFF}.to_float() == 65504.0f);
    static_assert(f16{0x0001}.to_float() == 0x1p-24f);
    static_assert(bf16::from_float(1.0f).bits == 0x3F80);
    static_assert(f8_e4m3::from_float(448.0f).bits == 0x7E);
    static_assert(f16::from_float(1.0f).bits == 0x3C00);
    CHECK(bits(f8_e4m3{0x7F}.to_float()) == 0x7FF00000u);  // the NaN bits torch decodes 0x7F to
    CHECK(bits(f8_e4m3{0xFF}.to_float()) == 0xFFF00000u);
    CHECK(bits(f8_e4m3{0x80}.to_float()) == 0x80000000u);  // -0
    CHECK(std::isinf(bf16{0x7F80}.to_float()));
    CHECK(bf16{0x0001}.to_float() == 0x1p-133f);
}

TEST_CASE("io: all 256 f8_e4m3 codes decode by the e4m3fn definition") {
    int nans = 0;
    for (unsigned code = 0; code < 256; ++code) {
        CAPTURE(code);
        const f8_e4m3 v{std::uint8_t(code)};
        if ((code & 0x7F) == 0x7F) {  // only S.1111.111 is NaN; no infinities
            CHECK(std::isnan(v.to_float()));
            CHECK(v.is_nan());
            ++nans;
            continue;
        }
        CHECK(!v.is_nan());
        const double expected = format_value(code, 4, 3);
        CHECK(same_float(v.to_float(), std::copysign(float(expected), (code & 0x80) ? -1.0f : 1.0f)));
        CHECK(std::abs(expected) <= 448.0);
        CHECK(f8_e4m3::from_float(v.to_float()).bits == code);  // every finite code round-trips
    }
    CHECK(nans == 2);
}

TEST_CASE("io: all 65536 bf16 and f16 codes decode by the IEEE-style definition") {
    for (unsigned code = 0; code < 65536; ++code) {
        CAPTURE(code);
        const float sign = (code & 0x8000) ? -1.0f : 1.0f;
        const bf16 b{std::uint16_t(code)};
        const unsigned be = (code >> 7) & 0xFF;
        if (be == 0xFF) {
            CHECK(((code & 0x7F) ? std::isnan(b.to_float()) : b.to_float() == sign * INFINITY));
            CHECK(b.is_nan() == ((code & 0x7F) != 0));
        } else {
            CHECK(same_float(b.to_float(), std::copysign(float(format_value(code, 8, 7)), sign)));
            CHECK(bf16::from_float(b.to_float()).bits == code);
        }
        const f16 h{std::uint16_t(code)};
        const unsigned he = (code >> 10) & 0x1F;
        if (he == 0x1F) {
            CHECK(((code & 0x3FF) ? std::isnan(h.to_float()) : h.to_float() == sign * INFINITY));
            CHECK(h.is_nan() == ((code & 0x3FF) != 0));
        } else {
            CHECK(same_float(h.to_float(), std::copysign(float(format_value(code, 5, 10)), sign)));
            CHECK(f16::from_float(h.to_float()).bits == code);
        }
    }
}

TEST_CASE("io: float to bf16 / f16 / f8 rounds to nearest, ties to even, at every code boundary") {
    for (unsigned lo = 0; lo + 1 < 0x7F; ++lo)  // up to 0x7D | 0x7E (448)
        check_boundary<f8_e4m3, std::uint8_t>(std::uint8_t(lo), std::uint8_t(lo + 1), 0x80);
    for (unsigned lo = 0; lo + 1 < 0x7F80; ++lo)  // up to the largest finite bf16
        check_boundary<bf16, std::uint16_t>(std::uint16_t(lo), std::uint16_t(lo + 1), 0x8000);
    for (unsigned lo = 0; lo + 1 < 0x7C00; ++lo)
        check_boundary<f16, std::uint16_t>(std::uint16_t(lo), std::uint16_t(lo + 1), 0x8000);
}

TEST_CASE("io: out-of-range and special values convert as torch 2.15 does") {
    // f8_e4m3fn saturates (torch: `torch.tensor([1000.]).to(torch.float8_e4m3fn)` is 448); only NaN stays NaN.
    for (float x : {448.0f, 460.0f, 464.0f, std::nextafter(464.0f, INFINITY), 470.0f, 479.99f, 480.0f, 1000.0f, 1e30f,
                    std::numeric_limits<float>::max(), INFINITY}) {
        CAPTURE(x);
        CHECK(f8_e4m3::from_float(x).bits == 0x7E);
        CHECK(f8_e4m3::from_float(-x).bits == 0xFE);
    }
    CHECK(f8_e4m3::from_float(NAN).bits == 0x7F);
    CHECK(f8_e4m3::from_float(-NAN).bits == 0xFF);
    CHECK(f8_e4m3::from_float(0x1p-10f).bits == 0x00);            // half the smallest subnormal: tie to even 0
    CHECK(f8_e4m3::from_float(3 * 0x1p-10f).bits == 0x02);        // 1.5 units: tie to even 2
    CHECK(f8_e4m3::from_float(0x1p-6f - 0x1p-10f).bits == 0x08);  // 7.5 units: up into the smallest normal
    CHECK(f8_e4m3::from_float(1e-30f).bits == 0x00);
    CHECK(f8_e4m3::from_float(-1e-30f).bits == 0x80);

    // bf16: carries into inf past the largest finite + half an ulp; NaN becomes c10's quiet NaN 0x7FC0 (torch's
    // vectorised CPU kernel writes 0xFFFF instead; both are NaN).
    CHECK(bf16::from_float(from_bits(0x7F7F7FFFu)).bits == 0x7F7F);
    CHECK(bf16::from_float(from_bits(0x7F7F8000u)).bits == 0x7F80);
    CHECK(bf16::from_float(INFINITY).bits == 0x7F80);
    CHECK(bf16::from_float(-INFINITY).bits == 0xFF80);
    CHECK(bf16::from_float(NAN).is_nan());
    CHECK(bf16::from_float(-NAN).is_nan());
    CHECK(bf16::from_float(from_bits(0x7F800001u)).is_nan());  // a signalling NaN must not truncate to inf

    // f16: 65520 (the midpoint above 65504) and beyond is inf; NaN is sign | 0x7E00 as in torch.
    CHECK(f16::from_float(65519.996f).bits == 0x7BFF);
    CHECK(f16::from_float(65520.0f).bits == 0x7C00);
    CHECK(f16::from_float(-1e10f).bits == 0xFC00);
    CHECK(f16::from_float(NAN).bits == 0x7E00);
    CHECK(f16::from_float(-NAN).bits == 0xFE00);
    CHECK(f16::from_float(0x1p-25f).bits == 0x0000);  // tie to even 0
    CHECK(f16::from_float(std::nextafter(0x1p-25f, 1.0f)).bits == 0x0001);
}

TEST_CASE("io: f8_e4m3 from_float agrees with torch's algorithm on a sweep of float bit patterns") {
    std::size_t checked = 0;
    for (std::uint64_t u = 0; u < (1ull << 32); u += 4093) {  // every exponent, many mantissas, both signs
        const float x = from_bits(std::uint32_t(u));
        const std::uint8_t ours = f8_e4m3::from_float(x).bits, torch = torch_fp8_from_fp32(x);
        if (std::isnan(x)) CHECK((ours & 0x7F) == 0x7F);
        else if (ours != torch)
            FAIL_CHECK("x = " << x << " ours " << int(ours) << " torch " << int(torch));
        ++checked;
    }
    // and densely where it matters: every float in [2^-11, 2^-5] (subnormals and the first binade) of one in 7.
    for (std::uint32_t u = bits(0x1p-11f); u <= bits(0x1p-5f); u += 7) {
        const float x = from_bits(u);
        if (f8_e4m3::from_float(x).bits != torch_fp8_from_fp32(x)) FAIL_CHECK("x = " << x);
        ++checked;
    }
    CHECK(checked > 2'000'000);

    // Random values against a brute-force nearest-value search over all finite codes (ties to the even code).
    std::mt19937 rng(7);
    std::vector<float> finite;
    for (unsigned c = 0; c < 0x7F; ++c) finite.push_back(f8_e4m3{std::uint8_t(c)}.to_float());
    for (int i = 0; i < 20000; ++i) {
        const float x = std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng),
                                   std::uniform_int_distribution<int>(-12, 8)(rng));
        unsigned best = 0;
        for (unsigned c = 1; c < finite.size(); ++c) {
            const double d = std::abs(double(finite[c]) - x), db = std::abs(double(finite[best]) - x);
            if (d < db || (d == db && (c & 1) == 0)) best = c;
        }
        CAPTURE(x);
        CHECK(f8_e4m3::from_float(x).bits == best);
    }
}

}  // namespace unit_io_dtype
