// RowOps (backend/rows.hpp) on every test backend against plain loops in double precision.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <cmath>
#include <vector>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_rows {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {
Tensor<float, 1> random_vector(index_t n, std::uint64_t seed, float offset = 0.0f) {
    const Mat m = random_matrix(1, n, seed);
    Tensor<float, 1> v({n});
    for (index_t i = 0; i < n; ++i) v(i) = m(0, i) + offset;
    return v;
}
/// log sum_v exp(z(t, v)), in double.
double row_logsumexp(const Mat& z, index_t t) {
    double m = -INFINITY, sum = 0;
    for (index_t v = 0; v < z.size(1); ++v) m = std::max(m, double(z(t, v)));
    for (index_t v = 0; v < z.size(1); ++v) sum += std::exp(double(z(t, v)) - m);
    return m + std::log(sum);
}
Tensor<index_t, 1> indices(std::vector<index_t> values) {
    Tensor<index_t, 1> t({index_t(values.size())});
    for (std::size_t i = 0; i < values.size(); ++i) t(index_t(i)) = values[i];
    return t;
}
}  // namespace

TEST_CASE_TEMPLATE("rmsnorm_forward: y = w x / rms, rstd per row", B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RowOps<B>;  // the family alone: Ops<cuda> needs every family
    const index_t rows = 70, n = 37;
    const float eps = 1e-5f;
    const Mat x = random_matrix(rows, n, 1);
    const Tensor<float, 1> w = random_vector(n, 2, 1.0f);
    Tensor<float, 2, B> y({rows, n});
    Tensor<float, 1, B> rstd({rows});
    const auto xd = on<B>(x);
    const auto wd = on<B>(w);
    Ops::rmsnorm_forward(xd.view(), wd.view(), eps, y.view(), rstd.view());
    const Mat yh = host(y);
    const Tensor<float, 1> rh = host(rstd);
    for (index_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (index_t j = 0; j < n; ++j) ss += double(x(r, j)) * x(r, j);
        const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
        CHECK(rh(r) == doctest::Approx(inv).epsilon(1e-6));
        for (index_t j = 0; j < n; ++j) CHECK(yh(r, j) == doctest::Approx(double(w(j)) * x(r, j) * inv).epsilon(1e-5));
    }
    Tensor<float, 1, B> short_rstd({rows - 1});
    CHECK_THROWS_AS(Ops::rmsnorm_forward(xd.view(), wd.view(), eps, y.view(), short_rstd.view()), shape_error);
}

TEST_CASE_TEMPLATE("rmsnorm_backward: dx written or added, dweight accumulated over more than one row chunk", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RowOps<B>;    // the family alone: Ops<cuda> needs every family
    const index_t rows = 150, n = 19;  // three 64-row chunks for dweight
    const Mat x = random_matrix(rows, n, 3), dy = random_matrix(rows, n, 4), dx0 = random_matrix(rows, n, 5);
    const Tensor<float, 1> w = random_vector(n, 6, 1.0f), dw0 = random_vector(n, 7);
    Tensor<float, 1> rstd({rows});
    for (index_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (index_t j = 0; j < n; ++j) ss += double(x(r, j)) * x(r, j);
        rstd(r) = float(1.0 / std::sqrt(ss / double(n) + 1e-6));
    }
    for (bool accumulate : {false, true}) {
        CAPTURE(accumulate);
        auto dx = on<B>(dx0);
        auto dw = on<B>(dw0);
        Ops::rmsnorm_backward(on<B>(x).view(), on<B>(w).view(), on<B>(rstd).view(), on<B>(dy).view(), dx.view(),
                              dw.view(), accumulate);
        const Mat dxh = host(dx);
        const Tensor<float, 1> dwh = host(dw);
        for (index_t r = 0; r < rows; ++r) {
            double dot = 0;
            for (index_t j = 0; j < n; ++j) dot += double(w(j)) * dy(r, j) * x(r, j);
            const double inv = rstd(r);
            for (index_t j = 0; j < n; ++j) {
                const double expect = inv * w(j) * dy(r, j) - x(r, j) * inv * inv * inv * dot / double(n);
                CHECK(dxh(r, j) == doctest::Approx(expect + (accumulate ? dx0(r, j) : 0.0)).epsilon(1e-4));
            }
        }
        for (index_t j = 0; j < n; ++j) {
            double s = dw0(j);
            for (index_t r = 0; r < rows; ++r) s += double(dy(r, j)) * x(r, j) * rstd(r);
            CHECK(dwh(j) == doctest::Approx(s).epsilon(1e-5));
        }
    }
}

