// moonmoe/backend/attention.hpp: the attention (RoPE, causal attention forward and backward with per-head maximum logits, decoding) primitives.
//
// AttentionOps<B>: (the list is completed with the family's implementation)
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct AttentionOps {
    static_assert(missing_backend<B>, "moonmoe: no attention primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
