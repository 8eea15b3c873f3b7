// moonmoe/backend/map.hpp: element-wise work over named functors (backend/functors.hpp), copies and fills.
//
// MapOps<B>:
//   map(f, v0, v1, ...)          f(v0[i, j], v1[i, j], ...) for every element of equally shaped 2-D views (any
//                                element types; rows contiguous, any row pitch); a non-const view's element is
//                                passed by reference, a const one's by value
//   map_indexed(f, v0, ...)      f(i, j, v0[i, j], ...): for functors that read per-row or per-column data
//   fill<T>(dst, value)          dst[:] = value
//   copy<T>(src, dst)            same shape, any row pitches
//   transpose<T>(src, dst)       dst [n, m] = src [m, n]^T
//   cast<To, From>(src, dst)     dst = convert<To>(src) (numeric/bf16.hpp), same shape, any row pitches: f32 -> bf16
//                                rounds to nearest even (NaN stays NaN, inf stays inf), bf16 -> f32 is exact; also
//                                f32 <-> f64 and bf16 <-> f64 (through f32)
// Each element is computed on its own, so results never depend on the thread or block split.
#pragma once

#include <string>
#include <type_traits>

#include "../numeric/bf16.hpp"
#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct MapOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no element-wise primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// The argument checks every backend's MapOps runs before touching data (shapes only), so both backends reject
/// the same calls with the same messages.
namespace contract {

/// Every view has the first one's shape.
template <class First, class... Rest>
void require_same_shapes([[maybe_unused]] const char* op, const First& first, const Rest&... rest) {
    ((rest.shape == first.shape ? void() : throw_shape_mismatch(op, first.shape, rest.shape)), ...);
}

/// dst [n, m] for src [m, n]; `op` names the caller.
template <class S, class D>
void check_transposed(const char* op, const S& src, const D& dst) {
    if (dst.shape[0] != src.shape[1] || dst.shape[1] != src.shape[0])
        throw shape_error(std::string(op) + ": " + shape_string(src.shape) + " into " + shape_string(dst.shape));
}

/// The element types cast converts between: float, double and bf16.
template <class T>
inline constexpr bool castable = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, bf16>;

}  // namespace contract

}  // namespace moonmoe::backend
