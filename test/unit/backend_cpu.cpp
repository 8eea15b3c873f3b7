// The CPU backend's primitives and the tensor views against plain loops in double precision.
#include "support/nn_testing.hpp"

#include <cmath>
#include <cstring>
#include <string>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_cpu {

using namespace moonmoe;
using namespace moonmoe::testing;
using Ops = backend::Ops<cpu>;
using backend::Trans;

namespace {
double reference(const Mat& A, bool ta, const Mat& B, bool tb, index_t i, index_t j) {
    const index_t k = ta ? A.size(0) : A.size(1);
    double s = 0.0;
    for (index_t p = 0; p < k; ++p) s += double(ta ? A(p, i) : A(i, p)) * double(tb ? B(j, p) : B(p, j));
    return s;
}
}  // namespace

TEST_CASE("gemm: every transpose combination, alpha and beta, against double loops") {
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            CAPTURE(ta);
            CAPTURE(tb);
            const index_t m = 37, n = 29, k = 53;
            Mat A = ta ? random_matrix(k, m, 1) : random_matrix(m, k, 1);
            Mat B = tb ? random_matrix(n, k, 2) : random_matrix(k, n, 2);
            Mat C = random_matrix(m, n, 3), C0 = C.clone();
            Ops::gemm(Trans(ta), Trans(tb), 0.5f, A.view(), B.view(), 2.0f, C.view());
            for (index_t i = 0; i < m; ++i)
                for (index_t j = 0; j < n; ++j)
                    CHECK(C(i, j) ==
                          doctest::Approx(0.5 * reference(A, ta, B, tb, i, j) + 2.0 * C0(i, j)).epsilon(1e-5));
        }
}

TEST_CASE("gemm on strided column slices, and shape errors that name both shapes") {
    Mat A = random_matrix(8, 20, 4), B = random_matrix(6, 20, 5), C({8, 12});
    // columns 5..14 of A and B: row pitch 20
    View<const float, 2> a(A.data() + 5, {8, 10}, {20, 1}), b(B.data() + 5, {6, 10}, {20, 1});
    View<float, 2> c(C.data() + 3, {8, 6}, {12, 1});
    Ops::gemm(Trans::no, Trans::yes, 1.0f, a, b, 0.0f, c);
    for (index_t i = 0; i < 8; ++i)
        for (index_t j = 0; j < 6; ++j) {
            double s = 0.0;
            for (index_t p = 5; p < 15; ++p) s += double(A(i, p)) * B(j, p);
            CHECK(C(i, 3 + j) == doctest::Approx(s).epsilon(1e-5));
        }
    CHECK(C(0, 0) == 0.0f);  // outside the slice: untouched
    Mat wrong({8, 5});
    CHECK_THROWS_WITH_AS(Ops::gemm(Trans::no, Trans::yes, 1.0f, a, b, 0.0f, wrong.view()),
                         "gemm: op(A) [8, 10] times op(B) [10, 6] into C [8, 5]", shape_error);
}

TEST_CASE("gemm, few rows times a big weight (the unpacked path): every row / column / k remainder, k-chunks, slices") {
    // m <= 64, k >= 256 and n >= 64 take gemm_small.hpp's path on AVX-512 machines; k = 4100 crosses its 2048-wide
    // k-chunks and leaves a remainder of 4 lanes, n = 67 and m = 1..7 leave partial 4 x 4 tiles.
    for (index_t m : {1, 2, 3, 5, 7, 33, 64})
        for (index_t k : {256, 300, 4100}) {
            CAPTURE(m);
            CAPTURE(k);
            const index_t n = 67;
            Mat A = random_matrix(m, k + 3, 1), B = random_matrix(n, k, 2), C = random_matrix(m, n + 5, 3),
                C0 = C.clone();
            View<const float, 2> a(A.data() + 3, {m, k}, {k + 3, 1});  // a column slice: row pitch k + 3
            View<float, 2> c(C.data() + 2, {m, n}, {n + 5, 1});
            Ops::gemm(Trans::no, Trans::yes, 0.5f, a, B.view(), m % 2 ? 0.0f : 2.0f, c);
            for (index_t i = 0; i < m; ++i) {
                CHECK(C(i, 0) == C0(i, 0));  // outside the slice: untouched
                for (index_t j = 0; j < n; ++j) {
                    double s = 0.0;
                    for (index_t p = 0; p < k; ++p) s += double(A(i, 3 + p)) * B(j, p);
                    const double expect = 0.5 * s + (m % 2 ? 0.0 : 2.0 * C0(i, 2 + j));
                    CHECK(C(i, 2 + j) == doctest::Approx(expect).epsilon(1e-5).scale(std::sqrt(double(k))));
                }
            }
        }
}

