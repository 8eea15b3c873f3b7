// moonmoe/nn/pass.hpp: what a forward is for, and so which training state it may touch.
//
// Two statistics live in the model between optimizer steps and steer the next one: the routers' load counts (the
// auxiliary-loss-free balancing moves each expert's bias by them, nn/router.hpp) and the attention modules'
// per-head maximum logits (QK-Clip rescales the heads over tau by them, optim/qk_clip.hpp). Only the forwards that
// train may feed them; generation, evaluation and logging between two steps must leave the next step as it was.
//
//   Pass::inference    decoding, evaluation, logging: neither statistic moves (the model's forward by default)
//   Pass::measurement  QK-Clip's re-measure of the updated weights (Optimizer::step's remeasure): records the
//                      maximum logits, counts no load
//   Pass::training     a forward whose backward trains (train_step, the pipeline): counts the load and records the
//                      maxima
#pragma once

namespace moonmoe::nn {

enum class Pass { inference, measurement, training };

/// Whether a forward of this pass adds its tokens to the routers' load counts.
constexpr bool counts_load(Pass p) { return p == Pass::training; }
/// Whether a forward of this pass records the attention's per-head maximum logits.
constexpr bool records_max_logits(Pass p) { return p != Pass::inference; }

constexpr const char* pass_name(Pass p) {
    return p == Pass::training ? "training" : p == Pass::measurement ? "measurement" : "inference";
}

}  // namespace moonmoe::nn
