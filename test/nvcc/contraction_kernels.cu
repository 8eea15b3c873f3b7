// The CUDA backend's functors that are claimed bitwise equal to the CPU, each in a kernel of its own, for
// cmake/ContractionCheck.cmake (ctest nvcc.contraction): it compiles this file to PTX with -fmad=true (nvcc's default)
// and -fmad=false and fails, naming the kernel, where nvcc fused a product and a sum into one FMA that the CPU
// rounds twice, or left a product and a sum that ptxas may still fuse. Such functors write fn::add_product.
//
// Not here, because they are claimed only within a tolerance: the normal fill (device log / sqrt / cos), the
// router's scores (device expf / exp: the math library itself is compiled under -fmad), route_select's fast kernel
// (held to the portable path on a GPU by fast_kernels.cu), AdamW, Muon's momentum and decay, the SwiGLU backward,
// Newton-Schulz's norm, the row and attention functors. A kernel added here must call no math library function.
#include <moonmoe/backend/cuda/optim.hpp>
#include <moonmoe/backend/cuda/random.hpp>
#include <moonmoe/backend/cuda/routing.hpp>

using namespace moonmoe;
namespace cd = moonmoe::backend::cuda_detail;

// extern "C": the check names kernels as written here.
extern "C" {

// ---- backend/cuda/random.hpp: uniform fills are bitwise the CPU's (test/unit/backend_random.cpp) ----
__global__ void uniform_at(cd::UniformAt f, float* x) { f(blockIdx.x, threadIdx.x, x[threadIdx.x]); }

// ---- backend/functors.hpp, through MapOps (test/unit/backend_map.cpp checks Axpby bitwise) ----
__global__ void axpby_f32(fn::Axpby<float> f, float* y, const float* x) { f(y[threadIdx.x], x[threadIdx.x]); }
__global__ void axpby_f64(fn::Axpby<double> f, double* y, const double* x) { f(y[threadIdx.x], x[threadIdx.x]); }
__global__ void scale_by_pair_weight(fn::ScaleByPairWeight f, float* x) { f(blockIdx.x, 0, x[threadIdx.x]); }
__global__ void sum_f32(fn::Sum f, float* out, const float* a, const float* b) {
    f(out[threadIdx.x], a[threadIdx.x], b[threadIdx.x]);
}
__global__ void add_to_f32(fn::AddTo<float> f, float* y, const float* x) { f(y[threadIdx.x], x[threadIdx.x]); }
__global__ void convert_f32_bf16(fn::Convert f, bf16* y, const float* x) { f(y[threadIdx.x], x[threadIdx.x]); }
__global__ void sum_bf16(fn::SumBF16 f, float* out, const float* a, const float* b) {
    f(out[threadIdx.x], a[threadIdx.x], b[threadIdx.x]);
}
__global__ void add_to_bf16(fn::AddToBF16 f, float* y, const float* x) { f(y[threadIdx.x], x[threadIdx.x]); }

// ---- backend/cuda/routing.hpp: selection, backward, combine and dots in the CPU's operations ----
__global__ void route_select_choice(cd::RouteSelectToken f) {  // top-k, groups and weights; not the scores (exp)
    const index_t t = blockIdx.x;
    index_t chosen[cd::route_max_top_k];
    f.select(t, f.scores + t * f.E, chosen);
    f.write_weights(t, f.scores + t * f.E, chosen);
}
__global__ void route_backward_token(cd::RouteBackwardToken f) { f(blockIdx.x); }
__global__ void bias_step(cd::BiasStep f) { f(threadIdx.x); }
__global__ void combine_element(cd::CombineElement f) { f(threadIdx.x); }
__global__ void pair_dot(cd::PairDot f) { f(threadIdx.x); }

// ---- backend/cuda/optim.hpp: scaled_copy and scale_rows are bitwise the CPU's ----
__global__ void scaled_copy(cd::ScaledCopyKernel<float> f) { f(threadIdx.x); }
__global__ void scale_rows(cd::ScaleRowsKernel f) { f(threadIdx.x); }

}  // extern "C"
