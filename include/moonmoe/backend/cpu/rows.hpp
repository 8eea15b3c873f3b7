// moonmoe/backend/cpu/rows.hpp: RowOps<cpu> (backend/rows.hpp).
#pragma once

#include "../../tensor/tensor.hpp"
#include "../rows.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct RowOps<cpu> {};

}  // namespace moonmoe::backend
