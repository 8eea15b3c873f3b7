// moonmoe/backend/optim.hpp: the optimizer (reductions, finite checks, QK-Clip row scaling) primitives.
//
// OptimOps<B>:
//   sum_squares<T>(x, out)                 out[0] = sum of x[i, j]^2 over a 2-D view, accumulated in double
//   sum_squares<T>(x) -> Tensor<double, 1, B>
//                                          the same into a new one-element tensor
//   scaled_copy<T>(t, src, factor, dst)    dst = factor[0] * op(src), op a transpose when t is Trans::yes; the
//                                          factor is a one-element backend tensor, so a scale computed on the
//                                          backend (Newton-Schulz's 1 / ||G||) never crosses to the host
//   first_nonfinite(xs, out)               out[0] = the lowest i such that xs[i] holds a NaN or an infinity, or
//                                          xs.size() when none does (the optimizer's skip test); xs a list of
//                                          1-D views, index_t result
//   zero_all(xs)                           every element of every 1-D view in xs = 0, in one pass (many small
//                                          gradients and a few large ones keep the threads equally busy)
//   scale_rows(w, factors)                 row r of w *= factors[r]; a row whose factor is exactly 1 is not written
//                                          (QK-Clip: heads at or below tau stay bit for bit)
//   adamw_update(f, w, g, m, v)            fn::AdamWUpdate f on every element of the 1-D views (w, m, v, g)
// T is float or double. Shapes are checked and named on a mismatch.
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct OptimOps {
    static_assert(missing_backend<B>, "moonmoe: no optim primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
