// The bf16 layer of the precision policy (docs/precision.md) on every backend of the build: the bf16 conversions
// against a table of torch.bfloat16's own (test/data/bf16, tools/make_bf16_reference.py), MapOps::cast round trips,
// BlasOps::gemm_bf16 against double loops over the bf16 operands, Newton-Schulz in bf16 against torch.optim.Muon's
// (torch/optim/_muon.py) and Muon's bf16 step against torch.optim.Muon's, and the policy types.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <moonmoe/config.hpp>
#include <moonmoe/numeric/bf16.hpp>
#include <moonmoe/optim/muon.hpp>

#include "support/backends.hpp"
#include "support/reference.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_precision {

using namespace moonmoe;
using namespace moonmoe::testing;
using backend::Trans;

namespace {

std::vector<std::uint16_t> u16(const Reference& r, const std::string& name) {
    const TensorRecord& rec = r.file.at(name);
    REQUIRE(rec.dtype == DType::bf16);
    std::vector<std::uint16_t> out(std::size_t(rec.numel()));
    std::memcpy(out.data(), rec.bytes.data(), out.size() * 2);
    return out;
}
std::vector<float> f32_raw(const Reference& r, const std::string& name) {  // bit for bit, NaN payloads kept
    const TensorRecord& rec = r.file.at(name);
    REQUIRE(rec.dtype == DType::f32);
    std::vector<float> out(std::size_t(rec.numel()));
    std::memcpy(out.data(), rec.bytes.data(), out.size() * 4);
    return out;
}
std::uint32_t bits(float x) { return std::bit_cast<std::uint32_t>(x); }

template <class T>
Tensor<T, 2, cpu> host_matrix(index_t rows, index_t cols, const std::vector<T>& v) {
    Tensor<T, 2, cpu> t({rows, cols});
    std::copy(v.begin(), v.end(), t.data());
    return t;
}

/// N(0, 1) values rounded to bf16 (the operands), and their f32 originals.
Tensor<bf16, 2, cpu> random_bf16(index_t rows, index_t cols, std::uint64_t seed) {
    Tensor<float, 2, cpu> f({rows, cols});
    backend::RandomOps<cpu>::fill_normal(f.view(), 0.0f, 1.0f, seed);
    Tensor<bf16, 2, cpu> b({rows, cols});
    for (index_t i = 0; i < f.numel(); ++i) b.data()[i] = bf16::from_float(f.data()[i]);
    return b;
}

double as_double(bf16 x) { return double(x.to_float()); }
double as_double(float x) { return double(x); }

}  // namespace

// ---- the scalar conversions (numeric/bf16.hpp), at compile time ----
static_assert(bf16::from_float(1.0f).bits == 0x3F80 && bf16{0x3F80}.to_float() == 1.0f);
static_assert(bf16::from_float(std::bit_cast<float>(0x3F808000u)).bits == 0x3F80);  // tie: to even (down)
static_assert(bf16::from_float(std::bit_cast<float>(0x3F818000u)).bits == 0x3F82);  // tie: to even (up)
static_assert(bf16::from_float(std::numeric_limits<float>::max()).bits == 0x7F80);  // overflow: inf
static_assert(bf16::from_float(std::numeric_limits<float>::quiet_NaN()).is_nan());
static_assert(convert<float>(convert<bf16>(0.5f)) == 0.5f && convert<double>(bf16{0xC000}) == -2.0);

