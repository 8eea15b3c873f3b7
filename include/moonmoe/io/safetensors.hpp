// moonmoe/io/safetensors.hpp: read a .safetensors file through a read-only memory map.
//
// Format (huggingface/safetensors): 8-byte little-endian header length N, N bytes of JSON mapping each tensor name
// to {dtype, shape, data_offsets [begin, end)} (offsets relative to the data section) plus an optional
// "__metadata__" string-to-string map, then the data section. The checks follow the reference reader
// (safetensors/src/tensor.rs `read_metadata` + `Metadata::validate`): header at most 100,000,000 bytes, tensors
// tile the data section exactly (sorted by offset, no overlap, no gap, nothing after the last one), byte sizes
// agree with dtype and shape. Every error names the file and, where one applies, the tensor.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../config/named.hpp"
#include "../tensor/dtype.hpp"
#include "detail/json.hpp"
#include "detail/mapped_file.hpp"
#include "error.hpp"

namespace moonmoe {

static_assert(std::endian::native == std::endian::little,
              "moonmoe io: safetensors data is little-endian and is read in place; a big-endian host is not supported");

/// One tensor of a safetensors file: its header entry and its bytes inside the mapping (valid while the file is).
struct TensorRecord {
    std::string name;
    DType dtype;
    std::vector<index_t> shape;
    std::span<const std::byte> bytes;

    /// Elements; throws io_error if the shape is negative or overflows (a parsed header never is: it was checked).
    index_t numel() const {
        const auto n = checked_product(shape);
        if (!n) throw io_error("tensor " + detail::quoted(name) + ": shape " + shape_string(shape) + " overflows");
        return *n;
    }
};

namespace detail {

/// The reference reader's limit on the JSON header (safetensors MAX_HEADER_SIZE).
inline constexpr std::uint64_t max_safetensors_header = 100'000'000;

/// A JSON value that is an integer >= 0 (a float such as 2.0 is not: the format writes integers).
inline std::optional<std::uint64_t> json_nonnegative_integer(const nlohmann::json& v) {
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return std::uint64_t(v.get<std::int64_t>());
    return std::nullopt;
}

struct SafetensorsHeader {
    std::vector<TensorRecord> records;  // sorted by name
    std::map<std::string, std::string, std::less<>> metadata;
    std::size_t header_bytes = 0;  // N
};

inline TensorRecord parse_tensor_entry(const std::string& where, const std::string& name, const nlohmann::json& e,
                                       std::span<const std::byte> data) {
    const std::string at = where + ": tensor " + detail::quoted(name) + ": ";
    if (!e.is_object()) throw io_error(at + "entry is not a JSON object");
    for (const char* key : {"dtype", "shape", "data_offsets"})
        if (!e.contains(key)) throw io_error(at + "entry has no '" + key + "'");

    const auto& dtype_json = e["dtype"];
    if (!dtype_json.is_string()) throw io_error(at + "dtype is not a string");
    const auto dtype = parse_dtype(dtype_json.get_ref<const std::string&>());
    if (!dtype) throw io_error(at + "unknown dtype " + detail::quoted(dtype_json.get_ref<const std::string&>()));

    const auto& shape_json = e["shape"];
    const auto shape_text = [&] { return json_excerpt(shape_json); };
    if (!shape_json.is_array()) throw io_error(at + "shape is not an array");
    std::vector<index_t> shape;
    std::uint64_t numel = 1;
    for (const auto& d : shape_json) {
        const auto v = json_nonnegative_integer(d);
        if (!v || *v > std::uint64_t(INT64_MAX))
            throw io_error(at + "shape " + shape_text() + " has an entry that is not a non-negative integer");
        if (__builtin_mul_overflow(numel, *v, &numel)) throw io_error(at + "shape " + shape_text() + " overflows");
        shape.push_back(index_t(*v));
    }
    // the element count as every reader of the record computes it (TensorRecord::numel, signed, left to right):
    // [2^62, 2, 0] holds no element but overflows on the way there
    if (!checked_product(shape)) throw io_error(at + "shape " + shape_text() + " overflows");
    std::uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(numel, std::uint64_t(dtype_size(*dtype)), &expected_bytes))
        throw io_error(at + "shape " + shape_text() + " overflows");

