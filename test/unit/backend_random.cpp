// RandomOps<B> on every backend of the build (MOONMOE_TEST_BACKENDS): the numbers of the CPU, whatever the
// backend, the view's row pitch or the thread split, and their distributions.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "support/backends.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_random {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {
/// The floats one ulp either side of x, for the normal fill on a GPU (see backend/cuda/random.hpp).
bool within_one_ulp(float a, float b) {
    return a == b || std::nextafter(a, INFINITY) == b || std::nextafter(a, -INFINITY) == b;
}
}  // namespace

TEST_CASE_TEMPLATE("RandomOps: the CPU's values on every backend, on a pitched view too", B, MOONMOE_TEST_BACKENDS) {
    const index_t rows = 37, cols = 53;
    Tensor<float, 2, cpu> expect_u({rows, cols}), expect_n({rows, cols});
    backend::RandomOps<cpu>::fill_uniform(expect_u.view(), -2.0f, 3.0f, 42);
    backend::RandomOps<cpu>::fill_normal(expect_n.view(), 0.5f, 2.0f, 43);

    // Element k of the shape (not of the memory) takes counter k: a column slice gets the same numbers.
    auto u = on<B>(Tensor<float, 2, cpu>({rows, cols + 7})), n = on<B>(Tensor<float, 2, cpu>({rows, cols}));
    backend::RandomOps<B>::fill_uniform(View<float, 2, B>(u.data() + 7, {rows, cols}, {cols + 7, 1}), -2.0f, 3.0f, 42);
    backend::RandomOps<B>::fill_normal(n.view(), 0.5f, 2.0f, 43);
    const auto uh = host(u), nh = host(n);
    for (index_t i = 0; i < rows; ++i) {
        for (index_t j = 0; j < 7; ++j) CHECK(uh(i, j) == 0.0f);
        for (index_t j = 0; j < cols; ++j) {
            CHECK(std::memcmp(&uh(i, 7 + j), &expect_u(i, j), sizeof(float)) == 0);  // bitwise
            CHECK(within_one_ulp(nh(i, j), expect_n(i, j)));
        }
    }
}

TEST_CASE_TEMPLATE("RandomOps: U(lo, hi) and N(mean, stddev^2) moments, different seeds differ", B,
                   MOONMOE_TEST_BACKENDS) {
    const index_t rows = 200, cols = 500;
    auto u = on<B>(Tensor<float, 2, cpu>({rows, cols})), n = on<B>(Tensor<float, 2, cpu>({rows, cols}));
    backend::RandomOps<B>::fill_uniform(u.view(), 1.0f, 3.0f, 7);
    backend::RandomOps<B>::fill_normal(n.view(), -1.0f, 0.5f, 7);
    const std::vector<float> uv = to_host(u), nv = to_host(n);
    double su = 0, sn = 0, sn2 = 0;
    float lo = 10.0f, hi = -10.0f;
    for (float x : uv) su += x, lo = std::min(lo, x), hi = std::max(hi, x);
    for (float x : nv) sn += x, sn2 += double(x) * x;
    const double count = double(rows * cols), mean_n = sn / count;
    CHECK(lo >= 1.0f);
    CHECK(hi <= 3.0f);
    CHECK(su / count == doctest::Approx(2.0).epsilon(0.01));
    CHECK(mean_n == doctest::Approx(-1.0).epsilon(0.01));
    CHECK(std::sqrt(sn2 / count - mean_n * mean_n) == doctest::Approx(0.5).epsilon(0.01));

    auto other = on<B>(Tensor<float, 2, cpu>({rows, cols}));
    backend::RandomOps<B>::fill_uniform(other.view(), 1.0f, 3.0f, 8);
    const std::vector<float> ov = to_host(other);
    std::size_t same = 0;
    for (std::size_t i = 0; i < ov.size(); ++i) same += ov[i] == uv[i];
    CHECK(same < ov.size() / 1000);
}

}  // namespace unit_backend_random