TEST_CASE_TEMPLATE(
    "bf16: f32 -> bf16 rounds as torch.bfloat16 does (ties, subnormals, max, inf, NaN), scalar and "
    "MapOps::cast",
    B, MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("bf16") + "/conversions.safetensors");
    const std::vector<float> in = f32_raw(ref, "f32_to_bf16.input");
    const std::vector<std::uint16_t> want = u16(ref, "f32_to_bf16.output");
    REQUIRE(in.size() == want.size());
    const index_t n = index_t(in.size());
    // a pitched destination: the cast writes the view, not the padding
    const auto src = on<B>(host_matrix<float>(1, n, in));
    Tensor<bf16, 2, B> dst({3, n + 2});
    backend::Ops<B>::template cast<bf16, float>(src.view(), dst.view().slice(0, 1, 2).slice(1, 1, n + 1));
    const auto got = host(dst);
    int nans = 0, ties = 0, subnormal = 0, to_inf = 0;
    for (index_t i = 0; i < n; ++i) {
        CAPTURE(i);
        CAPTURE(bits(in[std::size_t(i)]));
        const std::uint16_t w = want[std::size_t(i)], scalar = bf16::from_float(in[std::size_t(i)]).bits,
                            cast = got(1, i + 1).bits;
        CHECK(got(0, i + 1).bits == 0);  // untouched rows
        CHECK(got(2, i + 1).bits == 0);
        if (bf16{w}.is_nan()) {  // torch's vectorised cast may write another NaN; ours is the quiet 0x7FC0
            ++nans;
            CHECK(scalar == 0x7FC0);
            CHECK(cast == 0x7FC0);
            continue;
        }
        CHECK(scalar == w);
        CHECK(cast == w);
        const std::uint32_t b = bits(in[std::size_t(i)]);
        ties += (b & 0xFFFFu) == 0x8000u;
        subnormal += (w & 0x7F80u) == 0 && (w & 0x7Fu) != 0;
        to_inf += (w & 0x7FFFu) == 0x7F80u && (b & 0x7FFFFFFFu) != 0x7F800000u;
    }
    CHECK(got(1, 0).bits == 0);
    CHECK(got(1, n + 1).bits == 0);
    // the table covers what it claims
    CHECK(nans >= 6);
    CHECK(ties >= 200);
    CHECK(subnormal >= 4);
    CHECK(to_inf >= 4);
}

TEST_CASE_TEMPLATE("bf16: bf16 -> f32 is exact, as torch widens it, scalar and MapOps::cast", B,
                   MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("bf16") + "/conversions.safetensors");
    const std::vector<std::uint16_t> in = u16(ref, "bf16_to_f32.input");
    const std::vector<float> want = f32_raw(ref, "bf16_to_f32.output");
    const index_t n = index_t(in.size());
    std::vector<bf16> v(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) v[i] = bf16{in[i]};
    const auto src = on<B>(host_matrix<bf16>(1, n, v));
    Tensor<float, 2, B> dst({1, n});
    backend::Ops<B>::template cast<float, bf16>(src.view(), dst.view());
    const auto got = host(dst);
    for (index_t i = 0; i < n; ++i) {
        CAPTURE(in[std::size_t(i)]);
        const float w = want[std::size_t(i)];
        if (std::isnan(w)) {
            CHECK(std::isnan(v[std::size_t(i)].to_float()));
            CHECK(std::isnan(got(0, i)));
        } else {
            CHECK(bits(v[std::size_t(i)].to_float()) == bits(w));  // -0 and subnormals included
            CHECK(bits(got(0, i)) == bits(w));
        }
    }
}

TEST_CASE_TEMPLATE(
    "MapOps::cast round trips: bf16 -> f32 -> bf16 is the identity on every bit pattern but NaN's, "
    "f32 -> bf16 -> f32 -> bf16 is stable, f32 -> f64 -> f32 is exact",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    std::vector<bf16> all(0x10000);
    for (std::uint32_t b = 0; b < 0x10000; ++b) all[b] = bf16{std::uint16_t(b)};
    const auto src = on<B>(host_matrix<bf16>(256, 256, all));
    Tensor<float, 2, B> wide({256, 256});
    Tensor<bf16, 2, B> back({256, 256});
    Ops::template cast<float, bf16>(src.view(), wide.view());
    Ops::template cast<bf16, float>(wide.view(), back.view());
    const auto got = host(back);
    int mismatches = 0;
    for (std::uint32_t b = 0; b < 0x10000; ++b) mismatches += got.data()[b].bits != (all[b].is_nan() ? 0x7FC0 : b);
    CHECK(mismatches == 0);

    Tensor<float, 2, cpu> f({64, 96});
    backend::RandomOps<cpu>::fill_normal(f.view(), 0.0f, 100.0f, 7);
    const auto fb = on<B>(f);
    Tensor<bf16, 2, B> once({64, 96}), twice({64, 96});
    Tensor<float, 2, B> mid({64, 96});
    Tensor<double, 2, B> d({64, 96});
    Ops::template cast<bf16, float>(fb.view(), once.view());
    Ops::template cast<float, bf16>(once.view(), mid.view());
    Ops::template cast<bf16, float>(mid.view(), twice.view());
    Ops::template cast<double, float>(fb.view(), d.view());
    Ops::template cast<float, double>(d.view(), mid.view());
    const auto o = host(once), t = host(twice);  // nvcc wants one deduced type per declaration
    const auto m = host(mid);
    int unstable = 0, inexact = 0, off = 0;
    for (index_t i = 0; i < f.numel(); ++i) {
        unstable += o.data()[i].bits != t.data()[i].bits;
        inexact += bits(m.data()[i]) != bits(f.data()[i]);
        // rounding to nearest: within half a bf16 ulp (2^-8 relative)
        off += std::abs(o.data()[i].to_float() - f.data()[i]) > std::ldexp(std::abs(f.data()[i]), -8);
    }
    CHECK(unstable == 0);
    CHECK(inexact == 0);
    CHECK(off == 0);

    Tensor<float, 2, B> wrong({3, 4});
    const auto bad = [&] { Ops::template cast<bf16, float>(wrong.view(), once.view()); };
    CHECK_THROWS_WITH_AS(bad(), doctest::Contains("cast"), shape_error);
}