TEST_CASE_TEMPLATE("cross_entropy: mean over counted targets, gradient rows, ignored rows zero", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RowOps<B>;  // the family alone: Ops<cuda> needs every family
    const index_t T = 6, V = 11;
    const Mat z = random_matrix(T, V, 8, 3.0f);
    const std::vector<index_t> targets = {3, -100, 0, 10, -100, 5};
    const index_t count = 4;
    Tensor<float, 2, B> dz({T, V});
    Tensor<float, 1, B> loss({1});
    const auto zd = on<B>(z);
    const auto td = on<B>(indices(targets));
    Ops::cross_entropy(zd.view(), td.view(), -100, count, loss.view(), dz.view());
    const Mat dzh = host(dz);
    double total = 0;
    for (index_t t = 0; t < T; ++t) {
        const index_t y = targets[std::size_t(t)];
        const double lse = row_logsumexp(z, t);
        if (y >= 0) total += lse - z(t, y);
        for (index_t v = 0; v < V; ++v) {
            const double expect =
                y < 0 ? 0.0 : (std::exp(double(z(t, v)) - lse) - (v == y ? 1.0 : 0.0)) / double(count);
            CHECK(dzh(t, v) == doctest::Approx(expect).epsilon(1e-5));
        }
    }
    CHECK(to_host(loss)[0] == doctest::Approx(total / double(count)).epsilon(1e-6));
    Tensor<float, 1, B> loss_only({1});  // no gradient asked
    Ops::cross_entropy(zd.view(), td.view(), -100, count, loss_only.view(), View<float, 2, B>{});
    CHECK(to_host(loss_only)[0] == to_host(loss)[0]);
}

TEST_CASE_TEMPLATE("token_cross_entropy: each row's loss, gradient rows scaled by their weights, ignored rows zero", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RowOps<B>;  // the family alone: Ops<cuda> needs every family
    const index_t T = 7, V = 300;    // more columns than a block's threads
    const Mat z = random_matrix(T, V, 12, 4.0f);
    const std::vector<index_t> targets = {3, -100, 0, 299, 7, -100, 150};
    const Tensor<float, 1> w = random_vector(T, 13);
    Tensor<float, 2, B> dz({T, V});
    Tensor<float, 1, B> nll({T});
    const auto zd = on<B>(z);
    const auto td = on<B>(indices(targets));
    const auto wd = on<B>(w);
    Ops::token_cross_entropy(zd.view(), td.view(), -100, wd.view(), nll.view(), dz.view());
    const Mat dzh = host(dz);
    const std::vector<float> nllh = to_host(nll);
    for (index_t t = 0; t < T; ++t) {
        const index_t y = targets[std::size_t(t)];
        const double lse = row_logsumexp(z, t);
        CHECK(nllh[std::size_t(t)] == doctest::Approx(y < 0 ? 0.0 : lse - z(t, y)).epsilon(1e-6));
        for (index_t v = 0; v < V; ++v) {
            const double expect = y < 0 ? 0.0 : (std::exp(double(z(t, v)) - lse) - (v == y ? 1.0 : 0.0)) * w(t);
            CHECK(dzh(t, v) == doctest::Approx(expect).epsilon(1e-5).scale(1e-6));
        }
    }
    Tensor<float, 1, B> nll_only({T});  // no gradient asked, no weights needed
    Ops::token_cross_entropy(zd.view(), td.view(), -100, View<const float, 1, B>{}, nll_only.view(),
                             View<float, 2, B>{});
    CHECK(to_host(nll_only) == nllh);
    Tensor<float, 1, B> short_weights({T - 1});
    CHECK_THROWS_WITH_AS(Ops::token_cross_entropy(zd.view(), td.view(), -100,
                                                  View<const float, 1, B>(short_weights.view()), nll.view(), dz.view()),
                         doctest::Contains("token_cross_entropy: weights is [6], expected [7]"), shape_error);
}

TEST_CASE_TEMPLATE("embedding_gather and embedding_scatter_add (repeated ids add in token order)", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RowOps<B>;  // the family alone: Ops<cuda> needs every family
    const index_t V = 5, n = 300;    // more than one column block
    const Mat table = random_matrix(V, n, 9), dy = random_matrix(4, n, 10), dt0 = random_matrix(V, n, 11);
    const std::vector<index_t> ids = {2, 0, 2, 4};
    const auto idd = on<B>(indices(ids));
    Tensor<float, 2, B> out({4, n});
    Ops::embedding_gather(on<B>(table).view(), idd.view(), out.view());
    const Mat oh = host(out);
    for (index_t t = 0; t < 4; ++t)
        for (index_t j = 0; j < n; ++j) CHECK(oh(t, j) == table(ids[std::size_t(t)], j));
    auto dt = on<B>(dt0);
    Ops::embedding_scatter_add(on<B>(dy).view(), idd.view(), dt.view());
    const Mat dth = host(dt);
    for (index_t v = 0; v < V; ++v)
        for (index_t j = 0; j < n; ++j) {
            float expect = dt0(v, j);  // f32 in token order: bitwise
            for (index_t t = 0; t < 4; ++t)
                if (ids[std::size_t(t)] == v) expect += dy(t, j);
            CHECK(dth(v, j) == expect);
        }
}

TEST_CASE_TEMPLATE("sum_heads: per-row sums over the heads of a strided view", B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RowOps<B>;  // the family alone: Ops<cuda> needs every family
    const index_t T = 7, H = 3, R = 4;
    const Mat x = random_matrix(T, H * R + 2, 12);  // heads at columns 2 + h R: a row pitch wider than H R
    const auto xd = on<B>(x);
    Tensor<float, 2, B> y({T, R});
    Ops::sum_heads(View<const float, 3, B>(xd.data() + 2, {T, H, R}, {H * R + 2, R, 1}), y.view());
    const Mat yh = host(y);
    for (index_t t = 0; t < T; ++t)
        for (index_t j = 0; j < R; ++j) {
            double s = 0;
            for (index_t h = 0; h < H; ++h) s += x(t, 2 + h * R + j);
            CHECK(yh(t, j) == doctest::Approx(s).epsilon(1e-6));
        }
}

}  // namespace unit_backend_rows
