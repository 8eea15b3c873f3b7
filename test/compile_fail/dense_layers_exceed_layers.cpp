// expect-error: Dims: DenseLayers must be between 0 and Layers
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Dims<Layers<4>, DenseLayers<5>>>;
static_assert(Bad::parameter_count() > 0);
