// moonmoe/backend/cpu.hpp: Backend<cpu>, on Eigen (optionally BLAS through EIGEN_USE_BLAS) and a thread pool.
#pragma once

#include "backend.hpp"
#include "cpu/attention.hpp"
#include "cpu/blas.hpp"
#include "cpu/fp8.hpp"
#include "cpu/map.hpp"
#include "cpu/memory.hpp"
#include "cpu/optim.hpp"
#include "cpu/random.hpp"
#include "cpu/routing.hpp"
#include "cpu/rows.hpp"
#include "cpu/threads.hpp"
