// moonmoe/backend/cuda/optim.hpp: OptimOps<cuda> (backend/optim.hpp): reductions, finite checks, scaled copies,
// row scaling and the AdamW step on the device.
//
// Element-wise primitives (scaled_copy, scale_rows, adamw_update) are one thrust::for_each over the flat index, as in
// cuda/map.hpp, and reproduce the CPU's arithmetic per element: scaled_copy and scale_rows are bitwise the CPU's;
// adamw_update agrees to rounding (below). The reductions (sum_squares, first_nonfinite) leave their result on the
// device: under nvcc cub::DeviceReduce::TransformReduce on the current stream (no host wait), in the emulated mode
// thrust::transform_reduce on OpenMP, the portable reference of the same transform and operator.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cfloat>
#include <cmath>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#if MOONMOE_CUDA_EMULATED
#include <thrust/execution_policy.h>
#include <thrust/transform_reduce.h>
#else
#include <cub/device/device_reduce.cuh>
#endif

#include "../../tensor/tensor.hpp"
#include "../../tensor/transfer.hpp"
#include "../functors.hpp"
#include "../optim.hpp"

namespace moonmoe::backend {

namespace cuda_detail {

/// out[0] = init op f(0) op f(1) ... op f(count - 1), written on the device and ordered on the current stream;
/// out[0] = init when count is 0. The order of the operations is the reduction's (a tree), not a loop's.
template <class R, class F, class Op>
void reduce_into(R* out, index_t count, const F& f, Op op, R init) {
#if MOONMOE_CUDA_EMULATED
    // Device memory is host memory here, and Thrust's OpenMP reduction returns when the value is there.
    *out = thrust::transform_reduce(thrust::device, thrust::counting_iterator<index_t>(0),
                                    thrust::counting_iterator<index_t>(count), f, init, op);
#else
    const thrust::counting_iterator<index_t> first(0);
    std::size_t bytes = 0;
    MOONMOE_CUDA_CHECK(
        cub::DeviceReduce::TransformReduce(nullptr, bytes, first, out, count, op, f, init, current_stream()));
    // Stream-ordered scratch: freed after the reduction on the same stream, from the pool (no device-wide sync).
    // At least one byte: a null scratch pointer would make the second call another size query.
    Tensor<unsigned char, 1, cuda> scratch({index_t(bytes > 0 ? bytes : 1)});
    MOONMOE_CUDA_CHECK(
        cub::DeviceReduce::TransformReduce(scratch.data(), bytes, first, out, count, op, f, init, current_stream()));
#endif
}

/// double(x[i, j])^2 for the flat index k = i * cols + j of a 2-D view.
template <class T>
struct SquareAt {
    Strided<const T> x;
    index_t cols;
    MOONMOE_HD double operator()(index_t k) const {
        const double v = double(x.data[(k / cols) * x.pitch + (k % cols) * x.step]);
        return v * v;
    }
};

/// True for a NaN or an infinity. A comparison, not std::isfinite or std::bit_cast, so the same code compiles for
/// the device without relaxed constexpr; correct without -ffast-math (which neither build uses).
MOONMOE_HD inline bool nonfinite(float x) { return !(fabsf(x) <= FLT_MAX); }

/// One view of a list, as the list kernels see it: the views laid end to end, this one ends at flat index `end`.
struct ListItem {
    const float* data;
    index_t end;
};

/// The item of a list laid end to end that holds flat index k (items[i].end: where item i ends): the first whose
/// end exceeds k, by binary search (an empty item ends where the previous one does, so it is never chosen).
template <class Item>
MOONMOE_HD index_t item_holding(const Item* items, index_t count, index_t k) {
    index_t lo = 0, hi = count - 1;
    while (lo < hi) {
        const index_t mid = lo + (hi - lo) / 2;
        if (items[mid].end > k) hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/// The list's views on the device (one small host-to-device copy, which waits for the current stream: see
/// first_nonfinite), and their total element count. Views must be contiguous, as on the CPU.
inline Tensor<ListItem, 1, cuda> list_items(std::span<const View<const float, 1, cuda>> xs, index_t& total) {
    std::vector<ListItem> items;
    items.reserve(xs.size());
    total = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
        contract::require_list_view(i, xs[i]);
        total += xs[i].shape[0];
        items.push_back({xs[i].data, total});
    }
    return to_device<cuda>(items);
}

/// For the flat index k of a list: the number of the view holding k (item_holding) when that element is a NaN or
/// an infinity, else the view count (the min-reduction's identity).
struct NonfiniteViewAt {
    const ListItem* items;
    index_t count;
    MOONMOE_HD index_t operator()(index_t k) const {
        const index_t i = item_holding(items, count, k);
        return nonfinite(items[i].data[k - (i == 0 ? 0 : items[i - 1].end)]) ? i : count;
    }
};

/// first_unsafe_update's items on the device: each UpdateItem, ending at flat index `end` of the items laid end to
/// end.
struct UpdateListItem {
    UpdateItem item;
    index_t end;
};

/// For the flat index k of the items: the number of the item holding k (item_holding) when its step fails the
/// check there, else the item count.
struct UnsafeUpdateAt {
    fn::UpdateStaysFinite f;
    const UpdateListItem* items;
    index_t count;
    MOONMOE_HD index_t operator()(index_t k) const {
        const index_t n = item_holding(items, count, k);
        const UpdateItem& it = items[n].item;
        const index_t i = k - (n == 0 ? 0 : items[n - 1].end);
        const bool ok =
            it.v ? f.adamw_ok(it.w[i], it.g[i], it.m[i], it.v[i]) : f.muon_ok(it.muon_step, it.w[i], it.g[i], it.m[i]);
        return ok ? count : n;
    }
};

/// dst(r, c) = factor[0] * src(r, c), or factor[0] * src(c, r) when transposed, for the flat index of dst (coalesced
/// writes; the transposed reads go down src's columns, as in TransposeKernel). The factor is read on the device.
template <class T>
struct ScaledCopyKernel {
    Strided<const T> src;
    Strided<T> dst;
    const T* factor;
    index_t cols;  // of dst
    bool transposed;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t r = k / cols, c = k % cols;
        const T s = transposed ? src.data[c * src.pitch + r * src.step] : src.data[r * src.pitch + c * src.step];
        dst.data[r * dst.pitch + c * dst.step] = s * factor[0];
    }
};

/// w(r, c) *= factors[r] for the flat index of w, unless that factor is exactly 1 (then w(r, c) is not written).
struct ScaleRowsKernel {
    Strided<float> w;
    const float* factors;
    index_t factor_step, cols;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t r = k / cols, c = k % cols;
        const float f = factors[r * factor_step];
        if (f != 1.0f) w.data[r * w.pitch + c * w.step] *= f;
    }
};

/// fn::AdamWUpdate on element k of contiguous views.
struct AdamWKernel {
    fn::AdamWUpdate f;
    float* w;
    const float* g;
    float* m;
    float* v;
    MOONMOE_HD void operator()(index_t k) const { f(w[k], m[k], v[k], g[k]); }
};

}  // namespace cuda_detail

