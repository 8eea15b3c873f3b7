// The training run of examples/train_tiny.cpp, as a function the test suite runs too (a short version).
//
// A small model of Kimi K2's shape (MLA, the first layer dense, MoE with a shared expert and the sigmoid router
// whose correction bias moves by the balancing rule) learns the bytes of a text file. Two runs start from the
// same weights and see the same batches: Muon alone, and MuonClip (Muon + QK-Clip at tau).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <moonmoe/moonmoe.hpp>
#include <moonmoe/optim.hpp>

namespace train_tiny {

using moonmoe::index_t;

using TinyModel =
    moonmoe::Model<moonmoe::Dims<moonmoe::Hidden<128>, moonmoe::Layers<3>, moonmoe::DenseLayers<1>, moonmoe::Vocab<256>,
                                 moonmoe::DenseHidden<256>>,
                   moonmoe::Attention<moonmoe::MLA<moonmoe::Heads<4>, moonmoe::QRank<64>, moonmoe::KVRank<32>,
                                                   moonmoe::NopeDim<16>, moonmoe::RopeDim<8>, moonmoe::VDim<16>>>,
                   moonmoe::RoPE<moonmoe::MaxPositions<4096>, moonmoe::YaRN<moonmoe::OriginalMaxPositions<512>>>,
                   moonmoe::MoE<moonmoe::Experts<8>, moonmoe::TopK<2>, moonmoe::Shared<1>, moonmoe::ExpertHidden<64>>,
                   moonmoe::Parallel<1, 1, 1>>;

struct Options {
    std::string text = "/usr/share/common-licenses/GPL-3";  // on every Debian system
    index_t steps = 300, batch = 8, seq = 64;
    double lr = 2e-2;   ///< Muon and AdamW peak rate (RMS-matched, as in K2)
    double tau = 30.0;  ///< QK-Clip threshold
    index_t warmup = 20;
    float bias_rate = 1e-3f;  ///< auxiliary-loss-free balancing
    std::uint64_t seed = 7;
    /// MuonClip measures the maxima for QK-Clip after the update on the step's batch (Optimizer::step with
    /// remeasure), so every head ends the step at or below tau on that batch; false: Algorithm 1 as written
    /// (maxima from the step's own forward, before the update).
    bool clip_after_update = true;
    /// Also measure the maximum logit after each step: a forward of the step's batch with the updated (and, for
    /// MuonClip, clipped) weights. Costs one more forward per step.
    bool measure_after_step = true;
};

struct StepLog {
    index_t step;
    float loss;
    float max_logit;               ///< over every layer and head, in this step's forward
    std::vector<float> layer_max;  ///< per layer
    index_t heads_clipped;
    float max_logit_after = NAN;  ///< on the same batch, with the weights this step left (measure_after_step)
    bool clip_exhausted = false;  ///< QK-Clip's re-measure ran out of rounds with a head over tau
};

inline std::vector<index_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error(path + ": cannot open the training text");
    std::vector<index_t> ids;
    for (std::istreambuf_iterator<char> it(in), end; it != end; ++it)
        ids.push_back(index_t(static_cast<unsigned char>(*it)));
    return ids;
}

/// One run's state: the model initialised from the seed, its optimizer, and the stream of batches (the same for
/// both runs of a seed). step() trains on the next batch. B: the backend the model and its optimizer live on.
template <class B = moonmoe::cpu>
class Trainer {
public:
    moonmoe::nn::Transformer<B> model{TinyModel::config};
    moonmoe::optim::Optimizer<TinyModel::optimizer, B> opt{model};
    const moonmoe::nn::TokenLayout layout;
    moonmoe::optim::StepReport report;  ///< of the last step

