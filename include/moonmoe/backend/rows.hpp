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
//   embedding_gather(table, ids, out)
//                                out[t] = table[ids[t]]: table [V, n], ids [rows] in [0, V), out [rows, n]
//   embedding_scatter_add(dy, ids, dtable)
//                                dtable[ids[t]] += dy[t], tokens in order for every element (repeatable sums)
//   sum_heads(x, y)              y[t, j] = sum over h in order of x[t, h, j] (f32): x [rows, heads, n] (unit last
//                                stride), y [rows, n]; MLA's shared rope key gradient
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RowOps {
    static_assert(missing_backend<B>, "moonmoe: no rows primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
