// moonmoe/backend/cpu/attention.hpp: AttentionOps<cpu> (backend/attention.hpp).
#pragma once

#include "../../tensor/tensor.hpp"
#include "../attention.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct AttentionOps<cpu> {};

}  // namespace moonmoe::backend
