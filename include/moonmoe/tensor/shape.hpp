// moonmoe/tensor/shape.hpp: shapes, strides and the shape errors every op raises (naming both shapes).
#pragma once

#include <array>
#include <stdexcept>
#include <string>

#include "../config/named.hpp"

namespace moonmoe {

template <int Rank>
using Shape = std::array<index_t, Rank>;

/// An op got tensors whose shapes do not fit together; what() names the op and both shapes.
struct shape_error : std::invalid_argument {
    using std::invalid_argument::invalid_argument;
};

template <class Range>
std::string shape_string(const Range& shape) {
    std::string s = "[";
    bool first = true;
    for (auto d : shape) {
        s += (first ? "" : ", ") + std::to_string(d);
        first = false;
    }
    return s + "]";
}

template <class A, class B>
[[noreturn]] void throw_shape_mismatch(const char* op, const A& found, const B& expected) {
    throw shape_error(std::string(op) + ": shape " + shape_string(found) + " does not match " + shape_string(expected));
}

/// Throws shape_error unless `found` equals `expected`.
template <int R>
void check_shape(const char* op, const Shape<R>& found, const Shape<R>& expected) {
    if (found != expected) throw_shape_mismatch(op, found, expected);
}

template <int R>
constexpr index_t numel(const Shape<R>& s) {
    index_t n = 1;
    for (index_t d : s) n *= d;
    return n;
}

template <int R>
constexpr Shape<R> contiguous_strides(const Shape<R>& s) {
    Shape<R> st{};
    index_t step = 1;
    for (int d = R - 1; d >= 0; --d) {
        st[d] = step;
        step *= s[d];
    }
    return st;
}

}  // namespace moonmoe
