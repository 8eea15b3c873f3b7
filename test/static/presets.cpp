// Compile-time pins: the accounting of both presets is a constant expression equal to the exact counts of the
// released checkpoints, and the README's spelling compiles as written.
#include <moonmoe/config.hpp>

namespace mm = moonmoe;

using KimiK2 =
    mm::Model<mm::Dims<mm::Hidden<7168>, mm::Layers<61>, mm::DenseLayers<1>, mm::Vocab<163840>>,
              mm::Attention<mm::MLA<mm::Heads<64>, mm::QRank<1536>, mm::KVRank<512>, mm::NopeDim<128>, mm::RopeDim<64>,
                                    mm::VDim<128>>>,
              mm::MoE<mm::Experts<384>, mm::TopK<8>, mm::Shared<1>, mm::ExpertHidden<2048>>,
              mm::Optimizer<mm::Muon<>, mm::QKClip<100>>, mm::Parallel<16, 16, mm::Dynamic>, mm::Backend<mm::cpu>>;
static_assert(KimiK2::parameter_count() == 1'026'408'232'448);

static_assert(mm::KimiK2::parameter_count() == 1'026'408'232'448);
static_assert(mm::KimiK2::parameters().total_without_embeddings == 1'024'059'422'208);
static_assert(mm::KimiK2::activated_parameter_count() == 31'687'095'808);  // published convention: no embed_tokens
static_assert(mm::KimiK2::parameters().active_with_embeddings == 32'861'500'928);
static_assert(mm::KimiK2::parameters().active_without_embeddings == 30'512'690'688);
static_assert(mm::KimiK2::parameters().routed_experts == 1'014'686'023'680);
static_assert(mm::DeepSeekV3::parameter_count() == 671'026'419'200);
static_assert(mm::DeepSeekV3::parameters().total_without_embeddings == 669'173'061'120);
static_assert(mm::DeepSeekV3::activated_parameter_count() == 36'625'618'432);
static_assert(mm::DeepSeekV3::parameters().active_with_embeddings == 37'552'297'472);
static_assert(mm::DeepSeekV3::parameters().active_without_embeddings == 35'698'939'392);
static_assert(mm::DeepSeekV3::parameters().routed_experts == 653'908'770'816);

// The memory figures are constant expressions too.
static_assert(mm::KimiK2::memory_per_rank(64).moe_layers == 4);
static_assert(mm::KimiK2::flops_per_token(4096).forward_backward == 3 * mm::KimiK2::flops_per_token(4096).forward);

// The latent KV cache of K2: 576 values per token per layer (kv_lora_rank 512 + qk_rope_head_dim 64).
static_assert(mm::KimiK2::config.attention.kv_rank + mm::KimiK2::config.attention.rope_dim == 576);
static_assert(mm::KimiK2::config.attention.qk_head_dim() == 192);
