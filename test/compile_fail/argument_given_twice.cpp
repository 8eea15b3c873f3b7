// expect-error: MoE<...>: the same argument is given twice
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<MoE<Experts<8>, Experts<16>>>;
static_assert(Bad::parameter_count() > 0);
