// OptimOps (backend/optim.hpp) on every test backend against plain loops in double precision.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <cmath>
#include <limits>
#include <vector>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_optim {

using namespace moonmoe;
using namespace moonmoe::testing;
using backend::Trans;

namespace {
template <class T>
Tensor<T, 2> random_of(index_t rows, index_t cols, std::uint64_t seed) {
    const Mat r = random_matrix(rows, cols, seed);
    Tensor<T, 2> out({rows, cols});
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) out(i, j) = T(r(i, j));
    return out;
}
Tensor<float, 1> flat(std::vector<float> v) {
    Tensor<float, 1> t({index_t(v.size())});
    std::copy(v.begin(), v.end(), t.data());
    return t;
}
}  // namespace

TEST_CASE_TEMPLATE("sum_squares: the squared Frobenius norm in double, of whole and strided views", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::OptimOps<B>;
    const Tensor<float, 2> x = random_of<float>(37, 53, 1);
    const Tensor<double, 2> xd = random_of<double>(19, 23, 2);
    double expected = 0.0, expected_d = 0.0, expected_slice = 0.0;
    for (index_t i = 0; i < 37; ++i)
        for (index_t j = 0; j < 53; ++j) {
            expected += double(x(i, j)) * double(x(i, j));
            if (j >= 10 && j < 30) expected_slice += double(x(i, j)) * double(x(i, j));
        }
    for (index_t i = 0; i < 19; ++i)
        for (index_t j = 0; j < 23; ++j) expected_d += xd(i, j) * xd(i, j);
    const auto dx = on<B>(x);
    const auto dxd = on<B>(xd);
    Tensor<double, 1, B> out({1});
    Ops::template sum_squares<float>(dx.view(), out.view());
    CHECK(host(out)(0) == doctest::Approx(expected).epsilon(1e-14));
    CHECK(host(Ops::template sum_squares<double>(dxd.view()))(0) == doctest::Approx(expected_d).epsilon(1e-14));
    const View<const float, 2, B> columns = View<const float, 2, B>(dx.view()).slice(1, 10, 30);
    CHECK(host(Ops::template sum_squares<float>(columns))(0) == doctest::Approx(expected_slice).epsilon(1e-14));
    CHECK(host(Ops::template sum_squares<float>(Tensor<float, 2, B>({0, 5}).view()))(0) == 0.0);
}

TEST_CASE_TEMPLATE("scaled_copy: dst = factor op(src), as stored and transposed, by a factor on the backend", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::OptimOps<B>;
    const Tensor<float, 2> src = random_of<float>(45, 70, 3);  // not a multiple of the 32 x 32 tiles
    const auto d_src = on<B>(src);
    const auto factor = on<B>(flat({0.37f}));
    Tensor<float, 2, B> same({45, 70}), transposed({70, 45});
    Ops::template scaled_copy<float>(Trans::no, d_src.view(), factor.view(), same.view());
    Ops::template scaled_copy<float>(Trans::yes, d_src.view(), factor.view(), transposed.view());
    const Tensor<float, 2> s = host(same), t = host(transposed);
    for (index_t i = 0; i < 45; ++i)
        for (index_t j = 0; j < 70; ++j) {
            CHECK(s(i, j) == src(i, j) * 0.37f);
            CHECK(t(j, i) == src(i, j) * 0.37f);
        }
    // Views whose columns are strided: src^T read as [70, 45] into a transposed destination
    Ops::template scaled_copy<float>(Trans::no, View<const float, 2, B>(d_src.data(), {70, 45}, {1, 70}), factor.view(),
                                     View<float, 2, B>(same.data(), {70, 45}, {1, 70}));
    const Tensor<float, 2> u = host(same);
    for (index_t i = 0; i < 45; ++i)
        for (index_t j = 0; j < 70; ++j) CHECK(u(i, j) == src(i, j) * 0.37f);
    Tensor<float, 2, B> wrong({45, 70});
    CHECK_THROWS_AS(Ops::template scaled_copy<float>(Trans::yes, d_src.view(), factor.view(), wrong.view()),
                    shape_error);
}

TEST_CASE_TEMPLATE("first_nonfinite: the lowest view holding a NaN or an infinity, or the count", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::OptimOps<B>;
    const index_t sizes[] = {3, 20000, 40000, 1, 300};
    std::vector<Tensor<float, 1>> xs;
    for (index_t n : sizes) {
        Tensor<float, 1> x({n});
        for (index_t i = 0; i < n; ++i) x(i) = float(i % 3 == 0 ? 3.0e38 : i % 3 == 1 ? 1e-42 : -0.0);
        xs.push_back(std::move(x));
    }
    auto first = [&](const std::vector<std::pair<std::size_t, index_t>>& bad, float value) {
        std::vector<Tensor<float, 1, B>> on_b;
        for (std::size_t k = 0; k < xs.size(); ++k) {
            Tensor<float, 1> x = xs[k].clone();
            for (const auto& [which, at] : bad)
                if (which == k) x(at) = value;
            on_b.push_back(to_device<B, 1>(std::span<const float>(x.data(), std::size_t(x.numel())), x.shape()));
        }
        std::vector<View<const float, 1, B>> views;
        for (auto& t : on_b) views.push_back(t.view());
        Tensor<index_t, 1, B> out({1});
        Ops::first_nonfinite(views, out.view());
        return host(out)(0);
    };
    CHECK(first({}, 0.0f) == 5);
    for (float bad : {NAN, INFINITY, -INFINITY, -std::numeric_limits<float>::quiet_NaN()}) {
        CAPTURE(bad);
        CHECK(first({{2, 30000}}, bad) == 2);
        CHECK(first({{4, 299}, {1, 19999}}, bad) == 1);  // the lowest view, not the first found
        CHECK(first({{0, 0}, {3, 0}}, bad) == 0);
        CHECK(first({{3, 0}}, bad) == 3);
    }
    Tensor<index_t, 1, B> out({1});
    Ops::first_nonfinite(std::vector<View<const float, 1, B>>{}, out.view());
    CHECK(host(out)(0) == 0);
}