/// The few-rows kernels' check: product(m, beta) writes C = 0.5 X W^T + beta C for the first m of `rows` rows of X
/// (x(i, p)) against n rows of W (w(j, p)), k values each, into columns 1..n of a copy of C0 [rows, n + 2]. For
/// beta 0 and 2: every element against double (columns 0 and n + 1 untouched), and the products of fewer rows bit for
/// bit equal to the first rows of the whole one.
template <class Product, class XAt, class WAt>
void check_few_rows_kernel(Product product, XAt x, WAt w, const Mat& C0, index_t rows, index_t n, index_t k) {
    for (float beta : {0.0f, 2.0f}) {
        CAPTURE(beta);
        const Mat all = product(rows, beta);
        for (index_t i = 0; i < rows; ++i) {
            CHECK(all(i, 0) == C0(i, 0));  // outside the slice: untouched
            CHECK(all(i, n + 1) == C0(i, n + 1));
            for (index_t j = 0; j < n; ++j) {
                double s = 0.0;
                for (index_t p = 0; p < k; ++p) s += x(i, p) * w(j, p);
                CHECK(all(i, 1 + j) ==
                      doctest::Approx(0.5 * s + beta * C0(i, 1 + j)).epsilon(1e-5).scale(std::sqrt(double(k))));
            }
        }
        for (index_t m : {1, 2, 5, 8, 9, 16, 17, 33, 40, 63, 64, 65, 96, 100, 129}) {
            if (m >= rows) break;
            CAPTURE(m);
            const Mat some = product(m, beta);
            CHECK(std::memcmp(some.data(), all.data(), std::size_t(m * (n + 2)) * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("the few-rows f32 kernel: a row of C is the same bits whatever the other rows, in both of its layouts") {
    // gemm_small.hpp computes each element of C as one chain of FMAs over k in order: with W's rows in the vector
    // lanes up to 8 rows of X, with X's rows in them from 9 (1 to 4 vectors of 16 rows, k in chunks with the sums
    // kept between them: 4096, 2048, 1360 and 1024 values of k). Called directly, so that it runs whatever engine
    // the CPU's rules choose for Ops::gemm. n = 79 leaves a short tile of W's rows in both layouts (16 x 4 + 15;
    // 10 x 7 + 2 x 4 + 1, 12 x 6 + 4 + 3 x 1, ...), k = 4133 a tail of 5 and more than one chunk for every number of
    // vectors.
    if (!backend::cpu_detail::small_gemm_available()) {
        MESSAGE("no AVX-512 on this CPU (or build): the few-rows kernel does not exist here");
        return;
    }
    const index_t rows = 64, n = 79, k = 4133;
    Mat X = random_matrix(rows, k + 3, 11), W = random_matrix(n, k, 12), C0 = random_matrix(rows, n + 2, 13);
    const auto product = [&](index_t m, float beta) {
        Mat C = C0.clone();
        backend::cpu_detail::gemm_small_nt<float>(0.5f, View<const float, 2>(X.data() + 3, {m, k}, {k + 3, 1}),
                                                  W.view(), beta, View<float, 2>(C.data() + 1, {m, n}, {n + 2, 1}));
        return C;
    };
    check_few_rows_kernel(
        product, [&](index_t i, index_t p) { return double(X(i, 3 + p)); },
        [&](index_t j, index_t p) { return double(W(j, p)); }, C0, rows, n, k);
}

TEST_CASE("the few-rows bf16 kernel on AVX512_BF16: against double, and a row of C the same bits whatever the others") {
    // gemm_small_bf16.hpp: bf16 X and W multiplied as they are by VDPBF16PS, each element of C one chain over the
    // k-pairs in order, with W's rows in the vector lanes up to 8 rows of X and X's rows in them from 9 (1 to 4
    // vectors, k in chunks of 1024, 512, 336 and 256 k-pairs with the sums kept between them; beyond 64 rows, panels
    // of 32 rows: 150 rows are four and a panel of 22, whose second vector holds 6). k = 4133 is odd (its last
    // element paired with zero) and crosses chunks for every number of vectors; n = 79 leaves short tiles of W's rows
    // in both layouts. Called directly, so that it runs whatever engine the CPU's rules choose.
    if (!backend::cpu_detail::small_gemm_bf16_available()) {
        MESSAGE("no AVX512_BF16 on this CPU (or build): the bf16 few-rows kernel does not exist here");
        return;
    }
    const index_t rows = 150, n = 79, k = 4133;
    const auto bf16_matrix = [](index_t r, index_t c, std::uint64_t seed) {
        const Mat f = random_matrix(r, c, seed);
        Tensor<bf16, 2, cpu> b({r, c});
        for (index_t i = 0; i < r * c; ++i) b.data()[i] = bf16::from_float(f.data()[i]);
        return b;
    };
    const Tensor<bf16, 2, cpu> X = bf16_matrix(rows, k + 3, 21), W = bf16_matrix(n, k, 22);
    const Mat C0 = random_matrix(rows, n + 2, 23);
    const auto product = [&](index_t m, float beta) {
        Mat C = C0.clone();
        backend::cpu_detail::gemm_small_nt_bf16(0.5f, View<const bf16, 2>(X.data() + 3, {m, k}, {k + 3, 1}), W.view(),
                                                beta, View<float, 2>(C.data() + 1, {m, n}, {n + 2, 1}));
        return C;
    };
    check_few_rows_kernel(
        product, [&](index_t i, index_t p) { return double(X.data()[i * (k + 3) + 3 + p].to_float()); },
        [&](index_t j, index_t p) { return double(W.data()[j * k + p].to_float()); }, C0, rows, n, k);
}

TEST_CASE("gemm_strided_batched equals one gemm per matrix") {
    const index_t count = 5, m = 7, n = 4, k = 9;
    Mat A = random_matrix(count * m, k, 6), B = random_matrix(count * n, k, 7), C({count * m, n});
    Ops::gemm_strided_batched(count, Trans::no, Trans::yes, 1.0f, View<const float, 2>(A.data(), {m, k}), m * k,
                              View<const float, 2>(B.data(), {n, k}), n * k, 0.0f, View<float, 2>(C.data(), {m, n}),
                              m * n);
    for (index_t c = 0; c < count; ++c)
        for (index_t i = 0; i < m; ++i)
            for (index_t j = 0; j < n; ++j) {
                double s = 0.0;
                for (index_t p = 0; p < k; ++p) s += double(A(c * m + i, p)) * B(c * n + j, p);
                CHECK(C(c * m + i, j) == doctest::Approx(s).epsilon(1e-5));
            }
}

TEST_CASE("the counter-based RNG: N(0, 1) moments, and the same numbers whatever the thread count") {
    const int n = threads();
    set_threads(1);
    Mat a = random_matrix(500, 400, 42);
    set_threads(n);
    Mat b = random_matrix(500, 400, 42);
    CHECK(std::memcmp(a.data(), b.data(), a.bytes()) == 0);
    double mean = 0.0, var = 0.0;
    for (index_t i = 0; i < a.numel(); ++i) mean += a.data()[i];
    mean /= double(a.numel());
    for (index_t i = 0; i < a.numel(); ++i) var += (a.data()[i] - mean) * (a.data()[i] - mean);
    var /= double(a.numel());
    CHECK(std::abs(mean) < 0.01);  // 5 standard errors of 1/sqrt(200000)
    CHECK(var == doctest::Approx(1.0).epsilon(0.02));
}

TEST_CASE("views: slices, reshapes and their errors") {
    Mat m = random_matrix(4, 6, 10);
    View<float, 2> s = m.view().slice(1, 2, 5);
    CHECK(s.shape == Shape<2>{4, 3});
    CHECK(&s(1, 0) == &m(1, 2));
    CHECK_FALSE(s.contiguous());
    CHECK_THROWS_WITH_AS(s.reshape<1>({12}), "reshape: cannot view [4, 3] (strided) as [12]", shape_error);
    CHECK_THROWS_WITH_AS(m.view().slice(0, 3, 7), "slice: range [3, 7) of dimension 0 is outside shape [4, 6]",
                         shape_error);
    CHECK(m.reshape<3>({2, 2, 6})(1, 1, 5) == m(3, 5));
    CHECK_THROWS_AS(Mat({3, -1}), shape_error);
    Mat c = m.clone();
    CHECK(std::memcmp(c.data(), m.data(), m.bytes()) == 0);
}

}  // namespace unit_backend_cpu