TEST_CASE_TEMPLATE(
    "BlasOps::gemm_bf16: every transpose, f32 and bf16 C, alpha and beta, pitched slices, against a "
    "double loop over the bf16 operands",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    for (bool ta : {false, true})
        for (bool tb : {false, true})
            for (bool bf16_out : {false, true})
                for (float beta : {0.0f, 1.5f}) {
                    CAPTURE(ta);
                    CAPTURE(tb);
                    CAPTURE(bf16_out);
                    CAPTURE(beta);
                    const index_t m = 37, n = 29, k = 300;
                    const index_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
                    const auto Ah = random_bf16(ra, ca + 3, 1), Bh = random_bf16(rb, cb + 5, 2);
                    const auto A = on<B>(Ah), Bm = on<B>(Bh);
                    View<const bf16, 2, B> a(A.data() + 3, {ra, ca}, {ca + 3, 1}),
                        b(Bm.data() + 5, {rb, cb}, {cb + 5, 1});
                    View<const bf16, 2> ah(Ah.data() + 3, {ra, ca}, {ca + 3, 1}),
                        bh(Bh.data() + 5, {rb, cb}, {cb + 5, 1});
                    const float alpha = 0.75f;
                    const auto expected = [&](index_t i, index_t j, double c0) {
                        double s = 0.0;
                        for (index_t p = 0; p < k; ++p)
                            s += as_double(ta ? ah(p, i) : ah(i, p)) * as_double(tb ? bh(j, p) : bh(p, j));
                        return alpha * s + (beta == 0.0f ? 0.0 : beta * c0);
                    };
                    const double tol = 1e-5 * std::sqrt(double(k));  // f32 accumulation of k products of N(0, 1)
                    const auto check = [&](const auto& out, const auto& c0, auto narrow) {
                        for (index_t i = 0; i < m; ++i) {
                            CHECK(as_double(out(i, 0)) == as_double(c0(i, 0)));  // outside the slice: untouched
                            for (index_t j = 0; j < n; ++j) {
                                const double want = expected(i, j, as_double(c0(i, j + 1)));
                                // a bf16 C is rounded once: within half its ulp (2^-8 relative) of the f32 result
                                const double slack = narrow ? std::ldexp(std::abs(want), -8) * 1.0001 : 0.0;
                                CHECK(std::abs(as_double(out(i, j + 1)) - want) <= tol * (1 + std::abs(want)) + slack);
                            }
                        }
                    };
                    if (bf16_out) {
                        auto Ch = random_bf16(m, n + 2, 3);
                        if (beta == 0.0f) Ch(2, 3) = bf16{0x7FC0};  // C is not read when beta is 0 (BLAS)
                        auto C = on<B>(Ch);
                        Ops::template gemm_bf16<bf16>(Trans(ta), Trans(tb), alpha, a, b, beta,
                                                      View<bf16, 2, B>(C.data() + 1, {m, n}, {n + 2, 1}));
                        check(host(C), Ch, true);
                    } else {
                        Tensor<float, 2, cpu> Ch({m, n + 2});
                        backend::RandomOps<cpu>::fill_normal(Ch.view(), 0.0f, 1.0f, 3);
                        if (beta == 0.0f) Ch(2, 3) = std::numeric_limits<float>::quiet_NaN();
                        auto C = on<B>(Ch);
                        Ops::template gemm_bf16<float>(Trans(ta), Trans(tb), alpha, a, b, beta,
                                                       View<float, 2, B>(C.data() + 1, {m, n}, {n + 2, 1}));
                        check(host(C), Ch, false);
                    }
                }
}

