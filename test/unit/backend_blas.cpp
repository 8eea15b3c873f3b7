// BlasOps<B> on every backend of the build (MOONMOE_TEST_BACKENDS) against double-precision loops, and the
// row-major to column-major translation that hands products to cuBLAS (backend/cuda/layout.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include <moonmoe/backend/cuda/layout.hpp>

#include "support/backends.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_blas {

using namespace moonmoe;
using namespace moonmoe::testing;
using backend::Trans;

namespace {

template <class T = float>
Tensor<T, 2, cpu> random_host(index_t rows, index_t cols, std::uint64_t seed) {
    Tensor<float, 2, cpu> f({rows, cols});
    backend::RandomOps<cpu>::fill_normal(f.view(), 0.0f, 1.0f, seed);
    Tensor<T, 2, cpu> m({rows, cols});
    for (index_t i = 0; i < f.numel(); ++i) m.data()[i] = T(f.data()[i]);
    return m;
}

/// (op(A) op(B))(i, j) in double, on host views of any pitch.
template <class T>
double product(View<const T, 2> A, bool ta, View<const T, 2> B, bool tb, index_t i, index_t j) {
    const index_t k = ta ? A.shape[0] : A.shape[1];
    double s = 0.0;
    for (index_t p = 0; p < k; ++p) s += double(ta ? A(p, i) : A(i, p)) * double(tb ? B(j, p) : B(p, j));
    return s;
}

/// A tolerance for a sum of k products of N(0, 1) values.
double tolerance(index_t k) { return 1e-5 * std::sqrt(double(k) + 1.0); }

}  // namespace

TEST_CASE_TEMPLATE("BlasOps::gemm<float>: every transpose combination, alpha and beta, on pitched column slices", B,
                   MOONMOE_TEST_BACKENDS) {
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            CAPTURE(ta);
            CAPTURE(tb);
            const index_t m = 37, n = 29, k = 53;
            // Each operand is a column slice of a wider matrix: row pitch larger than the row, offset start.
            const index_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
            auto Ah = random_host(ra, ca + 3, 1), Bh = random_host(rb, cb + 5, 2), Ch = random_host(m, n + 2, 3);
            auto A = on<B>(Ah), Bm = on<B>(Bh), C = on<B>(Ch);
            View<const float, 2, B> a(A.data() + 3, {ra, ca}, {ca + 3, 1}), b(Bm.data() + 5, {rb, cb}, {cb + 5, 1});
            View<float, 2, B> c(C.data() + 1, {m, n}, {n + 2, 1});
            backend::BlasOps<B>::template gemm<float>(Trans(ta), Trans(tb), 0.5f, a, b, 2.0f, c);
            const auto out = host(C);
            View<const float, 2> ah(Ah.data() + 3, {ra, ca}, {ca + 3, 1}), bh(Bh.data() + 5, {rb, cb}, {cb + 5, 1});
            for (index_t i = 0; i < m; ++i) {
                CHECK(out(i, 0) == Ch(i, 0));  // outside the slice: untouched
                CHECK(out(i, n + 1) == Ch(i, n + 1));
                for (index_t j = 0; j < n; ++j)
                    CHECK(out(i, 1 + j) == doctest::Approx(0.5 * product(ah, ta, bh, tb, i, j) + 2.0 * Ch(i, 1 + j))
                                               .epsilon(tolerance(k)));
            }
        }
}

TEST_CASE_TEMPLATE("BlasOps::gemm<double>: every transpose combination", B, MOONMOE_TEST_BACKENDS) {
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            CAPTURE(ta);
            CAPTURE(tb);
            const index_t m = 19, n = 23, k = 31;
            auto Ah = ta ? random_host<double>(k, m, 4) : random_host<double>(m, k, 4);
            auto Bh = tb ? random_host<double>(n, k, 5) : random_host<double>(k, n, 5);
            auto Ch = random_host<double>(m, n, 6);
            auto A = on<B>(Ah), Bm = on<B>(Bh), C = on<B>(Ch);
            backend::BlasOps<B>::template gemm<double>(Trans(ta), Trans(tb), -1.5, A.view(), Bm.view(), 0.25, C.view());
            const auto out = host(C);
            for (index_t i = 0; i < m; ++i)
                for (index_t j = 0; j < n; ++j)
                    CHECK(out(i, j) ==
                          doctest::Approx(-1.5 * product<double>(Ah.view(), ta, Bh.view(), tb, i, j) + 0.25 * Ch(i, j))
                              .epsilon(1e-12));
        }
}

