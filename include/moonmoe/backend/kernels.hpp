// moonmoe/backend/kernels.hpp: a model type's kernel choice (config/backend.hpp, `Backend<cuda, FastKernels>`)
// applied to its backend, an optional family of the backend contract, as backend/offload.hpp is.
//
// KernelOps<B>::use(choice) switches the backend's kernels to `choice` for the process and returns, in words, what
// the run uses and where that came from; moonmoe::Trainer calls it when it is built and reports the answer
// (Trainer::kernels()). The primary definition is that of a backend with one implementation of each primitive (the
// CPU backend: a type cannot ask it for another, config/backend.hpp); the CUDA backend specialises it
// (backend/cuda/kernels.hpp), where the environment variable MOONMOE_CUDA_FAST_KERNELS overrides the type.
#pragma once

#include <string>

#include "../config/backend.hpp"

namespace moonmoe::backend {

template <class B>
struct KernelOps {
    static std::string use(KernelChoice) { return std::string(B::name) + ": one implementation of each primitive"; }
};

/// "attention, rmsnorm" / "none": the fast kernels a choice switches on.
inline std::string describe_fast_kernels(KernelChoice k) {
    std::string s;
    const auto add = [&](bool on, const char* name) {
        if (on) s += (s.empty() ? "" : ", ") + std::string(name);
    };
    add(k.attention, "attention");
    add(k.rmsnorm, "rmsnorm");
    add(k.router, "router");
    add(k.grouped_gemm, "grouped_gemm");
    return s.empty() ? "none" : s;
}

}  // namespace moonmoe::backend
