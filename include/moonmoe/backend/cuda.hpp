// moonmoe/backend/cuda.hpp: Backend<cuda>, on the CUDA runtime, cuBLAS and Thrust.
//
// Compile with nvcc for the real backend, or with a host compiler and Thrust's OpenMP device system for the emulated
// one (host memory, the same kernels' functors on OpenMP threads, cuBLAS's column-major calls served on the host):
//   g++ -std=c++20 -fopenmp -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP -isystem <cuda>/include/cccl
//       -isystem <cuda>/include ...
// Any other host compile stops with an #error (cuda/memory.hpp).
//
// Every family of the contract (backend/backend.hpp) is implemented: Memory<cuda> (with current_stream, StreamGuard,
// Stream, cuda_error), BlasOps, MapOps, RowOps, AttentionOps, RoutingOps, OptimOps and RandomOps. The row, attention
// and routing kernels are portable Thrust functors (one thread per row, output element or (row, head)); the
// comments of each cuda/<family>.hpp name the fused nvcc kernels that would replace them for speed.
#pragma once

#include "backend.hpp"
#include "cuda/attention.hpp"
#include "cuda/blas.hpp"
#include "cuda/fp8.hpp"
#include "cuda/graph.hpp"
#include "cuda/kernels.hpp"
#include "cuda/layout.hpp"
#include "cuda/map.hpp"
#include "cuda/memory.hpp"
#include "cuda/offload.hpp"
#include "cuda/optim.hpp"
#include "cuda/random.hpp"
#include "cuda/routing.hpp"
#include "cuda/rows.hpp"
