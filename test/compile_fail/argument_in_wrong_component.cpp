// expect-error: MLA<...>: an argument does not belong here
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Attention<MLA<Heads<8>, Experts<16>>>>;
static_assert(Bad::parameter_count() > 0);
