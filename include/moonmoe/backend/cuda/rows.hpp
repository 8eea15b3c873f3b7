// moonmoe/backend/cuda/rows.hpp: RowOps<cuda> (backend/rows.hpp): the row kernels as Thrust functors, one thread per
// row (or per element / column where rows need no reduction).
//
// Every functor repeats RowOps<cpu>'s arithmetic in the CPU's order: double sums per row in column order, the
// dweight chunks of 64 rows summed in order, the loss summed over rows in order, scattered embedding gradients added
// in token order. So the emulated mode (the same host compiler and libm) gives the CPU's bits. Under nvcc two
// things may move the last bit: the device's double exp / log in cross_entropy (documented by CUDA to within 1 ulp
// of double; after the rounding to float this is a rare one-ulp difference), and nvcc's fused multiply-adds (on by
// default) where the host compile did not fuse the same products (or the other way round); the sums are in double,
// so the float results agree to about 1e-7 relative.
//
// For speed on a GPU, rmsnorm_forward, rmsnorm_backward's dx and cross_entropy want a warp (or a block for V of
// many thousands) per row with a shuffle reduction: one thread per row reads a row serially, its warp's loads fall
// a row pitch apart (uncoalesced), and a few thousand rows leave most of the device idle. Under nvcc the RMSNorm
// ones can take fast/rmsnorm.hpp (opt-in: fast/select.hpp), checked against these functors by
// test/nvcc/fast_kernels.cu; cross_entropy's rows take a block each under nvcc (cuda/cross_entropy.hpp), always. The
// rest (dweight's chunk partials, the gathers, the per-column scatter, sum_heads) is already one thread per output
// element or column, with coalesced reads.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cmath>
#include <string>

#include "../../tensor/tensor.hpp"
#include "../rows.hpp"
#if !MOONMOE_CUDA_EMULATED
#include "cross_entropy.hpp"  // a block per row
#include "fast/rmsnorm.hpp"   // a warp or block per row, opt-in (fast/select.hpp)
#include "fast/select.hpp"
#endif

