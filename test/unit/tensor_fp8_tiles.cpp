// FP8-E4M3 activation storage in 1 x 128 tiles (tensor/fp8_tiles.hpp, backend/fp8.hpp) on every backend of the
// build: codes, scales and dequantized values bit for bit against torch's float8_e4m3fn on the same recipe
// (test/data/fp8, tools/make_fp8_reference.py), pitched views, empty shapes, the error bound on N(0, 1) activations
// at K2's hidden width, and the shape errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <moonmoe/backend/random.hpp>
#include <moonmoe/tensor/fp8_tiles.hpp>

#include "support/backends.hpp"
#include "support/reference.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_tensor_fp8_tiles {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

/// Equal bits, or both NaN: the sign and payload of a NaN made by x / scale differ between x86 (torch) and a GPU.
bool same(float a, float b) { return bits(a) == bits(b) || (std::isnan(a) && std::isnan(b)); }
bool same(f8_e4m3 a, f8_e4m3 b) { return a.bits == b.bits || (a.is_nan() && b.is_nan()); }

/// A case of tiles.safetensors: the input and torch's codes, scales and dequantized values, on the host.
struct TorchCase {
    index_t rows = 0, cols = 0;
    Tensor<float, 2, cpu> x, scales, dequantized;
    Tensor<f8_e4m3, 2, cpu> codes;

    TorchCase(const Reference& ref, const std::string& name) {
        const auto shape = ref.shape(name + ".x");
        rows = shape[0], cols = shape[1];
        x = matrix(ref, name + ".x", rows, cols);
        scales = matrix(ref, name + ".scales", rows, fp8_tiles_per_row(cols));
        dequantized = matrix(ref, name + ".dequantized", rows, cols);
        const TensorRecord& c = ref.file.at(name + ".codes");
        REQUIRE(c.dtype == DType::f8_e4m3);
        REQUIRE(c.numel() == rows * cols);
        codes = Tensor<f8_e4m3, 2, cpu>({rows, cols});
        std::memcpy(codes.data(), c.bytes.data(), std::size_t(rows * cols));
    }
    static Tensor<float, 2, cpu> matrix(const Reference& ref, const std::string& name, index_t rows, index_t cols) {
        const TensorRecord& r = ref.file.at(name);
        REQUIRE(r.dtype == DType::f32);
        REQUIRE(r.numel() == rows * cols);
        Tensor<float, 2, cpu> t({rows, cols});
        std::memcpy(t.data(), r.bytes.data(), std::size_t(rows * cols) * sizeof(float));  // NaN payloads kept
        return t;
    }
};

/// A host copy of a strided backend view (to_host wants a contiguous one): the whole parent, then the window.
template <class T, class B>
Tensor<T, 2, cpu> window(const Tensor<T, 2, B>& parent, index_t r0, index_t c0, index_t rows, index_t cols) {
    const auto all = host(parent);
    Tensor<T, 2, cpu> out({rows, cols});
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) out(i, j) = all(r0 + i, c0 + j);
    return out;
}

}  // namespace

static_assert(fp8_tile_width == 128);
static_assert(fp8_tiles_per_row(0) == 0 && fp8_tiles_per_row(1) == 1 && fp8_tiles_per_row(128) == 1 &&
              fp8_tiles_per_row(129) == 2 && fp8_tiles_per_row(7168) == 56);
// K2's hidden width: 7168 bytes of codes and 56 scales per token, against 28672 bytes in f32 (3.88x smaller)
static_assert(fp8_tiles_bytes(1, 7168) == 7168 + 4 * 56);
static_assert(fp8_tiles_bytes(4096, 7168) == 4096ull * 7168 + 4ull * 4096 * 56);
static_assert(fp8_tiles_bytes(3, 300) == 900 + 4 * 3 * 3 && fp8_tiles_bytes(0, 300) == 0 && fp8_tiles_bytes(5, 0) == 0);

