// moonmoe/backend/cpu/optim.hpp: OptimOps<cpu> (backend/optim.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "../functors.hpp"
#include "../optim.hpp"
#include "map.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {
/// True when none of the n floats is a NaN or an infinity (exponent bits all ones). Integer tests over fixed-size
/// chunks, so the compiler vectorises them without -ffast-math (a float compare or std::isfinite loop does not);
/// returns at the first chunk that holds a bad value.
inline bool all_finite(const float* x, index_t n) {
    constexpr index_t chunk = 256;
    constexpr std::uint32_t exponent = 0x7f800000u;
    index_t i = 0;
    for (; i + chunk <= n; i += chunk) {
        std::uint32_t bad = 0;
        for (index_t j = 0; j < chunk; ++j)
            bad |= std::uint32_t((std::bit_cast<std::uint32_t>(x[i + j]) & exponent) == exponent);
        if (bad) return false;
    }
    for (; i < n; ++i)
        if ((std::bit_cast<std::uint32_t>(x[i]) & exponent) == exponent) return false;
    return true;
}

/// A piece of one view of a list: the unit the list primitives spread over the threads.
struct ListBlock {
    std::size_t item;
    index_t offset, length;
};
/// Every view of `xs` cut into pieces of at most `block` elements, in list order.
template <class T>
std::vector<ListBlock> list_blocks(std::span<const View<T, 1>> xs, index_t block = 16384) {
    std::vector<ListBlock> out;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        contract::require_list_view(i, xs[i]);
        for (index_t lo = 0; lo < xs[i].shape[0]; lo += block)
            out.push_back({i, lo, std::min(block, xs[i].shape[0] - lo)});
    }
    return out;
}
}  // namespace cpu_detail

