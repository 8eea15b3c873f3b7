// moonmoe/io/error.hpp: the one exception type of the io layer, and the wording helpers its messages share.
//
// Every io error names the file it is about and, where one applies, the tensor or config field, so a failed load
// of a thousand-tensor checkpoint says exactly what to look at. A missing name also lists the closest names that
// do exist, since the usual cause is a naming-convention mismatch (`experts.0.w1` for `experts.0.gate_proj`).
#pragma once

#include "../tensor/shape.hpp"

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace moonmoe {

namespace detail {

/// `text` safe to print: valid UTF-8 and newlines / tabs kept, every other control byte and every byte that does not
/// belong to a valid UTF-8 sequence (a crafted file's raw bytes, which a parser's message may quote) as \xNN.
inline std::string printable(std::string_view text) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
        const auto c = static_cast<unsigned char>(text[i]);
        std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
        bool valid = n > 0 && i + n <= text.size() && (n > 1 || c >= 0x20 || c == '\n' || c == '\t') && c != 0x7f;
        for (std::size_t k = 1; valid && k < n; ++k) valid = (static_cast<unsigned char>(text[i + k]) >> 6) == 0x2;
        if (valid && n == 2) valid = c >= 0xc2;  // no overlong encodings
        if (valid && n == 3) {
            const auto d = static_cast<unsigned char>(text[i + 1]);
            valid = !(c == 0xe0 && d < 0xa0) && !(c == 0xed && d >= 0xa0);  // overlong, surrogates
        }
        if (valid && n == 4) {
            const auto d = static_cast<unsigned char>(text[i + 1]);
            valid = c <= 0xf4 && !(c == 0xf0 && d < 0x90) && !(c == 0xf4 && d >= 0x90);
        }
        if (valid) {
            out.append(text.substr(i, n));
            i += n;
        } else {
            out += "\\x", out += hex[c >> 4], out += hex[c & 15];
            ++i;
        }
    }
    return out;
}

}  // namespace detail

/// A file that cannot be read, is malformed, or does not hold what the caller needs. The message is made printable
/// (detail::printable): a crafted file's raw bytes, quoted by a parser's message, never reach a terminal or log.
struct io_error : std::runtime_error {
    explicit io_error(const std::string& message) : std::runtime_error(detail::printable(message)) {}
    explicit io_error(const char* message) : io_error(std::string(message)) {}
};

namespace detail {

/// "[a, b, c]" for any range of integers (one spelling of shapes across the library: tensor/shape.hpp).
template <class Range>
std::string format_shape(const Range& shape) {
    return shape_string(shape);
}

/// `name` as it appears in a message: in single quotes, with quotes, backslashes and bytes outside printable ASCII
/// escaped (\xNN), and cut after `limit` bytes with the full length given, so an empty name, a NUL byte or a
/// megabyte name from a crafted file stays readable and bounded.
inline std::string quoted(std::string_view name, std::size_t limit = 120) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string s = "'";
    for (std::size_t i = 0; i < name.size() && i < limit; ++i) {
        const auto c = static_cast<unsigned char>(name[i]);
        if (c == '\'' || c == '\\') s += '\\', s += char(c);
        else if (c >= 0x20 && c < 0x7f)
            s += char(c);
        else
            s += "\\x", s += hex[c >> 4], s += hex[c & 15];
    }
    s += '\'';
    if (name.size() > limit) s += "... (" + std::to_string(name.size()) + " bytes)";
    return s;
}

/// Levenshtein distance, two rows.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (std::size_t j = 1; j <= b.size(); ++j)
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

/// "; closest: x, y, z" listing up to `count` of `candidates` nearest to `wanted`, or "" if there are none.
/// Names longer than this get no suggestions (the distance is quadratic in length; checkpoint names are short).
inline constexpr std::size_t max_suggestion_name = 256;

template <class Names>
std::string closest_names(std::string_view wanted, const Names& candidates, std::size_t count = 3) {
    std::vector<std::pair<std::size_t, std::string_view>> scored;
    if (wanted.size() > max_suggestion_name) return "";
    for (const auto& name : candidates)
        if (std::string_view(name).size() <= max_suggestion_name)
            scored.emplace_back(edit_distance(wanted, name), name);
    const std::size_t n = std::min(count, scored.size());
    std::partial_sort(scored.begin(), scored.begin() + std::ptrdiff_t(n), scored.end());
    std::string s;
    for (std::size_t i = 0; i < n; ++i) s += (i == 0 ? "; closest: " : ", ") + detail::quoted(scored[i].second);
    return s;
}

}  // namespace detail
}  // namespace moonmoe
