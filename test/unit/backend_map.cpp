// MapOps<B> on every backend of the build (MOONMOE_TEST_BACKENDS): maps of the functors of backend/functors.hpp over
// pitched views against the same arithmetic in plain loops, map_indexed, fill, copy and transpose.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <moonmoe/backend/cuda/divide.hpp>

#include "support/backends.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_map {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

Tensor<float, 2, cpu> random_host(index_t rows, index_t cols, std::uint64_t seed, float mean = 0.0f) {
    Tensor<float, 2, cpu> m({rows, cols});
    backend::RandomOps<cpu>::fill_normal(m.view(), mean, 1.0f, seed);
    return m;
}

/// x = 1000 i + j + x: shows which element each (i, j) reached.
struct MarkPosition {
    MOONMOE_HD void operator()(index_t i, index_t j, float& x) const { x = float(1000 * i + j) + x; }
};

/// y = x * scale[row]: reads per-row data through a pointer it holds by value, as a functor of functors.hpp may.
struct ScaleRows {
    const float* scale;
    MOONMOE_HD void operator()(index_t i, index_t, float& y, float x) const { y = x * scale[i]; }
};

}  // namespace

TEST_CASE_TEMPLATE("MapOps::map: functors of one to four views, pitched slices, untouched outside", B,
                   MOONMOE_TEST_BACKENDS) {
    const index_t rows = 13, cols = 37;
    auto yh = random_host(rows, cols + 3, 1), xh = random_host(rows, cols, 2);
    auto y = on<B>(yh), x = on<B>(xh);
    View<float, 2, B> ys(y.data() + 1, {rows, cols}, {cols + 3, 1});  // columns 1..cols of a wider matrix
    backend::MapOps<B>::map(fn::Axpby<float>{2.0f, -0.5f}, ys, View<const float, 2, B>(x.view()));
    const auto out = host(y);
    for (index_t i = 0; i < rows; ++i) {
        CHECK(out(i, 0) == yh(i, 0));
        for (index_t j = cols + 1; j < cols + 3; ++j) CHECK(out(i, j) == yh(i, j));
        for (index_t j = 0; j < cols; ++j) CHECK(out(i, 1 + j) == 2.0f * xh(i, j) + -0.5f * yh(i, 1 + j));
    }

    // SwiGLU forward and backward: three views, two of them written.
    auto gh = random_host(rows, cols, 3), uh = random_host(rows, cols, 4), dah = random_host(rows, cols, 5);
    auto g = on<B>(gh), u = on<B>(uh), da = on<B>(dah), a = on<B>(Tensor<float, 2, cpu>({rows, cols}));
    backend::MapOps<B>::map(fn::SwiGLUForward{}, a.view(), View<const float, 2, B>(g.view()),
                            View<const float, 2, B>(u.view()));
    backend::MapOps<B>::map(fn::SwiGLUBackward{}, g.view(), u.view(), View<const float, 2, B>(da.view()));
    const auto ah = host(a), dg = host(g), du = host(u);
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) {
            const double z = gh(i, j), s = 1.0 / (1.0 + std::exp(-z));
            CHECK(ah(i, j) == doctest::Approx(z * s * uh(i, j)).epsilon(1e-6));
            CHECK(dg(i, j) == doctest::Approx(dah(i, j) * uh(i, j) * s * (1.0 + z * (1.0 - s))).epsilon(1e-6));
            CHECK(du(i, j) == doctest::Approx(dah(i, j) * z * s).epsilon(1e-6));
        }

    // AdamW: four views.
    auto wh = random_host(rows, cols, 6), mh = random_host(rows, cols, 7), gradh = random_host(rows, cols, 9);
    auto vh = random_host(rows, cols, 8);
    for (index_t i = 0; i < vh.numel(); ++i) vh.data()[i] = vh.data()[i] * vh.data()[i];  // a second moment is >= 0
    auto w = on<B>(wh), m = on<B>(mh), v = on<B>(vh), grad = on<B>(gradh);
    const fn::AdamWUpdate step{0.99f, 0.9f, 0.95f, 1e-2f, 0.5f, 1e-8f};
    backend::MapOps<B>::map(step, w.view(), m.view(), v.view(), View<const float, 2, B>(grad.view()));
    const auto w1 = host(w), m1 = host(m), v1 = host(v);
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) {
            const double gr = gradh(i, j), mm = mh(i, j) + 0.1 * (gr - mh(i, j)), vv = 0.95 * vh(i, j) + 0.05 * gr * gr;
            CHECK(m1(i, j) == doctest::Approx(mm).epsilon(1e-6));
            CHECK(v1(i, j) == doctest::Approx(vv).epsilon(1e-6));
            CHECK(w1(i, j) ==
                  doctest::Approx(0.99 * wh(i, j) - 1e-2 * mm / (std::sqrt(vv) / 0.5 + 1e-8)).epsilon(1e-5));
        }

    // Convert: float to double.
    auto d = on<B>(Tensor<double, 2, cpu>({rows, cols}));
    backend::MapOps<B>::map(fn::Convert{}, d.view(), View<const float, 2, B>(x.view()));
    const auto dh = host(d);
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) CHECK(dh(i, j) == double(xh(i, j)));

    auto other = on<B>(Tensor<float, 2, cpu>({rows, cols + 1}));
    CHECK_THROWS_WITH_AS(backend::MapOps<B>::map(fn::AddTo<float>{}, x.view(), View<const float, 2, B>(other.view())),
                         "map: shape [13, 37] does not match [13, 38]", shape_error);
    // No elements: nothing runs.
    auto empty = on<B>(Tensor<float, 2, cpu>({0, 4}));
    backend::MapOps<B>::map(fn::SetTo<float>{1.0f}, empty.view());
}

