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
    /// x[j] = exp(x[j] - shift) for j < n (vectorised).
    ///
    /// On a Map, Eigen computes the elements before the first 64-byte boundary and after the last whole packet
    /// with std::exp and the rest with its vectorised exp, and the two differ in the last bit: which elements got
    /// which depended on the buffer's address. Attention's score rows live in per-call heap buffers, whose
    /// addresses depend on what ran before and, at 2 threads, on which thread freed what when, so training runs
    /// at 2 threads differed between processes within a few steps. Here every element goes through the
    /// vectorised exp, the last partial packet padded in a small buffer: each result depends on its input alone.
    static void exp_shifted(float* x, index_t n, float shift) {
        namespace ei = Eigen::internal;
        using Packet = ei::packet_traits<float>::type;
        constexpr index_t width = ei::packet_traits<float>::size;
        const Packet s = ei::pset1<Packet>(shift);
        index_t j = 0;
        for (; j + width <= n; j += width) ei::pstoreu(x + j, ei::pexp(ei::psub(ei::ploadu<Packet>(x + j), s)));
        if (j < n) {
            float tail[width];
            std::fill(tail, tail + width, shift);
            std::memcpy(tail, x + j, std::size_t(n - j) * sizeof(float));
            ei::pstoreu(tail, ei::pexp(ei::psub(ei::ploadu<Packet>(tail), s)));
            std::memcpy(x + j, tail, std::size_t(n - j) * sizeof(float));
        }
    }

    /// Softmax of each row in place: exponentials in f32 (Eigen's vectorised exp), their sum in double. With
    /// causal_first >= 0 row i sees only columns t <= causal_first + i (the rest become 0): causal attention whose
    /// row 0 sits at key position causal_first. Writes each row's log-sum-exp to lse (if given); returns the largest
    /// visible input value.
    static float softmax_rows(View<float, 2> s, index_t causal_first = -1, float* lse = nullptr) {
        const index_t n = s.shape[0], L = s.shape[1];
        float max_value = -INFINITY;
        for (index_t i = 0; i < n; ++i) {
            float* row = s.data + i * s.strides[0];
            const index_t last = causal_first < 0 ? L - 1 : std::min(causal_first + i, L - 1);
            Eigen::Map<Eigen::ArrayXf> visible(row, last + 1);
            const float m = visible.maxCoeff();
            exp_shifted(row, last + 1, m);
            const double sum = visible.template cast<double>().sum();
            const float log_sum = m + float(std::log(sum));
            visible *= float(1.0 / sum);
            for (index_t t = last + 1; t < L; ++t) row[t] = 0.0f;
            if (lse) lse[i] = log_sum;
            max_value = std::max(max_value, m);
        }
        return max_value;
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
