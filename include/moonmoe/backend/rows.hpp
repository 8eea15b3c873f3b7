// moonmoe/backend/rows.hpp: the row kernels (RMSNorm, cross-entropy, per-row reductions, embedding rows) primitives.
//
// RowOps<B>: (the list is completed with the family's implementation)
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RowOps {
    static_assert(missing_backend<B>, "moonmoe: no rows primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