TEST_CASE_TEMPLATE("MapOps::map_indexed: the row and column of every element, per-row data read through a pointer", B,
                   MOONMOE_TEST_BACKENDS) {
    const index_t rows = 9, cols = 70;
    auto xh = random_host(rows, cols + 5, 10);
    auto x = on<B>(xh);
    View<float, 2, B> xs(x.data() + 5, {rows, cols}, {cols + 5, 1});
    backend::MapOps<B>::map_indexed(MarkPosition{}, xs);
    const auto out = host(x);
    for (index_t i = 0; i < rows; ++i) {
        for (index_t j = 0; j < 5; ++j) CHECK(out(i, j) == xh(i, j));
        for (index_t j = 0; j < cols; ++j) CHECK(out(i, 5 + j) == float(1000 * i + j) + xh(i, 5 + j));
    }

    auto scale_h = random_host(rows, 1, 11);
    auto scale = on<B>(scale_h), y = on<B>(Tensor<float, 2, cpu>({rows, cols}));
    backend::MapOps<B>::map_indexed(ScaleRows{scale.data()}, y.view(), View<const float, 2, B>(xs));
    const auto yh = host(y);
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) CHECK(yh(i, j) == out(i, 5 + j) * scale_h(i, 0));
}

TEST_CASE_TEMPLATE("MapOps::fill, copy between pitched views, transpose", B, MOONMOE_TEST_BACKENDS) {
    const index_t rows = 11, cols = 23;
    auto ah = random_host(rows, cols + 4, 12), bh = random_host(rows, cols + 2, 13);
    auto a = on<B>(ah), b = on<B>(bh);
    View<float, 2, B> as(a.data() + 4, {rows, cols}, {cols + 4, 1}), bs(b.data() + 1, {rows, cols}, {cols + 2, 1});

    backend::MapOps<B>::template copy<float>(as, bs);
    auto out = host(b);
    for (index_t i = 0; i < rows; ++i) {
        CHECK(out(i, 0) == bh(i, 0));
        CHECK(out(i, cols + 1) == bh(i, cols + 1));
        for (index_t j = 0; j < cols; ++j) CHECK(out(i, 1 + j) == ah(i, 4 + j));
    }
    // A source whose rows overlap (one row repeated: pitch 0) cannot be one 2-D memcpy on CUDA; it is still a copy.
    View<const float, 2, B> repeated(a.data() + 4, {rows, cols}, {0, 1});
    auto c = on<B>(Tensor<float, 2, cpu>({rows, cols}));
    backend::MapOps<B>::template copy<float>(repeated, c.view());
    const auto ch = host(c);
    for (index_t i = 0; i < rows; ++i)
        for (index_t j = 0; j < cols; ++j) CHECK(ch(i, j) == ah(0, 4 + j));
    // A source read down its columns (a^T as [cols, rows]): element by element, not row by row.
    auto d = on<B>(Tensor<float, 2, cpu>({cols, rows}));
    backend::MapOps<B>::template copy<float>(View<const float, 2, B>(a.data() + 4, {cols, rows}, {1, cols + 4}),
                                             d.view());
    const auto dh = host(d);
    for (index_t i = 0; i < cols; ++i)
        for (index_t j = 0; j < rows; ++j) CHECK(dh(i, j) == ah(j, 4 + i));
    auto narrow = on<B>(Tensor<float, 2, cpu>({rows, 13}));
    CHECK_THROWS_WITH_AS(backend::MapOps<B>::template copy<float>(as, narrow.view()),
                         "copy: shape [11, 23] does not match [11, 13]", shape_error);

    backend::MapOps<B>::template fill<float>(bs, -2.5f);
    out = host(b);
    for (index_t i = 0; i < rows; ++i) {
        CHECK(out(i, 0) == bh(i, 0));
        for (index_t j = 0; j < cols; ++j) CHECK(out(i, 1 + j) == -2.5f);
    }

    auto t = on<B>(Tensor<float, 2, cpu>({cols, rows}));
    backend::MapOps<B>::template transpose<float>(as, t.view());
    const auto th = host(t);
    for (index_t i = 0; i < cols; ++i)
        for (index_t j = 0; j < rows; ++j) CHECK(th(i, j) == ah(j, 4 + i));
    CHECK_THROWS_WITH_AS(backend::MapOps<B>::template transpose<float>(as, narrow.view()),
                         "transpose: [11, 23] into [11, 13]", shape_error);

    auto di = on<B>(Tensor<double, 2, cpu>({3, 4}));
    backend::MapOps<B>::template fill<double>(di.view(), 0.125);
    for (double v : to_host(di)) CHECK(v == 0.125);
}

