// moonmoe/backend/cpu/rows.hpp: RowOps<cpu> (backend/rows.hpp): row kernels on the thread pool.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../rows.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct RowOps<cpu> {
    /// y = weight * x * rstd per row; rstd[r] = 1 / sqrt(mean(x[r]^2) + eps), the sum of squares in double.
    static void rmsnorm_forward(View<const float, 2> x, View<const float, 1> weight, float eps, View<float, 2> y,
                                View<float, 1> rstd) {
        using namespace cpu_detail;
        const index_t rows = x.shape[0], n = x.shape[1];
        contract::check_rmsnorm_forward(x, weight, y, rstd);
        const float* w = weight.data;
        parallel_for(rows, [&](index_t r) {
            const float* xr = x.data + r * x.strides[0];
            float* yr = y.data + r * y.strides[0];
            double ss = 0.0;
            for (index_t j = 0; j < n; ++j) ss += double(xr[j]) * double(xr[j]);
            const float inv = 1.0f / std::sqrt(float(ss / double(n)) + eps);
            rstd.data[r] = inv;
            for (index_t j = 0; j < n; ++j) yr[j] = w[j] * (xr[j] * inv);
        });
    }

    /// dx = rstd g - x rstd^3 mean(g x), g = weight * dy (+= when accumulate_dx); dweight += sum_rows dy x rstd.
    static void rmsnorm_backward(View<const float, 2> x, View<const float, 1> weight, View<const float, 1> rstd,
                                 View<const float, 2> dy, View<float, 2> dx, View<float, 1> dweight,
                                 bool accumulate_dx) {
        using namespace cpu_detail;
        const index_t rows = x.shape[0], n = x.shape[1];
        contract::check_rmsnorm_backward(x, weight, rstd, dy, dx, dweight);
        const float* w = weight.data;
        parallel_for(rows, [&](index_t r) {
            const float* xr = x.data + r * x.strides[0];
            const float* gr = dy.data + r * dy.strides[0];
            float* dr = dx.data + r * dx.strides[0];
            double dot = 0.0;
            for (index_t j = 0; j < n; ++j) dot += double(w[j] * gr[j]) * double(xr[j]);
            const float inv = rstd.data[r];
            const float c = float(dot / double(n)) * inv * inv * inv;
            for (index_t j = 0; j < n; ++j) {
                const float v = inv * w[j] * gr[j] - c * xr[j];
                dr[j] = accumulate_dx ? dr[j] + v : v;
            }
        });
        // dweight: partial column sums over fixed row chunks (contiguous rows, so memory is read in order), then
        // the chunks summed in order. The chunking does not depend on the thread count: results are repeatable.
        constexpr index_t chunk_rows = 64;
        const index_t chunks = (rows + chunk_rows - 1) / chunk_rows;
        std::vector<double> partial(static_cast<std::size_t>(chunks * n), 0.0);
        parallel_for(chunks, [&](index_t k) {
            double* p = partial.data() + k * n;
            for (index_t r = k * chunk_rows; r < std::min(rows, (k + 1) * chunk_rows); ++r) {
                const float* xr = x.data + r * x.strides[0];
                const float* gr = dy.data + r * dy.strides[0];
                const double inv = rstd.data[r];
                for (index_t j = 0; j < n; ++j) p[j] += double(gr[j]) * xr[j] * inv;
            }
        });
        parallel_for(n, [&](index_t j) {
            double s = 0.0;
            for (index_t k = 0; k < chunks; ++k) s += partial[k * n + j];
            dweight.data[j] += float(s);
        });
    }

    /// loss[0] = mean over the targets other than `ignore` of logsumexp(z) - z[target] (double); dlogits = (softmax -
    /// onehot) / count.
    static void cross_entropy(View<const float, 2> logits, View<const index_t, 1> targets, index_t ignore,
                              index_t count, View<float, 1> loss, View<float, 2> dlogits) {
        contract::check_cross_entropy(logits, targets, loss, dlogits);
        std::vector<double> per_token(static_cast<std::size_t>(logits.shape[0]), 0.0);
        cross_entropy_rows(logits, targets.data, ignore, nullptr, count, per_token.data(), dlogits);
        double total = 0.0;
        for (double l : per_token) total += l;  // in token order: repeatable
        loss.data[0] = count ? float(total / double(count)) : 0.0f;
    }

    /// nll[t] = logsumexp(z_t) - z_t[target] (double, rounded); dlogits[t] = weights[t] (softmax - onehot).
    static void token_cross_entropy(View<const float, 2> logits, View<const index_t, 1> targets, index_t ignore,
                                    View<const float, 1> weights, View<float, 1> nll, View<float, 2> dlogits) {
        contract::check_token_cross_entropy(logits, targets, weights, nll, dlogits);
        std::vector<double> per_token(static_cast<std::size_t>(logits.shape[0]), 0.0);
        cross_entropy_rows(logits, targets.data, ignore, weights.data, 0, per_token.data(), dlogits);
        for (index_t t = 0; t < logits.shape[0]; ++t) nll.data[t] = float(per_token[std::size_t(t)]);
    }

