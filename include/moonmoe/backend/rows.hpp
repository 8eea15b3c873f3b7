// moonmoe/backend/rows.hpp: the row kernels (RMSNorm, cross-entropy, per-row reductions, embedding rows) primitives.
// Every primitive works on whole rows of row-major 2-D views (unit column stride, any row pitch); 1-D views are
// contiguous. Per-row statistics are backend tensors.
//
// RowOps<B>:
//   rmsnorm_forward(x, weight, eps, y, rstd)
//                                y[r] = weight * x[r] * rstd[r], rstd[r] = 1 / sqrt(mean(x[r]^2) + eps): x, y
//                                [rows, n], weight [n], rstd [rows]; the sum of squares in double
//   rmsnorm_backward(x, weight, rstd, dy, dx, dweight, accumulate_dx)
//                                dx = rstd g - x rstd^3 mean(g x) with g = weight * dy (written, or added when
//                                accumulate_dx); dweight += sum over rows of dy * x * rstd, in double over fixed
//                                64-row chunks summed in order (repeatable for any thread count)
//   cross_entropy(logits, targets, ignore, count, loss, dlogits)
//                                loss[0] = sum over rows with targets[r] != ignore of (logsumexp(z_r) -
//                                z_r[target]) / count, in double, rows summed in order; dlogits = (softmax(z_r) -
//                                onehot) / count, zero rows for ignored targets (skipped when dlogits.data is
//                                null). logits [rows, V], targets [rows] in [0, V) or ignore (checked by the
//                                caller, who also counts them), loss [1]
//   token_cross_entropy(logits, targets, ignore, weights, nll, dlogits)
//                                per row: nll[r] = logsumexp(z_r) - z_r[target] (in double, rounded to f32; 0 for
//                                ignored rows), i.e. minus the row's log-probability of its target; when dlogits.data
//                                is set, dlogits[r] = weights[r] (softmax(z_r) - onehot), zero rows for ignored
//                                targets. weights [rows] (may be empty without dlogits), nll [rows]. The loss of any
//                                per-token weighting (a policy gradient's log pi is -nll, its gradient weights -g)
//   embedding_gather(table, ids, out)
//                                out[t] = table[ids[t]]: table [V, n], ids [rows] in [0, V), out [rows, n]
//   embedding_scatter_add(dy, ids, dtable)
//                                dtable[ids[t]] += dy[t], tokens in order for every element (repeatable sums)
//   sum_heads(x, y)              y[t, j] = sum over h in order of x[t, h, j] (f32): x [rows, heads, n] (unit last
//                                stride), y [rows, n]; MLA's shared rope key gradient
#pragma once

#include <string>

