// moonmoe/backend/cpu.hpp: Backend<cpu>, on Eigen (optionally BLAS through EIGEN_USE_BLAS) and OpenMP.
#pragma once

#include "cpu/memory.hpp"
#include "cpu/ops.hpp"
#include "cpu/threads.hpp"
