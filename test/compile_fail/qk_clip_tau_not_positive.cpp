// expect-error: QKClip: tau must be positive
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Optimizer<QKClip<-1.0>>>;
static_assert(Bad::parameter_count() > 0);