    const auto& off = e["data_offsets"];
    std::optional<std::uint64_t> begin, end;
    if (off.is_array() && off.size() == 2)
        begin = json_nonnegative_integer(off[0]), end = json_nonnegative_integer(off[1]);
    if (!begin || !end)
        throw io_error(at + "data_offsets " + json_excerpt(off) +
                       " is not a pair of non-negative integers [begin, end]");
    if (*begin > *end) throw io_error(at + "data_offsets " + json_excerpt(off) + " has begin > end");
    if (*end > data.size())
        throw io_error(at + "data_offsets " + json_excerpt(off) + " end beyond the data section (" +
                       std::to_string(data.size()) + " bytes)");
    if (*end - *begin != expected_bytes)
        throw io_error(at + "holds " + std::to_string(*end - *begin) + " bytes but " + std::string(dtype_name(*dtype)) +
                       " " + format_shape(shape) + " needs " + std::to_string(expected_bytes));
    return TensorRecord{name, *dtype, std::move(shape), data.subspan(std::size_t(*begin), std::size_t(*end - *begin))};
}

/// The raw header bytes must be one JSON object as the reference writer makes it: starting with '{' (no byte-order
/// mark, no leading padding), no NUL byte anywhere (the reference pads with spaces; a NUL would end the text for
/// some parsers and hide what follows), and nesting at most max_json_depth deep.
inline void check_header_text(std::string_view text, const std::string& where) {
    if (text.starts_with("\xEF\xBB\xBF"))
        throw io_error(where + ": safetensors header starts with a UTF-8 byte-order mark; it must start with '{'");
    if (!text.starts_with('{'))
        throw io_error(where + ": safetensors header must start with '{', found " +
                       (text.empty() ? std::string("an empty header") : "byte " + detail::quoted(text.substr(0, 1))));
    if (const auto nul = text.find('\0'); nul != std::string_view::npos)
        throw io_error(where + ": safetensors header has a NUL byte at offset " + std::to_string(8 + nul) +
                       " (a header may be padded with spaces only)");
    if (const auto at = json_too_deep(text))
        throw io_error(where + ": safetensors header nests deeper than " + std::to_string(max_json_depth) +
                       " levels (at byte " + std::to_string(8 + *at) + ")");
}

/// Parses and validates the whole header of a mapped file; `where` (the path) prefixes every message.
inline SafetensorsHeader parse_safetensors(std::span<const std::byte> file, const std::string& where) {
    if (file.size() < 8)
        throw io_error(where + ": file is " + std::to_string(file.size()) +
                       " bytes, shorter than the 8-byte header length of a safetensors file");
    std::uint64_t n = 0;
    std::memcpy(&n, file.data(), 8);
    if (n > file.size() - 8)
        throw io_error(where + ": header length " + std::to_string(n) + " is larger than the rest of the file (" +
                       std::to_string(file.size() - 8) + " bytes); truncated or not a safetensors file");
    if (n > max_safetensors_header)
        throw io_error(where + ": header length " + std::to_string(n) + " exceeds the format's limit of 100,000,000");

    const char* text = reinterpret_cast<const char*>(file.data() + 8);
    check_header_text(std::string_view(text, std::size_t(n)), where);

    // Duplicates would silently collapse in a JSON object (the last one wins): the parser callback sees every key
    // of the top level (tensor names) and of each entry (dtype, shape, data_offsets; metadata keys).
    std::vector<std::string> keys, entry_keys;
    const auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if (depth == 1 && event == E::key) keys.push_back(parsed.get<std::string>());
        if (depth == 1 && event == E::object_start) entry_keys.clear();
        if (depth == 2 && event == E::key) {
            const auto& key = parsed.get_ref<const std::string&>();
            if (std::find(entry_keys.begin(), entry_keys.end(), key) != entry_keys.end())
                throw io_error(where + ": " +
                               (keys.back() == "__metadata__" ? std::string("__metadata__")
                                                              : "tensor " + detail::quoted(keys.back())) +
                               ": field " + detail::quoted(key) + " appears twice");
            entry_keys.push_back(key);
        }
        return true;
    };
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(text, text + n, on_event);
    } catch (const nlohmann::json::exception& e) {
        throw io_error(where + ": safetensors header is not valid JSON: " + e.what());
    }
    if (!header.is_object()) throw io_error(where + ": safetensors header is not a JSON object");
    std::sort(keys.begin(), keys.end());
    if (auto dup = std::adjacent_find(keys.begin(), keys.end()); dup != keys.end())
        throw io_error(
            where + ": " +
            (*dup == "__metadata__" ? std::string("the __metadata__ object") : "tensor " + detail::quoted(*dup)) +
            " appears twice in the header");

    SafetensorsHeader out;
    out.header_bytes = std::size_t(n);
    const auto data = file.subspan(8 + std::size_t(n));
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") {
            if (!entry.is_object()) throw io_error(where + ": __metadata__ is not a JSON object");
            for (const auto& [k, v] : entry.items()) {
                if (!v.is_string())
                    throw io_error(where + ": __metadata__ value of " + detail::quoted(k) + " is not a string");
                out.metadata.emplace(k, v.get<std::string>());
            }
            continue;
        }
        out.records.push_back(parse_tensor_entry(where, name, entry, data));  // items() iterate sorted by name
    }

    // Tensors must tile the data section: sort by offset, then each starts where the previous ended.
    std::vector<const TensorRecord*> by_offset;
    for (const auto& r : out.records) by_offset.push_back(&r);
    std::sort(by_offset.begin(), by_offset.end(), [](const TensorRecord* a, const TensorRecord* b) {
        return a->bytes.data() != b->bytes.data() ? a->bytes.data() < b->bytes.data()
                                                  : a->bytes.size() < b->bytes.size();
    });
    const std::byte* expected = data.data();
    const TensorRecord* previous = nullptr;
    for (const TensorRecord* r : by_offset) {
        if (r->bytes.data() < expected)
            throw io_error(where + ": tensors " + detail::quoted(previous->name) + " and " + detail::quoted(r->name) +
                           " overlap in the data section");
        if (r->bytes.data() > expected)
            throw io_error(where + ": " + std::to_string(r->bytes.data() - expected) +
                           " unused bytes in the data section before tensor " + detail::quoted(r->name));
        expected = r->bytes.data() + r->bytes.size();
        previous = r;
    }
    if (expected != data.data() + data.size())
        throw io_error(where + ": " + std::to_string(data.data() + data.size() - expected) +
                       " bytes after the last tensor; the data section must end with it");
    return out;
}

}  // namespace detail

