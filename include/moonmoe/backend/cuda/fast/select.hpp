// moonmoe/backend/cuda/fast/select.hpp: which of the CUDA backend's fast kernels are switched on (default: none).
// header-check: nvcc-only
//
// The fast kernels (this folder) are nvcc-only replacements for the portable Thrust functors of a few primitives;
// each is selected inside its primitive (AttentionOps<cuda>, RowOps<cuda>, RoutingOps<cuda>, BlasOps<cuda>), with the
// primitive's contract unchanged, so module code never changes. They are off until switched on, in one of two ways:
//   the environment   MOONMOE_CUDA_FAST_KERNELS=attention,rmsnorm,router,grouped_gemm (a comma-separated subset,
//                     "all" or "none"), read once, at the first primitive call that asks;
//   the program       moonmoe::backend::set_cuda_fast_kernels({.attention = true, ...}), which overrides the
//                     environment from then on (process-wide; tests switch it to compare both paths).
// An unknown name in the variable is an error (std::invalid_argument naming it), not silently ignored.
// A primitive whose shapes a fast kernel does not cover (see each kernel's `supported`) keeps the portable path.
#pragma once

#include "../memory.hpp"
#if defined(MOONMOE_CUDA_EMULATED) && MOONMOE_CUDA_EMULATED
#error "moonmoe: backend/cuda/fast/ holds nvcc-only kernels; the emulated CUDA backend uses the portable path"
#endif
#if defined(MOONMOE_CUDA_EMULATED)

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

namespace moonmoe::backend {

/// The fast kernels of the CUDA backend, one switch per family of primitives: a model type's KernelChoice
/// (config/backend.hpp, Backend<cuda, Kernels>).
using CudaFastKernels = KernelChoice;

namespace cuda_fast {

/// Parses MOONMOE_CUDA_FAST_KERNELS' value: names separated by commas (spaces ignored), "all", "none" or empty.
inline CudaFastKernels parse_fast_kernels(std::string_view text) {
    CudaFastKernels k;
    while (!text.empty()) {
        const std::size_t comma = text.find(',');
        std::string_view name = text.substr(0, comma);
        text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
        while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
        while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
        if (name.empty() || name == "none") continue;
        if (name == "all") k = {true, true, true, true};
        else if (name == "attention")
            k.attention = true;
        else if (name == "rmsnorm")
            k.rmsnorm = true;
        else if (name == "router")
            k.router = true;
        else if (name == "grouped_gemm")
            k.grouped_gemm = true;
        else
            throw std::invalid_argument("moonmoe: MOONMOE_CUDA_FAST_KERNELS names an unknown kernel '" +
                                        std::string(name) +
                                        "' (known: attention, rmsnorm, router, grouped_gemm, all, none)");
    }
    return k;
}

inline unsigned pack(CudaFastKernels k) {
    return (k.attention ? 1u : 0u) | (k.rmsnorm ? 2u : 0u) | (k.router ? 4u : 0u) | (k.grouped_gemm ? 8u : 0u);
}
inline CudaFastKernels unpack(unsigned b) { return {(b & 1u) != 0, (b & 2u) != 0, (b & 4u) != 0, (b & 8u) != 0}; }

/// The process-wide switches, initialised from the environment on first use (a thread-safe static).
inline std::atomic<unsigned>& switches() {
    static std::atomic<unsigned> bits{[] {
        const char* env = std::getenv("MOONMOE_CUDA_FAST_KERNELS");
        return pack(parse_fast_kernels(env ? env : ""));
    }()};
    return bits;
}

}  // namespace cuda_fast

/// The fast kernels in use now.
inline CudaFastKernels cuda_fast_kernels() {
    return cuda_fast::unpack(cuda_fast::switches().load(std::memory_order_relaxed));
}

/// Switches the fast kernels on or off for the whole process (overrides MOONMOE_CUDA_FAST_KERNELS). Work already
/// queued keeps the path it was queued with; calls after this one use the new choice.
inline void set_cuda_fast_kernels(CudaFastKernels k) {
    cuda_fast::switches().store(cuda_fast::pack(k), std::memory_order_relaxed);
}

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
