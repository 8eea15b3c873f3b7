// The run-time policies a model type carries, as constant expressions: the CUDA kernel choice of Backend<>, the
// Newton-Schulz products of Muon<> (by its precision unless given), ClipAlpha where the attention takes it.
// test/compile_fail/ holds the refusals: a kernel choice on Backend<cpu>, ClipAlpha with MLA.
#include <moonmoe/config.hpp>

namespace mm = moonmoe;

using Mixed = mm::TinyK2::with<mm::Backend<mm::cuda, mm::CudaKernels<true, false, false, true>>>;
static_assert(std::is_same_v<Mixed::backend, mm::cuda>);
static_assert(Mixed::kernels.attention && !Mixed::kernels.rmsnorm && !Mixed::kernels.router &&
              Mixed::kernels.grouped_gemm);
static_assert(!mm::TinyK2::kernels.any());  // portable by default
static_assert(mm::TinyK2::with<mm::Backend<mm::cuda, mm::FastKernels>>::kernels.rmsnorm);

// NSProducts: symmetric in f32 and in bf16 by default (the backend's SYRK), or as given
static_assert(mm::TinyK2::config.optimizer.muon.products == mm::Products::symmetric);
using BF16NS = mm::Optimizer<mm::Muon<mm::NSPrecision<mm::BF16>>>;
static_assert(mm::TinyK2::with<BF16NS>::config.optimizer.muon.products == mm::Products::symmetric);
using BF16Full = mm::Optimizer<mm::Muon<mm::NSPrecision<mm::BF16>, mm::NSProducts<mm::GeneralProducts>>>;
static_assert(mm::TinyK2::with<BF16Full>::config.optimizer.muon.products == mm::Products::general);

// ClipAlpha applies to MHA
using Mha = mm::TinyK2::with<mm::Attention<mm::MHA<mm::Heads<4>, mm::KVHeads<2>, mm::HeadDim<16>, mm::RopeDim<8>>>,
                             mm::Optimizer<mm::QKClip<100, mm::ClipAlpha<0.3>>>>;
static_assert(Mha::config.optimizer.qk_clip.alpha == 0.3);
