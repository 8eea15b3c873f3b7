// expect-error: LearningRate in (0, 10]
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Optimizer<Muon<LearningRate<1e38>>>>;  // issue 29: a rate that steps every weight to infinity
static_assert(Bad::parameter_count() > 0);