template <>
struct OptimOps<cuda> {
    /// out[0] = sum of x^2 in double, as a reduction tree: the order differs from the CPU's row-major loop, so the
    /// result agrees with the CPU's to double rounding (about n * 1e-16 relative at worst), not bitwise. Run to run
    /// it is the same on one GPU (CUB's reduction is deterministic). One thread per element reading across the
    /// pitch: already coalesced along rows.
    template <class T = float>
    static void sum_squares(View<const std::type_identity_t<T>, 2, cuda> x, View<double, 1, cuda> out) {
        contract::require_one("sum_squares: the result", out);
        const index_t count = x.shape[0] * x.shape[1];
        cuda_detail::reduce_into(out.data, count, cuda_detail::SquareAt<T>{cuda_detail::strided(x), x.shape[1]},
                                 thrust::plus<double>{}, 0.0);
    }
    template <class T = float>
    static Tensor<double, 1, cuda> sum_squares(View<const std::type_identity_t<T>, 2, cuda> x) {
        Tensor<double, 1, cuda> out({1});
        sum_squares<T>(x, out.view());
        return out;
    }

    /// dst = factor[0] * op(src), one thread per element of dst; bitwise the CPU's (the same single product).
    template <class T = float>
    static void scaled_copy(Trans t, View<const std::type_identity_t<T>, 2, cuda> src,
                            View<const std::type_identity_t<T>, 1, cuda> factor,
                            View<std::type_identity_t<T>, 2, cuda> dst) {
        contract::check_scaled_copy<T>(t, src, factor, dst);
        const bool transposed = t == Trans::yes;
        if (dst.shape[0] == 0 || dst.shape[1] == 0) return;
        cuda_detail::launch(dst.shape[0] * dst.shape[1],
                            cuda_detail::ScaledCopyKernel<T>{cuda_detail::strided(src), cuda_detail::strided(dst),
                                                             factor.data, dst.shape[1], transposed});
    }

