// moonmoe/optim.hpp: the optimizer layer: Newton-Schulz, Muon, AdamW, QK-Clip and their composition.
#pragma once

#include "optim/adamw.hpp"
#include "optim/muon.hpp"
#include "optim/newton_schulz.hpp"
#include "optim/optimizer.hpp"
#include "optim/qk_clip.hpp"
