// moonmoe/optim/optimizer.hpp: the configured optimizer, `optim::Optimizer<moonmoe::Optimizer<Muon<...>,
// QKClip<tau>>>` (MuonClip by default), bound to a model.
//
// Each parameter is routed by its ParamKind (overridable): matrices and expert matrices to Muon (each expert on its
// own), embeddings, the output head and norm gains to AdamW, the router's correction bias to neither (it moves by
// the balancing rule, bias_update_rate). step(), in this order:
//   1. checks every gradient it will step for NaN / +-Inf, then whether the step would leave a NaN or an infinity
//      in a weight or in the optimizer state (a finite but huge gradient, a setting whose product overflows); if
//      either finds one, the whole step is skipped, nothing changed, and reported;
//   2. applies the learning-rate schedule and updates every parameter (Muon, AdamW);
//   3. moves the router biases by the balancing rule, from the tokens the training forwards routed;
//   4. QK-Clip, the last thing that changes a weight, by the maxima the training forwards recorded; with
//      `remeasure`, measure and clip until a measurement forward of the weights the step leaves has every head at or
//      below tau;
//   5. sets the gradients it stepped with to zero (zero_grads_after_step), so the next train_step starts afresh.
//
// Under Precision<BF16, Weights<BF16>> the model holds its matrices in bf16 alone; the optimizer keeps an f32
// master of each such parameter it steps (Slot::master: the bf16 values widened, at construction), updates the
// masters and rounds them into the bf16 weights after every change (the update, QK-Clip). Under ZeRO-1 each rank
// steps its own share, so the masters are sharded as the rest of the optimizer state (parallel/zero.hpp).
//
// The training loop is therefore `loss = model.train_step(ids, layout); opt.step();`. To accumulate micro-batches,
// run train_step (or forward + backward) once per micro-batch, then step() once: each backward adds (+=) its
// gradient, and only step() clears them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "adamw.hpp"
#include "muon.hpp"
#include "qk_clip.hpp"
#include "../tensor/transfer.hpp"

namespace moonmoe::optim {

enum class Route { muon, adamw, none };

/// The default routing: Muon takes 2-D hidden matrices, AdamW the rest, nothing the router bias.
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

/// The largest learning rate a step accepts: no Muon or AdamW recipe comes near it, and 1e38 or an infinity, which
/// would step every weight to a non-finite value, is refused by name.
inline constexpr double max_learning_rate = 10.0;

/// Throws std::invalid_argument naming the first run-time setting out of its range (a type's values are checked
/// at compile time by the same rules, config/model_config.hpp; a program may change them afterwards).
inline void check_settings(const OptimizerConfig& c, double bias_update_rate, const std::string& where) {
    const auto fail = [&](const char* field, double value, const char* range) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", value);
        throw std::invalid_argument(where + ": " + field + " is " + text + "; it must be " + range);
    };
    const auto in = [](double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; };
    if (!in(c.muon.learning_rate, 0.0, max_learning_rate))
        fail("config.muon.learning_rate", c.muon.learning_rate, "finite and in [0, 10]");
    if (!in(c.adamw.learning_rate, 0.0, max_learning_rate))
        fail("config.adamw.learning_rate", c.adamw.learning_rate, "finite and in [0, 10]");
    if (!in(c.muon.momentum, 0.0, 1.0) || c.muon.momentum == 1.0)
        fail("config.muon.momentum", c.muon.momentum, "in [0, 1)");
    if (!in(c.muon.weight_decay, 0.0, 1e308)) fail("config.muon.weight_decay", c.muon.weight_decay, "finite and >= 0");
    if (!in(c.muon.scale_factor, 0.0, 1e308) || c.muon.scale_factor == 0.0)
        fail("config.muon.scale_factor", c.muon.scale_factor, "finite and > 0");
    if (c.muon.ns_steps < 1 || c.muon.ns_steps > 100) fail("config.muon.ns_steps", c.muon.ns_steps, "in [1, 100]");
    if (!in(c.adamw.beta1, 0.0, 1.0) || c.adamw.beta1 == 1.0) fail("config.adamw.beta1", c.adamw.beta1, "in [0, 1)");
    if (!in(c.adamw.beta2, 0.0, 1.0) || c.adamw.beta2 == 1.0) fail("config.adamw.beta2", c.adamw.beta2, "in [0, 1)");
    if (!in(c.adamw.eps, 0.0, 1e308) || c.adamw.eps == 0.0) fail("config.adamw.eps", c.adamw.eps, "finite and > 0");
    if (!in(c.adamw.weight_decay, 0.0, 1e308))
        fail("config.adamw.weight_decay", c.adamw.weight_decay, "finite and >= 0");
    if (c.qk_clip.enabled && (!in(c.qk_clip.tau, 0.0, 1e308) || c.qk_clip.tau == 0.0))
        fail("config.qk_clip.tau", c.qk_clip.tau, "finite and > 0");
    if (c.qk_clip.enabled && !in(c.qk_clip.alpha, 0.0, 1.0)) fail("config.qk_clip.alpha", c.qk_clip.alpha, "in [0, 1]");
    if (c.schedule.warmup < 0 || c.schedule.stable < 0 || c.schedule.decay < 0)
        fail("config.schedule's warmup, stable or decay",
             double(std::min({c.schedule.warmup, c.schedule.stable, c.schedule.decay})), ">= 0");
    if (!in(c.schedule.final_fraction, 0.0, 1.0))
        fail("config.schedule.final_fraction", c.schedule.final_fraction, "in [0, 1]");
    if (!in(bias_update_rate, 0.0, 1e308)) fail("bias_update_rate", bias_update_rate, "finite and >= 0");
}

