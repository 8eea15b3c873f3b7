// expect-error: MoE: Groups must divide Experts evenly
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = DeepSeekV3::with<DeepSeekV3::moe::with<Groups<7>, TopGroups<4>>>;
static_assert(Bad::parameter_count() > 0);
