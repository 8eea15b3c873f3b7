// expect-error: is_static
#include <moonmoe/config.hpp>
using namespace moonmoe;
// Whether the router has a correction bias (a parameter per expert) is left to config.json: no compile-time count.
using Open = KimiK2::with<KimiK2::moe::with<CorrectionBias<Dynamic>>>;
static_assert(Open::parameter_count() > 0);