struct StepReport {
    long long step = 0;  ///< steps taken, this one included (a skipped step is not taken)
    double muon_lr = 0, adamw_lr = 0;
    /// Heads clipped per layer (summed over the re-measure rounds) and the maxima the first clip acted on.
    ClipReport clip;
    /// With `remeasure`: the measure-and-clip rounds run, and the per-layer maxima of the last measured forward.
    /// When clip_exhausted is false, that forward clipped nothing, so these are the maxima of the weights the step
    /// leaves, every one at or below tau.
    int clip_rounds = 0;
    std::vector<float> max_logit_remeasured;
    /// The rounds ran out with a head still over tau at the last measurement (which was then clipped once more):
    /// the weights are not known to be at or below tau.
    bool clip_exhausted = false;
    /// 1 when a stepped gradient held a NaN or an infinity, or (nonfinite_update) when the step would have left one
    /// in a weight or its optimizer state: nothing changed (no weight, no optimizer state, no step count, no router
    /// bias, no QK-Clip); nonfinite_param names the first such parameter in visit order.
    index_t skipped_nonfinite = 0;
    std::string nonfinite_param;
    bool nonfinite_update = false;
};

/// Whether Optimizer::step checks the gradients and the updates for non-finite values first (`run`), or its caller
/// has just done so over the same gradients (`done`).
enum class Checks { run, done };

template <class Config = moonmoe::Optimizer<>, class B = cpu>
class Optimizer {
public:
    using Coefficients = typename Config::coefficients;
    using Router = std::function<Route(const ParamRef&)>;
    /// The most rounds of QK-Clip a step() with `remeasure` runs unless told otherwise.
    static constexpr int clip_rounds = 10;

    /// One parameter's optimizer state: Muon's momentum, or AdamW's two moments, flat (numel) tensors on the
    /// backend (io/optimizer_state.hpp moves them to and from the host); empty where the route has none. A stepped
    /// parameter stored in bf16 has its f32 master here, and param.value points to it.
    struct Slot {
        ParamRef param;
        Route route;
        Tensor<float, 1, B> momentum, exp_avg, exp_avg_sq;
        Tensor<float, 1, B> master;
    };

    OptimizerConfig config = Config::value;
    /// gamma of the auxiliary-loss-free balancing (0: bias frozen); the configuration's BiasUpdateRate
    float bias_update_rate = float(Config::value.bias_update_rate);
    /// step() ends by setting every gradient it steps with to zero, a skipped step's too (Route::none
    /// parameters' are left alone). false leaves them to the caller, who then zeroes them (model.zero_grad())
    /// before the next accumulation.
    bool zero_grads_after_step = true;