TEST_CASE_TEMPLATE("BlasOps::gemm_bf16: no terms (k = 0) scales C, bad shapes, counts and strides are refused", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    Tensor<bf16, 2, B> A({4, 0}), Bk({0, 3});
    Tensor<bf16, 2, cpu> c0({4, 3});
    for (index_t i = 0; i < c0.numel(); ++i) c0.data()[i] = bf16::from_float(float(i) - 5.0f);
    auto C = on<B>(c0);
    Ops::template gemm_bf16<bf16>(Trans::no, Trans::no, 1.0f, A.view(), Bk.view(), 2.0f, C.view());
    const auto out = host(C);
    for (index_t i = 0; i < c0.numel(); ++i) CHECK(out.data()[i].to_float() == 2.0f * (float(i) - 5.0f));
    Tensor<float, 2, B> F({4, 3});
    Ops::map(fn::SetTo<float>{std::numeric_limits<float>::quiet_NaN()}, F.view());
    Ops::template gemm_bf16<float>(Trans::no, Trans::no, 1.0f, A.view(), Bk.view(), 0.0f, F.view());
    for (float x : to_host(F)) CHECK(x == 0.0f);  // beta 0: C is not read, so a NaN does not survive

    Tensor<bf16, 2, B> X({4, 5}), Y({6, 3});
    Tensor<float, 2, B> Z({4, 3});
    CHECK_THROWS_WITH_AS(Ops::template gemm_bf16<float>(Trans::no, Trans::no, 1.0f, X.view(), Y.view(), 0.0f, Z.view()),
                         doctest::Contains("gemm_bf16: op(A) [4, 5] times op(B) [6, 3]"), shape_error);
    Tensor<bf16, 2, B> Y5({5, 3});
    CHECK_THROWS_WITH_AS(Ops::template gemm_bf16_strided_batched<float>(-1, Trans::no, Trans::no, 1.0f, X.view(), 20,
                                                                        Y5.view(), 15, 0.0f, Z.view(), 12),
                         doctest::Contains("negative count"), shape_error);
    CHECK_THROWS_WITH_AS(Ops::template gemm_bf16_strided_batched<float>(2, Trans::no, Trans::no, 1.0f, X.view(), 0,
                                                                        Y5.view(), 0, 0.0f, Z.view(), 0),
                         doctest::Contains("C's stride is 0"), shape_error);
}

TEST_CASE_TEMPLATE("BlasOps::gemm_bf16_strided_batched: a batch with a shared operand (stride 0), bf16 C", B,
                   MOONMOE_TEST_BACKENDS) {
    const index_t count = 5, m = 12, n = 10, k = 64;
    const auto Ah = random_bf16(count * m, k, 11), Bh = random_bf16(n, k, 12);  // B shared, used transposed
    const auto A = on<B>(Ah), Bm = on<B>(Bh);
    Tensor<bf16, 2, B> C({count * m, n});
    backend::Ops<B>::template gemm_bf16_strided_batched<bf16>(
        count, Trans::no, Trans::yes, 1.0f, View<const bf16, 2, B>(A.data(), {m, k}, {k, 1}), m * k, Bm.view(), 0, 0.0f,
        View<bf16, 2, B>(C.data(), {m, n}, {n, 1}), m * n);
    const auto out = host(C);
    for (index_t b = 0; b < count; ++b)
        for (index_t i = 0; i < m; ++i)
            for (index_t j = 0; j < n; ++j) {
                double s = 0.0;
                for (index_t p = 0; p < k; ++p) s += as_double(Ah(b * m + i, p)) * as_double(Bh(j, p));
                CHECK(std::abs(as_double(out(b * m + i, j)) - s) <=
                      1e-4 * (1 + std::abs(s)) + std::ldexp(std::abs(s), -8));
            }
}

