// bench/support/configs.hpp: the two model configurations of bench/SUITE.md.
#pragma once

#include <moonmoe/config.hpp>

namespace bench {

/// Kimi K2 at full width; its MoE benchmarks hold the experts of expert-parallel rank 0 of 16 (24 of 384).
inline constexpr moonmoe::ModelConfig k2 = moonmoe::KimiK2::config;
inline constexpr moonmoe::index_t k2_local_experts = k2.moe.experts / k2.parallel.ep;

/// A small model of the same architecture, for quick runs and CI: every expert local.
using SmallModel = moonmoe::KimiK2::with<
    moonmoe::Dims<moonmoe::Hidden<512>, moonmoe::Layers<2>, moonmoe::DenseLayers<1>, moonmoe::DenseHidden<1024>>,
    moonmoe::Attention<moonmoe::MLA<moonmoe::Heads<8>, moonmoe::QRank<192>, moonmoe::KVRank<128>, moonmoe::NopeDim<64>,
                                    moonmoe::RopeDim<32>, moonmoe::VDim<64>>>,
    moonmoe::MoE<moonmoe::Experts<16>, moonmoe::TopK<2>, moonmoe::Shared<1>, moonmoe::ExpertHidden<256>,
                 moonmoe::Groups<1>, moonmoe::TopGroups<1>, moonmoe::RoutedScale<2.5>>,
    moonmoe::Parallel<1, 1, 1>>;
inline constexpr moonmoe::ModelConfig small = SmallModel::config;

/// The same two under Kimi K2's training precision, Precision<BF16, Weights<BF16>>: bf16 products, activations and
/// weights, f32 gradients (docs/precision.md). The suite's `_bf16` rows run on them.
using TrainingPrecision = moonmoe::Precision<moonmoe::BF16, moonmoe::Weights<moonmoe::BF16>>;
inline constexpr moonmoe::ModelConfig k2_bf16 = moonmoe::KimiK2::with<TrainingPrecision>::config;
inline constexpr moonmoe::ModelConfig small_bf16 = SmallModel::with<TrainingPrecision>::config;
/// ... and with K2's activation policies (docs/activation_memory.md): selective recomputation with bf16 storage,
/// then the FP8 MLP inputs too (KimiK2Activations).
using Recomputed = moonmoe::Activations<moonmoe::Recompute<moonmoe::KimiK2Selection>, moonmoe::Storage<moonmoe::BF16>>;
inline constexpr moonmoe::ModelConfig k2_recompute = moonmoe::KimiK2::with<TrainingPrecision, Recomputed>::config;
inline constexpr moonmoe::ModelConfig k2_fp8 =
    moonmoe::KimiK2::with<TrainingPrecision, moonmoe::KimiK2Activations>::config;
inline constexpr moonmoe::ModelConfig small_fp8 =
    SmallModel::with<TrainingPrecision, moonmoe::KimiK2Activations>::config;

/// The routed experts a benchmark holds: K2's one expert-parallel rank, or every expert of the small model.
inline moonmoe::index_t local_experts(const moonmoe::ModelConfig& cfg) {
    return cfg.dims.hidden == k2.dims.hidden ? k2_local_experts : cfg.moe.experts;
}

}  // namespace bench
