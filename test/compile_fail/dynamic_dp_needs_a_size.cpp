// expect-error: dp_is_static
#include <moonmoe/config.hpp>
// Kimi K2 leaves DP Dynamic: the optimizer-state share per rank needs the data-parallel size, memory_per_rank(dp).
static_assert(moonmoe::KimiK2::memory_per_rank().total_bytes() > 0);
