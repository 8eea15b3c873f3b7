// expect-error: Attention: head dims do not fit
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Attention<MLA<RopeDim<63>>>>;
static_assert(Bad::parameter_count() > 0);
