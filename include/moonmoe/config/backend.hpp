// moonmoe/config/backend.hpp: backend tags. `Backend<cpu>` (Eigen) or `Backend<cuda>` (cuBLAS, Thrust, NCCL), and
// for CUDA which kernels run: `Backend<cuda, FastKernels>`, `Backend<cuda, CudaKernels<Attention, RMSNorm, Router,
// GroupedGemm>>` (each true or false), or the portable Thrust functors alone (PortableKernels, the default).
//
// A tag only selects specialisations of the primitives in backend/; it carries no state. The kernel choice is part of
// the type because it changes results bit for bit (the fast kernels sum in another order): moonmoe::Trainer applies
// it when a run starts, the environment variable MOONMOE_CUDA_FAST_KERNELS overrides it, and the trainer says which
// it used (Trainer::kernels()). The CPU backend has one implementation of each primitive, so a kernel choice on
// Backend<cpu> is a compile error.
#pragma once

#include <concepts>

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct backend;
}

enum class BackendKind { cpu, cuda };

struct cpu {
    static constexpr BackendKind kind = BackendKind::cpu;
    static constexpr const char* name = "cpu";
};
struct cuda {
    static constexpr BackendKind kind = BackendKind::cuda;
    static constexpr const char* name = "cuda";
};

template <class Tag>
concept backend_tag = requires {
    { Tag::kind } -> std::convertible_to<BackendKind>;
};

/// Which of the CUDA primitives that have a fast kernel (backend/cuda/fast/) use it.
struct KernelChoice {
    bool attention = false;     ///< attention forward / backward: FlashAttention-2 tiles
    bool rmsnorm = false;       ///< RMSNorm forward / backward: a warp or block per row
    bool router = false;        ///< the router's top-k selection: a warp per token
    bool grouped_gemm = false;  ///< the experts' grouped products: one cuBLAS grouped-batched call
    constexpr bool any() const { return attention || rmsnorm || router || grouped_gemm; }
};

template <bool Attention, bool RMSNorm, bool Router, bool GroupedGemm>
struct CudaKernels {
    static constexpr KernelChoice value{Attention, RMSNorm, Router, GroupedGemm};
};
using PortableKernels = CudaKernels<false, false, false, false>;
using FastKernels = CudaKernels<true, true, true, true>;

template <class Tag = cpu, class Kernels = PortableKernels>
struct Backend {
    static_assert(backend_tag<Tag>, "Backend<Tag>: Tag must be a backend tag, moonmoe::cpu or moonmoe::cuda");
    static_assert(
        requires {
            { Kernels::value } -> std::convertible_to<KernelChoice>;
        }, "Backend<Tag, Kernels>: Kernels is PortableKernels, FastKernels or CudaKernels<a, r, t, g>");
    static_assert(Tag::kind == BackendKind::cuda || !Kernels::value.any(),
                  "Backend<cpu, Kernels>: the fast kernels are the CUDA backend's; the CPU backend has one "
                  "implementation of each primitive (use Backend<cuda, Kernels>, or Backend<cpu>)");
    using slot = slots::backend;
    using type = Tag;
    static constexpr KernelChoice kernels = Kernels::value;
};

}  // namespace moonmoe
