// expect-error: Backend<Tag>: Tag must be a backend tag
#include <moonmoe/config.hpp>
using namespace moonmoe;
using Bad = Model<Backend<int>>;
static_assert(Bad::parameter_count() > 0);
