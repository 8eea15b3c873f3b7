// expect-error: Parallel: MicroBatches must be at least PP
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = KimiK2::with<Parallel<16, 16, 1, VirtualStages<2>, MicroBatches<8>>>;
static_assert(Bad::parameter_count() > 0);
