// moonmoe/backend/functors.hpp: the element-wise math of the modules and optimizers, written once as named
// functors that run on the host and on the device (MOONMOE_HD), for MapOps::map / map_indexed (backend/map.hpp).
//
// A functor holds plain values (scalars, and device pointers where it reads per-row data); it is copied to the
// device, so it never captures by reference. operator() takes the elements of the views passed to map, in order,
// by reference (outputs) or by value (inputs); map_indexed passes the row and column first.
#pragma once

#include <cmath>
#include <cstdint>

#include "../config/macros.hpp"
#include "../numeric/bf16.hpp"
#include "../tensor/shape.hpp"

namespace moonmoe::fn {

// ---- explicit rounding ----

/// c + a * b, the product rounded and then the sum, as the host computes it (x86-64 has no FMA in its baseline).
/// nvcc contracts a plain `c + a * b` into one FMA (-fmad=true, its default), a different result; __fmul_rn and
/// __fadd_rn are never contracted. Functors claimed bitwise equal to the CPU use this (checked by ctest
/// nvcc.contraction over test/nvcc/contraction_kernels.cu).
MOONMOE_HD inline float add_product(float c, float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(c, __fmul_rn(a, b));
#else
    return c + a * b;
#endif
}
MOONMOE_HD inline double add_product(double c, double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(c, __dmul_rn(a, b));
#else
    return c + a * b;
#endif
}

// ---- the router's order ----

/// a ranks above b in a top-k: torch.topk's order (HF's router), a NaN above every number (+inf included), numbers
/// by value. A total order (NaNs level with each other), so every backend's selection is the same with NaNs too.
MOONMOE_HD inline bool ranks_above(float a, float b) { return a > b || (a != a && b == b); }

/// Value a of index i comes before value b of index j: it ranks above, or level (equal, or both NaN) at a lower index.
MOONMOE_HD inline bool ranks_before(float a, index_t i, float b, index_t j) {
    return ranks_above(a, b) || (!ranks_above(b, a) && i < j);
}

MOONMOE_HD inline float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

/// silu(z) = z * sigmoid(z)
MOONMOE_HD inline float silu(float z) { return z * sigmoid(z); }

/// d silu / dz = s (1 + z (1 - s)), s = sigmoid(z)
MOONMOE_HD inline float silu_grad(float z) {
    const float s = sigmoid(z);
    return s * (1.0f + z * (1.0f - s));
}

// ---- routing ----

/// The auxiliary-loss-free balancing step on one expert's bias: b += gamma * sign(mean - load).
struct LoadBalanceStep {
    float gamma;
    double mean;  ///< the mean load over the experts
    MOONMOE_HD void operator()(float& b, index_t load) const {
        const double diff = mean - double(load);
        b = add_product(b, gamma, float((diff > 0) - (diff < 0)));
    }
};

/// Row i of a dispatch buffer times its pair's routing weight: x *= weight[row_slot[i]] (map_indexed; weight and
/// row_slot are backend pointers, the [T, K] routing weights and the plan's row_slot).
struct ScaleByPairWeight {
    const float* weight;
    const index_t* row_slot;
    MOONMOE_HD void operator()(index_t i, index_t, float& x) const { x *= weight[row_slot[i]]; }
};

// ---- generic ----

/// x = value
template <class T>
struct SetTo {
    T value;
    MOONMOE_HD void operator()(T& x) const { x = value; }
};

/// x *= factor
template <class T>
struct ScaleBy {
    T factor;
    MOONMOE_HD void operator()(T& x) const { x *= factor; }
};

/// y = alpha x + beta y (T = float or double), each product rounded, then the sum: the CPU's bits on a GPU too
template <class T>
struct Axpby {
    T alpha, beta;
    MOONMOE_HD void operator()(T& y, T x) const { y = add_product(alpha * x, beta, y); }
};

/// y += x
template <class T>
struct AddTo {
    MOONMOE_HD void operator()(T& y, T x) const { y += x; }
};

/// y = x, converting the element type (f32 master weights to a bf16 or f64 working copy, and back): bf16 rounds to
/// nearest even, as numeric/bf16.hpp's convert does (MapOps::cast)
struct Convert {
    template <class To, class From>
    MOONMOE_HD void operator()(To& y, From x) const {
        y = convert<To>(x);
    }
};

// ---- SwiGLU ----

/// a = silu(g) * u
struct SwiGLUForward {
    MOONMOE_HD void operator()(float& a, float g, float u) const { a = silu(g) * u; }
};

/// From da and the kept (g, u): g becomes dg = da u silu'(g), u becomes du = da silu(g) (the cache is spent).
struct SwiGLUBackward {
    MOONMOE_HD void operator()(float& g_to_dg, float& u_to_du, float da) const {
        const float g = g_to_dg, u = u_to_du;
        g_to_dg = da * u * silu_grad(g);
        u_to_du = da * silu(g);
    }
};

// ---- optimizers ----

/// x rounded to the nearest bf16 (ties to even), kept as f32: what a bf16 tensor would hold (also the bf16 compute
/// policy's, below).
MOONMOE_HD inline float round_bf16(float x) { return convert<float>(convert<bf16>(x)); }

/// Muon's momentum (torch.optim.Muon): m.lerp_(g, 1 - beta); u = g.lerp(m, beta) with Nesterov, else m.
struct MuonMomentum {
    float beta;
    bool nesterov;
    bool round_u = false;  ///< u rounded to bf16 (kept in f32): what a bf16 Newton-Schulz does with it first
    MOONMOE_HD void operator()(float& m, float& u, float g) const {
        m += (1.0f - beta) * (g - m);
        const float v = nesterov ? g + beta * (m - g) : m;
        u = round_u ? round_bf16(v) : v;
    }
};

/// W = W * decay - step * O: decoupled weight decay, then the orthogonalised update.
struct DecayAndStep {
    float decay, step;
    MOONMOE_HD void operator()(float& w, float o) const { w = w * decay - step * o; }
    MOONMOE_HD void operator()(float& w, bf16 o) const { (*this)(w, o.to_float()); }  ///< a bf16 Newton-Schulz's O
};

/// One AdamW element (torch.optim.AdamW): W *= decay; m.lerp_(g, 1 - b1); v = b2 v + (1 - b2) g^2;
/// W -= step * m / (sqrt(v) / root2 + eps), with step = lr / (1 - b1^t) and root2 = sqrt(1 - b2^t).
struct AdamWUpdate {
    float decay, b1, b2, step, root2, eps;
    MOONMOE_HD void operator()(float& w, float& m, float& v, float g) const {
        w *= decay;
        m += (1.0f - b1) * (g - m);
        v = v * b2 + (1.0f - b2) * g * g;
        w -= step * m / (sqrtf(v) / root2 + eps);
    }
};

/// Whether one optimizer step leaves an element finite, decided before the step changes anything (the update
/// pre-check of optim::Optimizer::step). AdamW: the step itself on copies, so exactly whether w, m and v stay
/// finite (to the rounding of a contracted FMA). Muon: the momentum on copies (m and Newton-Schulz's input u
/// finite), and the weight W * decay - step * O for every |O| <= o_bound, the largest element Newton-Schulz can
/// return (its output's largest singular value bounds every element): |W * decay| + step * o_bound within the
/// float range, in double.
struct UpdateStaysFinite {
    AdamWUpdate adamw;
    MuonMomentum momentum;
    float muon_decay, o_bound;
    MOONMOE_HD static bool finite(float x) { return fabsf(x) <= 3.402823466e38f; }  // false for NaN and +-Inf
    MOONMOE_HD bool adamw_ok(float w, float g, float m, float v) const {
        adamw(w, m, v, g);
        return finite(w) && finite(m) && finite(v);
    }
    MOONMOE_HD bool muon_ok(float step, float w, float g, float m) const {
        float u = 0.0f;
        momentum(m, u, g);
        // The largest float less half an ulp of it, so that a sum rounding to the largest float still passes and
        // nothing that rounds to an infinity does.
        const double reach = fabs(double(w) * double(muon_decay)) + double(step) * double(o_bound);
        return finite(m) && finite(u) && reach < 3.4028235677973366e38;
    }
};

/// inv = 1 / max(sqrt(sq) * safety + add_eps, clamp_eps): Newton-Schulz's scale of G from its squared Frobenius
/// norm (in double), so that X = inv G has every singular value at most 1.
template <class T>
struct InverseNorm {
    double safety, add_eps, clamp_eps;
    MOONMOE_HD void operator()(T& inv, double sq) const {
        const double d = sqrt(sq) * safety + add_eps;
        inv = T(1.0 / (d < clamp_eps ? clamp_eps : d));  // std::max(d, clamp_eps), NaN kept as std::max keeps it
    }
};

/// out = a + b: the residual adds of the decoder layer.
struct Sum {
    MOONMOE_HD void operator()(float& out, float a, float b) const { out = a + b; }
};

// ---- the bf16 compute policy (Precision<BF16>, docs/precision.md): f32 storage holding bf16 values ----

/// x = round_bf16(x): an activation leaving an operation, as torch's bf16 result of it.
struct RoundToBF16 {
    MOONMOE_HD void operator()(float& x) const { x = round_bf16(x); }
};

/// y = round_bf16(x): a value rounded to bf16 and kept in f32.
struct RoundedCopy {
    MOONMOE_HD void operator()(float& y, float x) const { y = round_bf16(x); }
};

/// out = round_bf16(a + b): a bf16 residual add.
struct SumBF16 {
    MOONMOE_HD void operator()(float& out, float a, float b) const { out = round_bf16(a + b); }
};

/// y = round_bf16(y + x): adding a bf16 result into a bf16 accumulator.
struct AddToBF16 {
    MOONMOE_HD void operator()(float& y, float x) const { y = round_bf16(y + x); }
};

/// a = round_bf16(round_bf16(silu(g)) * u): torch's bf16 `act_fn(gate) * up`, each op rounding its result.
struct SwiGLUForwardBF16 {
    MOONMOE_HD void operator()(float& a, float g, float u) const { a = round_bf16(round_bf16(silu(g)) * u); }
};

}  // namespace moonmoe::fn
