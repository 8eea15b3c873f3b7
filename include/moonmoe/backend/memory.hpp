// moonmoe/backend/memory.hpp: where a backend keeps tensors, and the only ways data crosses to and from the host.
//
// Memory<B> (one specialisation per backend, backend/<name>/memory.hpp):
//   allocate(bytes) -> void*     zeroed, 64-byte aligned; null for 0 bytes
//   release(void*)               null is a no-op; never throws (Tensor's destructor calls it): the CUDA backend
//                                records a failure for its next checked call to throw (cuda/error.hpp)
//   copy(dst, src, bytes)        within the backend's memory
//   fill_zero(p, bytes)
//   to_host(host_dst, src, bytes), to_device(dst, host_src, bytes)
//                                the explicit crossings; on the CUDA backend they synchronise the current stream,
//                                and every call site in nn/ and optim/ says why it needs the values on the host
// host_visible<B> says whether the host may dereference the backend's pointers: View::operator() and Tensor's
// element access compile only when it holds, so module code that indexes tensor data fails to build for CUDA.
#pragma once

#include <cstddef>

#include "../config/backend.hpp"

namespace moonmoe::backend {

template <class B>
inline constexpr bool missing_backend = false;

template <class B>
struct Memory {
    static_assert(missing_backend<B>, "moonmoe: no memory primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// Whether host code may read and write the backend's memory through plain pointers.
template <class B>
inline constexpr bool host_visible = B::kind == BackendKind::cpu;

}  // namespace moonmoe::backend
