// expect-error: Parallel: Layers do not split over the pipeline as configured: UnevenSplit
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = KimiK2::with<Parallel<16, 16, 1, Split<UnevenSplit<2, 2>>>>;
static_assert(Bad::parameter_count() > 0);
