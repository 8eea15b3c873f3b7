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

namespace moonmoe::nn {

class RotaryEmbedding {
public:
    RotaryEmbedding() = default;
    RotaryEmbedding(const RopeConfig& cfg, index_t rope_dim) : dim_(rope_dim), interleave_(cfg.interleave) {
        const index_t half = rope_dim / 2;
        inv_freq_.resize(static_cast<std::size_t>(half));
        // HF: pos_freqs = base ** (arange(0, d, 2).float() / d), all in f32
        std::vector<float> pos_freqs(static_cast<std::size_t>(half));
        for (index_t i = 0; i < half; ++i)
            pos_freqs[i] = std::pow(float(cfg.theta), float(2 * i) / float(rope_dim));
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

    index_t dim() const { return dim_; }
    const std::vector<float>& inv_freq() const { return inv_freq_; }

    /// Rotates each row's `dim` values in place. x: [rows, heads, dim] (any strides with unit last stride),
    /// positions[row]. transpose = true applies the transpose of the rotation (its backward).
    template <class B = cpu>
    void apply(View<float, 3, B> x, const index_t* positions, bool transpose = false) const {
        const index_t rows = x.shape[0], heads = x.shape[1], half = dim_ / 2;
        if (x.shape[2] != dim_) throw_shape_mismatch("RotaryEmbedding.apply", x.shape, Shape<3>{rows, heads, dim_});
        backend::Ops<B>::for_each(rows, [&, x](index_t r) {
            std::vector<float> c(static_cast<std::size_t>(half)), s(static_cast<std::size_t>(half)), tmp(static_cast<std::size_t>(dim_));
            const float pos = float(positions[r]);
            for (index_t i = 0; i < half; ++i) {
                const float angle = inv_freq_[i] * pos;  // f32, as HF's inv_freq @ position_ids
                c[i] = std::cos(angle) * attention_factor_;
                s[i] = std::sin(angle) * attention_factor_;
            }
            for (index_t h = 0; h < heads; ++h) {
                float* v = x.data + r * x.strides[0] + h * x.strides[1];
                if (!transpose) {
                    for (index_t i = 0; i < half; ++i) {  // gather to half-split order, then rotate
                        const float a = interleave_ ? v[2 * i] : v[i], b = interleave_ ? v[2 * i + 1] : v[i + half];
                        tmp[i] = a * c[i] - b * s[i];
                        tmp[i + half] = b * c[i] + a * s[i];
                    }
                    for (index_t i = 0; i < dim_; ++i) v[i] = tmp[i];
                } else {
                    for (index_t i = 0; i < half; ++i) {  // rotate back, then scatter to the stored order
                        const float a = v[i] * c[i] + v[i + half] * s[i];
                        const float b = v[i + half] * c[i] - v[i] * s[i];
                        tmp[interleave_ ? 2 * i : i] = a;
                        tmp[interleave_ ? 2 * i + 1 : i + half] = b;
                    }
                    for (index_t i = 0; i < dim_; ++i) v[i] = tmp[i];
                }
            }
        });
    }

private:
    index_t dim_ = 0;
    bool interleave_ = true;
    float attention_factor_ = 1.0f;
    std::vector<float> inv_freq_;
};

}  // namespace moonmoe::nn
