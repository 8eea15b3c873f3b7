// moonmoe/tensor/transfer.hpp: moving tensor data between the host and a backend, the only way module code
// reads values it computed (Memory<B>::to_host / to_device underneath; on the CUDA backend these synchronise).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "tensor.hpp"

namespace moonmoe {

/// The elements of a contiguous view, on the host.
template <class T, int Rank, class B>
std::vector<std::remove_const_t<T>> to_host(View<T, Rank, B> v) {
    if (!v.contiguous()) throw shape_error("to_host: the view " + shape_string(v.shape) + " is not contiguous");
    std::vector<std::remove_const_t<T>> out(static_cast<std::size_t>(v.numel()));
    if (!out.empty()) backend::Memory<B>::to_host(out.data(), v.data, out.size() * sizeof(T));
    return out;
}
template <class T, int Rank, class B>
std::vector<T> to_host(const Tensor<T, Rank, B>& t) {
    return to_host(t.view());
}

/// One element of a backend tensor, on the host.
template <class T, int Rank, class B>
std::remove_const_t<T> element_to_host(View<T, Rank, B> v, index_t flat_index) {
    std::remove_const_t<T> x{};
    backend::Memory<B>::to_host(&x, v.data + flat_index, sizeof(T));
    return x;
}

/// A backend tensor holding `values` with the given shape (its element count must match).
template <class B, int Rank = 1, class T>
Tensor<std::remove_const_t<T>, Rank, B> to_device(std::span<T> values, Shape<Rank> shape) {
    if (moonmoe::numel<Rank>(shape) != index_t(values.size()))
        throw shape_error("to_device: " + std::to_string(values.size()) + " values for shape " + shape_string(shape));
    Tensor<std::remove_const_t<T>, Rank, B> t(shape);
    if (!values.empty()) backend::Memory<B>::to_device(t.data(), values.data(), values.size() * sizeof(T));
    return t;
}
template <class B, class T>
Tensor<std::remove_const_t<T>, 1, B> to_device(std::span<T> values) {
    return to_device<B, 1>(values, Shape<1>{index_t(values.size())});
}
template <class B, class T>
Tensor<T, 1, B> to_device(const std::vector<T>& values) {
    return to_device<B, 1>(std::span<const T>(values), Shape<1>{index_t(values.size())});
}

/// Copies host values into an existing backend view (contiguous, same element count).
template <class T, int Rank, class B>
void copy_to_device(std::span<const T> values, View<T, Rank, B> dst) {
    if (!dst.contiguous() || dst.numel() != index_t(values.size()))
        throw shape_error("copy_to_device: " + std::to_string(values.size()) + " values into " +
                          shape_string(dst.shape) + (dst.contiguous() ? "" : " (strided)"));
    if (!values.empty()) backend::Memory<B>::to_device(dst.data, values.data(), values.size() * sizeof(T));
}

}  // namespace moonmoe
