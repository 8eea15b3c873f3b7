// moonmoe/io/safetensors_writer.hpp: write a .safetensors file byte-for-byte as the reference implementation does.
//
// The reference serializer (huggingface/safetensors, safetensors/src/tensor.rs `prepare`):
//   - orders tensors by dtype alignment, largest first (its Dtype enum order, descending), then by name;
//   - lays their bytes out back to back in that order;
//   - writes compact JSON: "__metadata__" first, then each tensor as {"dtype","shape","data_offsets"} in that order;
//   - pads the JSON with spaces to a multiple of 8 bytes, so every tensor of 8-byte or smaller elements starts
//     aligned and the file can be used in place.
// Doing the same makes our files interchangeable with torch's `save_file` output (the tests compare against the
// reference's own byte vectors). The file is replaced atomically (detail/atomic_file.hpp), so readers never see
// half a checkpoint.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../config/named.hpp"
#include "../tensor/dtype.hpp"
#include "detail/atomic_file.hpp"
#include "error.hpp"

namespace moonmoe {

namespace detail {

/// Position of a dtype in the reference's Dtype enum, which lists types in increasing alignment
/// (BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64).
constexpr int reference_dtype_rank(DType t) {
    switch (t) {
    case DType::boolean: return 0;
    case DType::u8: return 1;
    case DType::i8: return 2;
    case DType::f8_e5m2: return 3;
    case DType::f8_e4m3: return 4;
    case DType::i16: return 5;
    case DType::u16: return 6;
    case DType::f16: return 7;
    case DType::bf16: return 8;
    case DType::i32: return 9;
    case DType::u32: return 10;
    case DType::f32: return 11;
    case DType::f64: return 12;
    case DType::i64: return 13;
    case DType::u64: return 14;
    }
    return -1;
}

}  // namespace detail

/// Collects tensors (copying their bytes, or borrowing them) and metadata, then writes one safetensors file.
class SafetensorsWriter {
public:
    /// Adds a tensor; `bytes` must hold product(shape) * dtype_size(dtype) bytes, little-endian, row-major.
    void add(std::string name, DType dtype, std::vector<index_t> shape, std::span<const std::byte> bytes) {
        add_entry(std::move(name), dtype, std::move(shape), bytes, true);
    }
    /// The same without a copy: `bytes` must stay valid and unchanged until the last serialize() or write() (a
    /// checkpoint's tensors written straight from the parameters, with no second copy of a shard in memory).
    void add_borrowed(std::string name, DType dtype, std::vector<index_t> shape, std::span<const std::byte> bytes) {
        add_entry(std::move(name), dtype, std::move(shape), bytes, false);
    }

    /// Adds a tensor of any stored element type (float, bf16, f8_e4m3, std::int64_t, ...).
    template <class T>
        requires has_dtype<T>
    void add_values(std::string name, std::vector<index_t> shape, std::span<const T> values) {
        add(std::move(name), dtype_of<T>, std::move(shape), std::as_bytes(values));
    }
    void add_f32(std::string name, std::vector<index_t> shape, std::span<const float> values) {
        add_values<float>(std::move(name), std::move(shape), values);
    }

private:
    void add_entry(std::string name, DType dtype, std::vector<index_t> shape, std::span<const std::byte> bytes,
                   bool copy) {
        const std::string at = "safetensors writer: tensor " + detail::quoted(name) + ": ";
        if (name == "__metadata__") throw io_error(at + "the name is reserved for the metadata map");
        if (names_.count(name)) throw io_error(at + "added twice");
        std::size_t numel = 1;
        for (index_t d : shape) {
            if (d < 0) throw io_error(at + "shape " + detail::format_shape(shape) + " has a negative size");
            numel *= std::size_t(d);
        }
        if (bytes.size() != numel * dtype_size(dtype))
            throw io_error(at + std::string(dtype_name(dtype)) + " " + detail::format_shape(shape) + " needs " +
                           std::to_string(numel * dtype_size(dtype)) + " bytes, got " + std::to_string(bytes.size()));
        std::string quoted;
        try {
            quoted = nlohmann::json(name).dump();
        } catch (const nlohmann::json::exception&) {
            throw io_error(at + "the name is not valid UTF-8");
        }
        names_.insert(name);
        Entry& e = tensors_.emplace_back(Entry{std::move(name), std::move(quoted), dtype, std::move(shape), {}, bytes});
        if (copy) {
            e.owned.assign(bytes.begin(), bytes.end());
            e.bytes = e.owned;  // the vector's buffer: it stays put when tensors_ grows (a move keeps it)
        }
    }

public:
    /// Sets one "__metadata__" entry (Hugging Face writes {"format": "pt"}).
    void metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }

    std::size_t size() const { return tensors_.size(); }

    /// The whole file as bytes.
    std::vector<std::byte> serialize() const {
        const auto order = layout_order();
        const std::string header = header_json(order);
        std::size_t total = 8 + header.size();
        for (const Entry* e : order) total += e->bytes.size();
        std::vector<std::byte> out(total);
        const std::uint64_t n = header.size();
        std::memcpy(out.data(), &n, 8);
        std::memcpy(out.data() + 8, header.data(), header.size());
        std::size_t at = 8 + header.size();
        for (const Entry* e : order) {
            if (!e->bytes.empty()) std::memcpy(out.data() + at, e->bytes.data(), e->bytes.size());
            at += e->bytes.size();
        }
        return out;
    }

    /// Writes the file at `path` (through an exclusively created temporary in the same directory, then rename);
    /// throws io_error naming the path on failure, leaving any previous file at `path` untouched.
    void write(const std::filesystem::path& path) const {
        const auto order = layout_order();
        const std::string header = header_json(order);
        const std::uint64_t n = header.size();
        std::vector<std::span<const std::byte>> chunks{std::as_bytes(std::span(&n, 1)),
                                                       std::as_bytes(std::span(header.data(), header.size()))};
        for (const Entry* e : order) chunks.emplace_back(e->bytes);
        detail::write_file_atomically(path, chunks);
    }

private:
    struct Entry {
        std::string name, quoted_name;
        DType dtype;
        std::vector<index_t> shape;
        std::vector<std::byte> owned;      ///< the copy, unless borrowed
        std::span<const std::byte> bytes;  ///< owned, or the caller's
    };

    std::vector<const Entry*> layout_order() const {
        std::vector<const Entry*> order;
        for (const Entry& e : tensors_) order.push_back(&e);
        std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
            const int ra = detail::reference_dtype_rank(a->dtype), rb = detail::reference_dtype_rank(b->dtype);
            return ra != rb ? ra > rb : a->name < b->name;
        });
        return order;
    }

    std::string header_json(const std::vector<const Entry*>& order) const {
        std::string s = "{";
        if (!metadata_.empty()) s += "\"__metadata__\":" + nlohmann::json(metadata_).dump();
        std::size_t offset = 0;
        for (const Entry* e : order) {
            s += (s.size() > 1 ? "," : "") + e->quoted_name + ":{\"dtype\":\"" + std::string(dtype_name(e->dtype)) +
                 "\",\"shape\":" + nlohmann::json(e->shape).dump() + ",\"data_offsets\":[" + std::to_string(offset) +
                 "," + std::to_string(offset + e->bytes.size()) + "]}";
            offset += e->bytes.size();
        }
        s += "}";
        s.append((8 - s.size() % 8) % 8, ' ');
        return s;
    }

    std::vector<Entry> tensors_;
    std::set<std::string, std::less<>> names_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace moonmoe