private:
    /// Both cross-entropies' rows: per_token[t] = logsumexp(z_t) - z_t[target] (0 when ignored) and, when
    /// dlogits.data is set, its gradient row scaled by weights[t], or by 1 / count without weights.
    static void cross_entropy_rows(View<const float, 2> logits, const index_t* targets, index_t ignore,
                                   const float* weights, index_t count, double* per_token, View<float, 2> dlogits) {
        using namespace cpu_detail;
        const index_t V = logits.shape[1];
        parallel_for(logits.shape[0], [&](index_t t) {
            const float* z = logits.data + t * logits.strides[0];
            float* dz = dlogits.data ? dlogits.data + t * dlogits.strides[0] : nullptr;
            const index_t target = targets[t];
            if (target == ignore) {
                if (dz) std::fill(dz, dz + V, 0.0f);
                return;
            }
            float m = z[0];
            for (index_t v = 1; v < V; ++v) m = z[v] > m ? z[v] : m;
            double sum = 0.0;
            for (index_t v = 0; v < V; ++v) sum += std::exp(double(z[v] - m));
            const double lse = double(m) + std::log(sum);
            per_token[t] = lse - double(z[target]);
            if (!dz) return;
            if (weights) {
                const double w = weights[t];
                for (index_t v = 0; v < V; ++v) dz[v] = float(std::exp(double(z[v]) - lse) * w);
                dz[target] = float((std::exp(double(z[target]) - lse) - 1.0) * w);
            } else {
                for (index_t v = 0; v < V; ++v) dz[v] = float(std::exp(double(z[v]) - lse) / double(count));
                dz[target] -= 1.0f / float(count);
            }
        });
    }

public:
    /// out[t] = table[ids[t]] (ids checked by the caller).
    static void embedding_gather(View<const float, 2> table, View<const index_t, 1> ids, View<float, 2> out) {
        using namespace cpu_detail;
        contract::check_embedding_gather(table, ids, out);
        const index_t cols = out.shape[1];
        parallel_for(out.shape[0], [&](index_t t) {
            const float* src = table.data + ids.data[t] * table.strides[0];
            std::copy(src, src + cols, out.data + t * out.strides[0]);
        });
    }

    /// dtable[ids[t]] += dy[t]; every element sums its tokens in token order, so repeated ids give repeatable sums.
    /// Column blocks run in parallel (each reads every token), which keeps that order.
    static void embedding_scatter_add(View<const float, 2> dy, View<const index_t, 1> ids, View<float, 2> dtable) {
        using namespace cpu_detail;
        contract::check_embedding_scatter_add(dy, ids, dtable);
        constexpr index_t block = 256;
        const index_t cols = dy.shape[1], blocks = (cols + block - 1) / block;
        parallel_for(blocks, [&](index_t b) {
            const index_t lo = b * block, hi = std::min(cols, lo + block);
            for (index_t t = 0; t < dy.shape[0]; ++t) {
                const float* src = dy.data + t * dy.strides[0];
                float* dst = dtable.data + ids.data[t] * dtable.strides[0];
                for (index_t j = lo; j < hi; ++j) dst[j] += src[j];
            }
        });
    }

    /// y[t, j] = sum over heads h, in order, of x[t, h, j] (f32).
    static void sum_heads(View<const float, 3> x, View<float, 2> y) {
        const index_t rows = x.shape[0], heads = x.shape[1], n = x.shape[2];
        contract::check_sum_heads(x, y);
        cpu_detail::parallel_for(rows, [&](index_t t) {
            float* yr = y.data + t * y.strides[0];
            for (index_t j = 0; j < n; ++j) {
                float s = 0.0f;
                for (index_t h = 0; h < heads; ++h) s += x.data[t * x.strides[0] + h * x.strides[1] + j];
                yr[j] = s;
            }
        });
    }
};

}  // namespace moonmoe::backend
