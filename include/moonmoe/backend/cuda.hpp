// moonmoe/backend/cuda.hpp: Backend<cuda>, on the CUDA runtime, cuBLAS and Thrust.
//
// Compile with nvcc for the real backend, or with a host compiler and Thrust's OpenMP device system for the emulated
// one (host memory, the same kernels' functors on OpenMP threads, cuBLAS's column-major calls served on the host):
//   g++ -std=c++20 -fopenmp -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem <cuda>/include/cccl
//       -isystem <cuda>/include ...
// Any other host compile stops with an #error (cuda/memory.hpp).
//
// Implemented families, usable directly: Memory<cuda> (with current_stream, StreamGuard, Stream, cuda_error),
// BlasOps<cuda>, MapOps<cuda>, RandomOps<cuda>, RowOps<cuda>. AttentionOps, RoutingOps and OptimOps are not specialised
// for cuda yet, so Ops<cuda> (which inherits every family) does not instantiate until they are.
#pragma once

#include "backend.hpp"
#include "cuda/blas.hpp"
#include "cuda/layout.hpp"
#include "cuda/map.hpp"
#include "cuda/memory.hpp"
#include "cuda/random.hpp"
#include "cuda/rows.hpp"