TEST_CASE_TEMPLATE("Fp8Tiles: shapes of codes and scales, bytes held", B, MOONMOE_TEST_BACKENDS) {
    const Fp8Tiles<B> t(5, 300);
    CHECK(t.rows() == 5);
    CHECK(t.cols() == 300);
    CHECK(t.shape() == Shape<2>{5, 300});
    CHECK(t.codes.shape() == Shape<2>{5, 300});
    CHECK(t.scales.shape() == Shape<2>{5, 3});
    CHECK(t.bytes() == fp8_tiles_bytes(5, 300));
    CHECK(Fp8Tiles<B>(Shape<2>{0, 7168}).bytes() == 0);
    CHECK(Fp8Tiles<B>().bytes() == 0);
}

TEST_CASE_TEMPLATE(
    "quantize_fp8_tiles / dequantize_fp8_tiles: codes, scales and values equal torch's float8_e4m3fn "
    "bit for bit, from pitched views into pitched views",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    const Reference ref(data_dir("fp8") + "/tiles.safetensors");
    int cases = 0, subnormal_codes = 0, zero_tiles = 0, nan_codes = 0;
    for (const char* name : {"ragged", "special", "short", "nonfinite"}) {
        CAPTURE(name);
        const TorchCase want(ref, name);
        const index_t rows = want.rows, cols = want.cols, tiles = fp8_tiles_per_row(cols);

        // x inside a larger matrix whose margins hold 1e30: a read past the view would change a tile's amax
        Tensor<float, 2, cpu> xh({rows + 2, cols + 5});
        for (index_t i = 0; i < xh.numel(); ++i) xh.data()[i] = 1e30f;
        for (index_t i = 0; i < rows; ++i)
            for (index_t j = 0; j < cols; ++j) xh(i + 1, j + 2) = want.x(i, j);
        const auto xb = on<B>(xh);
        const auto x = xb.view().slice(0, 1, rows + 1).slice(1, 2, cols + 2);

        // codes and scales as windows of larger tensors too; the margins must stay 0
        Tensor<f8_e4m3, 2, B> codes({rows + 1, cols + 3});
        Tensor<float, 2, B> scales({rows + 1, tiles + 2});
        const auto cv = codes.view().slice(0, 1, rows + 1).slice(1, 3, cols + 3);
        const auto sv = scales.view().slice(0, 1, rows + 1).slice(1, 1, tiles + 1);
        Ops::quantize_fp8_tiles(x, cv, sv);

        // back into a pitched window, its margins 0
        Tensor<float, 2, B> back({rows, cols + 7});
        const auto bv = back.view().slice(1, 4, cols + 4);
        Ops::dequantize_fp8_tiles(cv, sv, bv);

        const auto got_codes = host(codes);
        const auto got_scales = host(scales);
        const auto got_back = host(back);
        int code_mismatch = 0, scale_mismatch = 0, value_mismatch = 0, margins = 0;
        for (index_t i = 0; i < rows; ++i) {
            for (index_t k = 0; k < tiles; ++k) {
                scale_mismatch += !same(got_scales(i + 1, k + 1), want.scales(i, k));
                zero_tiles += want.scales(i, k) == 1.0f && got_codes(i + 1, 3 + k * 128).to_float() == 0.0f;
            }
            for (index_t j = 0; j < cols; ++j) {
                const f8_e4m3 c = got_codes(i + 1, j + 3);
                code_mismatch += !same(c, want.codes(i, j));
                value_mismatch += !same(got_back(i, j + 4), want.dequantized(i, j));
                subnormal_codes += (c.bits & 0x78u) == 0 && (c.bits & 0x07u) != 0;
                nan_codes += c.is_nan();
            }
        }
        for (index_t i = 0; i < got_codes.numel(); ++i) {
            const index_t r = i / (cols + 3), c = i % (cols + 3);
            margins += (r == 0 || c < 3) && got_codes.data()[i].bits != 0;
        }
        for (index_t i = 0; i < got_scales.numel(); ++i) {
            const index_t r = i / (tiles + 2), c = i % (tiles + 2);
            margins += (r == 0 || c == 0 || c == tiles + 1) && got_scales.data()[i] != 0.0f;
        }
        for (index_t i = 0; i < rows; ++i)
            for (index_t j = 0; j < cols + 7; ++j) margins += (j < 4 || j >= cols + 4) && got_back(i, j) != 0.0f;
        CHECK(code_mismatch == 0);
        CHECK(scale_mismatch == 0);
        CHECK(value_mismatch == 0);
        CHECK(margins == 0);
        ++cases;
    }
    CHECK(cases == 4);
    // the data covers what it claims (tools/make_fp8_reference.py)
    CHECK(subnormal_codes >= 20);
    CHECK(zero_tiles >= 3);   // all zeros, -0 only, an amax whose amax / 448 underflows
    CHECK(nan_codes >= 129);  // the NaN tile, and inf / inf
}