    explicit Optimizer(nn::Transformer<B>& model, Router route = {}) : model_(model) {
        check_settings(config, bias_update_rate, "Optimizer");
        newton_schulz_output_bound();  // refuses a diverging coefficient schedule now rather than at a step
        const bool muon = config.muon.enabled;
        model.visit_params([&](const ParamRef& p) {
            Slot s{p, route ? route(p) : route_by_kind(p, muon), {}, {}, {}, {}};
            if (s.route == Route::muon && p.shape.size() != 2)
                throw std::invalid_argument("Optimizer: " + p.name + " is routed to Muon but is not a matrix");
            if (s.route != Route::none && !p.grad)
                throw std::invalid_argument("Optimizer: " + p.name + " has no gradient to step with");
            const index_t n = p.numel();
            if (s.route == Route::muon) s.momentum = Tensor<float, 1, B>({n});  // zeroed
            if (s.route == Route::adamw) s.exp_avg = Tensor<float, 1, B>({n}), s.exp_avg_sq = Tensor<float, 1, B>({n});
            if (s.route != Route::none && p.stored_bf16) {  // Weights<BF16>: the f32 master the step updates
                s.master = Tensor<float, 1, B>({n});
                backend::Ops<B>::template cast<float, bf16>(View<const bf16, 2, B>(p.value16, {1, n}),
                                                            s.master.template reshape<2>({1, n}));
                s.param.value = s.master.data();
                master_of_[p.value16] = s.master.data();
            }
            if (s.route != Route::none) {
                stepped_slot_.push_back(slots_.size());
                stepped_grads_.push_back(View<float, 1, B>(p.grad, {n}));
            }
            slots_.push_back(std::move(s));
        });
    }

    /// Steps taken. A step skipped for a non-finite gradient does not count, so it advances neither the
    /// learning-rate schedule nor AdamW's bias correction (as torch.amp.GradScaler skips optimizer.step()).
    long long steps() const { return step_; }
    void set_steps(long long t) { step_ = t; }
    /// Steps skipped for a NaN or an infinity in a gradient or in what the step would leave, since construction.
    long long skipped_nonfinite_steps() const { return skipped_nonfinite_; }
    /// Steps whose QK-Clip re-measure ran out of rounds with a head over tau, since construction.
    long long clip_exhausted_steps() const { return clip_exhausted_; }
    std::vector<Slot>& slots() { return slots_; }

    /// The learning rates the next step will use (the schedule at this step).
    std::pair<double, double> learning_rates() const {
        const double f = config.schedule.multiplier(step_);
        return {config.muon.learning_rate * f, config.adamw.learning_rate * f};
    }

    /// One optimizer step from the accumulated gradients (the order is in the header comment); the gradients are
    /// zero afterwards (unless zero_grads_after_step is false), ready for the next accumulation.
    ///
    /// Non-finite gradients: if any stepped gradient holds a NaN or an infinity, nothing is changed and the report
    /// says so (skipped_nonfinite, nonfinite_param). The forwards' statistics (maxima, router loads) are dropped
    /// too, since they may come from the same non-finite activations.
    ///
    /// QK-Clip without `remeasure` is Algorithm 1 as written: it clips by the maxima the forwards recorded before
    /// the update, so the update, the new router biases, and the clip of earlier layers changing later layers'
    /// inputs can all leave a head above tau. With `remeasure` (re-run the step's forwards, no backward) each round
    /// measures the weights as they now are (updated, biases moved, clipped so far) and clips by those maxima, until
    /// a round clips nothing: that round's forward is one of the exact weights the step leaves, with every head at
    /// or below tau. At most `rounds` rounds; running out is reported (clip_exhausted). `remeasure` runs its forwards
    /// as measurements, forward(ids, layout, cache, nn::Pass::measurement): they record the maxima and count no
    /// router load (nn/pass.hpp); one that records nothing is refused. The maxima are reset at the end for the next
    /// step's forwards.
    ///
    /// `rounds` defaults to clip_rounds. `checks`: Checks::done where the caller has just made step()'s checks of the
    /// gradients and the updates over the same gradients itself and found them finite (parallel::DistributedOptimizer,
    /// whose ranks decide together before it updates), so that the gradients and the updates are not scanned twice.
    StepReport step(const std::function<void()>& remeasure = {}, int rounds = clip_rounds,
                    Checks checks = Checks::run) {
        if (remeasure && rounds < 1)
            throw std::invalid_argument("Optimizer::step: rounds must be at least 1 with remeasure (got " +
                                        std::to_string(rounds) + ")");
        check_settings(config, bias_update_rate, "Optimizer::step");  // a program may have changed them
        StepReport r;
        std::tie(r.muon_lr, r.adamw_lr) = learning_rates();
        const Slot* bad = checks == Checks::run ? first_nonfinite_gradient() : nullptr;
        r.nonfinite_update = checks == Checks::run && !bad && (bad = first_unsafe_slot()) != nullptr;
        if (bad) {
            r.step = step_;
            r.skipped_nonfinite = 1;
            r.nonfinite_param = bad->param.name;
            ++skipped_nonfinite_;
            reset_max_logits();
            for (auto& layer : model_.layers)
                if (nn::Router<B>* router = layer.router()) router->reset_load();
            if (zero_grads_after_step) zero_stepped_gradients();
            return r;
        }
        r.step = ++step_;
        for (Slot& s : slots_) {
            if (s.route == Route::muon) {
                const index_t rows = s.param.shape[0], cols = s.param.shape[1];
                auto& ws = workspaces_[{rows, cols}];
                const auto step_with = [&](auto& ns) {  // the workspace's type is the Newton-Schulz precision
                    muon_step<Coefficients, B>(config.muon, r.muon_lr, View<float, 2, B>(s.param.value, {rows, cols}),
                                               View<const float, 2, B>(s.param.grad, {rows, cols}),
                                               s.momentum.template reshape<2>({rows, cols}), ns, ws.u, ws.o);
                };
                if (config.muon.ns_precision == NumberFormat::bf16) step_with(ws.ns_bf16);
                else
                    step_with(ws.ns);
            } else if (s.route == Route::adamw) {
                adamw_step<B>(config.adamw, r.adamw_lr, step_, s.param.value, s.param.grad, s.exp_avg.data(),
                              s.exp_avg_sq.data(), s.param.numel());
            }
        }
        round_masters();                   // Weights<BF16>: the bf16 weights are the updated masters rounded
        model_.refresh_working_weights();  // bf16 compute: the products read the updated masters rounded to bf16
        if (bias_update_rate != 0.0f)      // before QK-Clip: a bias changes the routing, so what later layers see
            for (auto& layer : model_.layers)
                if (nn::Router<B>* router = layer.router()) router->update_bias(bias_update_rate);
        if (config.qk_clip.enabled && remeasure) clip_until_at_most_tau(remeasure, rounds, r);
        else if (config.qk_clip.enabled)
            r.clip = apply_qk_clip(model_, config.qk_clip, masters());
        else
            reset_max_logits();
        if (zero_grads_after_step) zero_stepped_gradients();
        return r;
    }

