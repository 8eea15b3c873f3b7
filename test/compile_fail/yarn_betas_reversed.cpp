// expect-error: YaRN: Factor must be >= 1, OriginalMaxPositions positive and BetaFast >= BetaSlow
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<RoPE<YaRN<BetaFast<1.0>, BetaSlow<32.0>>>>;
static_assert(Bad::parameter_count() > 0);
