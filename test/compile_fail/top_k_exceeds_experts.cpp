// expect-error: MoE: TopK must not exceed Experts
#include <moonmoe/config.hpp>
using Bad = moonmoe::Model<moonmoe::MoE<moonmoe::Experts<8>, moonmoe::TopK<16>>>;
static_assert(Bad::parameter_count() > 0);
