// moonmoe/config/macros.hpp: version and the one host/device annotation macro.
//
// Everything under config/ is plain constexpr C++20 with no third-party headers, so it compiles with g++, clang
// and nvcc alike. Element-wise functors shared by the CPU and CUDA backends are marked MOONMOE_HD.
#pragma once

#define MOONMOE_VERSION_MAJOR 0
#define MOONMOE_VERSION_MINOR 1
#define MOONMOE_VERSION_PATCH 0

#if defined(__CUDACC__)
#define MOONMOE_HD __host__ __device__
#else
#define MOONMOE_HD
#endif
