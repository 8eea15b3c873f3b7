// moonmoe/nn/rope.hpp: rotary position embedding with YaRN, exactly as HF transformers computes it for
// DeepseekV3 (transformers 5.23 modeling_deepseek_v3.py, modeling_rope_utils.py; YaRN: arXiv 2309.00071), in f32.
// DeepseekV2 rotates the same interleaved pairs as complex numbers and keeps them interleaved
// (modeling_deepseek_v2.py apply_rotary_emb); q.k and every gradient are the same, so one rotation serves both.
//
// inv_freq[i] = extrapolated base^(-2i/d) blended with interpolated base^(-2i/d)/factor by the YaRN ramp over the
// correction range [low, high] (from original_max_position_embeddings). With rope_interleave (the HF default for
// these checkpoints) a head's rope part x is first permuted to x' = [x0, x2, ..., x1, x3, ...]; then
//   y[i] = x'[i] cos - x'[i+d/2] sin,   y[i+d/2] = x'[i+d/2] cos + x'[i] sin,   angle = pos * inv_freq[i],
// and cos / sin carry attention_factor (1.0 for K2 and V3). The result stays in the half-split order, for queries
// and keys alike, so q.k is what the interleaved reference computes.
#pragma once

#include <cmath>
#include <vector>

#include "../backend/backend.hpp"
#include "../config/rope.hpp"
#include "../tensor/tensor.hpp"
#include "../tensor/transfer.hpp"
#include "flags.hpp"

namespace moonmoe::nn {

/// The frequencies live on the host (inv_freq()) and, for the primitive, on backend B.
template <class B = cpu>
class RotaryEmbedding {
public:
    RotaryEmbedding() = default;
    RotaryEmbedding(const RopeConfig& cfg, index_t rope_dim) : dim_(rope_dim), interleave_(cfg.interleave) {
        init(cfg, rope_dim);
        inv_freq_device_ = to_device<B>(inv_freq_);  // once, at construction
    }

    index_t dim() const { return dim_; }
    const std::vector<float>& inv_freq() const { return inv_freq_; }

    /// Rotates each row's `dim` values in place. x: [rows, heads, dim] (any strides with unit last stride),
    /// positions [rows] on the backend. Rotation::transposed applies the transpose of the rotation (its backward).
    void apply(View<float, 3, B> x, View<const index_t, 1, B> positions, Rotation rotation = Rotation::forward) const {
        if (x.shape[2] != dim_)
            throw_shape_mismatch("RotaryEmbedding.apply", x.shape, Shape<3>{x.shape[0], x.shape[1], dim_});
        backend::Ops<B>::rope(x, positions, inv_freq_device_.view(), attention_factor_, interleave_,
                              rotation == Rotation::transposed);
    }

private:
    void init(const RopeConfig& cfg, index_t rope_dim) {
        const index_t half = rope_dim / 2;
        inv_freq_.resize(static_cast<std::size_t>(half));
        // HF: pos_freqs = base ** (arange(0, d, 2).float() / d), all in f32
        std::vector<float> pos_freqs(static_cast<std::size_t>(half));
        for (index_t i = 0; i < half; ++i) pos_freqs[i] = std::pow(float(cfg.theta), float(2 * i) / float(rope_dim));
        if (!cfg.yarn) {
            for (index_t i = 0; i < half; ++i) inv_freq_[i] = 1.0f / pos_freqs[i];
            return;
        }
        const YarnRange range = yarn_correction_range(cfg, rope_dim);
        float low = float(range.low), high = float(range.high);
        if (low == high) high += 0.001f;  // HF: avoid a zero-width ramp
        for (index_t i = 0; i < half; ++i) {
            const float extrapolation = 1.0f / pos_freqs[i];
            const float interpolation = 1.0f / (float(cfg.factor) * pos_freqs[i]);
            float ramp = (float(i) - low) / (high - low);
            ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
            const float extrapolation_factor = 1.0f - ramp;
            inv_freq_[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
        }
        attention_factor_ = float(rope_attention_factor(cfg));
    }

    index_t dim_ = 0;
    bool interleave_ = true;
    float attention_factor_ = 1.0f;
    std::vector<float> inv_freq_;
    Tensor<float, 1, B> inv_freq_device_;
};

}  // namespace moonmoe::nn
