// moonmoe/backend/optim.hpp: the optimizer (reductions, finite checks, QK-Clip row scaling) primitives.
//
// OptimOps<B>: (the list is completed with the family's implementation)
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct OptimOps {
    static_assert(missing_backend<B>, "moonmoe: no optim primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