TEST_CASE_TEMPLATE(
    "quantize_fp8_tiles: the error bound |x - x'| <= 2^-4 |x| + 2^-10 scale on N(0, 1) activations at "
    "K2's hidden width, rows at scales 2^-20 .. 2^20",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    const index_t rows = 1024, cols = 7168, tiles = fp8_tiles_per_row(cols);
    Tensor<float, 2, cpu> xh({rows, cols});
    backend::RandomOps<cpu>::fill_normal(xh.view(), 0.0f, 1.0f, 13);
    // the first 64 rows at powers of two from 2^-20 to 2^20 (exact scalings: the relative errors must not change)
    for (index_t i = 0; i < 64; ++i)
        for (index_t j = 0; j < cols; ++j) xh(i, j) = std::ldexp(xh(i, j), int(i % 41) - 20);
    const auto x = on<B>(xh);
    Fp8Tiles<B> t(rows, cols);
    Ops::quantize_fp8_tiles(x.view(), t.codes.view(), t.scales.view());
    Tensor<float, 2, B> back({rows, cols});
    Ops::dequantize_fp8_tiles(t.codes.view(), t.scales.view(), back.view());
    const auto got = host(back);
    const auto scales = host(t.scales);

    // Rounding q = x / s to e4m3 (3 mantissa bits) moves it by at most half an ulp: for a normal code
    // (|q| >= 2^-6) at most 2^-4 of the binade's start, so |x - x'| <= |x| / 17 (reached at q = 2^e * 17/16, a tie
    // that goes down); below, half the subnormal step 2^-9: 2^-10 s. The f32 division and product add a rounding
    // of 2^-24 each, hence the slack.
    int beyond = 0, scale_mismatch = 0;
    double worst_normal = 0.0, err2 = 0.0, ref2 = 0.0, err2_plain = 0.0, ref2_plain = 0.0;
    index_t zero_codes = 0;
    for (index_t i = 0; i < rows; ++i)
        for (index_t k = 0; k < tiles; ++k) {
            const double s = scales(i, k);
            double amax = 0.0;
            for (index_t j = k * 128; j < std::min(cols, k * 128 + 128); ++j)
                amax = std::max(amax, std::abs(double(xh(i, j))));
            scale_mismatch += s != double(float(amax) / 448.0f);  // amax exact in double, / 448 in f32
            for (index_t j = k * 128; j < std::min(cols, k * 128 + 128); ++j) {
                const double v = xh(i, j), e = std::abs(v - double(got(i, j)));
                beyond += e > (0x1p-4 + 0x1p-21) * std::abs(v) + 0x1p-10 * s * (1 + 0x1p-21);
                if (std::abs(v) >= 0x1p-6 * s) worst_normal = std::max(worst_normal, e / std::abs(v));
                zero_codes += got(i, j) == 0.0f;
                const double r = std::ldexp(1.0, -(int(i % 41) - 20) * (i < 64));  // undo the row's scaling
                err2 += e * e * r * r, ref2 += v * v * r * r;
                if (i >= 64) err2_plain += e * e, ref2_plain += v * v;
            }
        }
    const double rel = std::sqrt(err2 / ref2), rel_plain = std::sqrt(err2_plain / ref2_plain);
    CHECK(scale_mismatch == 0);
    CHECK(beyond == 0);
    CHECK(worst_normal <= (1.0 / 17) * (1 + 0x1p-20));
    CHECK(worst_normal >= 0.058);                            // and nearly reached: some values lie near such a tie
    CHECK(rel == doctest::Approx(rel_plain).epsilon(0.02));  // scaling a row by 2^k changes nothing
    CHECK(rel < 0.03);
    MESSAGE("fp8 tiles, N(0, 1) " << rows << " x " << cols << ": ||x - x'|| / ||x|| = " << rel_plain
                                  << ", max |x - x'| / |x| over normal codes = " << worst_normal << ", zero codes "
                                  << double(zero_codes) / double(rows * cols));
}