TEST_CASE_TEMPLATE("BlasOps::syrk_bf16: C = alpha X X^T + beta C, exactly symmetric, f32 and bf16 C, pitched X", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::Ops<B>;
    const index_t n = 300, k = 200;  // more than one of the CPU's 256-row SYRK blocks
    const auto Xh = random_bf16(n, k + 4, 21);
    const auto X = on<B>(Xh);
    const View<const bf16, 2, B> x(X.data() + 4, {n, k}, {k + 4, 1});
    const auto s0 = random_bf16(n, n, 22);  // C0 = (S + S^T) / 2 rounded: symmetric, as the contract asks
    Tensor<bf16, 2, cpu> c0({n, n});
    for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < n; ++j) c0(i, j) = bf16::from_float(0.5f * (s0(i, j).to_float() + s0(j, i).to_float()));
    const float alpha = 0.5f, beta = -1.25f;
    const auto expected = [&](index_t i, index_t j) {
        double s = 0.0;
        for (index_t p = 0; p < k; ++p) s += as_double(Xh(i, p + 4)) * as_double(Xh(j, p + 4));
        return alpha * s + beta * as_double(c0(i, j));
    };
    const double tol = 1e-5 * std::sqrt(double(k));
    const auto check = [&](const auto& out, bool narrow) {
        for (index_t i = 0; i < n; ++i)
            for (index_t j = 0; j < n; ++j) {
                CHECK(as_double(out(i, j)) == as_double(out(j, i)));
                if (j % 7 != i % 7) continue;  // a sample of the elements against the double sum, diagonal included
                const double want = expected(i, j), slack = narrow ? std::ldexp(std::abs(want), -8) * 1.0001 : 0.0;
                CHECK(std::abs(as_double(out(i, j)) - want) <= tol * (1 + std::abs(want)) + slack);
            }
    };
    auto C16 = on<B>(c0);
    Ops::template syrk_bf16<bf16>(alpha, x, beta, C16.view());
    check(host(C16), true);
    Tensor<float, 2, cpu> c32({n, n});
    for (index_t i = 0; i < c0.numel(); ++i) c32.data()[i] = c0.data()[i].to_float();
    auto C32 = on<B>(c32);
    Ops::template syrk_bf16<float>(alpha, x, beta, C32.view());
    check(host(C32), false);
    Tensor<float, 2, B> wrong({n, n + 1});
    CHECK_THROWS_WITH_AS(Ops::template syrk_bf16<float>(alpha, x, 0.0f, wrong.view()),
                         doctest::Contains("syrk_bf16: A [300, 200] gives an [300, 300] result, C is [300, 301]"),
                         shape_error);
}

