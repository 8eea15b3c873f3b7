// expect-error: a flag argument is true, false or Dynamic
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<MoE<CorrectionBias<2>>>;
static_assert(Bad::config.moe.correction_bias);