TEST_CASE_TEMPLATE("BlasOps::gemm: no inner dimension scales C, beta 0 ignores C, shape errors name both shapes", B,
                   MOONMOE_TEST_BACKENDS) {
    auto Ch = random_host(4, 3, 7);
    auto A = on<B>(Tensor<float, 2, cpu>({4, 0})), Bm = on<B>(Tensor<float, 2, cpu>({0, 3}));
    auto C = on<B>(Ch);
    backend::BlasOps<B>::template gemm<float>(Trans::no, Trans::no, 1.0f, A.view(), Bm.view(), 3.0f, C.view());
    auto out = host(C);
    for (index_t i = 0; i < 4; ++i)
        for (index_t j = 0; j < 3; ++j) CHECK(out(i, j) == 3.0f * Ch(i, j));
    backend::BlasOps<B>::template gemm<float>(Trans::no, Trans::no, 1.0f, A.view(), Bm.view(), 0.0f, C.view());
    out = host(C);
    for (index_t i = 0; i < 4; ++i)
        for (index_t j = 0; j < 3; ++j) CHECK(out(i, j) == 0.0f);

    // beta = 0: C's old values (NaN here) are not read.
    Tensor<float, 2, cpu> nan_h({2, 2});
    for (index_t i = 0; i < 4; ++i) nan_h.data()[i] = std::nanf("");
    auto X = on<B>(random_host(2, 5, 8)), Y = on<B>(random_host(2, 5, 9)), Z = on<B>(nan_h);
    backend::BlasOps<B>::template gemm<float>(Trans::no, Trans::yes, 1.0f, X.view(), Y.view(), 0.0f, Z.view());
    for (float z : to_host(Z)) CHECK(std::isfinite(z));

    auto wrong = on<B>(Tensor<float, 2, cpu>({2, 3}));
    CHECK_THROWS_WITH_AS(
        backend::BlasOps<B>::template gemm<float>(Trans::no, Trans::yes, 1.0f, X.view(), Y.view(), 0.0f, wrong.view()),
        "gemm: op(A) [2, 5] times op(B) [5, 2] into C [2, 3]", shape_error);
}

TEST_CASE_TEMPLATE("BlasOps::linear: y = x W^T, and accumulated", B, MOONMOE_TEST_BACKENDS) {
    auto xh = random_host(6, 17, 10), Wh = random_host(9, 17, 11), yh = random_host(6, 9, 12);
    auto x = on<B>(xh), W = on<B>(Wh), y = on<B>(yh), y2 = on<B>(yh);
    backend::BlasOps<B>::linear(x.view(), W.view(), y.view());
    backend::BlasOps<B>::linear(x.view(), W.view(), y2.view(), true);
    const auto out = host(y), acc = host(y2);
    for (index_t i = 0; i < 6; ++i)
        for (index_t j = 0; j < 9; ++j) {
            const double s = product<float>(xh.view(), false, Wh.view(), true, i, j);
            CHECK(out(i, j) == doctest::Approx(s).epsilon(tolerance(17)));
            CHECK(acc(i, j) == doctest::Approx(s + yh(i, j)).epsilon(tolerance(17)));
        }
}

