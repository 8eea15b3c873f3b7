// expect-error: MLA's split is fixed
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = TinyK2::with<Optimizer<QKClip<100, ClipAlpha<0.3>>>>;
static_assert(Bad::parameter_count() > 0);
