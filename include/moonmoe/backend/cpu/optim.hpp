// moonmoe/backend/cpu/optim.hpp: OptimOps<cpu> (backend/optim.hpp).
#pragma once

#include "../../tensor/tensor.hpp"
#include "../optim.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct OptimOps<cpu> {};

}  // namespace moonmoe::backend
