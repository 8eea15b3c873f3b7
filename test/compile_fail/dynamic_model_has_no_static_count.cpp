// expect-error: is_static
#include <moonmoe/config.hpp>
// A Dynamic size has no compile-time count: use count_parameters(resolved_config) at run time instead.
static_assert(moonmoe::AnyDeepSeekV3::parameter_count() > 0);