TEST_CASE_TEMPLATE("BlasOps::syrk: C = alpha A A^T + beta C, both triangles, float and double, pitched A", B,
                   MOONMOE_TEST_BACKENDS) {
    for (index_t n : {1, 37, 300}) {
        CAPTURE(n);
        const index_t k = 20;
        auto Ah = random_host(n, k + 4, 13);
        auto Sh = random_host(n, n, 14);
        Tensor<float, 2, cpu> Ch({n, n});  // a symmetric starting C
        for (index_t i = 0; i < n; ++i)
            for (index_t j = 0; j < n; ++j) Ch(i, j) = Sh(i, j) + Sh(j, i);
        auto A = on<B>(Ah), C = on<B>(Ch);
        View<const float, 2, B> a(A.data() + 2, {n, k}, {k + 4, 1});
        backend::BlasOps<B>::template syrk<float>(0.5f, a, 2.0f, C.view());
        const auto out = host(C);
        View<const float, 2> ah(Ah.data() + 2, {n, k}, {k + 4, 1});
        for (index_t i = 0; i < n; ++i)
            for (index_t j = 0; j < n; ++j)
                CHECK(out(i, j) == doctest::Approx(0.5 * product<float>(ah, false, ah, true, i, j) + 2.0 * Ch(i, j))
                                       .epsilon(tolerance(k)));
    }
    auto Ah = random_host<double>(11, 7, 15);
    auto A = on<B>(Ah), C = on<B>(Tensor<double, 2, cpu>({11, 11}));
    backend::BlasOps<B>::template syrk<double>(1.0, A.view(), 0.0, C.view());
    const auto out = host(C);
    for (index_t i = 0; i < 11; ++i)
        for (index_t j = 0; j < 11; ++j)
            CHECK(out(i, j) ==
                  doctest::Approx(product<double>(Ah.view(), false, Ah.view(), true, i, j)).epsilon(1e-12));
    auto wrong = on<B>(Tensor<double, 2, cpu>({11, 10}));
    CHECK_THROWS_WITH_AS(backend::BlasOps<B>::template syrk<double>(1.0, A.view(), 0.0, wrong.view()),
                         "syrk: A [11, 7] gives an [11, 11] result, C is [11, 10]", shape_error);
}

TEST_CASE_TEMPLATE("BlasOps::gemm_strided_batched: one product per matrix, a zero stride shares an operand", B,
                   MOONMOE_TEST_BACKENDS) {
    const index_t count = 5, m = 7, n = 4, k = 9;
    for (bool tb : {false, true}) {
        CAPTURE(tb);
        // A: `count` matrices [m, k] one after the other; B: one [k, n] (or [n, k]) shared by all (stride 0).
        auto Ah = random_host(count * m, k, 16), Bh = tb ? random_host(n, k, 17) : random_host(k, n, 17);
        auto Ch = random_host(count * m, n, 18);
        auto A = on<B>(Ah), Bm = on<B>(Bh), C = on<B>(Ch);
        View<const float, 2, B> a(A.data(), {m, k}), b = Bm.view();
        View<float, 2, B> c(C.data(), {m, n});
        backend::BlasOps<B>::gemm_strided_batched(count, Trans::no, Trans(tb), 2.0f, a, m * k, b, 0, -1.0f, c, m * n);
        const auto out = host(C);
        for (index_t p = 0; p < count; ++p) {
            View<const float, 2> ah(Ah.data() + p * m * k, {m, k});
            for (index_t i = 0; i < m; ++i)
                for (index_t j = 0; j < n; ++j)
                    CHECK(out(p * m + i, j) ==
                          doctest::Approx(2.0 * product<float>(ah, false, Bh.view(), tb, i, j) - Ch(p * m + i, j))
                              .epsilon(tolerance(k)));
        }
    }
}

TEST_CASE_TEMPLATE(
    "BlasOps::gemm_strided_batched: refuses a zero C stride for more than one product, and negative "
    "counts or strides",
    B, MOONMOE_TEST_BACKENDS) {
    // Every product would write the same C: a race on a GPU, the last product's result on the CPU.
    auto A = on<B>(random_host(3, 4, 28)), Bm = on<B>(random_host(4, 2, 29)), C = on<B>(random_host(3, 2, 30));
    const auto before = host(C);
    CHECK_THROWS_WITH_AS(backend::BlasOps<B>::gemm_strided_batched(2, Trans::no, Trans::no, 1.0f, A.view(), 0,
                                                                   Bm.view(), 0, 1.0f, C.view(), 0),
                         "gemm_strided_batched: C's stride is 0 for 2 products (each would overwrite the others)",
                         shape_error);
    CHECK(to_host(C) == std::vector<float>(before.data(), before.data() + before.numel()));  // refused before any work
    CHECK_THROWS_WITH_AS(backend::BlasOps<B>::gemm_strided_batched(-1, Trans::no, Trans::no, 1.0f, A.view(), 0,
                                                                   Bm.view(), 0, 1.0f, C.view(), 6),
                         doctest::Contains("gemm_strided_batched: negative count or stride"), shape_error);
    // One product may keep C where it is (stride 0), as may a batch of none.
    backend::BlasOps<B>::gemm_strided_batched(1, Trans::no, Trans::no, 1.0f, A.view(), 0, Bm.view(), 0, 0.0f, C.view(),
                                              0);
    backend::BlasOps<B>::gemm_strided_batched(0, Trans::no, Trans::no, 1.0f, A.view(), 0, Bm.view(), 0, 0.0f, C.view(),
                                              0);
}

