// moonmoe/backend/backend.hpp: the backend contract, every primitive a backend provides, by family:
//
//   memory.hpp     Memory<B>        allocation, copies, the explicit to_host / to_device crossings
//   blas.hpp       BlasOps<B>       gemm, linear, syrk, strided-batched and grouped (per-expert) GEMMs
//   map.hpp        MapOps<B>        element-wise maps over the functors of functors.hpp, fill, copy, transpose
//   rows.hpp       RowOps<B>        RMSNorm, cross-entropy, per-row reductions, embedding rows
//   attention.hpp  AttentionOps<B>  RoPE, causal attention forward / backward with per-head maximum logits
//   routing.hpp    RoutingOps<B>    router selection, dispatch plan, gather, combine, sorted scatter-add
//   optim.hpp      OptimOps<B>      reductions, finite checks, QK-Clip row scaling
//   random.hpp     RandomOps<B>     counter-based fills, the same numbers on every backend
//   fp8.hpp        Fp8Ops<B>        FP8-E4M3 storage in 1 x 128 tiles: quantize, dequantize
//   graph.hpp      StepGraph<B>     optional, not in Ops<B>: device work captured once and replayed (CUDA graphs);
//                                   the primary definition runs the work every time
//   offload.hpp    OffloadOps<B>    optional, not in Ops<B>: whether the backend offloads activations to host memory,
//                                   and its mover (the CUDA backend's HostOffload); the primary definition says no
//
// Each family is a class template whose primary definition only fails (a static_assert naming the header to
// include); backend/cpu/ and backend/cuda/ specialise every family in a file of the same name. Ops<B> gathers the
// families, so module code calls `Ops::gemm`, `Ops::map`, `Ops::rmsnorm_forward` and so on. Module code (nn/,
// optim/) calls only these primitives: it never indexes tensor data (View::operator() compiles only for host-visible
// backends) and never calls a primitive from inside a parallel loop.
#pragma once

#include "../tensor/tensor.hpp"
#include "attention.hpp"
#include "blas.hpp"
#include "fp8.hpp"
#include "graph.hpp"
#include "functors.hpp"
#include "map.hpp"
#include "memory.hpp"
#include "optim.hpp"
#include "random.hpp"
#include "routing.hpp"
#include "rows.hpp"

namespace moonmoe::backend {

template <class B>
struct Ops : BlasOps<B>, MapOps<B>, RowOps<B>, AttentionOps<B>, RoutingOps<B>, OptimOps<B>, RandomOps<B>, Fp8Ops<B> {};

/// MapOps' cast over n contiguous elements: a flat parameter rounded into (f32 -> bf16) or widened from its bf16
/// storage (the bf16 weights' masters, numeric/bf16.hpp's rounding).
template <class To, class From, class B>
void cast_flat(const From* from, To* to, index_t n) {
    if (n > 0) MapOps<B>::template cast<To, From>(View<const From, 2, B>(from, {1, n}), View<To, 2, B>(to, {1, n}));
}

}  // namespace moonmoe::backend
