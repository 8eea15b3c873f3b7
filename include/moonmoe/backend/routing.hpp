// moonmoe/backend/routing.hpp: the routing (router selection and backward, dispatch plan, gather, combine, sorted scatter-add) primitives.
//
// RoutingOps<B>: (the list is completed with the family's implementation)
#pragma once

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RoutingOps {
    static_assert(missing_backend<B>, "moonmoe: no routing primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
