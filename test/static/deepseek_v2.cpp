// Compile-time pins: DeepSeek-V2-Lite and DeepSeek-V2 declared the obvious way (Score<Softmax>, nothing else about
// the router) count exactly what their checkpoints hold, and the activated counts follow the published convention.
//
// The integers are an independent count: transformers 5.23's DeepseekV2ForCausalLM / DeepseekV3ForCausalLM built on
// the meta device from the released config.json values, summing every parameter's numel (and V3's
// e_score_correction_bias buffers, which its checkpoints store); activated = total - embed_tokens - (Experts -
// TopK) routed experts per MoE layer. The published figures: V2-Lite 15.7B total / 2.4B activated, V2 236B / 21B
// (arXiv 2405.04434), V3 671B / 37B (arXiv 2412.19437), Kimi K2 32B activated (Kimi K2 technical report §1).
#include <moonmoe/config.hpp>

namespace mm = moonmoe;

// deepseek-ai/DeepSeek-V2-Lite config.json: no query compression, greedy softmax routing, yarn 40 with mscale 0.707.
using DeepSeekV2Lite =
    mm::Model<mm::Dims<mm::Hidden<2048>, mm::Layers<27>, mm::DenseLayers<1>, mm::Vocab<102400>, mm::DenseHidden<10944>>,
              mm::Attention<mm::MLA<mm::Heads<16>, mm::QRank<mm::NoQCompression>, mm::KVRank<512>>>,
              mm::RoPE<mm::Theta<10000>, mm::MaxPositions<163840>,
                       mm::YaRN<mm::Factor<40>, mm::OriginalMaxPositions<4096>, mm::BetaFast<32>, mm::BetaSlow<1>,
                                mm::MScale<0.707>, mm::MScaleAllDim<0.707>>>,
              mm::MoE<mm::Experts<64>, mm::TopK<6>, mm::Shared<2>, mm::ExpertHidden<1408>, mm::Score<mm::Softmax>,
                      mm::RoutedScale<1.0>>>;

// deepseek-ai/DeepSeek-V2 config.json: query compression, group-limited routing over 8 groups of 20 experts.
using DeepSeekV2 =
    mm::Model<mm::Dims<mm::Hidden<5120>, mm::Layers<60>, mm::DenseLayers<1>, mm::Vocab<102400>, mm::DenseHidden<12288>>,
              mm::Attention<mm::MLA<mm::Heads<128>, mm::QRank<1536>, mm::KVRank<512>>>,
              mm::RoPE<mm::Theta<10000>, mm::MaxPositions<163840>,
                       mm::YaRN<mm::Factor<40>, mm::OriginalMaxPositions<4096>, mm::BetaFast<32>, mm::BetaSlow<1>,
                                mm::MScale<0.707>, mm::MScaleAllDim<0.707>>>,
              mm::MoE<mm::Experts<160>, mm::TopK<6>, mm::Shared<2>, mm::ExpertHidden<1536>, mm::Groups<8>,
                      mm::TopGroups<3>, mm::Score<mm::Softmax>, mm::RoutedScale<16.0>>>;

// Defaults that follow Score<Softmax>: V2's router.
static_assert(!DeepSeekV2Lite::config.moe.correction_bias);
static_assert(!DeepSeekV2Lite::config.moe.norm_top_k);
static_assert(DeepSeekV2::config.moe.group_score == mm::GroupScoreFunc::max);
static_assert(DeepSeekV2Lite::parameters().router_layer == 64 * 2048);  // gate weight only

static_assert(DeepSeekV2Lite::parameter_count() == 15'706'484'224);            // "15.7B"
static_assert(DeepSeekV2Lite::activated_parameter_count() == 2'451'435'008);   // "2.4B"
static_assert(DeepSeekV2::parameter_count() == 235'741'434'880);               // "236B"
static_assert(DeepSeekV2::activated_parameter_count() == 20'851'512'320);      // "21B"
static_assert(mm::DeepSeekV3::activated_parameter_count() == 36'625'618'432);  // "37B"
static_assert(mm::KimiK2::activated_parameter_count() == 31'687'095'808);      // "32B"

// The other conventions, named beside the headline.
static_assert(DeepSeekV2Lite::parameters().active_with_embeddings == 2'661'150'208);
static_assert(DeepSeekV2Lite::parameters().active_without_embeddings == 2'241'719'808);
static_assert(DeepSeekV2::parameters().active_with_embeddings == 21'375'800'320);
static_assert(DeepSeekV2::parameters().active_without_embeddings == 20'327'224'320);

// An explicit argument wins over the default that follows the score.
static_assert(mm::MoE<mm::Score<mm::Softmax>, mm::CorrectionBias<true>>::value.correction_bias);
static_assert(!mm::MoE<mm::Score<mm::Sigmoid>, mm::CorrectionBias<false>>::value.correction_bias);
static_assert(mm::MoE<mm::Score<mm::Softmax>, mm::NormTopK<true>>::value.norm_top_k);
static_assert(mm::MoE<mm::Score<mm::Softmax>, mm::GroupScore<mm::TopTwoSum>>::value.group_score ==
              mm::GroupScoreFunc::top_two_sum);
static_assert(mm::MoE<>::value.correction_bias && mm::MoE<>::value.norm_top_k &&
              mm::MoE<>::value.group_score == mm::GroupScoreFunc::top_two_sum);
