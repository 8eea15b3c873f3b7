// expect-error: the fast kernels are the CUDA backend's
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = TinyK2::with<Backend<cpu, FastKernels>>;
static_assert(Bad::parameter_count() > 0);
