// Restores the CPU backend's thread count when a test that changed it ends (also on a failed check).
#pragma once

#include <moonmoe/backend/cpu.hpp>

namespace moonmoe::testing {

struct ThreadCount {
    int saved = threads();
    ~ThreadCount() { set_threads(saved); }
};

}  // namespace moonmoe::testing