TEST_CASE_TEMPLATE(
    "BlasOps::gemm_grouped: one product per segment of rows, empty groups skipped, W used as stored "
    "or transposed",
    B, MOONMOE_TEST_BACKENDS) {
    const std::vector<index_t> offsets{0, 3, 3, 10};  // group 1 has no rows
    const index_t groups = 3, rows = 10, k = 6, n = 5;
    for (bool tw : {false, true}) {
        CAPTURE(tw);
        auto Xh = random_host(rows, k, 19), Yh = random_host(rows, n, 20);
        auto Wh = tw ? random_host(groups * n, k, 21) : random_host(groups * k, n, 21);
        auto X = on<B>(Xh), Y = on<B>(Yh), Wm = on<B>(Wh);
        const index_t wr = tw ? n : k, wc = tw ? k : n;
        View<const float, 3, B> W(Wm.data(), {groups, wr, wc});
        backend::BlasOps<B>::gemm_grouped(Trans(tw), 1.0f, X.view(), W, 1.0f, Y.view(), offsets);
        const auto out = host(Y);
        for (index_t g = 0; g < groups; ++g) {
            View<const float, 2> wg(Wh.data() + g * wr * wc, {wr, wc});
            for (index_t i = offsets[g]; i < offsets[g + 1]; ++i)
                for (index_t j = 0; j < n; ++j)
                    CHECK(out(i, j) == doctest::Approx(product<float>(Xh.view(), false, wg, tw, i, j) + Yh(i, j))
                                           .epsilon(tolerance(k)));
        }
    }
    auto X = on<B>(random_host(rows, k, 22)), Y = on<B>(random_host(rows, n, 23)),
         Wm = on<B>(random_host(groups * k, n, 24));
    View<const float, 3, B> W(Wm.data(), {groups, k, n});
    const std::vector<index_t> short_offsets{0, 3, 9};
    CHECK_THROWS_WITH_AS(backend::BlasOps<B>::gemm_grouped(Trans::no, 1.0f, X.view(), W, 0.0f, Y.view(), short_offsets),
                         "gemm_grouped: 3 offsets for 3 groups (expected groups + 1)", shape_error);
    const std::vector<index_t> decreasing{0, 5, 4, 10};
    CHECK_THROWS_WITH_AS(backend::BlasOps<B>::gemm_grouped(Trans::no, 1.0f, X.view(), W, 0.0f, Y.view(), decreasing),
                         "gemm_grouped: offsets decrease at group 1", shape_error);
}

TEST_CASE_TEMPLATE(
    "BlasOps::gemm_grouped_weight_grad: dW_g = alpha dY_g^T X_g + beta dW_g, an empty group only "
    "scaled",
    B, MOONMOE_TEST_BACKENDS) {
    const std::vector<index_t> offsets{0, 4, 4, 9};
    const index_t groups = 3, rows = 9, k = 6, n = 5;
    auto dYh = random_host(rows, n, 25), Xh = random_host(rows, k, 26), dWh = random_host(groups * n, k, 27);
    auto dY = on<B>(dYh), X = on<B>(Xh), dWm = on<B>(dWh);
    View<float, 3, B> dW(dWm.data(), {groups, n, k});
    backend::BlasOps<B>::gemm_grouped_weight_grad(0.5f, dY.view(), X.view(), 0.5f, dW, offsets);
    const auto out = host(dWm);
    for (index_t g = 0; g < groups; ++g)
        for (index_t a = 0; a < n; ++a)
            for (index_t b = 0; b < k; ++b) {
                double s = 0.0;
                for (index_t r = offsets[g]; r < offsets[g + 1]; ++r) s += double(dYh(r, a)) * Xh(r, b);
                CHECK(out(g * n + a, b) == doctest::Approx(0.5 * s + 0.5 * dWh(g * n + a, b)).epsilon(tolerance(5)));
            }
    const std::vector<index_t> wrong_end{0, 4, 4, 8};
    CHECK_THROWS_WITH_AS(backend::BlasOps<B>::gemm_grouped_weight_grad(1.0f, dY.view(), X.view(), 0.0f, dW, wrong_end),
                         "gemm_grouped_weight_grad: offsets run from 0 to 8, the rows from 0 to 9", shape_error);
}

