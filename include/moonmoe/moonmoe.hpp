// moonmoe/moonmoe.hpp: the umbrella header.
//
// moonmoe is a header-only C++20 library for Mixture-of-Experts transformers of the Kimi K2 family (DeepSeek-V3
// architecture). Layers, each a folder, each including only the ones above it: config/ (compile-time model
// description and accounting), then tensor/, backend/, nn/, optim/, parallel/, io/ as they land.
#pragma once

#include "config.hpp"
