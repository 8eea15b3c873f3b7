// expect-error: MoE: TopGroups must be between 1 and Groups
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<MoE<Experts<256>, Groups<8>, TopGroups<9>>>;
static_assert(Bad::parameter_count() > 0);