    /// The first stepped parameter (visit order) whose next step would leave a NaN or an infinity in its weight or
    /// its optimizer state, or null; nothing is written. Exact for AdamW and Muon's momentum (the step's own
    /// arithmetic on copies); Muon's weight is checked against Newton-Schulz's largest possible output element
    /// (newton_schulz_bound), which only a weight within a few units of the float range can fail without failing
    /// the update itself. One primitive over every stepped parameter (backend/optim.hpp, first_unsafe_update) and a
    /// host read of its answer.
    const ParamRef* first_unsafe_update() {
        const Slot* s = first_unsafe_slot();
        return s ? &s->param : nullptr;
    }

    /// Each master rounded into its bf16 parameter (Weights<BF16>): step() does it; so does loading a saved state.
    void round_masters() {
        for (Slot& s : slots_) {
            if (!s.master.empty())
                backend::cast_flat<bf16, float, B>(s.master.data(), s.param.value16, s.master.numel());
        }
    }

    /// Where QK-Clip finds a weight's f32 values: its own, or (Weights<BF16>) the master this optimizer keeps of it;
    /// null for a bf16 weight another rank steps.
    MasterOf<B> masters() {
        return [this](const Param<2, B>& w) -> float* {
            if (!w.value.empty()) return const_cast<float*>(w.value.data());
            const auto it = master_of_.find(w.value16.data());
            return it == master_of_.end() ? nullptr : it->second;
        };
    }

    void reset_max_logits() {
        for (auto& layer : model_.layers) layer.reset_max_logits();
    }

private:
    struct Workspace {
        NSWorkspace<float, B> ns;
        NSWorkspaceBF16<B> ns_bf16;  ///< used when config.muon.ns_precision is bf16 (Muon<NSPrecision<BF16>>)
        Tensor<float, 2, B> u, o;
    };

    /// The first slot (in visit order) whose gradient holds a NaN or an infinity, or null: one primitive over
    /// every stepped gradient (backend/optim.hpp, first_nonfinite).
    const Slot* first_nonfinite_gradient() {
        std::vector<View<const float, 1, B>> grads(stepped_grads_.begin(), stepped_grads_.end());
        backend::Ops<B>::first_nonfinite(grads, first_bad_.view());
        // Host sync: whether the step is taken (and which parameter the report names) is decided on the host.
        const auto k = std::size_t(element_to_host(first_bad_.view(), 0));
        return k < stepped_slot_.size() ? &slots_[stepped_slot_[k]] : nullptr;
    }

