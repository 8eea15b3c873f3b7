// moonmoe/backend/backend.hpp: the primitives every backend provides, as primary templates that only fail.
//
// Each backend specialises these in its own folder (backend/cpu/, backend/cuda/). Using a backend whose header
// was not included stops at a static_assert that names the header, instead of at a link error.
#pragma once

#include <cstddef>

#include "../config/backend.hpp"

namespace moonmoe::backend {

template <class B>
inline constexpr bool missing_backend = false;

/// Whether a GEMM operand is used as stored or transposed.
enum class Trans : bool { no = false, yes = true };

/// Memory: allocate(bytes) (64-byte aligned, zeroed) / release(pointer), copies between host and backend.
template <class B>
struct Memory {
    static_assert(missing_backend<B>, "moonmoe: no memory primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// Compute primitives: gemm (plain, transposed, batched), parallel loops for element-wise and row kernels,
/// softmax, top-k, gather / scatter-add, RNG.
template <class B>
struct Ops {
    static_assert(missing_backend<B>, "moonmoe: no compute primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