TEST_CASE_TEMPLATE(
    "BlasOps::gemm_grouped with bf16 operands: a bf16 Y is the f32 product rounded once, and the weight gradient is "
    "f32",
    B, MOONMOE_TEST_BACKENDS) {
    // The MoE's experts under Precision<BF16>: one grouped call per projection on a GPU (bf16 C), the per-segment
    // loop elsewhere; an empty expert in the middle, K2's layout of W (used transposed), and an accumulating dW.
    const std::vector<index_t> offsets{0, 7, 7, 20, 21};
    const index_t groups = 4, rows = 21, k = 48, n = 24;
    const auto Xh = random_bf16(rows, k, 31), Wh = random_bf16(groups * n, k, 32), dYh = random_bf16(rows, n, 33);
    const auto X = on<B>(Xh), Wm = on<B>(Wh), dY = on<B>(dYh);
    const View<const bf16, 3, B> W(Wm.data(), {groups, n, k});
    Tensor<bf16, 2, B> Y16({rows, n});
    Tensor<float, 2, B> Y32({rows, n});
    backend::Ops<B>::template gemm_grouped<bf16, bf16>(Trans::yes, 1.0f, X.view(), W, 0.0f, Y16.view(), offsets);
    backend::Ops<B>::template gemm_grouped<bf16>(Trans::yes, 1.0f, X.view(), W, 0.0f, Y32.view(), offsets);
    const auto y16 = host(Y16);
    const auto y32 = host(Y32);
    for (index_t g = 0; g < groups; ++g)
        for (index_t i = offsets[g]; i < offsets[g + 1]; ++i)
            for (index_t j = 0; j < n; ++j) {
                double s = 0.0;
                for (index_t p = 0; p < k; ++p) s += as_double(Xh(i, p)) * as_double(Wh(g * n + j, p));
                CAPTURE(i);
                CAPTURE(j);
                CHECK(std::abs(double(y32(i, j)) - s) <= 1e-5 * (1 + std::abs(s)));
                // rounded once: within half a bf16 ulp (at most 2^-8 of the value) of the f32 product
                CHECK(std::abs(as_double(y16(i, j)) - s) <= 1e-5 * (1 + std::abs(s)) + std::ldexp(std::abs(s), -8));
            }
    Tensor<float, 2, B> dWm({groups * n, k});
    backend::Ops<B>::template fill<float>(dWm.view(), 0.25f);
    const View<float, 3, B> dW(dWm.data(), {groups, n, k});
    backend::Ops<B>::template gemm_grouped_weight_grad<bf16>(1.0f, dY.view(), X.view(), 1.0f, dW, offsets);
    const auto dw = host(dWm);
    for (index_t g = 0; g < groups; ++g)
        for (index_t a = 0; a < n; ++a)
            for (index_t b = 0; b < k; ++b) {
                double s = 0.25;  // beta 1 keeps what was there; the empty group keeps only that
                for (index_t r = offsets[g]; r < offsets[g + 1]; ++r) s += as_double(dYh(r, a)) * as_double(Xh(r, b));
                CHECK(std::abs(double(dw(g * n + a, b)) - s) <= 1e-5 * (1 + std::abs(s)));
            }
}

namespace {

/// Our Newton-Schulz (f32 or bf16) of a reference input on backend B, as f32 on the host.
template <class B>
std::vector<float> ns_on(const std::vector<float>& g, index_t rows, index_t cols, bool bf16_policy) {
    const auto G = on<B>(host_matrix<float>(rows, cols, g));
    Tensor<float, 2, B> out({rows, cols});
    if (bf16_policy) {
        optim::NSWorkspaceBF16<B> ws;
        optim::newton_schulz_bf16<KellerQuintic, B>(G.view(), out.view(), 5, ws);
    } else {
        optim::NSWorkspace<float, B> ws;
        optim::newton_schulz<KellerQuintic, float, B>(G.view(), out.view(), 5, ws);
    }
    return to_host(out);
}

}  // namespace

