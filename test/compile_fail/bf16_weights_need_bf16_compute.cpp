// expect-error: bf16 weights are read by bf16 products only
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Precision<F32, Weights<BF16>>>;
static_assert(Bad::config.precision.weights == NumberFormat::bf16);
