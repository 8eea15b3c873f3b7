// moonmoe/config.hpp: the compile-time configuration layer alone (no tensors, no third-party headers).
#pragma once

#include "config/accounting.hpp"
#include "config/attention.hpp"
#include "config/backend.hpp"
#include "config/dims.hpp"
#include "config/macros.hpp"
#include "config/model.hpp"
#include "config/model_config.hpp"
#include "config/moe.hpp"
#include "config/named.hpp"
#include "config/optimizer.hpp"
#include "config/parallel.hpp"
#include "config/presets.hpp"
#include "config/rl.hpp"
#include "config/rope.hpp"
