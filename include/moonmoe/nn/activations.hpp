// moonmoe/nn/activations.hpp: element-wise functors, written once for the CPU and CUDA backends.
#pragma once

#include <cmath>

#include "../config/macros.hpp"

namespace moonmoe::fn {

MOONMOE_HD inline float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

/// silu(z) = z * sigmoid(z)
MOONMOE_HD inline float silu(float z) { return z * sigmoid(z); }

/// d silu / dz = s (1 + z (1 - s)), s = sigmoid(z)
MOONMOE_HD inline float silu_grad(float z) {
    const float s = sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
}

}  // namespace moonmoe::fn
