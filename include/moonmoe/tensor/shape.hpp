// moonmoe/tensor/shape.hpp: shapes, strides and the shape errors every op raises (naming both shapes).
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <optional>
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

/// `a * b` for sizes, or nullopt when either is negative or the product does not fit in index_t. Every product
/// of sizes that can come from a file (config.json, a safetensors header) goes through this, so a crafted size
/// cannot wrap around into a small allocation.
constexpr std::optional<index_t> checked_mul(index_t a, index_t b) {
    if (a < 0 || b < 0) return std::nullopt;
    if (b != 0 && a > std::numeric_limits<index_t>::max() / b) return std::nullopt;
    return a * b;
}

/// The product of a range of sizes, or nullopt on a negative size or overflow.
template <class Range>
constexpr std::optional<index_t> checked_product(const Range& sizes) {
    index_t n = 1;
    for (auto d : sizes) {
        const auto next = checked_mul(n, index_t(d));
        if (!next) return std::nullopt;
        n = *next;
    }
    return n;
}

/// Elements of a shape; throws shape_error on a negative extent or a count that overflows index_t.
template <int R>
constexpr index_t numel(const Shape<R>& s) {
    const auto n = checked_product(s);
    if (!n)
        throw shape_error("shape " + shape_string(s) + " has a negative extent or more elements than fit in 64 bits");
    return *n;
}

/// Bytes of `count` elements of `element_size` bytes; throws shape_error (naming `what`) when that overflows.
inline std::size_t checked_bytes(index_t count, std::size_t element_size, const std::string& what) {
    const auto n = checked_mul(count, index_t(element_size));
    if (!n)
        throw shape_error(what + ": " + std::to_string(count) + " elements of " + std::to_string(element_size) +
                          " bytes overflow a 64-bit size");
    return std::size_t(*n);
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
