// The CUDA backend's real mode under nvcc (sm_90): every implemented primitive is instantiated for float (and the
// double ones for double), and every functor of backend/functors.hpp goes through MapOps<Cuda>::map, so each
// Thrust kernel, each cuBLAS call and each functor's device code is compiled. Compiled only (-c): nothing runs.
#include <moonmoe/backend/cuda.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include <moonmoe/tensor/transfer.hpp>

using namespace moonmoe;
using backend::Trans;
// `cuda` alone is ambiguous here: CUDA's headers declare a global namespace cuda (libcu++), and this file brings in
// moonmoe's names with a using-directive. Inside namespace moonmoe the tag is found first.
using Cuda = moonmoe::cuda;

static_assert(!backend::host_visible<Cuda>, "module code must not index CUDA tensor data");
static_assert(MOONMOE_CUDA_EMULATED == 0, "nvcc compiles the real backend");

using Blas = backend::BlasOps<Cuda>;
using Map = backend::MapOps<Cuda>;
using Random = backend::RandomOps<Cuda>;
using Rows = backend::RowOps<Cuda>;

template <class T>
using M = View<T, 2, Cuda>;
template <class T>
using CM = View<const T, 2, Cuda>;

void blas_primitives(CM<float> a, CM<float> b, M<float> c, CM<double> ad, CM<double> bd, M<double> cd,
                     View<const float, 3, Cuda> w, View<float, 3, Cuda> dw, std::span<const index_t> offsets) {
    Blas::gemm<float>(Trans::no, Trans::yes, 1.0f, a, b, 0.0f, c);
    Blas::gemm<double>(Trans::yes, Trans::no, 1.0, ad, bd, 1.0, cd);
    Blas::linear(a, b, c, true);
    Blas::syrk<float>(1.0f, a, 0.0f, c);
    Blas::syrk<double>(1.0, ad, 0.0, cd);
    Blas::gemm_strided_batched(4, Trans::no, Trans::no, 1.0f, a, 0, b, 16, 0.0f, c, 16);
    Blas::gemm_grouped(Trans::yes, 1.0f, a, w, 1.0f, c, offsets);
    Blas::gemm_grouped_weight_grad(1.0f, a, b, 0.0f, dw, offsets);
}

void map_primitives(M<float> x, M<float> y, M<float> z, M<float> u, CM<float> g, M<double> xd, CM<double> gd) {
    Map::map(fn::SetTo<float>{1.0f}, x);
    Map::map(fn::ScaleBy<float>{2.0f}, x);
    Map::map(fn::Axpby<float>{1.0f, 0.5f}, x, g);
    Map::map(fn::AddTo<float>{}, x, g);
    Map::map(fn::Convert{}, xd, g);
    Map::map(fn::Convert{}, x, gd);
    Map::map(fn::SwiGLUForward{}, x, g, g);
    Map::map(fn::SwiGLUBackward{}, x, y, g);
    Map::map(fn::MuonMomentum{0.95f, true}, x, y, g);
    Map::map(fn::DecayAndStep{0.99f, 0.01f}, x, g);
    Map::map(fn::AdamWUpdate{0.99f, 0.9f, 0.95f, 0.01f, 0.5f, 1e-8f}, x, y, z, g);
    Map::fill<float>(u, 0.0f);
    Map::fill<double>(xd, 0.0);
    Map::copy<float>(g, u);
    Map::copy<double>(gd, xd);
    Map::transpose<float>(g, u);
    Map::transpose<double>(gd, xd);
}

void random_primitives(M<float> x, std::uint64_t seed) {
    Random::fill_uniform(x, -1.0f, 1.0f, seed);
    Random::fill_normal(x, 0.0f, 1.0f, seed);
}

void row_primitives(CM<float> x, View<const float, 1, Cuda> w, View<const float, 1, Cuda> rstd_in, M<float> y,
                    View<float, 1, Cuda> rstd, View<float, 1, Cuda> dw, View<const index_t, 1, Cuda> ids,
                    View<const float, 3, Cuda> heads) {
    Rows::rmsnorm_forward(x, w, 1e-6f, y, rstd);
    Rows::rmsnorm_backward(x, w, rstd_in, x, y, dw, true);
    Rows::cross_entropy(x, ids, -100, 4, rstd, y);
    Rows::embedding_gather(x, ids, y);
    Rows::embedding_scatter_add(x, ids, y);
    Rows::sum_heads(heads, y);
}

std::vector<float> memory_and_streams(const std::vector<float>& values) {
    backend::Stream stream;
    backend::StreamGuard on_stream(stream.get());
    Tensor<float, 1, Cuda> t = to_device<Cuda>(values);
    Tensor<float, 1, Cuda> copy = t.clone();
    copy.zero();
    backend::Memory<Cuda>::trim();
    return to_host(copy);
}