#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RowOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no rows primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// The argument checks every backend's RowOps runs before touching data (shapes and strides only), so both
/// backends reject the same calls with the same messages.
namespace contract {

template <class T, class B>
void require_vector(const char* op, const char* name, const View<T, 1, B>& v, index_t n) {
    if (v.shape[0] != n || (n > 1 && v.strides[0] != 1))
        throw shape_error(std::string(op) + ": " + name + " is " + shape_string(v.shape) +
                          (v.shape[0] == n ? " (strided)" : "") + ", expected [" + std::to_string(n) + "] contiguous");
}

template <class T, class B>
void require_unit_columns(const char* op, const char* name, const View<T, 2, B>& v) {
    if (v.strides[1] != 1 && v.shape[1] > 1)
        throw shape_error(std::string(op) + ": " + name + " " + shape_string(v.shape) + " must have contiguous rows");
}

template <class B>
void check_rmsnorm_forward(const View<const float, 2, B>& x, const View<const float, 1, B>& weight,
                           const View<float, 2, B>& y, const View<float, 1, B>& rstd) {
    if (y.shape != x.shape) throw_shape_mismatch("rmsnorm_forward: x against y", x.shape, y.shape);
    require_unit_columns("rmsnorm_forward", "x", x);
    require_unit_columns("rmsnorm_forward", "y", y);
    require_vector("rmsnorm_forward", "weight", weight, x.shape[1]);
    require_vector("rmsnorm_forward", "rstd", rstd, x.shape[0]);
}

template <class B>
void check_rmsnorm_backward(const View<const float, 2, B>& x, const View<const float, 1, B>& weight,
                            const View<const float, 1, B>& rstd, const View<const float, 2, B>& dy,
                            const View<float, 2, B>& dx, const View<float, 1, B>& dweight) {
    if (dy.shape != x.shape) throw_shape_mismatch("rmsnorm_backward: x against dy", x.shape, dy.shape);
    if (dx.shape != x.shape) throw_shape_mismatch("rmsnorm_backward: x against dx", x.shape, dx.shape);
    require_unit_columns("rmsnorm_backward", "x", x);
    require_unit_columns("rmsnorm_backward", "dy", dy);
    require_unit_columns("rmsnorm_backward", "dx", dx);
    require_vector("rmsnorm_backward", "weight", weight, x.shape[1]);
    require_vector("rmsnorm_backward", "dweight", dweight, x.shape[1]);
    require_vector("rmsnorm_backward", "rstd", rstd, x.shape[0]);
}

template <class B>
void check_cross_entropy(const View<const float, 2, B>& logits, const View<const index_t, 1, B>& targets,
                         const View<float, 1, B>& loss, const View<float, 2, B>& dlogits) {
    require_unit_columns("cross_entropy", "logits", logits);
    require_vector("cross_entropy", "targets", targets, logits.shape[0]);
    require_vector("cross_entropy", "loss", loss, 1);
    if (dlogits.data) {
        if (dlogits.shape != logits.shape)
            throw_shape_mismatch("cross_entropy: logits against dlogits", logits.shape, dlogits.shape);
        require_unit_columns("cross_entropy", "dlogits", dlogits);
    }
}

template <class B>
void check_token_cross_entropy(const View<const float, 2, B>& logits, const View<const index_t, 1, B>& targets,
                               const View<const float, 1, B>& weights, const View<float, 1, B>& nll,
                               const View<float, 2, B>& dlogits) {
    require_unit_columns("token_cross_entropy", "logits", logits);
    require_vector("token_cross_entropy", "targets", targets, logits.shape[0]);
    require_vector("token_cross_entropy", "nll", nll, logits.shape[0]);
    if (dlogits.data) {
        if (dlogits.shape != logits.shape)
            throw_shape_mismatch("token_cross_entropy: logits against dlogits", logits.shape, dlogits.shape);
        require_unit_columns("token_cross_entropy", "dlogits", dlogits);
        require_vector("token_cross_entropy", "weights", weights, logits.shape[0]);
    }
}

template <class B>
void check_embedding_gather(const View<const float, 2, B>& table, const View<const index_t, 1, B>& ids,
                            const View<float, 2, B>& out) {
    if (table.shape[1] != out.shape[1])
        throw_shape_mismatch("embedding_gather: table against out", table.shape, out.shape);
    require_vector("embedding_gather", "ids", ids, out.shape[0]);
}

template <class B>
void check_embedding_scatter_add(const View<const float, 2, B>& dy, const View<const index_t, 1, B>& ids,
                                 const View<float, 2, B>& dtable) {
    if (dy.shape[1] != dtable.shape[1])
        throw_shape_mismatch("embedding_scatter_add: dy against dtable", dy.shape, dtable.shape);
    require_vector("embedding_scatter_add", "ids", ids, dy.shape[0]);
}

template <class B>
void check_sum_heads(const View<const float, 3, B>& x, const View<float, 2, B>& y) {
    const index_t rows = x.shape[0], n = x.shape[2];
    if (y.shape[0] != rows || y.shape[1] != n || (n > 1 && (x.strides[2] != 1 || y.strides[1] != 1)))
        throw shape_error("sum_heads: x " + shape_string(x.shape) + " into y " + shape_string(y.shape) +
                          " (expected [rows, n] = [" + std::to_string(rows) + ", " + std::to_string(n) +
                          "], unit last strides)");
}

}  // namespace contract

}  // namespace moonmoe::backend