TEST_CASE_TEMPLATE("zero_all: every element of every view, nothing outside them", B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::OptimOps<B>;
    const Tensor<float, 2> values = random_of<float>(3, 30000, 4);
    auto d = on<B>(values);
    // row 0 whole, row 1 from column 7 to 20007, row 2 untouched
    const std::vector<View<float, 1, B>> xs = {View<float, 1, B>(d.data(), {30000}),
                                               View<float, 1, B>(d.data() + 30000 + 7, {20000})};
    Ops::zero_all(xs);
    const Tensor<float, 2> h = host(d);
    for (index_t j = 0; j < 30000; ++j) {
        CHECK(h(0, j) == 0.0f);
        CHECK(h(1, j) == (j >= 7 && j < 20007 ? 0.0f : values(1, j)));
        CHECK(h(2, j) == values(2, j));
    }
}

TEST_CASE_TEMPLATE("scale_rows: each row by its factor, rows with factor 1 stay bit for bit", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::OptimOps<B>;
    Tensor<float, 2> w = random_of<float>(12, 40, 5);
    w(3, 5) = NAN;  // a factor of 1 leaves even a NaN's bits alone
    std::vector<float> f(12, 1.0f);
    f[0] = 0.5f, f[4] = 0.999f, f[11] = std::nextafter(1.0f, 0.0f);
    auto d = on<B>(w);
    const auto factors = on<B>(flat(f));
    Ops::scale_rows(d.view(), factors.view());
    const Tensor<float, 2> h = host(d);
    for (index_t i = 0; i < 12; ++i)
        for (index_t j = 0; j < 40; ++j) {
            const float expected = f[std::size_t(i)] == 1.0f ? w(i, j) : float(double(w(i, j)) * f[std::size_t(i)]);
            CHECK(std::memcmp(&h(i, j), &expected, sizeof(float)) == 0);
        }
    CHECK_THROWS_AS(Ops::scale_rows(d.view(), on<B>(flat({1.0f, 2.0f})).view()), shape_error);

    // A view whose columns are strided (w^T as [40, 12]): the same factors per row of that view.
    auto e = on<B>(w);
    const auto column_factors = on<B>(flat(std::vector<float>(40, 0.25f)));
    Ops::scale_rows(View<float, 2, B>(e.data(), {40, 12}, {1, 40}), column_factors.view());
    const Tensor<float, 2> g = host(e);
    for (index_t i = 0; i < 12; ++i)
        for (index_t j = 0; j < 40; ++j)
            if (!(i == 3 && j == 5)) CHECK(g(i, j) == w(i, j) * 0.25f);
}

TEST_CASE_TEMPLATE("adamw_update: fn::AdamWUpdate on every element, against the formula in double", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::OptimOps<B>;
    const index_t n = 40000;  // several 16k blocks and a partial one
    const Mat r = random_matrix(4, n, 6);
    Tensor<float, 1> w({n}), g({n}), m({n}), v({n});
    for (index_t i = 0; i < n; ++i)
        w(i) = r(0, i), g(i) = 0.1f * r(1, i), m(i) = 0.01f * r(2, i), v(i) = 1e-4f * std::abs(r(3, i));
    const fn::AdamWUpdate f{.decay = 0.998f, .b1 = 0.9f, .b2 = 0.95f, .step = 1e-3f, .root2 = 0.3f, .eps = 1e-8f};
    auto dw = on<B>(w), dg = on<B>(g), dm = on<B>(m), dv = on<B>(v);
    Ops::adamw_update(f, dw.view(), dg.view(), dm.view(), dv.view());
    const Tensor<float, 1> hw = host(dw), hm = host(dm), hv = host(dv);
    for (index_t i = 0; i < n; ++i) {
        const double gi = g(i);
        const double mi = double(m(i)) + (1.0 - double(f.b1)) * (gi - double(m(i)));
        const double vi = double(v(i)) * double(f.b2) + (1.0 - double(f.b2)) * gi * gi;
        const double wi =
            double(w(i)) * double(f.decay) - double(f.step) * mi / (std::sqrt(vi) / double(f.root2) + double(f.eps));
        CHECK(hm(i) == doctest::Approx(mi).epsilon(1e-6));
        CHECK(hv(i) == doctest::Approx(vi).epsilon(1e-6));
        CHECK(hw(i) == doctest::Approx(wi).epsilon(1e-6));
    }
    Tensor<float, 1, B> short_one({n - 1});
    CHECK_THROWS_AS(Ops::adamw_update(f, short_one.view(), dg.view(), dm.view(), dv.view()), shape_error);
}

}  // namespace unit_backend_optim
