// expect-error: Parallel: every pipeline chunk needs a layer
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = TinyK2::with<Parallel<2, 1, 1, VirtualStages<2>>>;
static_assert(Bad::parameter_count() > 0);
