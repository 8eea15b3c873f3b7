// moonmoe/nn/flags.hpp: the two-way choices the modules' calls take, named so that a call site says which it makes.
//
//   Accumulate::no       write the result into the destination (forward's y, backward's dx) (the default)
//   Accumulate::yes      add it to what the destination holds: a residual branch, or a gradient with several
//                        contributions (the q, k and v projections all read x)
//   KeepInput::yes       the module keeps a copy of its input for backward (set_activations; the default)
//   KeepInput::no        it does not: the caller recomputes the input (a norm's output under recompute_norms) and
//                        hands it to backward
//   Rotation::forward    RoPE's rotation (RotaryEmbedding::apply; the default)
//   Rotation::transposed its transpose, which carries gradients back through it (the backward); the inverse only
//                        when attention_factor is 1
#pragma once

namespace moonmoe::nn {

enum class Accumulate { no, yes };
enum class KeepInput { no, yes };
enum class Rotation { forward, transposed };

}  // namespace moonmoe::nn
