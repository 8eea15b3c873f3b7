// moonmoe/nn.hpp: every module of the nn layer (generic over the backend; include a backend header too).
#pragma once

#include "nn/activations.hpp"
#include "nn/cross_entropy.hpp"
#include "nn/decoder_layer.hpp"
#include "nn/embedding.hpp"
#include "nn/gradcheck.hpp"
#include "nn/layout.hpp"
#include "nn/linear.hpp"
#include "nn/mla.hpp"
#include "nn/moe.hpp"
#include "nn/param.hpp"
#include "nn/rmsnorm.hpp"
#include "nn/rope.hpp"
#include "nn/router.hpp"
#include "nn/swiglu.hpp"
#include "nn/transformer.hpp"
