// moonmoe/backend/cpu/map.hpp: MapOps<cpu> (backend/map.hpp): element-wise maps, fills and copies on the thread pool.
#pragma once

#include <algorithm>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../../tensor/tensor.hpp"
#include "../functors.hpp"
#include "../map.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {
/// The element (i, j) of a 2-D view: a reference into a mutable view, a copy out of a const one.
template <class T>
decltype(auto) element(const View<T, 2>& v, index_t i, index_t j) {
    if constexpr (std::is_const_v<T>) return std::remove_const_t<T>(v.data[i * v.strides[0] + j * v.strides[1]]);
    else
        return (v.data[i * v.strides[0] + j * v.strides[1]]);
}
/// Columns of the blocks for_each_block cuts long rows into.
inline constexpr index_t map_block_columns = 4096;
/// Calls body(i, j_begin, j_end) over [rows, cols] in pieces of whole rows, or of column blocks when rows are few.
template <class Body>
void for_each_block(index_t rows, index_t cols, Body&& body) {
    constexpr index_t block = map_block_columns;
    const index_t per_row = cols > block ? (cols + block - 1) / block : 1;
    parallel_for(rows * per_row, [&](index_t k) {
        const index_t i = k / per_row, lo = (k % per_row) * block;
        body(i, per_row == 1 ? 0 : lo, per_row == 1 ? cols : std::min(cols, lo + block));
    });
}
/// dst [n, m] = op(src [m, n])^T element by element, in tiles of 32 x 32 so both sides are read and written in
/// whole cache lines (MapOps::transpose, OptimOps::scaled_copy). Each tile is transposed into a local copy first and
/// then written a whole row of dst at a time: written straight from src's rows, the tile's 32 rows of dst (a
/// multiple of 4 KiB apart in a wide dst, so all in one set of L1) took turns evicting each other, 32 times per line
/// (a bf16 16384 x 512 transposed at 0.4 GB/s).
template <class T, class Op>
void transpose_tiled(View<const T, 2> src, View<T, 2> dst, const Op& op) {
    const index_t m = src.shape[0], n = src.shape[1];
    constexpr index_t tile = 32;
    const index_t tiles_n = (n + tile - 1) / tile;
    parallel_for(((m + tile - 1) / tile) * tiles_n, [&](index_t k) {
        const index_t i0 = k / tiles_n * tile, j0 = k % tiles_n * tile;
        const index_t rows = std::min(tile, m - i0), cols = std::min(tile, n - j0);
        T t[tile][tile];  // t[j][i] = op(src[i0 + i, j0 + j])
        const index_t s1 = src.strides[1], d1 = dst.strides[1];
        if (rows == tile && cols == tile && s1 == 1 && d1 == 1) {  // whole tile, rows contiguous: fixed trip counts
            for (index_t i = 0; i < tile; ++i) {
                const T* s = src.data + (i0 + i) * src.strides[0] + j0;
                for (index_t j = 0; j < tile; ++j) t[j][i] = op(s[j]);
            }
            for (index_t j = 0; j < tile; ++j) std::copy_n(t[j], tile, dst.data + (j0 + j) * dst.strides[0] + i0);
            return;
        }
        for (index_t i = 0; i < rows; ++i) {
            const T* s = src.data + (i0 + i) * src.strides[0] + j0 * s1;
            for (index_t j = 0; j < cols; ++j) t[j][i] = op(s[j * s1]);
        }
        for (index_t j = 0; j < cols; ++j) {
            T* d = dst.data + (j0 + j) * dst.strides[0] + i0 * d1;
            for (index_t i = 0; i < rows; ++i) d[i * d1] = t[j][i];
        }
    });
}
}  // namespace cpu_detail

template <>
struct MapOps<cpu> {
    /// f(v0[i, j], v1[i, j], ...) over equally shaped views.
    template <class F, class... T>
    static void map(F f, View<T, 2>... v) {
        static_assert(sizeof...(T) > 0, "map: give at least one view");
        contract::require_same_shapes("map", v...);
        const auto& first = std::get<0>(std::tie(v...));
        cpu_detail::for_each_block(first.shape[0], first.shape[1], [&](index_t i, index_t lo, index_t hi) {
            for (index_t j = lo; j < hi; ++j) f(cpu_detail::element(v, i, j)...);
        });
    }

    /// f(i, j, v0[i, j], ...) over equally shaped views.
    template <class F, class... T>
    static void map_indexed(F f, View<T, 2>... v) {
        static_assert(sizeof...(T) > 0, "map_indexed: give at least one view");
        contract::require_same_shapes("map_indexed", v...);
        const auto& first = std::get<0>(std::tie(v...));
        cpu_detail::for_each_block(first.shape[0], first.shape[1], [&](index_t i, index_t lo, index_t hi) {
            for (index_t j = lo; j < hi; ++j) f(i, j, cpu_detail::element(v, i, j)...);
        });
    }

    /// dst = src (same shape, any strides): a memcpy per row when both have contiguous rows, else element-wise.
    template <class T = float>
    static void copy(View<const std::type_identity_t<T>, 2> src, View<std::type_identity_t<T>, 2> dst) {
        contract::require_same_shapes("copy", src, dst);
        if (!src.rows_contiguous() || !dst.rows_contiguous()) return map([](T& y, T x) { y = x; }, dst, src);
        const index_t cols = src.shape[1];
        cpu_detail::parallel_for(src.shape[0], [&](index_t i) {
            std::memcpy(dst.data + i * dst.strides[0], src.data + i * src.strides[0], std::size_t(cols) * sizeof(T));
        });
    }

    /// dst[:] = value, rows in parallel (also how fresh pages get faulted in by every thread)
    template <class T = float>
    static void fill(View<std::type_identity_t<T>, 2> dst, std::type_identity_t<T> value) {
        const index_t cols = dst.shape[1];
        cpu_detail::parallel_for(dst.shape[0], [&](index_t i) {
            T* row = dst.data + i * dst.strides[0];
            for (index_t j = 0; j < cols; ++j) row[j] = value;
        });
    }

    /// dst [n, m] = src [m, n]^T, in tiles of 32 x 32 so both sides are read and written in whole cache lines.
    template <class T = float>
    static void transpose(View<const std::type_identity_t<T>, 2> src, View<std::type_identity_t<T>, 2> dst) {
        contract::check_transposed("transpose", src, dst);
        cpu_detail::transpose_tiled<T>(src, dst, [](T x) { return x; });
    }

    /// dst = convert<To>(src) (f32 <-> bf16, f32 <-> f64; backend/map.hpp), rows in parallel.
    template <class To, class From>
    static void cast(View<const std::type_identity_t<From>, 2> src, View<std::type_identity_t<To>, 2> dst) {
        static_assert(contract::castable<To> && contract::castable<From>, "cast: float, double or bf16");
        contract::require_same_shapes("cast", src, dst);
        map(fn::Convert{}, dst, src);
    }
};

}  // namespace moonmoe::backend
