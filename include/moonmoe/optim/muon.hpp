// moonmoe/optim/muon.hpp: one Muon step on one matrix (Keller Jordan, "Muon", 2024; torch.optim.Muon; Kimi K2 technical
// report, Algorithm 1):
//
//   m = beta m + (1 - beta) g                     (EMA momentum, torch's lerp)
//   u = (1 - beta) g + beta m  if Nesterov, else m
//   O = NS(u)                                     (Newton-Schulz, newton_schulz.hpp)
//   W *= 1 - lr * weight_decay                     (decoupled decay with the unscaled lr)
//   W -= lr * scale(n, m) * O,  scale = 0.2 * sqrt(max(n, m)) (MatchAdamWRMS) or sqrt(max(1, n / m)) (ShapeScale)
// Expert weights are separate parameters, so each expert is orthogonalised on its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "newton_schulz.hpp"

namespace moonmoe::optim {

/// The factor on the orthogonalised update of an n x m (rows x cols) matrix.
inline double muon_update_scale(const MuonConfig& c, index_t rows, index_t cols) {
    if (c.scale == UpdateScaleKind::match_adamw_rms) return c.scale_factor * std::sqrt(double(std::max(rows, cols)));
    return std::sqrt(std::max(1.0, double(rows) / double(cols)));
}

/// W = W * (1 - lr * weight_decay) - lr * scale * O for a rows x cols matrix.
inline fn::DecayAndStep muon_weight_step(const MuonConfig& c, double lr, index_t rows, index_t cols) {
    return {float(1.0 - lr * c.weight_decay), float(lr * muon_update_scale(c, rows, cols))};
}

/// Updates W [rows, cols] in place from its gradient; momentum (W's shape) is the Muon state, on the backend. The
/// workspace chooses the Newton-Schulz precision: NSWorkspace<float, B> iterates in f32, NSWorkspaceBF16<B> in bf16
/// as torch.optim.Muon does (newton_schulz.hpp); momentum, update and weights stay f32 either way. u and o are the
/// step's scratch, kept by the caller (o unused with bf16 Newton-Schulz, whose result the weight step reads in bf16).
template <class Coeffs = KellerQuintic, class B = cpu, class Workspace = NSWorkspace<float, B>>
void muon_step(const MuonConfig& c, double lr, View<float, 2, B> W, View<const float, 2, B> grad,
               View<float, 2, B> momentum, Workspace& ws, Tensor<float, 2, B>& u, Tensor<float, 2, B>& o) {
    using Ops = backend::Ops<B>;
    if (grad.shape != W.shape) throw_shape_mismatch("muon_step: gradient against weight", grad.shape, W.shape);
    if (momentum.shape != W.shape) throw_shape_mismatch("muon_step: momentum against weight", momentum.shape, W.shape);
    if (u.shape() != W.shape) u = Tensor<float, 2, B>(W.shape);
    const fn::DecayAndStep step = muon_weight_step(c, lr, W.shape[0], W.shape[1]);
    if constexpr (std::is_same_v<Workspace, NSWorkspaceBF16<B>>) {
        // a bf16 Newton-Schulz: u rounded to bf16 as the momentum is taken (what it would do first), and its bf16
        // result read by the weight step as it is (no f32 copies of either)
        Ops::map(fn::MuonMomentum{float(c.momentum), c.nesterov, true}, momentum, u.view(), grad);
        Ops::map(step, W,
                 detail::newton_schulz_bf16_rounded<Coeffs, B>(View<const float, 2, B>(u.view()), c.ns_steps, ws, 1e-7,
                                                               c.products));
    } else {
        if (o.shape() != W.shape) o = Tensor<float, 2, B>(W.shape);
        // m.lerp_(g, 1 - beta); u = g.lerp(m, beta) with Nesterov, else m
        Ops::map(fn::MuonMomentum{float(c.momentum), c.nesterov}, momentum, u.view(), grad);
        orthogonalise<Coeffs, B>(u.view(), o.view(), c.ns_steps, ws, c.products);
        Ops::map(step, W, View<const float, 2, B>(o.view()));
    }
}

}  // namespace moonmoe::optim
