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
//   first_unsafe_update(f, items, out)     out[0] = the lowest i such that the step of items[i] (an UpdateItem:
//                                          AdamW where it has v, else Muon) fails fn::UpdateStaysFinite f at some
//                                          element, or items.size(): the optimizer's pre-check, nothing written
// T is float or double. Shapes are checked and named on a mismatch.
#pragma once

#include <cstddef>
#include <string>

#include "../tensor/tensor.hpp"
#include "blas.hpp"
#include "map.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct OptimOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no optim primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// One parameter in first_unsafe_update: its values w, gradient g and state (m, and v for AdamW; v null for Muon,
/// whose weight step, lr times the update scale, is muon_step), n contiguous elements each in backend memory.
struct UpdateItem {
    const float *w, *g, *m, *v;
    index_t n;
    float muon_step;
};

/// The argument checks every backend's OptimOps runs before touching data (shapes and strides only), so both
/// backends reject the same calls with the same messages.
namespace contract {

/// View i of a list primitive's list: contiguous.
template <class V>
void require_list_view(std::size_t i, const V& v) {
    if (!v.contiguous()) throw shape_error("optim list: view " + std::to_string(i) + " is strided");
}

/// A one-element result or factor [1]; `what` names it in the message ("sum_squares: the result").
template <class V>
void require_one(const char* what, const V& v) {
    if (v.shape[0] != 1) throw shape_error(std::string(what) + " is " + shape_string(v.shape) + ", not [1]");
}

template <class T, class B>
void check_scaled_copy(Trans t, const View<const T, 2, B>& src, const View<const T, 1, B>& factor,
                       const View<T, 2, B>& dst) {
    require_one("scaled_copy: the factor", factor);
    if (t == Trans::no) require_same_shapes("scaled_copy", src, dst);
    else
        check_transposed("scaled_copy (transposed)", src, dst);
}

template <class B>
void check_scale_rows(const View<float, 2, B>& w, const View<const float, 1, B>& factors) {
    if (factors.shape[0] != w.shape[0])
        throw shape_error("scale_rows: " + shape_string(factors.shape) + " factors for the rows of " +
                          shape_string(w.shape));
}

template <class B>
void check_adamw_update(const View<float, 1, B>& w, const View<const float, 1, B>& g, const View<float, 1, B>& m,
                        const View<float, 1, B>& v) {
    for (const auto* x : {&w.shape, &m.shape, &v.shape})
        if (*x != g.shape) throw_shape_mismatch("adamw_update: state against gradient", *x, g.shape);
    if (!w.contiguous() || !g.contiguous() || !m.contiguous() || !v.contiguous())
        throw shape_error("adamw_update: the views must be contiguous");
}

}  // namespace contract

}  // namespace moonmoe::backend
