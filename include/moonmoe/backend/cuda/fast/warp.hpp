// moonmoe/backend/cuda/fast/warp.hpp: what the fast kernels share: warp reductions, a float atomic maximum, the
// launch check and the opt-in to more than 48 KiB of shared memory.
// header-check: nvcc-only
#pragma once

#include "../memory.hpp"
#if defined(MOONMOE_CUDA_EMULATED) && MOONMOE_CUDA_EMULATED
#error "moonmoe: backend/cuda/fast/ holds nvcc-only kernels; the emulated CUDA backend uses the portable path"
#endif
#if defined(MOONMOE_CUDA_EMULATED)

#include <cstddef>

namespace moonmoe::backend::cuda_fast {

inline constexpr unsigned full_warp = 0xffffffffu;

/// The sum of v over the `Width` lanes of a lane group (Width a power of two up to 32), in every lane of it.
template <int Width = 32, class T>
__device__ __forceinline__ T group_sum(T v) {
#pragma unroll
    for (int off = Width / 2; off > 0; off /= 2) v += __shfl_xor_sync(full_warp, v, off);
    return v;
}

/// The maximum of v over the `Width` lanes of a lane group, in every lane of it.
template <int Width = 32>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int off = Width / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(full_warp, v, off));
    return v;
}

/// *address = max(*address, v) as the portable path's `if (v > m) m = v` takes it: a NaN v is never stored and a NaN
/// already at *address (of either sign) stays; at a tie of zeros +0 wins, so the order of the updates cannot choose
/// the sign. A compare-and-swap loop, deterministic: the integer atomicMax / atomicMin trick let v replace a NaN
/// whose sign bit is set.
__device__ __forceinline__ void atomic_max(float* address, float v) {
    unsigned* bits = reinterpret_cast<unsigned*>(address);
    unsigned old = *reinterpret_cast<volatile unsigned*>(bits);
    for (;;) {
        const float m = __uint_as_float(old);
        if (!(v > m || (v == m && __float_as_uint(v) < old))) return;  // at zero, +0's bits are the smaller
        const unsigned seen = atomicCAS(bits, old, __float_as_uint(v));
        if (seen == old) return;
        old = seen;
    }
}

/// Throws cuda_error when the kernel launch just made failed (bad configuration, too much shared memory).
inline void check_launch(const char* kernel) { cuda_detail::check(cudaGetLastError(), kernel, __FILE__, __LINE__); }

/// The most dynamic shared memory a block may opt in to on the current device.
inline std::size_t max_shared_bytes() {
    int device = 0, bytes = 0;
    MOONMOE_CUDA_CHECK(cudaGetDevice(&device));
    MOONMOE_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return std::size_t(bytes);
}

/// Lets `kernel` use `bytes` of dynamic shared memory (above the 48 KiB a launch gets without asking).
template <class Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
    MOONMOE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace moonmoe::backend::cuda_fast

#endif  // defined(MOONMOE_CUDA_EMULATED)
