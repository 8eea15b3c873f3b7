// Command-line flags with a value, for the training examples: the text after the flag, or a number read from all
// of it. A value that is missing, or is not a number of the kind the flag takes, is an error naming the flag and the
// text as given (std::stol took "--steps 12abc" as 12 steps, and said only "stol" of "--steps abc").
//
//   for (int i = 1; i < argc; ++i)
//       if (!std::strcmp(argv[i], "--steps")) steps = example::flag_number<long>(argc, argv, i, "--steps");
#pragma once

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>

namespace example {

/// The text after the flag at argv[i], i moved onto it; an error naming the flag where there is none.
inline std::string flag_text(int argc, char** argv, int& i, const char* flag) {
    if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
    return argv[++i];
}

/// The value after the flag at argv[i] (i moved onto it) as a T, from all of its text: an integer in base 10 for an
/// integral T, else a floating-point number as strtod reads one ("inf" and "nan" included: a flag that refuses them
/// says so itself, by name). Out of T's range, or anything else, is an error naming the flag and the text.
template <class T>
T flag_number(int argc, char** argv, int& i, const char* flag) {
    const std::string text = flag_text(argc, argv, i, flag);
    const char* end = text.data() + text.size();
    bool whole = false;
    T value{};
    if constexpr (std::is_integral_v<T>) {
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        whole = error == std::errc() && stop == end;
    } else {
        char* stop = nullptr;
        errno = 0;
        const double d = std::strtod(text.c_str(), &stop);
        whole = !text.empty() && stop == end && !(errno == ERANGE && std::isinf(d));
        value = T(d);
    }
    if (!whole)
        throw std::invalid_argument(std::string(flag) + " takes " +
                                    (std::is_integral_v<T> ? "an integer" : "a number") + ", not '" + text + "'");
    return value;
}

}  // namespace example
