// moonmoe/backend/cpu/routing.hpp: RoutingOps<cpu> (backend/routing.hpp).
#pragma once

#include "../../tensor/tensor.hpp"
#include "../routing.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct RoutingOps<cpu> {};

}  // namespace moonmoe::backend
