// moonmoe/config/detail/cmath.hpp: the few real functions the constexpr configuration needs (C++20's <cmath> is
// not constexpr, and nvcc must see the same code). Accurate to a few ulp; tested against libm.
#pragma once

#include <cstdint>
#include <limits>

namespace moonmoe::detail {

constexpr double cfloor(double x) {
    if (!(x > -4503599627370496.0 && x < 4503599627370496.0)) return x;  // |x| >= 2^52 is whole (or inf / NaN)
    auto t = static_cast<double>(static_cast<std::int64_t>(x));          // truncates towards zero
    return t > x ? t - 1.0 : t;
}

constexpr double cceil(double x) { return -cfloor(-x); }

/// sqrt by Newton's method from an exponent-halving first guess; x >= 0.
constexpr double csqrt(double x) {
    if (x <= 0.0) return 0.0;
    double guess = 1.0, scaled = x;
    while (scaled > 4.0) scaled /= 4.0, guess *= 2.0;
    while (scaled < 0.25) scaled *= 4.0, guess /= 2.0;
    double y = guess * (1.0 + scaled) / 2.0;
    for (int i = 0; i < 64; ++i) {
        double next = 0.5 * (y + x / y);
        if (next == y) break;
        y = next;
    }
    return y;
}

/// Natural logarithm, x > 0: x = m * 2^k with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh((m-1)/(m+1)).
constexpr double clog(double x) {
    constexpr double ln2 = 0.693147180559945309417232121458176568;
    constexpr double sqrt2 = 1.41421356237309504880168872420969808;
    if (x <= 0.0) return -std::numeric_limits<double>::infinity();  // callers never pass x < 0
    int k = 0;
    while (x >= sqrt2) x /= 2.0, ++k;
    while (x < sqrt2 / 2.0) x *= 2.0, --k;
    double z = (x - 1.0) / (x + 1.0), z2 = z * z, term = z, sum = 0.0;
    for (int n = 1; n < 200; n += 2) {
        double add = term / n;
        if (sum + add == sum) break;
        sum += add;
        term *= z2;
    }
    return 2.0 * sum + k * ln2;
}

}  // namespace moonmoe::detail

namespace moonmoe::detail {

/// cos(x) for |x| up to a few thousand: reduce to [-pi, pi], then the Taylor series to convergence.
constexpr double ccos(double x) {
    constexpr double pi = 3.14159265358979323846264338327950288;
    x -= 2.0 * pi * cfloor((x + pi) / (2.0 * pi));
    double term = 1.0, sum = 1.0, x2 = x * x;
    for (int n = 1; n < 60; ++n) {
        term *= -x2 / double((2 * n - 1) * (2 * n));
        if (sum + term == sum) break;
        sum += term;
    }
    return sum;
}

}  // namespace moonmoe::detail
