// moonmoe/backend/cpu/host_loops.hpp: HostLoops<cpu>, the host loops modules used before the backend contract
// (backend/backend.hpp). Each goes away with the last module that calls it.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../backend.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct HostLoops<cpu> {
    /// Indices of the k largest of v[0..n), largest first; ties go to the lower index.
    static std::vector<index_t> top_k(const float* v, index_t n, index_t k) {
        if (k < 0 || k > n) throw std::invalid_argument("top_k: k = " + std::to_string(k) + " of " + std::to_string(n));
        std::vector<index_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), index_t{0});
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [v](index_t a, index_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
        order.resize(static_cast<std::size_t>(k));
        return order;
    }

    /// out[i, :] = in[index[i], :]
    static void gather_rows(View<const float, 2> in, const index_t* index, View<float, 2> out) {
        if (in.shape[1] != out.shape[1]) throw_shape_mismatch("gather_rows", out.shape, in.shape);
        const index_t cols = in.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t i) {
            const float* src = in.data + index[i] * in.strides[0];
            float* dst = out.data + i * out.strides[0];
            for (index_t j = 0; j < cols; ++j) dst[j] = src[j];
        });
    }

    /// out[index[i], :] += scale[i] * in[i, :] (scale may be null = 1), in order of i: repeatable sums.
    static void scatter_add_rows(View<const float, 2> in, const index_t* index, const float* scale,
                                 View<float, 2> out) {
        if (in.shape[1] != out.shape[1]) throw_shape_mismatch("scatter_add_rows", in.shape, out.shape);
        const index_t cols = in.shape[1];
        for (index_t i = 0; i < in.shape[0]; ++i) {
            const float* src = in.data + i * in.strides[0];
            float* dst = out.data + index[i] * out.strides[0];
            const float s = scale ? scale[i] : 1.0f;
            for (index_t j = 0; j < cols; ++j) dst[j] += s * src[j];
        }
    }

    /// Calls f(i) for i in [0, n) in parallel; the element-wise / row kernel launcher.
    template <class F>
    static void for_each(index_t n, F&& f) {
        cpu_detail::parallel_for(n, std::forward<F>(f));
    }

};

}  // namespace moonmoe::backend