/// A safetensors file, memory-mapped. Records are spans into the mapping, valid while this object lives (moving
/// it keeps them valid). Not copyable.
class SafetensorsFile {
public:
    /// With a directory descriptor `dir`, the file `name` in that directory (`path` names it in messages).
    explicit SafetensorsFile(const std::filesystem::path& path, int dir = AT_FDCWD, const char* name = nullptr)
        : path_(path.string()), map_(path_, dir, name), header_(detail::parse_safetensors(map_.bytes(), path_)) {}

    const std::string& path() const { return path_; }

    /// Tensor names, sorted.
    std::vector<std::string> names() const {
        std::vector<std::string> out;
        for (const auto& r : header_.records) out.push_back(r.name);
        return out;
    }
    std::size_t size() const { return header_.records.size(); }
    /// Every record, sorted by name.
    std::span<const TensorRecord> records() const { return header_.records; }

    const TensorRecord* find(std::string_view name) const {
        auto it = std::lower_bound(header_.records.begin(), header_.records.end(), name,
                                   [](const TensorRecord& r, std::string_view n) { return r.name < n; });
        return it != header_.records.end() && it->name == name ? &*it : nullptr;
    }
    bool contains(std::string_view name) const { return find(name) != nullptr; }

    /// The record of `name`; throws io_error naming the file, the tensor and the closest names present.
    const TensorRecord& at(std::string_view name) const {
        if (const TensorRecord* r = find(name)) return *r;
        throw io_error(path_ + ": no tensor " + detail::quoted(name) + detail::closest_names(name, names()));
    }

    /// The "__metadata__" map (e.g. {"format": "pt"}); empty if the file has none.
    const std::map<std::string, std::string, std::less<>>& metadata() const { return header_.metadata; }
    /// N, the length of the JSON header in bytes.
    std::size_t header_size() const { return header_.header_bytes; }

private:
    std::string path_;
    detail::MappedFile map_;
    detail::SafetensorsHeader header_;
};

}  // namespace moonmoe
