// The one translation unit that holds doctest's implementation and main().
// Unit tests live in test/unit/*.cpp and include only <doctest/doctest.h>.
//
// Before anything runs, main refuses test names with a ';': CMake's test discovery (doctest_discover_tests) splits
// a name at ';' into halves that match no test, so such a test would silently never run under ctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
    bool named_well = true;
    for (const doctest::detail::TestCase& t : doctest::detail::getRegisteredTests())
        if (std::strchr(t.m_name, ';')) {
            std::fprintf(stderr,
                         "%s:%d: the test name \"%s\" contains ';', which ctest's discovery splits into names "
                         "that match no test: use another character\n",
                         t.m_file.c_str(), t.m_line, t.m_name);
            named_well = false;
        }
    if (!named_well) return 2;
    doctest::Context context(argc, argv);
    return context.run();
}