// ---- the translation to cuBLAS's column-major calls (pure functions: checked in every build) ----

namespace {
using backend::cuda_detail::CublasGemm;
using backend::cuda_detail::CublasOp;
using backend::cuda_detail::RowMajorGemm;
using backend::cuda_detail::to_cublas;

// C [4, 5] = A [4, 3] B [3, 5], dense: cuBLAS computes C^T [5, 4] = B^T A^T, B first, leading dimensions the rows.
static_assert(to_cublas(RowMajorGemm{Trans::no, Trans::no, 4, 5, 3, 3, 5, 5}) ==
              CublasGemm{CublasOp::n, CublasOp::n, 5, 4, 3, 5, 3, 5, false});
}  // namespace

TEST_CASE("to_cublas: the four transpose combinations swap the operands, keep their flags, pass row pitches") {
    const index_t m = 4, n = 5, k = 3;
    // Row pitches larger than the rows (column slices of wider matrices): 10, 20, 30.
    struct Case {
        Trans ta, tb;
        CublasGemm expect;
    };
    const Case cases[] = {
        {Trans::no, Trans::no, {CublasOp::n, CublasOp::n, n, m, k, 20, 10, 30, false}},
        {Trans::no, Trans::yes, {CublasOp::t, CublasOp::n, n, m, k, 20, 10, 30, false}},
        {Trans::yes, Trans::no, {CublasOp::n, CublasOp::t, n, m, k, 20, 10, 30, false}},
        {Trans::yes, Trans::yes, {CublasOp::t, CublasOp::t, n, m, k, 20, 10, 30, false}},
    };
    for (const Case& c : cases) {
        CAPTURE(int(c.ta));
        CAPTURE(int(c.tb));
        CHECK(to_cublas(RowMajorGemm{c.ta, c.tb, m, n, k, 10, 20, 30}) == c.expect);
    }
    // A single stored row: its pitch (0 here, as a broadcast view would have) is never followed and becomes the
    // row length, which cuBLAS accepts as a leading dimension.
    const CublasGemm one = to_cublas(RowMajorGemm{Trans::no, Trans::yes, 1, 7, 3, 0, 3, 0});
    CHECK(one.ld_second == 3);
    CHECK(one.ld_first == 3);
    CHECK(one.ldc == 7);
    CHECK_THROWS_WITH_AS(backend::cuda_detail::require_pitch("gemm", "A", 4, 8, 6),
                         "gemm: A's row pitch 6 is smaller than its 8 columns (cuBLAS needs whole, non-overlapping "
                         "rows)",
                         shape_error);
}

TEST_CASE(
    "to_cublas then the column-major host call reproduces the row-major product (pitched rows, every "
    "transpose)") {
    const index_t m = 6, n = 7, k = 5;
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            CAPTURE(ta);
            CAPTURE(tb);
            const index_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
            auto Ah = random_host(ra, ca + 2, 28), Bh = random_host(rb, cb + 1, 29), Ch = random_host(m, n + 3, 30);
            const auto c0 = Ch.clone();
            const CublasGemm g = to_cublas(RowMajorGemm{Trans(ta), Trans(tb), m, n, k, ca + 2, cb + 1, n + 3});
            backend::cuda_detail::host_gemm<float>(g.op_first, g.op_second, g.m, g.n, g.k, 1.0f, Bh.data(), g.ld_first,
                                                   Ah.data(), g.ld_second, -1.0f, Ch.data(), g.ldc);
            View<const float, 2> ah(Ah.data(), {ra, ca}, {ca + 2, 1}), bh(Bh.data(), {rb, cb}, {cb + 1, 1});
            for (index_t i = 0; i < m; ++i) {
                for (index_t j = 0; j < n; ++j)
                    CHECK(Ch(i, j) == doctest::Approx(product<float>(ah, ta, bh, tb, i, j) - c0(i, j)).epsilon(1e-6));
                for (index_t j = n; j < n + 3; ++j) CHECK(Ch(i, j) == c0(i, j));  // the pitch's tail: untouched
            }
        }
}

}  // namespace unit_backend_blas
