// moonmoe/backend/cpu/attention.hpp: AttentionOps<cpu> (backend/attention.hpp).
//
// Attention runs one task per (sequence, head) on the thread pool, each with Eigen GEMMs on its own thread (a
// primitive called inside a parallel body runs inline), an S x S score buffer of its own, and the exact softmax
// below. Results do not depend on the thread count or on where buffers lie.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../attention.hpp"
#include "blas.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {

/// x[j] = exp(x[j] - shift) for j < n (vectorised).
///
/// On a Map, Eigen computes the elements before the first 64-byte boundary and after the last whole packet
/// with std::exp and the rest with its vectorised exp, and the two differ in the last bit: which elements got
/// which depended on the buffer's address. Attention's score rows live in per-call heap buffers, whose
/// addresses depend on what ran before and, at 2 threads, on which thread freed what when, so training runs
/// at 2 threads differed between processes within a few steps. Here every element goes through the
/// vectorised exp, the last partial packet padded in a small buffer: each result depends on its input alone.
inline void exp_shifted(float* x, index_t n, float shift) {
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

/// Softmax of each row in place: exponentials in f32 (exp_shifted), their sum in double. Row i sees only columns
/// t <= causal_first + i (the rest become 0): causal attention whose row 0 sits at key position causal_first.
/// Writes each row's log-sum-exp to lse[i] (if given); returns the largest visible input value.
inline float softmax_rows(View<float, 2> s, index_t causal_first, float* lse = nullptr) {
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

/// Rows [r0, r0 + n) of head h of a [rows, heads, dim] view, as a matrix.
template <class T>
View<T, 2> head_rows(const View<T, 3>& x, index_t r0, index_t n, index_t h) {
    return View<T, 2>(x.data + r0 * x.strides[0] + h * x.strides[1], {n, x.shape[2]}, {x.strides[0], 1});
}

inline void check_heads_view(const char* op, const char* name, const Shape<3>& shape, const Shape<3>& strides,
                             index_t rows, index_t heads, index_t dim) {
    if (shape[0] != rows || shape[1] != heads || (dim >= 0 && shape[2] != dim) || strides[2] != 1)
        throw shape_error(std::string(op) + ": " + name + " is " + shape_string(shape) + ", expected [" +
                          std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                          (dim >= 0 ? std::to_string(dim) : std::string("dim")) + "] with a unit last stride");
}

inline void check_offsets(const char* op, std::span<const index_t> offsets, index_t rows) {
    if (offsets.size() < 2 || offsets.front() != 0 || offsets.back() != rows)
        throw shape_error(std::string(op) + ": offsets must run from 0 to the " + std::to_string(rows) +
                          " query rows (" + std::to_string(offsets.size()) + " given)");
    for (std::size_t s = 0; s + 1 < offsets.size(); ++s)
        if (offsets[s + 1] <= offsets[s])
            throw shape_error(std::string(op) + ": offsets must increase strictly, sequence " + std::to_string(s) +
                              " runs from " + std::to_string(offsets[s]) + " to " + std::to_string(offsets[s + 1]));
}

/// Checks queries and keys of one call; returns kv_heads. Keys have `key_rows` rows (-1: any).
inline index_t check_operands(const char* op, const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv,
                              index_t key_rows) {
    if (q.parts != 1 && q.parts != 2)
        throw shape_error(std::string(op) + ": " + std::to_string(q.parts) + " query parts (1 or 2)");
    const index_t rows = q.q[0].shape[0], heads = q.q[0].shape[1];
    const index_t L = key_rows >= 0 ? key_rows : kv.k[0].shape[0], kv_heads = kv.k[0].shape[1];
    if (kv_heads < 1 || heads % kv_heads != 0)
        throw shape_error(std::string(op) + ": " + std::to_string(heads) + " query heads over " +
                          std::to_string(kv_heads) + " key/value heads (must divide)");
    for (int p = 0; p < q.parts; ++p) {
        check_heads_view(op, p ? "q[1]" : "q[0]", q.q[p].shape, q.q[p].strides, rows, heads, -1);
        check_heads_view(op, p ? "k[1]" : "k[0]", kv.k[p].shape, kv.k[p].strides, L, kv_heads, q.q[p].shape[2]);
    }
    check_heads_view(op, "v", kv.v.shape, kv.v.strides, L, kv_heads, -1);
    return kv_heads;
}

/// One head against its keys: P = softmax(scale sum_p Q_p K_p^T) with row 0 at key causal_first; O = P V.
inline float head_forward(const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv, index_t q0, index_t n,
                          index_t k0, index_t L, index_t h, index_t g, float scale, View<float, 2> o, float* lse) {
    std::vector<float> buffer(static_cast<std::size_t>(n * L));
    View<float, 2> P(buffer.data(), {n, L});
    for (int p = 0; p < q.parts; ++p)
        BlasOps<cpu>::gemm<float>(Trans::no, Trans::yes, scale, head_rows(q.q[p], q0, n, h), head_rows(kv.k[p], k0, L, g),
                                  p ? 1.0f : 0.0f, P);
    const float max_logit = softmax_rows(P, L - n, lse);
    BlasOps<cpu>::gemm<float>(Trans::no, Trans::no, 1.0f, P, head_rows(kv.v, k0, L, g), 0.0f, o);
    return max_logit;
}

}  // namespace cpu_detail

template <>
struct AttentionOps<cpu> {
    /// RoPE in place over x [rows, heads, dim], HF-exact in f32 (nn/rope.hpp).
    static void rope(View<float, 3> x, View<const index_t, 1> positions, View<const float, 1> inv_freq,
                     float attention_factor, bool interleave, bool transpose) {
        const index_t rows = x.shape[0], heads = x.shape[1], dim = x.shape[2], half = dim / 2;
        if (dim != 2 * inv_freq.shape[0] || x.strides[2] != 1 || (half > 1 && inv_freq.strides[0] != 1))
            throw shape_error("rope: x " + shape_string(x.shape) + " against inv_freq " + shape_string(inv_freq.shape) +
                              " (dim = 2 * frequencies, unit last stride)");
        if (positions.shape[0] != rows || (rows > 1 && positions.strides[0] != 1))
            throw shape_error("rope: positions " + shape_string(positions.shape) + " for x " + shape_string(x.shape));
        const float* freq = inv_freq.data;
        cpu_detail::parallel_for(rows, [&](index_t r) {
            std::vector<float> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half)), tmp(static_cast<std::size_t>(dim));
            const float pos = float(positions.data[r]);
            for (index_t i = 0; i < half; ++i) {
                const float angle = freq[i] * pos;  // f32, as HF's inv_freq @ position_ids
                c[i] = std::cos(angle) * attention_factor;
                s[i] = std::sin(angle) * attention_factor;
            }
            for (index_t h = 0; h < heads; ++h) {
                float* v = x.data + r * x.strides[0] + h * x.strides[1];
                if (!transpose) {
                    for (index_t i = 0; i < half; ++i) {  // gather to half-split order, then rotate
                        const float a = interleave ? v[2 * i] : v[i], b = interleave ? v[2 * i + 1] : v[i + half];
                        tmp[i] = a * c[i] - b * s[i];
                        tmp[i + half] = b * c[i] + a * s[i];
                    }
                } else {
                    for (index_t i = 0; i < half; ++i) {  // rotate back, then scatter to the stored order
                        const float a = v[i] * c[i] + v[i + half] * s[i];
                        const float b = v[i + half] * c[i] - v[i] * s[i];
                        tmp[interleave ? 2 * i : i] = a;
                        tmp[interleave ? 2 * i + 1 : i + half] = b;
                    }
                }
                std::copy(tmp.begin(), tmp.end(), v);
            }
        });
    }

    /// o = softmax(causal scores) V for every (sequence, head); lse and max_logit as in backend/attention.hpp.
    static void attention_forward(const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv,
                                  std::span<const index_t> offsets, float scale, View<float, 3> o, View<float, 1> lse,
                                  View<float, 1> max_logit) {
        using namespace cpu_detail;
        const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        check_offsets("attention_forward", offsets, T);
        const index_t G = H / check_operands("attention_forward", q, kv, T);
        check_heads_view("attention_forward", "o", o.shape, o.strides, T, H, kv.v.shape[2]);
        if (lse.numel() != T * H || lse.strides[0] != 1 || max_logit.shape[0] != H || max_logit.strides[0] != 1)
            throw shape_error("attention_forward: lse " + shape_string(lse.shape) + " and max_logit " +
                              shape_string(max_logit.shape) + " for " + std::to_string(T) + " rows of " +
                              std::to_string(H) + " heads");
        std::vector<float> task_max(static_cast<std::size_t>(N * H), -INFINITY);
        parallel_for(N * H, [&](index_t task) {
            const index_t s = task / H, h = task % H, t0 = offsets[s], S = offsets[s + 1] - t0;
            task_max[std::size_t(task)] = head_forward(q, kv, t0, S, t0, S, h, h / G, scale, head_rows(o, t0, S, h),
                                                       lse.data + t0 * H + h * S);
        });
        for (index_t task = 0; task < N * H; ++task)
            max_logit.data[task % H] = std::max(max_logit.data[task % H], task_max[std::size_t(task)]);
    }

    /// Gradients of attention_forward, P recomputed from lse.
    static void attention_backward(const AttentionQueries<cpu>& q, const AttentionKeys<cpu>& kv,
                                   std::span<const index_t> offsets, float scale, View<const float, 3> o,
                                   View<const float, 1> lse, View<const float, 3> d_o, const AttentionGrads<cpu>& grads) {
        using namespace cpu_detail;
        const char* op = "attention_backward";
        const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        check_offsets(op, offsets, T);
        const index_t KV = check_operands(op, q, kv, T), G = H / KV, dim_v = kv.v.shape[2];
        check_heads_view(op, "o", o.shape, o.strides, T, H, dim_v);
        check_heads_view(op, "d_o", d_o.shape, d_o.strides, T, H, dim_v);
        for (int p = 0; p < q.parts; ++p) {
            check_heads_view(op, p ? "dq[1]" : "dq[0]", grads.dq[p].shape, grads.dq[p].strides, T, H, q.q[p].shape[2]);
            check_heads_view(op, p ? "dk[1]" : "dk[0]", grads.dk[p].shape, grads.dk[p].strides, T, KV, q.q[p].shape[2]);
            if (KV > 1 && grads.dk[p].strides[1] == 0) throw shape_error("attention_backward: dk needs a non-zero head stride");
        }
        check_heads_view(op, "dv", grads.dv.shape, grads.dv.strides, T, KV, dim_v);
        if (KV > 1 && grads.dv.strides[1] == 0) throw shape_error("attention_backward: dv needs a non-zero head stride");
        if (lse.numel() != T * H || lse.strides[0] != 1)
            throw shape_error("attention_backward: lse " + shape_string(lse.shape) + " for " + std::to_string(T) +
                              " rows of " + std::to_string(H) + " heads");
        // one task per (sequence, key/value head): the query heads of a group add into the same dK, dV in order
        parallel_for(N * KV, [&](index_t task) {
            const index_t s = task / KV, g = task % KV, t0 = offsets[s], S = offsets[s + 1] - t0;
            std::vector<float> p(static_cast<std::size_t>(S * S)), dp(static_cast<std::size_t>(S * S));
            View<float, 2> P(p.data(), {S, S}), dP(dp.data(), {S, S});
            for (index_t i = 0; i < G; ++i) {
                const index_t h = g * G + i;
                const float beta = i > 0 ? 1.0f : 0.0f;
                for (int part = 0; part < q.parts; ++part)
                    BlasOps<cpu>::gemm<float>(Trans::no, Trans::yes, scale, head_rows(q.q[part], t0, S, h),
                                              head_rows(kv.k[part], t0, S, g), part ? 1.0f : 0.0f, P);
                const float* head_lse = lse.data + t0 * H + h * S;
                for (index_t r = 0; r < S; ++r) {  // P again, from the log-sum-exp: the visible part, then zeros
                    exp_shifted(p.data() + r * S, r + 1, head_lse[r]);
                    std::fill(p.begin() + r * S + r + 1, p.begin() + (r + 1) * S, 0.0f);
                }
                const View<const float, 2> dO = head_rows(d_o, t0, S, h), O = head_rows(o, t0, S, h);
                BlasOps<cpu>::gemm<float>(Trans::yes, Trans::no, 1.0f, P, dO, beta, head_rows(grads.dv, t0, S, g));
                BlasOps<cpu>::gemm<float>(Trans::no, Trans::yes, 1.0f, dO, head_rows(kv.v, t0, S, g), 0.0f, dP);
                for (index_t r = 0; r < S; ++r) {
                    double d = 0.0;
                    const float *dor = dO.data + r * dO.strides[0], *orow = O.data + r * O.strides[0];
                    for (index_t j = 0; j < dim_v; ++j) d += double(dor[j]) * orow[j];
                    for (index_t j = 0; j < S; ++j)
                        dp[r * S + j] = j <= r ? p[r * S + j] * (dp[r * S + j] - float(d)) * scale : 0.0f;
                }
                for (int part = 0; part < q.parts; ++part) {
                    BlasOps<cpu>::gemm<float>(Trans::no, Trans::no, 1.0f, dP, head_rows(kv.k[part], t0, S, g), 0.0f,
                                              head_rows(grads.dq[part], t0, S, h));
                    BlasOps<cpu>::gemm<float>(Trans::yes, Trans::no, 1.0f, dP, head_rows(q.q[part], t0, S, h), beta,
                                              head_rows(grads.dk[part], t0, S, g));
                }
            }
        });
    }

    /// Decoding: the rows of sequence s attend to caches[s], of which they are the last rows.
    static void attention_decode(const AttentionQueries<cpu>& q, std::span<const AttentionKeys<cpu>> caches,
                                 std::span<const index_t> offsets, float scale, View<float, 3> o) {
        using namespace cpu_detail;
        const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        check_offsets("attention_decode", offsets, T);
        if (index_t(caches.size()) != N)
            throw shape_error("attention_decode: " + std::to_string(caches.size()) + " caches for " + std::to_string(N) +
                              " sequences");
        std::vector<index_t> groups(static_cast<std::size_t>(N));
        for (index_t s = 0; s < N; ++s) {
            const AttentionKeys<cpu>& kv = caches[std::size_t(s)];
            if (kv.k[0].shape[0] < offsets[s + 1] - offsets[s])
                throw shape_error("attention_decode: sequence " + std::to_string(s) + " has " +
                                  std::to_string(offsets[s + 1] - offsets[s]) + " new rows but its cache only " +
                                  std::to_string(kv.k[0].shape[0]) + " keys");
            groups[std::size_t(s)] = H / check_operands("attention_decode", q, kv, -1);
            check_heads_view("attention_decode", "o", o.shape, o.strides, T, H, kv.v.shape[2]);
        }
        parallel_for(N * H, [&](index_t task) {
            const index_t s = task / H, h = task % H, t0 = offsets[s], n = offsets[s + 1] - t0;
            const AttentionKeys<cpu>& kv = caches[std::size_t(s)];
            head_forward(q, kv, t0, n, 0, kv.k[0].shape[0], h, h / groups[std::size_t(s)], scale, head_rows(o, t0, n, h),
                         nullptr);
        });
    }
};

}  // namespace moonmoe::backend
