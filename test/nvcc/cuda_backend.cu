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
using Optim = backend::OptimOps<Cuda>;
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

void bf16_blas_primitives(CM<bf16> a, CM<bf16> b, M<float> c, M<bf16> c16, View<const bf16, 3, Cuda> w,
                          View<float, 3, Cuda> dw, std::span<const index_t> offsets) {
    Blas::gemm_bf16<float>(Trans::no, Trans::yes, 1.0f, a, b, 0.0f, c);
    Blas::gemm_bf16<bf16>(Trans::yes, Trans::no, 1.0f, a, b, 1.0f, c16);
    Blas::gemm_bf16_strided_batched<float>(4, Trans::no, Trans::no, 1.0f, a, 0, b, 16, 0.0f, c, 16);
    Blas::gemm_grouped<bf16>(Trans::yes, 1.0f, a, w, 0.0f, c, offsets);
    Blas::gemm_grouped<bf16, bf16>(Trans::yes, 1.0f, a, w, 0.0f, c16, offsets);
    Blas::gemm_grouped_weight_grad<bf16>(1.0f, a, b, 1.0f, dw, offsets);
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
    Map::map(fn::RoundToBF16{}, x);
    Map::map(fn::SumBF16{}, x, g, g);
    Map::map(fn::AddToBF16{}, x, g);
    Map::map(fn::SwiGLUForwardBF16{}, x, g, g);
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

void attention_primitives(View<float, 3, Cuda> x, View<const index_t, 1, Cuda> positions,
                          View<const float, 1, Cuda> inv_freq, const backend::AttentionQueries<Cuda>& q,
                          const backend::AttentionKeys<Cuda>& kv, std::span<const index_t> offsets,
                          View<float, 3, Cuda> o, View<float, 1, Cuda> lse, View<float, 1, Cuda> max_logit,
                          View<const float, 3, Cuda> d_o, const backend::AttentionGrads<Cuda>& grads) {
    using Attention = backend::AttentionOps<Cuda>;
    Attention::rope(x, positions, inv_freq, 1.0f, true, false);
    Attention::attention_forward(q, kv, offsets, 0.1f, o, lse, max_logit);
    Attention::attention_backward(q, kv, offsets, 0.1f, o, lse, d_o, grads);
    Attention::attention_decode(q, std::span<const backend::AttentionKeys<Cuda>>(&kv, 1), offsets, 0.1f, o);
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

void routing_primitives(const MoEConfig& cfg, M<float> scores, View<const float, 1, Cuda> bias,
                        View<const index_t, 2, Cuda> fixed, M<index_t> idx, M<float> weight, CM<float> dweight,
                        CM<float> aux, M<float> dlogits, View<index_t, 1, Cuda> counts, View<float, 1, Cuda> bias_out,
                        View<index_t, 1, Cuda> offsets, View<index_t, 1, Cuda> row_slot, M<index_t> slot_row,
                        CM<float> x, M<float> rows, M<float> y) {
    using Routing = backend::RoutingOps<Cuda>;
    Routing::route_select(cfg, scores, bias, fixed, idx, weight);
    Routing::route_backward(cfg, scores, idx, dweight, aux, dlogits);
    Routing::histogram(idx, 0, counts);
    Routing::update_bias(0.001f, counts, bias_out);
    Routing::dispatch_plan(idx, 0, offsets, row_slot, slot_row);
    Routing::gather_pairs(x, row_slot, 8, rows);
    Routing::combine(rows, slot_row, weight, y);
    Routing::pair_dot(rows, rows, row_slot, dlogits);
}

void optim_primitives(CM<float> a, M<float> b, CM<double> ad, View<double, 1, Cuda> sq, View<const float, 1, Cuda> f,
                      std::span<const View<const float, 1, Cuda>> grads, std::span<const View<float, 1, Cuda>> zeros,
                      View<index_t, 1, Cuda> bad, View<float, 1, Cuda> w, View<const float, 1, Cuda> g,
                      View<float, 1, Cuda> m, View<float, 1, Cuda> v) {
    Optim::sum_squares<float>(a, sq);
    Optim::sum_squares<double>(ad, sq);
    Tensor<double, 1, Cuda> s = Optim::sum_squares<float>(a);
    Optim::scaled_copy<float>(Trans::yes, a, f, b);
    Optim::first_nonfinite(grads, bad);
    Optim::zero_all(zeros);
    Optim::scale_rows(b, f);
    Optim::adamw_update(fn::AdamWUpdate{0.99f, 0.9f, 0.95f, 0.01f, 0.5f, 1e-8f}, w, g, m, v);
    const backend::UpdateItem items[] = {{w.data, g.data, m.data, v.data, w.shape[0], 0.0f},
                                         {w.data, g.data, m.data, nullptr, w.shape[0], 0.01f}};
    Optim::first_unsafe_update({{0.99f, 0.9f, 0.95f, 0.01f, 0.5f, 1e-8f}, {0.95f, true}, 0.99f, 2.4f}, items, bad);
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
