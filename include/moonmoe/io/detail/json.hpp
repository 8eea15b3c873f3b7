// moonmoe/io/detail/json.hpp: limits on untrusted JSON (nesting depth, size of what a message quotes).
//
// nlohmann::json parses without recursion, but dump() and comparisons recurse over the document's depth, so a
// header or config.json nested 100,000 levels deep would overflow the stack the moment a message quotes it. The
// depth is therefore checked on the raw text first, by an iterative scan, before anything is parsed; the limit is
// the reference safetensors reader's (serde_json's recursion limit of 128).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace moonmoe::detail {

inline constexpr std::size_t max_json_depth = 128;

/// The byte offset at which `text` first nests arrays / objects deeper than `limit`, or nullopt. Brackets inside
/// strings do not count; the scan is linear and uses no stack.
inline std::optional<std::size_t> json_too_deep(std::string_view text, std::size_t limit = max_json_depth) {
    std::size_t depth = 0;
    bool in_string = false, escaped = false;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const char c = text[i];
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > limit) return i;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return std::nullopt;
}

/// The offset of the first NUL byte in `text`, or nullopt. JSON text holds none (a string writes one as \u0000), and
/// nlohmann's lexer ends the input at one: valid JSON, a NUL and then anything at all would parse as the JSON alone.
inline std::optional<std::size_t> json_nul_byte(std::string_view text) {
    const std::size_t at = text.find('\0');
    return at == std::string_view::npos ? std::nullopt : std::optional<std::size_t>(at);
}

/// A short rendering of a JSON value for an error message: at most `limit` characters of its compact dump.
/// Only for values of a document that passed json_too_deep (dump() recurses).
inline std::string json_excerpt(const nlohmann::json& v, std::size_t limit = 60) {
    std::string text = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (text.size() > limit) text = text.substr(0, limit - 3) + "...";
    return text;
}

}  // namespace moonmoe::detail
