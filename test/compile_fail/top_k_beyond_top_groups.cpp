// expect-error: MoE: TopK must not exceed the experts of TopGroups groups
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<MoE<Experts<16>, TopK<5>, Groups<8>, TopGroups<2>>>;
static_assert(Bad::parameter_count() > 0);
