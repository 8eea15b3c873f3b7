// The one translation unit that holds doctest's implementation and main().
// Unit tests live in test/unit/*.cpp and include only <doctest/doctest.h>.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