TEST_CASE_TEMPLATE("Newton-Schulz in bf16 follows torch.optim.Muon's bf16 iteration", B, MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("bf16") + "/newton_schulz_bf16.safetensors");
    struct Case {
        const char* name;
        index_t rows, cols;
    };
    for (const Case c :
         {Case{"wide", 32, 64}, Case{"tall", 64, 32}, Case{"square", 48, 48}, Case{"wide_large", 96, 160}}) {
        CAPTURE(std::string(c.name));
        const std::vector<float> g = ref.f32(std::string(c.name) + ".g"), exact = ref.f32(std::string(c.name) + ".f64");
        const std::vector<float> torch = ref.f32(std::string(c.name) + ".torch");  // bf16, widened exactly
        const std::vector<float> ours = ns_on<B>(g, c.rows, c.cols, true), ours32 = ns_on<B>(g, c.rows, c.cols, false);
        double d_torch = 0, ss_torch = 0, ss32_torch = 0, e_ours = 0, e_torch = 0;
        std::size_t same = 0, not_bf16 = 0;
        for (std::size_t i = 0; i < g.size(); ++i) {
            const double d = double(ours[i]) - torch[i], d32 = double(ours32[i]) - torch[i];
            d_torch = std::max(d_torch, std::abs(d));
            ss_torch += d * d, ss32_torch += d32 * d32;
            e_ours = std::max(e_ours, double(std::abs(ours[i] - exact[i])));
            e_torch = std::max(e_torch, double(std::abs(torch[i] - exact[i])));
            same += ours[i] == torch[i];
            not_bf16 += bf16::from_float(ours[i]).to_float() != ours[i];
        }
        const double n = double(g.size()), rms = std::sqrt(ss_torch / n), rms32 = std::sqrt(ss32_torch / n);
        MESSAGE(std::string(c.name) << ": bf16 NS against torch: " << same / n * 100 << "% bitwise equal, max |diff| "
                                    << d_torch << ", RMS " << rms << " (the f32 iteration's RMS " << rms32
                                    << "); max |error| against f64: ours " << e_ours << ", torch " << e_torch);
        CHECK(not_bf16 == 0);  // the result is bf16, widened
        // The same roundings in the same places: where no f32 accumulation order decides a rounding, the result is
        // torch's bit for bit (all of it on the smaller inputs here, with the CPU's and the emulated cuBLAS's sums).
        // An order that does decide one (1 ulp in one element) grows by the iteration's slope into a few ulps
        // (96 x 160 here; any input on a GPU's order), so the bounds below are in bf16 ulps, not bitwise.
#if !defined(__CUDACC__)
        if (c.rows * c.cols <= 48 * 48) CHECK(same / n >= 0.99);
#endif
        CHECK(rms <= 0.5 * rms32);                    // much closer to torch than the f32 iteration
        CHECK(d_torch <= 6.0 * std::ldexp(1.0, -9));  // a few ulps of the largest entries (below 0.5)
        // as far from f64 as torch's bf16 is (8 bits), which f32 is not
        CHECK(e_ours <= 1.5 * e_torch);
        CHECK(e_ours >= 0.25 * e_torch);
    }
}

TEST_CASE_TEMPLATE("Newton-Schulz in bf16: the symmetric products (syrk_bf16) agree with the full ones", B,
                   MOONMOE_TEST_BACKENDS) {
    // 600 x 700 (wide) and 700 x 600 (tall): X X^T and A A of 600 x 600, rounded once per element either way; the
    // f32 sums may run in another order (the CPU's f32 SYRK in blocks of 256 rows), so a few bf16 ulps apart.
    for (const auto& [rows, cols] : {std::pair<index_t, index_t>{600, 700}, std::pair<index_t, index_t>{700, 600}}) {
        CAPTURE(rows);
        std::vector<float> g(std::size_t(rows * cols));
        std::mt19937 gen(11);
        std::normal_distribution<float> d;
        for (float& x : g) x = d(gen);
        const auto G = on<B>(host_matrix<float>(rows, cols, g));
        Tensor<float, 2, B> sym({rows, cols}), full({rows, cols});
        optim::NSWorkspaceBF16<B> ws;
        optim::newton_schulz_bf16<KellerQuintic, B>(G.view(), sym.view(), 5, ws, 1e-7, optim::Products::symmetric);
        optim::newton_schulz_bf16<KellerQuintic, B>(G.view(), full.view(), 5, ws, 1e-7, optim::Products::general);
        const std::vector<float> a = to_host(sym), b = to_host(full);
        std::size_t same = 0;
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
            same += a[i] == b[i], worst = std::max(worst, double(std::abs(a[i] - b[i])));
        MESSAGE("bf16 NS " << rows << " x " << cols << ": symmetric vs full products "
                           << 100.0 * double(same) / double(a.size()) << "% bitwise equal, max |diff| " << worst);
        CHECK(worst <= 4.0 * std::ldexp(1.0, -9));  // a few bf16 ulps of the entries (below 0.5) at most
    }
}

