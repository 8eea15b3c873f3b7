// expect-error: Parallel: Layers do not split over the pipeline as configured: EvenSplit
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = KimiK2::with<Parallel<16, 16, 1, VirtualStages<2>, Split<EvenSplit>>>;
static_assert(Bad::parameter_count() > 0);
