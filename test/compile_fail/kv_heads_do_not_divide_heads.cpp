// expect-error: MHA: KVHeads must divide Heads
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Attention<MHA<Heads<12>, KVHeads<5>>>>;
static_assert(Bad::parameter_count() > 0);
