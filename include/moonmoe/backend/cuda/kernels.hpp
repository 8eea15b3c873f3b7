// moonmoe/backend/cuda/kernels.hpp: KernelOps<cuda> (backend/kernels.hpp): a model type's choice of fast kernels
// (backend/cuda/fast/) switched on for the process, unless MOONMOE_CUDA_FAST_KERNELS is set, which wins (a run can
// compare the paths without recompiling). The emulated backend (g++ with Thrust's OpenMP system) has no fast kernels:
// it runs the portable functors whatever the type asks, and says so.
#pragma once

#include <cstdlib>
#include <string>

#include "../kernels.hpp"
#include "memory.hpp"
#if !MOONMOE_CUDA_EMULATED
#include "fast/select.hpp"
#endif

namespace moonmoe::backend {

template <>
struct KernelOps<cuda> {
    static std::string use(KernelChoice type) {
        const std::string asked = "fast kernels: " + describe_fast_kernels(type);
#if MOONMOE_CUDA_EMULATED
        return "cuda (emulated): the portable kernels (the emulated backend has none of the fast ones; the type asks "
               "for " +
               asked + ")";
#else
        if (const char* env = std::getenv("MOONMOE_CUDA_FAST_KERNELS")) {
            const CudaFastKernels k = cuda_fast::parse_fast_kernels(env);  // throws naming an unknown kernel
            set_cuda_fast_kernels(k);
            return "cuda: fast kernels: " + describe_fast_kernels(k) + " (MOONMOE_CUDA_FAST_KERNELS=" + env +
                   " overrides the type's " + asked + ")";
        }
        set_cuda_fast_kernels(type);
        return "cuda: " + asked + " (the model type's Backend<cuda, ...>)";
#endif
    }
};

}  // namespace moonmoe::backend