TEST_CASE_TEMPLATE(
    "quantize_fp8_tiles: no rows, no columns, one element, shape errors name what was found and what "
    "was expected",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    // rows = 0, cols = 0: nothing to do, no launch
    Tensor<float, 2, B> none({0, 300});
    Fp8Tiles<B> t0(0, 300);
    Ops::quantize_fp8_tiles(none.view(), t0.codes.view(), t0.scales.view());
    Ops::dequantize_fp8_tiles(t0.codes.view(), t0.scales.view(), none.view());
    Tensor<float, 2, B> thin({4, 0});
    Fp8Tiles<B> t1(4, 0);
    CHECK(t1.scales.shape() == Shape<2>{4, 0});
    Ops::quantize_fp8_tiles(thin.view(), t1.codes.view(), t1.scales.view());

    // one element: scale |x| / 448, code 448 (0x7E) with x's sign, read back as 448 * scale
    Tensor<float, 2, cpu> one({1, 1});
    one(0, 0) = -3.0f;
    const auto ob = on<B>(one);
    Fp8Tiles<B> t2(1, 1);
    Ops::quantize_fp8_tiles(ob.view(), t2.codes.view(), t2.scales.view());
    CHECK(host(t2.codes)(0, 0).bits == 0xFE);
    CHECK(host(t2.scales)(0, 0) == 3.0f / 448.0f);

    Tensor<float, 2, B> x({3, 200});
    Fp8Tiles<B> ok(3, 200), short_codes(3, 100), floor_scales(3, 128);
    Tensor<float, 2, B> one_scale({3, 1});
    const auto quantize = [&](auto codes, auto scales) { Ops::quantize_fp8_tiles(x.view(), codes, scales); };
    CHECK_THROWS_WITH_AS(quantize(short_codes.codes.view(), ok.scales.view()),
                         "quantize_fp8_tiles: codes are [3, 100], expected [3, 200] (the shape of x)", shape_error);
    CHECK_THROWS_WITH_AS(quantize(ok.codes.view(), one_scale.view()),
                         "quantize_fp8_tiles: scales are [3, 1], expected [3, 2] (one per 128 columns of x [3, 200])",
                         shape_error);
    CHECK_THROWS_WITH_AS(Ops::dequantize_fp8_tiles(ok.codes.view(), floor_scales.scales.view(), x.view()),
                         "dequantize_fp8_tiles: scales are [3, 1], expected [3, 2] (one per 128 columns of x [3, 200])",
                         shape_error);
    // a view whose columns are not contiguous (every other column of a wider matrix)
    Tensor<float, 2, B> wide({3, 400});
    View<float, 2, B> strided(wide.data(), {3, 200}, {400, 2});
    CHECK_THROWS_WITH_AS(Ops::quantize_fp8_tiles(strided, ok.codes.view(), ok.scales.view()),
                         doctest::Contains("x [3, 200] must have contiguous rows (column stride 2)"), shape_error);
}

}  // namespace unit_tensor_fp8_tiles
