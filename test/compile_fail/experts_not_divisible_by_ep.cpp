// expect-error: Parallel: Experts must be divisible by EP
#include <moonmoe/config.hpp>
using Bad = moonmoe::KimiK2::with<moonmoe::Parallel<16, 7, 1>>;
static_assert(Bad::parameter_count() > 0);
