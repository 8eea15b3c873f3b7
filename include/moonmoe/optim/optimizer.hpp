// moonmoe/optim/optimizer.hpp: the configured optimizer, `optim::Optimizer<moonmoe::Optimizer<Muon<...>,
// QKClip<tau>>>` (MuonClip by default), bound to a model.
//
// Each parameter is routed by its ParamKind (overridable): matrices and expert matrices to Muon (each expert on its
// own), embeddings, the output head and norm gains to AdamW, the router's correction bias to neither (it moves by
// the balancing rule, bias_update_rate). step() applies the learning-rate schedule, updates every parameter, then
// runs QK-Clip on the maxima the forwards since the last step recorded, and reports what it did.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "adamw.hpp"
#include "muon.hpp"
#include "qk_clip.hpp"

namespace moonmoe::optim {

enum class Route { muon, adamw, none };

/// The default routing (DESIGN.md §3): Muon takes 2-D hidden matrices, AdamW the rest, nothing the router bias.
inline Route route_by_kind(const ParamRef& p, bool muon_enabled) {
    switch (p.kind) {
    case ParamKind::matrix:
    case ParamKind::expert_matrix: return muon_enabled && p.shape.size() == 2 ? Route::muon : Route::adamw;
    case ParamKind::embedding:
    case ParamKind::output_head:
    case ParamKind::vector: return Route::adamw;
    case ParamKind::router_bias: return Route::none;
    }
    return Route::adamw;
}

struct StepReport {
    long long step = 0;  ///< steps taken, this one included
    double muon_lr = 0, adamw_lr = 0;
    ClipReport clip;
};

template <class Config = moonmoe::Optimizer<>, class B = cpu>
class Optimizer {
public:
    using Coefficients = typename Config::coefficients;
    using Router = std::function<Route(const ParamRef&)>;

    /// One parameter's optimizer state: Muon's momentum, or AdamW's two moments.
    struct Slot {
        ParamRef param;
        Route route;
        std::vector<float> momentum, exp_avg, exp_avg_sq;
    };

    OptimizerConfig config = Config::value;
    Products products = Products::symmetric;  ///< Newton-Schulz products (general: for measurement)
    float bias_update_rate = 0.0f;            ///< gamma of the auxiliary-loss-free balancing (0: bias frozen)

    explicit Optimizer(nn::Transformer<B>& model, Router route = {}) : model_(model) {
        const bool muon = config.muon.enabled;
        model.visit_params([&](const ParamRef& p) {
            Slot s{p, route ? route(p) : route_by_kind(p, muon), {}, {}, {}};
            if (s.route == Route::muon && p.shape.size() != 2)
                throw std::invalid_argument("Optimizer: " + p.name + " is routed to Muon but is not a matrix");
            if (s.route != Route::none && !p.grad)
                throw std::invalid_argument("Optimizer: " + p.name + " has no gradient to step with");
            if (s.route == Route::muon) s.momentum.assign(std::size_t(p.numel()), 0.0f);
            if (s.route == Route::adamw) s.exp_avg.assign(std::size_t(p.numel()), 0.0f), s.exp_avg_sq = s.exp_avg;
            slots_.push_back(std::move(s));
        });
    }

    long long steps() const { return step_; }
    void set_steps(long long t) { step_ = t; }
    std::vector<Slot>& slots() { return slots_; }

    /// The learning rates the next step will use (the schedule at this step).
    std::pair<double, double> learning_rates() const {
        const double f = config.schedule.multiplier(step_);
        return {config.muon.learning_rate * f, config.adamw.learning_rate * f};
    }

    /// Updates every parameter from its accumulated gradient, then QK-Clip (if configured) and bias balancing.
    /// Gradients are left as they are: zero them (model.zero_grad()) before the next accumulation.
    ///
    /// QK-Clip uses the maxima the forwards recorded before the update (Algorithm 1), so the update itself, and the
    /// clip of earlier layers changing later layers' inputs, can leave a head slightly above tau. Given
    /// `remeasure` (re-run the step's forwards, no backward), the clip instead uses maxima measured after the
    /// update and repeats, up to `rounds` times, until every head of that batch is at or below tau.
    StepReport step(const std::function<void()>& remeasure = {}, int rounds = 10) {
        StepReport r;
        std::tie(r.muon_lr, r.adamw_lr) = learning_rates();
        ++step_;
        for (Slot& s : slots_) {
            if (s.route == Route::muon) {
                const index_t rows = s.param.shape[0], cols = s.param.shape[1];
                auto& ws = workspaces_[{rows, cols}];
                muon_step<Coefficients, B>(config.muon, r.muon_lr, View<float, 2, B>(s.param.value, {rows, cols}),
                                           View<const float, 2, B>(s.param.grad, {rows, cols}), s.momentum.data(),
                                           ws.ns, ws.u, ws.o, products);
            } else if (s.route == Route::adamw) {
                adamw_step<B>(config.adamw, r.adamw_lr, step_, s.param.value, s.param.grad, s.exp_avg.data(),
                              s.exp_avg_sq.data(), s.param.numel());
            }
        }
        r.step = step_;
        if (config.qk_clip.enabled && remeasure) {
            for (int round = 0; round < rounds; ++round) {
                reset_max_logits();
                remeasure();
                const ClipReport c = apply_qk_clip(model_, config.qk_clip);
                if (round == 0) r.clip = c;
                else for (std::size_t l = 0; l < c.heads_clipped.size(); ++l) r.clip.heads_clipped[l] += c.heads_clipped[l];
                if (c.total() == 0) break;
            }
        } else if (config.qk_clip.enabled) {
            r.clip = apply_qk_clip(model_, config.qk_clip);
        } else {
            reset_max_logits();
        }
        if (bias_update_rate != 0.0f)
            for (auto& layer : model_.layers)
                if (!layer.dense) layer.moe.gate.update_bias(bias_update_rate);
        return r;
    }

    void reset_max_logits() {
        for (auto& layer : model_.layers) (layer.latent ? layer.self_attn.reset_max_logits() : layer.mha.reset_max_logits());
    }

private:
    struct Workspace {
        NSWorkspace<float, B> ns;
        Tensor<float, 2, B> u, o;
    };
    nn::Transformer<B>& model_;
    std::vector<Slot> slots_;
    std::map<std::pair<index_t, index_t>, Workspace> workspaces_;
    long long step_ = 0;
};

}  // namespace moonmoe::optim
