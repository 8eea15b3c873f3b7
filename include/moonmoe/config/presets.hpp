// moonmoe/config/presets.hpp: Kimi K2, DeepSeek-V3, and tiny models of each shape for tests.
//
// Every architecture value is that of the released config.json files; the optimizer values are the training recipes
// of the Kimi K2 technical report §2.5 and of DeepSeek-V3 (arXiv 2412.19437 §4.2). The presets spell each value out
// even where it equals the default, so they read as the configuration they are.
#pragma once

#include "model.hpp"

namespace moonmoe {

/// moonshotai/Kimi-K2-Instruct (and -Base): 1,026,408,232,448 parameters, trained on Parallel<16, 16, DP>.
using KimiK2 = Model<
    Dims<Hidden<7168>, Layers<61>, DenseLayers<1>, Vocab<163840>, DenseHidden<18432>, NormEps<1e-6>>,
    Attention<MLA<Heads<64>, QRank<1536>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
    RoPE<Theta<50000.0>, MaxPositions<131072>,
         YaRN<Factor<32.0>, OriginalMaxPositions<4096>, BetaFast<1.0>, BetaSlow<1.0>, MScale<1.0>, MScaleAllDim<1.0>>>,
    MoE<Experts<384>, TopK<8>, Shared<1>, ExpertHidden<2048>, Groups<1>, TopGroups<1>, Score<Sigmoid>,
        CorrectionBias<true>, NormTopK<true>, RoutedScale<2.827>>,
    Optimizer<Muon<>, QKClip<100.0>,
              WSD<Warmup<KimiK2Schedule::warmup>, Stable<KimiK2Schedule::stable>, Decay<KimiK2Schedule::decay>,
                  FinalLR<KimiK2Schedule::final_fraction>>,
              BiasUpdateRate<deepseek_v3_bias_update_rate>>,
    Parallel<16, 16, Dynamic, VirtualStages<2>>, Backend<cpu>>;

/// deepseek-ai/DeepSeek-V3 (main model; the MTP module is not part of it): 671,026,419,200 parameters.
/// Trained with AdamW and no QK-Clip, by the recipe of arXiv 2412.19437 §4.2 (AdamW beta 0.9 / 0.95, weight decay
/// 0.1, peak 2.2e-4, DeepSeekV3Schedule, gamma 0.001); the Parallel<> here is K2's layout, for comparison.
using DeepSeekV3 = Model<
    Dims<Hidden<7168>, Layers<61>, DenseLayers<3>, Vocab<129280>, DenseHidden<18432>, NormEps<1e-6>>,
    Attention<MLA<Heads<128>, QRank<1536>, KVRank<512>, NopeDim<128>, RopeDim<64>, VDim<128>>>,
    RoPE<Theta<10000.0>, MaxPositions<163840>,
         YaRN<Factor<40.0>, OriginalMaxPositions<4096>, BetaFast<32.0>, BetaSlow<1.0>, MScale<1.0>, MScaleAllDim<1.0>>>,
    MoE<Experts<256>, TopK<8>, Shared<1>, ExpertHidden<2048>, Groups<8>, TopGroups<4>, Score<Sigmoid>,
        CorrectionBias<true>, NormTopK<true>, RoutedScale<2.5>>,
    Optimizer<NoMuon, AdamW<Beta1<0.9>, Beta2<0.95>, WeightDecay<0.1>, LearningRate<2.2e-4>>, NoQKClip,
              WSD<Warmup<DeepSeekV3Schedule::warmup>, Stable<DeepSeekV3Schedule::stable>,
                  Decay<DeepSeekV3Schedule::decay>, FinalLR<DeepSeekV3Schedule::final_fraction>>,
              BiasUpdateRate<deepseek_v3_bias_update_rate>>,
    Parallel<16, 16, Dynamic, VirtualStages<2>>, Backend<cpu>>;

/// A few-thousand-parameter model of Kimi K2's shape: one group, first layer dense, YaRN with beta 1 / 1.
using TinyK2 = Model<
    Dims<Hidden<64>, Layers<3>, DenseLayers<1>, Vocab<256>, DenseHidden<96>, NormEps<1e-6>>,
    Attention<MLA<Heads<4>, QRank<32>, KVRank<16>, NopeDim<8>, RopeDim<4>, VDim<8>>>,
    RoPE<Theta<50000.0>, MaxPositions<4096>,
         YaRN<Factor<32.0>, OriginalMaxPositions<128>, BetaFast<1.0>, BetaSlow<1.0>, MScale<1.0>, MScaleAllDim<1.0>>>,
    MoE<Experts<8>, TopK<2>, Shared<1>, ExpertHidden<16>, Groups<1>, TopGroups<1>, RoutedScale<2.827>>,
    Parallel<1, 1, 1>>;

/// A tiny model of DeepSeek-V3's shape: several expert groups with top groups, several dense layers, YaRN with a
/// blended correction range.
using TinyV3 = Model<
    Dims<Hidden<64>, Layers<4>, DenseLayers<2>, Vocab<256>, DenseHidden<96>, NormEps<1e-6>>,
    Attention<MLA<Heads<4>, QRank<32>, KVRank<16>, NopeDim<8>, RopeDim<8>, VDim<8>>>,
    RoPE<Theta<10000.0>, MaxPositions<4096>,
         YaRN<Factor<40.0>, OriginalMaxPositions<256>, BetaFast<32.0>, BetaSlow<1.0>, MScale<1.0>, MScaleAllDim<1.0>>>,
    MoE<Experts<16>, TopK<4>, Shared<1>, ExpertHidden<16>, Groups<4>, TopGroups<2>, RoutedScale<2.5>>,
    Parallel<1, 1, 1>>;

/// Every size and every routing / RoPE value Dynamic: the shape of any DeepSeek-V3-architecture checkpoint (and of
/// DeepSeek-V2's, DeepseekV2ForCausalLM), read from its config.json.
using AnyDeepSeekV3 = Model<
    Dims<Hidden<Dynamic>, Layers<Dynamic>, DenseLayers<Dynamic>, Vocab<Dynamic>, DenseHidden<Dynamic>,
         NormEps<Dynamic>>,
    Attention<MLA<Heads<Dynamic>, QRank<Dynamic>, KVRank<Dynamic>, NopeDim<Dynamic>, RopeDim<Dynamic>, VDim<Dynamic>>>,
    RoPE<Theta<Dynamic>, MaxPositions<Dynamic>, Interleave<Dynamic>, AnyScaling>,
    MoE<Experts<Dynamic>, TopK<Dynamic>, Shared<Dynamic>, ExpertHidden<Dynamic>, Groups<Dynamic>, TopGroups<Dynamic>,
        Score<AnyScore>, GroupScore<AnyGroupScore>, CorrectionBias<Dynamic>, NormTopK<Dynamic>, RoutedScale<Dynamic>>,
    Parallel<1, 1, 1>>;

}  // namespace moonmoe