namespace moonmoe::backend {

namespace cuda_rows_detail {

/// Rows of a row-major matrix with unit column stride: the pointer and the row pitch.
template <class T>
struct Rows {
    T* data;
    index_t pitch;
    MOONMOE_HD T* row(index_t r) const { return data + r * pitch; }
};
template <class T>
Rows<T> rows_of(const View<T, 2, cuda>& v) {
    return {v.data, v.strides[0]};
}

/// Row r of rmsnorm_forward: rstd[r] from the double sum of squares, then y[r].
struct RmsNormForwardRow {
    Rows<const float> x;
    const float* w;
    float eps;
    Rows<float> y;
    float* rstd;
    index_t n;
    MOONMOE_HD void operator()(index_t r) const {
        const float* xr = x.row(r);
        float* yr = y.row(r);
        double ss = 0.0;
        for (index_t j = 0; j < n; ++j) ss += double(xr[j]) * double(xr[j]);
        const float inv = 1.0f / ::sqrtf(float(ss / double(n)) + eps);
        rstd[r] = inv;
        for (index_t j = 0; j < n; ++j) yr[j] = w[j] * (xr[j] * inv);
    }
};

/// Row r of rmsnorm_backward's dx: the double dot of g = w dy with x, then dx[r] written or added.
struct RmsNormBackwardRow {
    Rows<const float> x;
    const float* w;
    const float* rstd;
    Rows<const float> dy;
    Rows<float> dx;
    index_t n;
    bool accumulate;
    MOONMOE_HD void operator()(index_t r) const {
        const float* xr = x.row(r);
        const float* gr = dy.row(r);
        float* dr = dx.row(r);
        double dot = 0.0;
        for (index_t j = 0; j < n; ++j) dot += double(w[j] * gr[j]) * double(xr[j]);
        const float inv = rstd[r];
        const float c = float(dot / double(n)) * inv * inv * inv;
        for (index_t j = 0; j < n; ++j) {
            const float v = inv * w[j] * gr[j] - c * xr[j];
            dr[j] = accumulate ? dr[j] + v : v;
        }
    }
};

/// dweight's partial for (chunk k, column j), k = i / n, j = i % n: the rows of chunk k in order, in double.
struct DweightChunk {
    Rows<const float> x, dy;
    const float* rstd;
    double* partial;  // [chunks, n]
    index_t rows, n, chunk_rows;
    MOONMOE_HD void operator()(index_t i) const {
        const index_t k = i / n, j = i % n;
        const index_t end = (k + 1) * chunk_rows < rows ? (k + 1) * chunk_rows : rows;
        double p = 0.0;
        for (index_t r = k * chunk_rows; r < end; ++r) {
            const double inv = rstd[r];
            p += double(dy.row(r)[j]) * x.row(r)[j] * inv;
        }
        partial[i] = p;
    }
};

/// dweight[j] += the chunks' partials of column j, summed in chunk order.
struct DweightColumn {
    const double* partial;
    float* dweight;
    index_t chunks, n;
    MOONMOE_HD void operator()(index_t j) const {
        double s = 0.0;
        for (index_t k = 0; k < chunks; ++k) s += partial[k * n + j];
        dweight[j] += float(s);
    }
};

/// Row t of both cross-entropies: its loss (0 when ignored) into per_row[t], and its gradient row when dz.data is
/// set, scaled by weights[t] (token_cross_entropy) or by 1 / count without weights (cross_entropy).
struct CrossEntropyRow {
    Rows<const float> z;
    const index_t* targets;
    index_t ignore, count, V;
    const float* weights;
    Rows<float> dz;
    double* per_row;
    MOONMOE_HD void operator()(index_t t) const {
        const float* zr = z.row(t);
        float* dr = dz.data ? dz.row(t) : nullptr;
        const index_t target = targets[t];
        if (target == ignore) {
            per_row[t] = 0.0;
            if (dr)
                for (index_t v = 0; v < V; ++v) dr[v] = 0.0f;
            return;
        }
        float m = zr[0];
        for (index_t v = 1; v < V; ++v) m = zr[v] > m ? zr[v] : m;
        double sum = 0.0;
        for (index_t v = 0; v < V; ++v) sum += ::exp(double(zr[v] - m));
        const double lse = double(m) + ::log(sum);
        per_row[t] = lse - double(zr[target]);
        if (!dr) return;
        if (weights) {
            const double w = weights[t];
            for (index_t v = 0; v < V; ++v) dr[v] = float(::exp(double(zr[v]) - lse) * w);
            dr[target] = float((::exp(double(zr[target]) - lse) - 1.0) * w);
        } else {
            for (index_t v = 0; v < V; ++v) dr[v] = float(::exp(double(zr[v]) - lse) / double(count));
            dr[target] -= 1.0f / float(count);
        }
    }
};

/// loss[0] = the rows' losses summed in row order, over count: one thread, so the order is the CPU's.
struct CrossEntropyTotal {
    const double* per_row;
    float* loss;
    index_t rows, count;
    MOONMOE_HD void operator()(index_t) const {
        double total = 0.0;
        for (index_t t = 0; t < rows; ++t) total += per_row[t];
        loss[0] = count ? float(total / double(count)) : 0.0f;
    }
};

/// nll[t] = the row's loss, rounded to float.
struct RoundRows {
    const double* per_row;
    float* nll;
    MOONMOE_HD void operator()(index_t t) const { nll[t] = float(per_row[t]); }
};

/// out[t, j] = table[ids[t], j] for the flat index of out.
struct GatherElement {
    Rows<const float> table;
    const index_t* ids;
    Rows<float> out;
    index_t cols;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t t = k / cols, j = k % cols;
        out.row(t)[j] = table.row(ids[t])[j];
    }
};

/// Column j of dtable: dy[t, j] added into row ids[t] for t in order. One thread owns a column, so repeated ids
/// add in token order without atomics.
struct ScatterAddColumn {
    Rows<const float> dy;
    const index_t* ids;
    Rows<float> dtable;
    index_t tokens;
    MOONMOE_HD void operator()(index_t j) const {
        for (index_t t = 0; t < tokens; ++t) dtable.row(ids[t])[j] += dy.row(t)[j];
    }
};

/// y[t, j] = sum over h in order of x[t, h, j] (f32), for the flat index of y.
struct SumHeadsElement {
    const float* x;
    index_t x_row, x_head;  // strides of x's first two dimensions
    Rows<float> y;
    index_t heads, n;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t t = k / n, j = k % n;
        float s = 0.0f;
        for (index_t h = 0; h < heads; ++h) s += x[t * x_row + h * x_head + j];
        y.row(t)[j] = s;
    }
};

}  // namespace cuda_rows_detail

