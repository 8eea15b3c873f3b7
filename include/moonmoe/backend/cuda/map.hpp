// moonmoe/backend/cuda/map.hpp: MapOps<cuda> (backend/map.hpp): element-wise maps, fills, copies and transposes.
//
// Every element-wise primitive is one thrust::for_each over a counting iterator [0, rows * cols) on the current
// stream (par_nosync: no host wait), with a kernel functor that holds the functor and the views by value (raw
// pointers and strides), so it is copied to the device whole. In the emulated mode the same functors run on
// Thrust's OpenMP system.
#pragma once

#include "memory.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#if !MOONMOE_CUDA_EMULATED
#include <thrust/system/cuda/execution_policy.h>
#endif

#include "../../tensor/tensor.hpp"
#include "../functors.hpp"
#include "../map.hpp"
#include "divide.hpp"
#include "layout.hpp"

namespace moonmoe::backend {

namespace cuda_detail {

/// Calls f(k) for every k in [0, count) on the backend, ordered on the current stream.
template <class F>
void launch(index_t count, const F& f) {
    if (count <= 0) return;
#if MOONMOE_CUDA_EMULATED
    thrust::for_each(thrust::device, thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(count),
                     f);
#else
    thrust::for_each(thrust::cuda::par_nosync.on(current_stream()), thrust::counting_iterator<index_t>(0),
                     thrust::counting_iterator<index_t>(count), f);
#endif
}

/// A 2-D view as a kernel sees it: the pointer, the row pitch and the column step.
template <class T>
struct Strided {
    T* data;
    index_t pitch, step;

    /// Element (i, j): a reference into a mutable view, a copy out of a const one (as MapOps<cpu> passes them).
    MOONMOE_HD decltype(auto) at(index_t i, index_t j) const {
        if constexpr (std::is_const_v<T>) return std::remove_const_t<T>(data[i * pitch + j * step]);
        else
            return (data[i * pitch + j * step]);
    }
};

template <class T>
Strided<T> strided(const View<T, 2, cuda>& v) {
    return {v.data, v.strides[0], v.strides[1]};
}

/// The I-th view of a map, as a base class so a kernel can hold any number of them.
template <std::size_t I, class T>
struct Operand {
    Strided<T> view;
};

/// f(v0[i, j], ...) (or f(i, j, v0[i, j], ...) when Indexed) for the flat index k = i * cols + j (split without a
/// 64-bit division: cuda/divide.hpp).
template <bool Indexed, class F, class Seq, class... T>
struct MapKernel;
template <bool Indexed, class F, std::size_t... I, class... T>
struct MapKernel<Indexed, F, std::index_sequence<I...>, T...> : Operand<I, T>... {
    F f;
    FlatIndex index;

    MapKernel(F fn, FlatIndex flat, Strided<T>... v) : Operand<I, T>{v}..., f(fn), index(flat) {}

    MOONMOE_HD void operator()(index_t k) const {
        index_t i, j;
        index.split(k, i, j);
        if constexpr (Indexed) f(i, j, Operand<I, T>::view.at(i, j)...);
        else
            f(Operand<I, T>::view.at(i, j)...);
    }
};

template <bool Indexed, class F, class... T>
void run_map(const char* op, const F& f, const View<T, 2, cuda>&... v) {
    static_assert(sizeof...(T) > 0, "map: give at least one view");
    contract::require_same_shapes(op, v...);
    const auto& first = std::get<0>(std::tie(v...));
    const index_t rows = first.shape[0], cols = first.shape[1];
    if (rows == 0 || cols == 0) return;
    launch(rows * cols,
           MapKernel<Indexed, F, std::index_sequence_for<T...>, T...>(f, FlatIndex(rows * cols, cols), strided(v)...));
}

/// dst (r, c) = src (c, r) for the flat index of dst: writes in order, reads down src's columns.
template <class T>
struct TransposeKernel {
    Strided<const T> src;
    Strided<T> dst;
    FlatIndex index;  // over dst's columns
    MOONMOE_HD void operator()(index_t k) const {
        index_t r, c;
        index.split(k, r, c);
        dst.data[r * dst.pitch + c * dst.step] = src.data[c * src.pitch + r * src.step];
    }
};

}  // namespace cuda_detail

template <>
struct MapOps<cuda> {
    /// f(v0[i, j], v1[i, j], ...) over equally shaped views; f is a functor of backend/functors.hpp (or one like
    /// them: plain values, a MOONMOE_HD const operator()).
    template <class F, class... T>
    static void map(F f, View<T, 2, cuda>... v) {
        cuda_detail::run_map<false>("map", f, v...);
    }

    /// f(i, j, v0[i, j], ...) over equally shaped views.
    template <class F, class... T>
    static void map_indexed(F f, View<T, 2, cuda>... v) {
        cuda_detail::run_map<true>("map_indexed", f, v...);
    }

    /// dst = src (same shape, any row pitch): one 2-D memcpy when both have whole, non-overlapping rows, else a map.
    template <class T = float>
    static void copy(View<const std::type_identity_t<T>, 2, cuda> src, View<std::type_identity_t<T>, 2, cuda> dst) {
        contract::require_same_shapes("copy", src, dst);
        const index_t rows = src.shape[0], cols = src.shape[1];
        if (rows == 0 || cols == 0) return;
        const auto whole_rows = [&](const auto& v) { return v.strides[1] == 1 && (rows <= 1 || v.strides[0] >= cols); };
        if (!whole_rows(src) || !whole_rows(dst)) {
            map(fn::Convert{}, dst, src);
            return;
        }
        const std::size_t dpitch = cuda_detail::byte_pitch(rows, cols, dst.strides[0], sizeof(T));
        const std::size_t spitch = cuda_detail::byte_pitch(rows, cols, src.strides[0], sizeof(T));
        const std::size_t width = std::size_t(cols) * sizeof(T);
#if MOONMOE_CUDA_EMULATED
        cuda_detail::host_memcpy2d(dst.data, dpitch, src.data, spitch, width, std::size_t(rows));
#else
        MOONMOE_CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dpitch, src.data, spitch, width, std::size_t(rows),
                                             cudaMemcpyDeviceToDevice, current_stream()));
#endif
    }

    /// dst[:] = value
    template <class T = float>
    static void fill(View<std::type_identity_t<T>, 2, cuda> dst, std::type_identity_t<T> value) {
        map(fn::SetTo<T>{value}, dst);
    }

    /// dst [n, m] = src [m, n]^T, one thread per element of dst (coalesced writes).
    template <class T = float>
    static void transpose(View<const std::type_identity_t<T>, 2, cuda> src,
                          View<std::type_identity_t<T>, 2, cuda> dst) {
        contract::check_transposed("transpose", src, dst);
        const index_t m = src.shape[0], n = src.shape[1];
        if (m == 0 || n == 0) return;
        cuda_detail::launch(n * m, cuda_detail::TransposeKernel<T>{cuda_detail::strided(src), cuda_detail::strided(dst),
                                                                   cuda_detail::FlatIndex(n * m, m)});
    }

    /// dst = convert<To>(src) (f32 <-> bf16, f32 <-> f64; backend/map.hpp), one thread per element.
    template <class To, class From>
    static void cast(View<const std::type_identity_t<From>, 2, cuda> src, View<std::type_identity_t<To>, 2, cuda> dst) {
        static_assert(contract::castable<To> && contract::castable<From>, "cast: float, double or bf16");
        cuda_detail::run_map<false>("cast", fn::Convert{}, dst, src);
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