template <>
struct OptimOps<cpu> {
    /// out[0] = sum of x^2, in double, on one thread in a fixed order: the same sum (to the bit) whatever the thread
    /// count. Eight partial sums, element j of every row going to sum j mod 8 (a row's last n mod 8 elements to a
    /// ninth), added up at the end: eight independent chains that the compiler turns into one vector of doubles,
    /// where a single chain waited out each addition's latency (a Muon step on kv_a's 576 x 7168 spent a tenth of its
    /// time here).
    template <class T = float>
    static void sum_squares(View<const std::type_identity_t<T>, 2> x, View<double, 1> out) {
        contract::require_one("sum_squares: the result", out);
        constexpr index_t lanes = 8;
        double lane[lanes] = {}, rest = 0.0;
        const index_t n = x.shape[1], s1 = x.strides[1], whole = n / lanes * lanes;
        for (index_t i = 0; i < x.shape[0]; ++i) {
            const T* row = x.data + i * x.strides[0];
            if (s1 == 1)
                for (index_t j = 0; j < whole; j += lanes)
                    for (index_t l = 0; l < lanes; ++l) lane[l] += double(row[j + l]) * double(row[j + l]);
            else
                for (index_t j = 0; j < whole; ++j) lane[j % lanes] += double(row[j * s1]) * double(row[j * s1]);
            for (index_t j = whole; j < n; ++j) rest += double(row[j * s1]) * double(row[j * s1]);
        }
        out.data[0] =
            (((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]))) + rest;
    }
    template <class T = float>
    static Tensor<double, 1> sum_squares(View<const std::type_identity_t<T>, 2> x) {
        Tensor<double, 1> out({1});
        sum_squares<T>(x, out.view());
        return out;
    }

    /// dst = factor[0] * op(src); the transpose in tiles of 32 x 32, so both sides move in whole cache lines.
    template <class T = float>
    static void scaled_copy(Trans t, View<const std::type_identity_t<T>, 2> src,
                            View<const std::type_identity_t<T>, 1> factor, View<std::type_identity_t<T>, 2> dst) {
        contract::check_scaled_copy<T>(t, src, factor, dst);
        const T f = factor.data[0];
        if (t == Trans::no) {
            const index_t cols = src.shape[1];
            cpu_detail::parallel_for(src.shape[0], [&](index_t i) {
                const T* s = src.data + i * src.strides[0];
                T* d = dst.data + i * dst.strides[0];
                for (index_t j = 0; j < cols; ++j) d[j * dst.strides[1]] = s[j * src.strides[1]] * f;
            });
            return;
        }
        cpu_detail::transpose_tiled<T>(src, dst, [f](T x) { return x * f; });
    }

    /// out[0] = the first i whose xs[i] holds a NaN or an infinity, or xs.size(). One parallel loop over pieces
    /// of every view; a piece of a view after the first bad one found so far is not read, so the scan ends early
    /// after a find, yet the index is the lowest bad one whatever the thread timing.
    static void first_nonfinite(std::span<const View<const float, 1>> xs, View<index_t, 1> out) {
        contract::require_one("first_nonfinite: the result", out);
        const std::vector<cpu_detail::ListBlock> blocks = cpu_detail::list_blocks(xs);
        std::atomic<std::size_t> first{xs.size()};
        cpu_detail::parallel_for(index_t(blocks.size()), [&](index_t k) {
            const cpu_detail::ListBlock& b = blocks[std::size_t(k)];
            if (b.item >= first.load(std::memory_order_relaxed)) return;
            if (cpu_detail::all_finite(xs[b.item].data + b.offset, b.length)) return;
            std::size_t seen = first.load(std::memory_order_relaxed);
            while (b.item < seen && !first.compare_exchange_weak(seen, b.item, std::memory_order_relaxed)) {}
        });
        out.data[0] = index_t(first.load());
    }

    /// The items cut into pieces of 16k elements over the threads, as first_nonfinite; a piece stops at its first
    /// failing element, and pieces of items after a known failure are skipped.
    static void first_unsafe_update(const fn::UpdateStaysFinite& f, std::span<const UpdateItem> items,
                                    View<index_t, 1> out) {
        contract::require_one("first_unsafe_update: the result", out);
        std::vector<View<const float, 1>> values;
        for (const UpdateItem& it : items) values.push_back(View<const float, 1>(it.w, {it.n}));
        const std::vector<cpu_detail::ListBlock> blocks =
            cpu_detail::list_blocks(std::span<const View<const float, 1>>(values));
        std::atomic<std::size_t> first{items.size()};
        cpu_detail::parallel_for(index_t(blocks.size()), [&](index_t k) {
            const cpu_detail::ListBlock& b = blocks[std::size_t(k)];
            if (b.item >= first.load(std::memory_order_relaxed)) return;
            const UpdateItem& it = items[b.item];
            bool ok = true;
            for (index_t i = b.offset; i < b.offset + b.length && ok; ++i)
                ok = it.v ? f.adamw_ok(it.w[i], it.g[i], it.m[i], it.v[i])
                          : f.muon_ok(it.muon_step, it.w[i], it.g[i], it.m[i]);
            if (ok) return;
            std::size_t seen = first.load(std::memory_order_relaxed);
            while (b.item < seen && !first.compare_exchange_weak(seen, b.item, std::memory_order_relaxed)) {}
        });
        out.data[0] = index_t(first.load());
    }

    /// Every element of every view = 0, one parallel loop over pieces of all of them.
    static void zero_all(std::span<const View<float, 1>> xs) {
        const std::vector<cpu_detail::ListBlock> blocks = cpu_detail::list_blocks(xs);
        cpu_detail::parallel_for(index_t(blocks.size()), [&](index_t k) {
            const cpu_detail::ListBlock& b = blocks[std::size_t(k)];
            float* x = xs[b.item].data + b.offset;
            std::fill(x, x + b.length, 0.0f);
        });
    }

    /// Row r of w *= factors[r], rows in parallel; rows whose factor is exactly 1 are left unwritten.
    static void scale_rows(View<float, 2> w, View<const float, 1> factors) {
        contract::check_scale_rows(w, factors);
        const index_t cols = w.shape[1];
        cpu_detail::parallel_for(w.shape[0], [&](index_t r) {
            const float f = factors.data[r * factors.strides[0]];
            if (f == 1.0f) return;
            float* row = w.data + r * w.strides[0];
            for (index_t j = 0; j < cols; ++j) row[j * w.strides[1]] *= f;
        });
    }

    /// AdamW on every element: f(w, m, v, g). Blocks of 16k elements over the threads; each block as Eigen array
    /// expressions, so the square root and the division vectorise (a loop calling f per element does not, since
    /// sqrtf may set errno: measured 3x slower on 1e7 elements). Per element the operations and their order are
    /// those of fn::AdamWUpdate.
    static void adamw_update(const fn::AdamWUpdate& f, View<float, 1> w, View<const float, 1> g, View<float, 1> m,
                             View<float, 1> v) {
        contract::check_adamw_update(w, g, m, v);
        const index_t n = g.shape[0];
        constexpr index_t block = 16384;
        cpu_detail::parallel_for((n + block - 1) / block, [&](index_t k) {
            const index_t lo = k * block, len = std::min(block, n - lo);
            Eigen::Map<Eigen::ArrayXf> W(w.data + lo, len), M(m.data + lo, len), V(v.data + lo, len);
            const Eigen::Map<const Eigen::ArrayXf> G(g.data + lo, len);
            W *= f.decay;
            M += (1.0f - f.b1) * (G - M);  // exp_avg.lerp_(g, 1 - b1)
            V = V * f.b2 + (1.0f - f.b2) * G * G;
            W -= f.step * M / (V.sqrt() / f.root2 + f.eps);
        });
    }
};

}  // namespace moonmoe::backend
