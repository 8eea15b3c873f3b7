// expect-error: Attention<P>: P must be an attention policy, MLA<...> or MHA<...>
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Attention<MoE<>>>;
static_assert(Bad::parameter_count() > 0);
