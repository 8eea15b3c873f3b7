// moonmoe/moonmoe.hpp: the umbrella header.
//
// moonmoe is a header-only C++20 library for Mixture-of-Experts transformers of the Kimi K2 family (DeepSeek-V3
// architecture). Its layers, each a folder that includes only the ones listed before it: config/ (the model as a
// type, rules, accounting; no dependencies), tensor/, backend/ (cpu: Eigen), nn/ (modules with forward and
// backward, and the seeded initialiser), optim/ (Muon, AdamW, QK-Clip and their composition), io/ (safetensors,
// config.json, Hugging Face checkpoints loaded and saved, optimizer state), parallel/ (process groups over a
// communicator, the pipeline, expert parallelism, ZeRO-1; MPI and NCCL only in parallel/mpi.hpp and nccl.hpp, which
// this header does not include), rl/ (post-training: sampling, rollouts, the K1.5 objective, also through a
// pipeline), and trainer.hpp (moonmoe::Trainer<Model>: a run made from the model type, over all of them).
// <moonmoe/config.hpp> alone needs nothing but a C++20 compiler; this header needs Eigen and nlohmann_json (the CMake
// target moonmoe::cpu).
#pragma once

#include "config.hpp"
#include "tensor/dtype.hpp"
#include "tensor/fp8_tiles.hpp"
#include "tensor/tensor.hpp"
#include "backend/cpu.hpp"
#include "nn.hpp"
#include "nn/init.hpp"
#include "optim.hpp"
#include "io/checkpoint.hpp"
#include "io/model_io.hpp"
#include "io/optimizer_state.hpp"
#include "rl/objective.hpp"
#include "rl/pipeline.hpp"
#include "trainer.hpp"