// The CUDA maps' index split (backend/cuda/divide.hpp), plain C++: every build checks it against the division.
TEST_CASE("IndexDivider: n / d by a multiply-high and a shift, for every 32-bit n and divisor") {
    using backend::cuda_detail::IndexDivider;
    const std::uint32_t top = 0xffffffffu;
    std::vector<std::uint32_t> divisors{1,        2,
                                        3,        5,
                                        7,        10,
                                        64,       96,
                                        100,      576,
                                        7168,     163840,
                                        65535,    65536,
                                        65537,    (1u << 31) - 1,
                                        1u << 31, (1u << 31) + 1,
                                        top - 1,  top};
    std::mt19937 rng(11);
    for (int i = 0; i < 200; ++i) divisors.push_back(std::uint32_t(rng()) >> (rng() % 32) | 1u);
    for (std::uint32_t d : divisors) {
        CAPTURE(d);
        const IndexDivider div(d);
        std::vector<std::uint32_t> ns{0,     1,   d - 1,   d,       d + 1,         2 * d - 1,
                                      2 * d, top, top - 1, top / 2, (top / d) * d, (top / d) * d - 1};
        for (int i = 0; i < 2000; ++i) ns.push_back(std::uint32_t(rng()));
        for (std::uint32_t n : ns) {
            CAPTURE(n);
            REQUIRE(div.quotient(n) == n / d);
        }
    }
    // the split of a launch's flat index, narrow (by the divider) and wide (by 64-bit division) alike
    const backend::cuda_detail::FlatIndex narrow(7168 * 4096, 7168), wide(index_t(1) << 33, 7168);
    CHECK(narrow.narrow);
    CHECK_FALSE(wide.narrow);
    for (index_t k : {index_t(0), index_t(7167), index_t(7168), index_t(7168 * 4096 - 1)}) {
        index_t i = -1, j = -1;
        narrow.split(k, i, j);
        CHECK((i == k / 7168 && j == k % 7168));
        wide.split(k + (index_t(1) << 32), i, j);
        CHECK((i == (k + (index_t(1) << 32)) / 7168 && j == (k + (index_t(1) << 32)) % 7168));
    }
}

}  // namespace unit_backend_map