template <>
struct RowOps<cuda> {
    /// y = weight * x * rstd per row; rstd[r] = 1 / sqrt(mean(x[r]^2) + eps), the sum of squares in double.
    static void rmsnorm_forward(View<const float, 2, cuda> x, View<const float, 1, cuda> weight, float eps,
                                View<float, 2, cuda> y, View<float, 1, cuda> rstd) {
        using namespace cuda_rows_detail;
        const index_t rows = x.shape[0], n = x.shape[1];
        contract::check_rmsnorm_forward(x, weight, y, rstd);
#if !MOONMOE_CUDA_EMULATED
        if (cuda_fast_kernels().rmsnorm) return cuda_fast::rmsnorm_forward(x, weight, eps, y, rstd);
#endif
        cuda_detail::launch(rows, RmsNormForwardRow{rows_of(x), weight.data, eps, rows_of(y), rstd.data, n});
    }

    /// dx = rstd g - x rstd^3 mean(g x), g = weight * dy (+= when accumulate_dx); dweight += sum_rows dy x rstd,
    /// over the CPU's fixed 64-row chunks (a backend scratch of [chunks, n] doubles) summed in order.
    static void rmsnorm_backward(View<const float, 2, cuda> x, View<const float, 1, cuda> weight,
                                 View<const float, 1, cuda> rstd, View<const float, 2, cuda> dy,
                                 View<float, 2, cuda> dx, View<float, 1, cuda> dweight, bool accumulate_dx) {
        using namespace cuda_rows_detail;
        const index_t rows = x.shape[0], n = x.shape[1];
        contract::check_rmsnorm_backward(x, weight, rstd, dy, dx, dweight);
#if !MOONMOE_CUDA_EMULATED
        if (cuda_fast_kernels().rmsnorm) cuda_fast::rmsnorm_backward_dx(x, weight, rstd, dy, dx, accumulate_dx);
        else
#endif
            cuda_detail::launch(rows, RmsNormBackwardRow{rows_of(x), weight.data, rstd.data, rows_of(dy), rows_of(dx),
                                                         n, accumulate_dx});
        constexpr index_t chunk_rows = 64;  // RowOps<cpu>'s chunking, so the sums are the CPU's
        const index_t chunks = (rows + chunk_rows - 1) / chunk_rows;
        // Stream-ordered: released after the kernels below are queued, reused only by later work on the stream.
        Tensor<double, 1, cuda> partial({chunks * n});
        cuda_detail::launch(chunks * n,
                            DweightChunk{rows_of(x), rows_of(dy), rstd.data, partial.data(), rows, n, chunk_rows});
        cuda_detail::launch(n,
                            DweightColumn{partial.data(), dweight.data, chunks, n});  // adds 0 when no rows, as the CPU
    }

    /// loss[0] = mean over the targets other than `ignore` of logsumexp(z) - z[target] (double); dlogits =
    /// (softmax - onehot) / count. The per-row losses go to a backend scratch and one thread sums them in row order.
    static void cross_entropy(View<const float, 2, cuda> logits, View<const index_t, 1, cuda> targets, index_t ignore,
                              index_t count, View<float, 1, cuda> loss, View<float, 2, cuda> dlogits) {
        using namespace cuda_rows_detail;
        contract::check_cross_entropy(logits, targets, loss, dlogits);
        Tensor<double, 1, cuda> per_row({logits.shape[0]});
        cross_entropy_rows(logits, targets.data, ignore, count, nullptr, dlogits, per_row.data());
        cuda_detail::launch(1, CrossEntropyTotal{per_row.data(), loss.data, logits.shape[0], count});
    }

