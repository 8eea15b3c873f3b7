// expect-error: Attention: head dims do not fit
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Attention<MHA<Heads<8>, HeadDim<64>, RopeDim<96>>>>;
static_assert(Bad::parameter_count() > 0);