    /// out[0] = the lowest i whose xs[i] holds a NaN or an infinity, or xs.size(): a min-reduction over every
    /// element of every view of (bad ? view number : view count), so the lowest bad view whatever the order, and
    /// no early exit (a clean step, the common case, reads everything on the CPU too). The views' pointers and
    /// ends are copied to the device first; that copy waits for the current stream, which costs nothing extra in
    /// the optimizer, whose next act is to read out[0] on the host. A faster kernel would give each block a tile
    /// of one view (no search per element) and vote per warp; this one is bound by the reads already.
    static void first_nonfinite(std::span<const View<const float, 1, cuda>> xs, View<index_t, 1, cuda> out) {
        contract::require_one("first_nonfinite: the result", out);
        index_t total = 0;
        const Tensor<cuda_detail::ListItem, 1, cuda> items = cuda_detail::list_items(xs, total);
        const index_t count = index_t(xs.size());
        cuda_detail::reduce_into(out.data, total, cuda_detail::NonfiniteViewAt{items.data(), count},
                                 thrust::minimum<index_t>{}, count);
    }

    /// The same min-reduction as first_nonfinite, of (the step fails here ? item number : item count), after one
    /// upload of the items (which waits for the current stream, as first_nonfinite's does).
    static void first_unsafe_update(const fn::UpdateStaysFinite& f, std::span<const UpdateItem> items,
                                    View<index_t, 1, cuda> out) {
        contract::require_one("first_unsafe_update: the result", out);
        std::vector<cuda_detail::UpdateListItem> list;
        index_t total = 0;
        for (const UpdateItem& it : items) list.push_back({it, total += it.n});
        const index_t count = index_t(items.size());
        if (count == 0)
            return cuda_detail::reduce_into(out.data, 0, cuda_detail::UnsafeUpdateAt{f, nullptr, 0},
                                            thrust::minimum<index_t>{}, count);
        const Tensor<cuda_detail::UpdateListItem, 1, cuda> on_device = to_device<cuda>(list);
        cuda_detail::reduce_into(out.data, total, cuda_detail::UnsafeUpdateAt{f, on_device.data(), count},
                                 thrust::minimum<index_t>{}, count);
    }

    /// Every element of every view = 0: one stream-ordered memset per view (no host wait, no descriptor upload).
    static void zero_all(std::span<const View<float, 1, cuda>> xs) {
        for (std::size_t i = 0; i < xs.size(); ++i) {
            contract::require_list_view(i, xs[i]);
            Memory<cuda>::fill_zero(xs[i].data, std::size_t(xs[i].shape[0]) * sizeof(float));
        }
    }

    /// Row r of w *= factors[r], one thread per element; rows whose factor is exactly 1 are left unwritten.
    /// Bitwise the CPU's.
    static void scale_rows(View<float, 2, cuda> w, View<const float, 1, cuda> factors) {
        contract::check_scale_rows(w, factors);
        if (w.shape[0] == 0 || w.shape[1] == 0) return;
        cuda_detail::launch(w.shape[0] * w.shape[1], cuda_detail::ScaleRowsKernel{cuda_detail::strided(w), factors.data,
                                                                                  factors.strides[0], w.shape[1]});
    }

    /// fn::AdamWUpdate on every element, one thread each. The operations and their order are the CPU's, but not
    /// bitwise: nvcc contracts products and sums into FMAs, and the CPU's Eigen expressions use FMAs and a
    /// vectorised sqrt of their own on AVX-512. Tolerance against the CPU: m and v within 2 float ulps, w within
    /// 5e-7 * (|w| + |step m / (sqrt(v) / root2 + eps)|), i.e. a few ulps of the larger term (the difference is in
    /// the update's rounding, so a w near 0 may differ by more ulps of its own). Measured on 1e6 elements in the
    /// emulated mode at -O2 -march=native (AVX-512): m equal, v 1 ulp, w 1.8e-7 of that bound.
    static void adamw_update(const fn::AdamWUpdate& f, View<float, 1, cuda> w, View<const float, 1, cuda> g,
                             View<float, 1, cuda> m, View<float, 1, cuda> v) {
        contract::check_adamw_update(w, g, m, v);
        cuda_detail::launch(g.shape[0], cuda_detail::AdamWKernel{f, w.data, g.data, m.data, v.data});
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