    const Slot* first_unsafe_slot() {
        const auto [muon_lr, adamw_lr] = learning_rates();
        const fn::UpdateStaysFinite f{adamw_update(config.adamw, adamw_lr, step_ + 1),
                                      fn::MuonMomentum{float(config.muon.momentum), config.muon.nesterov},
                                      float(1.0 - muon_lr * config.muon.weight_decay),
                                      float(newton_schulz_output_bound())};
        std::vector<backend::UpdateItem> items;
        for (std::size_t k : stepped_slot_) {
            const Slot& s = slots_[k];
            const bool muon = s.route == Route::muon;
            items.push_back(
                {s.param.value, s.param.grad, muon ? s.momentum.data() : s.exp_avg.data(),
                 muon ? nullptr : s.exp_avg_sq.data(), s.param.numel(),
                 muon ? muon_weight_step(config.muon, muon_lr, s.param.shape[0], s.param.shape[1]).step : 0.0f});
        }
        backend::Ops<B>::first_unsafe_update(f, items, first_bad_.view());
        // Host sync: as first_nonfinite_gradient's, the step's decision is the host's.
        const auto k = std::size_t(element_to_host(first_bad_.view(), 0));
        return k < stepped_slot_.size() ? &slots_[stepped_slot_[k]] : nullptr;
    }

    /// newton_schulz_bound of the configured schedule and steps (cached per step count); a schedule that diverges
    /// is refused, naming the steps.
    double newton_schulz_output_bound() {
        if (!config.muon.enabled) return 0.0;
        if (bound_steps_ != config.muon.ns_steps) {
            bound_steps_ = config.muon.ns_steps;
            o_bound_ = newton_schulz_bound<Coefficients>(bound_steps_);
        }
        if (!std::isfinite(o_bound_) || o_bound_ > 1e6)
            throw std::invalid_argument(
                "Optimizer: the Newton-Schulz coefficients take a singular value in [0, 1] "
                "beyond 1e6 within " +
                std::to_string(bound_steps_) +
                " iterations (config.muon.ns_steps): they diverge, and Muon's updates "
                "would not be bounded");
        return o_bound_;
    }

    /// Sets the gradient of every slot routed to Muon or AdamW to zero, in one primitive call.
    void zero_stepped_gradients() { backend::Ops<B>::zero_all(stepped_grads_); }

    void clip_until_at_most_tau(const std::function<void()>& remeasure, int rounds, StepReport& r) {
        ClipReport c;
        for (int round = 1; round <= rounds; ++round) {
            reset_max_logits();
            remeasure();
            require_measured();
            c = apply_qk_clip(model_, config.qk_clip, masters());  // resets the maxima
            if (round == 1) r.clip = c;
            else
                for (std::size_t l = 0; l < c.heads_clipped.size(); ++l) r.clip.heads_clipped[l] += c.heads_clipped[l];
            r.clip_rounds = round;
            if (c.total() == 0) break;
        }
        r.max_logit_remeasured = c.max_logit;
        r.clip_exhausted = c.total() != 0;
        if (r.clip_exhausted) ++clip_exhausted_;
    }

    /// A re-measure whose forwards recorded nothing (inference forwards) would let every head pass unclipped.
    void require_measured() {
        for (auto& layer : model_.layers) {
            // Named host sync: one value per layer, once per re-measure round.
            const std::vector<float> m = to_host(layer.max_logits());
            if (std::any_of(m.begin(), m.end(), [](float v) { return v != -INFINITY; })) return;
        }
        if (!model_.layers.empty())
            throw std::logic_error(
                "Optimizer::step: the remeasure callback recorded no attention maxima: run its "
                "forwards as measurements, model.forward(ids, layout, cache, "
                "nn::Pass::measurement) (an inference forward records nothing)");
    }

    nn::Transformer<B>& model_;
    std::vector<Slot> slots_;
    std::vector<View<float, 1, B>> stepped_grads_;  ///< the gradients of the Muon and AdamW slots, in visit order
    std::vector<std::size_t> stepped_slot_;         ///< the slot of each of stepped_grads_
    Tensor<index_t, 1, B> first_bad_{Shape<1>{1}};  ///< first_nonfinite's answer
    std::map<std::pair<index_t, index_t>, Workspace> workspaces_;
    std::map<const bf16*, float*> master_of_;  ///< Weights<BF16>: each stepped bf16 parameter's master
    long long step_ = 0;
    long long skipped_nonfinite_ = 0, clip_exhausted_ = 0;
    int bound_steps_ = -1;  ///< the ns_steps o_bound_ was computed for
    double o_bound_ = 0.0;
};

}  // namespace moonmoe::optim