    /// `clip` selects MuonClip, else Muon alone.
    Trainer(const Options& o, bool clip)
        : layout(moonmoe::nn::TokenLayout::sequences(o.batch, o.seq)),
          o_(o),
          text_(read_bytes(o.text)),
          ids_(static_cast<std::size_t>(o.batch * o.seq)),
          state_(o.seed * 0x9E3779B97F4A7C15ull + 1) {
        if (index_t(text_.size()) < o.seq + 1)
            throw std::runtime_error(o.text + ": " + std::to_string(text_.size()) +
                                     " bytes, fewer than one sequence of " + std::to_string(o.seq));
        std::uint64_t seed = o.seed;
        model.visit_params([&](const moonmoe::ParamRef& p) {  // N(0, 1/fan_in), gains 1, bias 0
            if (p.kind == moonmoe::ParamKind::vector || p.kind == moonmoe::ParamKind::router_bias) return;
            const float std_dev =
                p.kind == moonmoe::ParamKind::embedding ? 1.0f : 1.0f / std::sqrt(float(p.shape.back()));
            moonmoe::backend::Ops<B>::fill_normal(moonmoe::View<float, 2, B>(p.value, {1, p.numel()}), 0.0f, std_dev,
                                                  seed++);
        });
        opt.config.muon.learning_rate = opt.config.adamw.learning_rate = o.lr;
        opt.config.schedule = {o.warmup, o.steps, 0, 1.0};
        opt.config.qk_clip.enabled = clip;
        opt.config.qk_clip.tau = o.tau;
        opt.bias_update_rate = o.bias_rate;
    }

    Trainer(const Trainer&) = delete;  // the optimizer holds the model's parameters by address
    Trainer& operator=(const Trainer&) = delete;

    /// The batch of the last step (token ids laid out as `layout`).
    const std::vector<index_t>& batch() const { return ids_; }

    /// One training step on the next batch: forward and backward, then the optimizer step (MuonClip re-measures
    /// on this batch when clip_after_update), then the optional measurement after the step.
    StepLog step() {
        for (index_t b = 0; b < o_.batch; ++b) {
            state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
            const index_t start = index_t((state_ >> 17) % std::uint64_t(text_.size() - o_.seq));
            std::copy(text_.begin() + start, text_.begin() + start + o_.seq, ids_.begin() + b * o_.seq);
        }
        model.zero_grad();
        StepLog log{++steps_, model.train_step(ids_.data(), layout), -INFINITY, {}, 0};
        for (auto& layer : model.layers) {
            const std::vector<float> m = moonmoe::to_host(layer.self_attn.max_logit_per_head);
            log.layer_max.push_back(*std::max_element(m.begin(), m.end()));
            log.max_logit = std::max(log.max_logit, log.layer_max.back());
        }
        std::function<void()> remeasure;
        if (o_.clip_after_update)
            remeasure = [&] {  // forward only: the maxima of the updated weights on this batch
                typename moonmoe::nn::Transformer<B>::Cache cache;
                model.forward(ids_.data(), layout, cache, moonmoe::nn::Pass::measurement);
            };
        report = opt.step(remeasure);
        log.heads_clipped = report.clip.total();
        log.clip_exhausted = report.clip_exhausted;
        if (o_.measure_after_step) {
            typename moonmoe::nn::Transformer<B>::Cache cache;  // a measurement: the router loads stay as they are
            model.forward(ids_.data(), layout, cache, moonmoe::nn::Pass::measurement);
            log.max_logit_after = -INFINITY;
            for (auto& layer : model.layers) {
                const std::vector<float> m = moonmoe::to_host(layer.self_attn.max_logit_per_head);
                log.max_logit_after = std::max(log.max_logit_after, *std::max_element(m.begin(), m.end()));
                layer.self_attn.reset_max_logits();  // the next step's forward records afresh
            }
        }
        return log;
    }

private:
    Options o_;
    std::vector<index_t> text_, ids_;
    std::uint64_t state_;
    index_t steps_ = 0;
};

/// One run on backend B; `clip` selects MuonClip, else Muon alone. progress(step, log) is called after every step.
template <class B = moonmoe::cpu>
std::vector<StepLog> run(const Options& o, bool clip, const std::function<void(const StepLog&)>& progress = {}) {
    Trainer<B> t(o, clip);
    std::vector<StepLog> history;
    for (index_t step = 0; step < o.steps; ++step) {
        history.push_back(t.step());
        if (progress) progress(history.back());
    }
    return history;
}

}  // namespace train_tiny