TEST_CASE_TEMPLATE("Muon<NSPrecision<BF16>> steps as torch.optim.Muon (bf16 Newton-Schulz) does", B,
                   MOONMOE_TEST_BACKENDS) {
    const Reference ref(data_dir("optim") + "/muon_torch.safetensors");
    MuonConfig cfg = Muon<NSPrecision<BF16>>::value;
    REQUIRE(cfg.ns_precision == NumberFormat::bf16);
    cfg.momentum = 0.95, cfg.weight_decay = 0.1, cfg.ns_steps = 5, cfg.nesterov = true;
    const std::pair<const char*, Shape<2>> params[] = {{"wide", {48, 96}}, {"tall", {96, 40}}, {"square", {64, 64}}};
    // Per-step NS results are bitwise torch's on small matrices (the test above) but drift by a few bf16 ulps where
    // accumulation orders differ, so the measure is the RMS of the difference of the weight updates, relative to
    // the RMS of torch's update (the max is reported).
    double worst16 = 0, worst32 = 0, max16 = 0, sum16 = 0, sum32 = 0;
    for (const auto& [param, shape] : params) {
        CAPTURE(std::string(param));
        const auto init = host_matrix<float>(shape[0], shape[1], ref.f32(std::string(param) + ".init"));
        auto w16 = on<B>(init), w32 = on<B>(init);
        Tensor<float, 2, B> m16(shape), m32(shape), u, o;
        optim::NSWorkspaceBF16<B> ws16;
        optim::NSWorkspace<float, B> ws32;
        std::vector<float> torch_before = to_host(w16);
        for (int t = 1; t <= 3; ++t) {
            CAPTURE(t);
            const std::string s = std::to_string(t);
            const auto before16 = to_host(w16), before32 = to_host(w32);
            const auto grad = on<B>(host_matrix<float>(shape[0], shape[1], ref.f32(std::string(param) + ".grad." + s)));
            MuonConfig cfg32 = cfg;  // the f32 Newton-Schulz beside it with its own default, the symmetric products
            cfg32.products = Products::symmetric;
            optim::muon_step<KellerQuintic, B>(cfg, 0.02, w16.view(), grad.view(), m16.view(), ws16, u, o);
            optim::muon_step<KellerQuintic, B>(cfg32, 0.02, w32.view(), grad.view(), m32.view(), ws32, u, o);
            const std::vector<float> want = ref.f32(std::string("match_nesterov.") + param + ".after." + s);
            const auto got16 = to_host(w16), got32 = to_host(w32);
            double ss = 0, ss16 = 0, ss32 = 0, mx = 0, mx16 = 0;
            for (std::size_t i = 0; i < want.size(); ++i) {
                const double upd = double(want[i]) - torch_before[i];
                const double d16 = (double(got16[i]) - before16[i]) - upd, d32 = (double(got32[i]) - before32[i]) - upd;
                ss += upd * upd, ss16 += d16 * d16, ss32 += d32 * d32;
                mx = std::max(mx, std::abs(upd)), mx16 = std::max(mx16, std::abs(d16));
            }
            const double r16 = std::sqrt(ss16 / ss), r32 = std::sqrt(ss32 / ss);
            worst16 = std::max(worst16, r16), worst32 = std::max(worst32, r32), max16 = std::max(max16, mx16 / mx);
            sum16 += r16, sum32 += r32;
            CHECK(r16 < r32);  // never further from torch than the f32 iteration is
            CHECK(r16 < 0.015);
            torch_before = want;
        }
    }
    MESSAGE("Muon step against torch.optim.Muon, worst RMS of the update difference / RMS of torch's update: bf16 NS "
            << worst16 << " (max entry " << max16 << " of the largest update), f32 NS " << worst32
            << "; mean over steps: bf16 " << sum16 / 9 << ", f32 " << sum32 / 9);
    CHECK(sum16 < 0.6 * sum32);  // on average much closer: most steps are bitwise or one ulp apart
}

// ---- the policy types ----
using TinyBF16 = Model<Precision<BF16>, Optimizer<Muon<NSPrecision<BF16>>>>;
static_assert(std::is_same_v<TinyBF16::precision::compute, BF16>);
static_assert(TinyBF16::config.precision.compute == NumberFormat::bf16);
static_assert(TinyBF16::config.optimizer.muon.ns_precision == NumberFormat::bf16);
static_assert(Model<>::config.precision.compute == NumberFormat::f32);
static_assert(Muon<>::value.ns_precision == NumberFormat::f32 && NoMuon::value.ns_precision == NumberFormat::f32);
static_assert(KimiK2::with<Precision<BF16>>::config.precision == PrecisionConfig{NumberFormat::bf16});
static_assert(std::is_same_v<Muon<NSPrecision<BF16>, NSSteps<4>>::ns_precision, BF16>);

}  // namespace unit_backend_precision