    /// nll[t] = logsumexp(z_t) - z_t[target] (double, rounded); dlogits[t] = weights[t] (softmax - onehot).
    static void token_cross_entropy(View<const float, 2, cuda> logits, View<const index_t, 1, cuda> targets,
                                    index_t ignore, View<const float, 1, cuda> weights, View<float, 1, cuda> nll,
                                    View<float, 2, cuda> dlogits) {
        using namespace cuda_rows_detail;
        contract::check_token_cross_entropy(logits, targets, weights, nll, dlogits);
        const index_t T = logits.shape[0];
        if (T == 0) return;
        Tensor<double, 1, cuda> per_row({T});
        cross_entropy_rows(logits, targets.data, ignore, 0, dlogits.data ? weights.data : nullptr, dlogits,
                           per_row.data());
        cuda_detail::launch(T, RoundRows{per_row.data(), nll.data});
    }

private:
    /// Both cross-entropies' rows (CrossEntropyRow; a block per row under nvcc).
    static void cross_entropy_rows(View<const float, 2, cuda> logits, const index_t* targets, index_t ignore,
                                   index_t count, const float* weights, View<float, 2, cuda> dlogits, double* per_row) {
        using namespace cuda_rows_detail;
        const index_t T = logits.shape[0], V = logits.shape[1];
        const Rows<float> dz = dlogits.data ? rows_of(dlogits) : Rows<float>{nullptr, 0};
#if MOONMOE_CUDA_EMULATED
        cuda_detail::launch(T, CrossEntropyRow{rows_of(logits), targets, ignore, count, V, weights, dz, per_row});
#else
        cuda_detail::cross_entropy_rows(logits.data, logits.strides[0], targets, ignore, count, weights, T, V, dz.data,
                                        dz.data ? dz.pitch : 0, per_row);
#endif
    }

public:
    /// out[t] = table[ids[t]] (ids checked by the caller); one thread per element of out.
    static void embedding_gather(View<const float, 2, cuda> table, View<const index_t, 1, cuda> ids,
                                 View<float, 2, cuda> out) {
        using namespace cuda_rows_detail;
        contract::check_embedding_gather(table, ids, out);
        contract::require_unit_columns("embedding_gather", "table", table);
        contract::require_unit_columns("embedding_gather", "out", out);
        const index_t cols = out.shape[1];
        if (cols == 0) return;
        cuda_detail::launch(out.shape[0] * cols, GatherElement{rows_of(table), ids.data, rows_of(out), cols});
    }

    /// dtable[ids[t]] += dy[t]; one thread per column adds the tokens in order, so repeated ids give the CPU's sums.
    static void embedding_scatter_add(View<const float, 2, cuda> dy, View<const index_t, 1, cuda> ids,
                                      View<float, 2, cuda> dtable) {
        using namespace cuda_rows_detail;
        contract::check_embedding_scatter_add(dy, ids, dtable);
        contract::require_unit_columns("embedding_scatter_add", "dy", dy);
        contract::require_unit_columns("embedding_scatter_add", "dtable", dtable);
        cuda_detail::launch(dy.shape[1], ScatterAddColumn{rows_of(dy), ids.data, rows_of(dtable), dy.shape[0]});
    }

    /// y[t, j] = sum over heads h, in order, of x[t, h, j] (f32); one thread per element of y.
    static void sum_heads(View<const float, 3, cuda> x, View<float, 2, cuda> y) {
        const index_t rows = x.shape[0], heads = x.shape[1], n = x.shape[2];
        contract::check_sum_heads(x, y);
        if (n == 0) return;
        cuda_detail::launch(rows * n, cuda_rows_detail::SumHeadsElement{x.data, x.strides[0], x.strides[1],
                                                                        cuda_rows_detail::rows_of(y), heads, n});
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
