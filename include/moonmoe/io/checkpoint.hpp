// moonmoe/io/checkpoint.hpp: a Hugging Face checkpoint directory, read tensor by tensor as f32; and saving one.
//
// A directory holds config.json and either model.safetensors or model.safetensors.index.json, whose "weight_map"
// names the shard of every tensor (transformers prefers the single file when both exist, and so do we). Shards are
// memory-mapped once each. read_f32 converts BF16 / F16 / F64 exactly and dequantises FP8 weights with their
// `<name>_scale_inv` companions (io/convert.hpp). Every tensor read is remembered, so that a loader can ask for
// unused() afterwards and refuse a checkpoint that holds tensors its model does not know.
// Not thread-safe: read from one thread, or give each thread its own Checkpoint.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../config/named.hpp"
#include "../tensor/dtype.hpp"
#include "convert.hpp"
#include "error.hpp"
#include "hf_config.hpp"
#include "safetensors.hpp"
#include "safetensors_writer.hpp"

namespace moonmoe {

class Checkpoint {
public:
    static constexpr std::string_view scale_suffix = "_scale_inv";

    explicit Checkpoint(const std::filesystem::path& dir) : dir_(dir) {
        namespace fs = std::filesystem;
        if (!fs::is_directory(dir_)) throw io_error(dir_.string() + ": not a checkpoint directory");
        config_ = read_hf_config(dir_ / "config.json");
        if (fs::exists(dir_ / "model.safetensors")) {
            shards_.emplace_back(dir_ / "model.safetensors");
            for (const auto& r : shards_[0].records()) shard_of_.emplace(r.name, 0);
        } else if (fs::exists(dir_ / "model.safetensors.index.json")) {
            open_index(dir_ / "model.safetensors.index.json");
        } else {
            throw io_error(dir_.string() + ": no model.safetensors or model.safetensors.index.json");
        }
    }

    const std::filesystem::path& directory() const { return dir_; }
    const HFConfig& config() const { return config_; }
    /// Paths of the safetensors files, in the order opened.
    std::vector<std::string> files() const {
        std::vector<std::string> out;
        for (const auto& s : shards_) out.push_back(s.path());
        return out;
    }

    /// Every tensor name, sorted.
    std::vector<std::string> names() const {
        std::vector<std::string> out;
        for (const auto& [name, shard] : shard_of_) out.push_back(name);
        return out;
    }
    bool contains(std::string_view name) const { return shard_of_.find(name) != shard_of_.end(); }

    /// The raw record (dtype, shape, bytes) of `name`; does not count as a read (see mark_used).
    const TensorRecord& record(std::string_view name) const { return shard(name).at(name); }
    /// Counts `name` as read, for a caller that consumed record() itself.
    void mark_used(std::string_view name) {
        record(name);
        used_.emplace(name);
    }

    /// `name` as f32, row-major, after checking its shape is `expected_shape`; F8 weights are dequantised with
    /// `<name>_scale_inv` in the blocks of quantization_config (default 128 x 128).
    void read_f32(std::string_view name, std::span<const index_t> expected_shape, std::span<float> out) {
        const SafetensorsFile& file = shard(name);
        const TensorRecord& r = file.at(name);
        const std::string at = file.path() + ": tensor '" + r.name + "'";
        if (!std::equal(r.shape.begin(), r.shape.end(), expected_shape.begin(), expected_shape.end()))
            throw io_error(at + " has shape " + detail::format_shape(r.shape) + ", expected " +
                           detail::format_shape(expected_shape));
        if (!is_floating(r.dtype))
            throw io_error(at + " is " + std::string(dtype_name(r.dtype)) + "; a weight must be a floating-point type");
        if (out.size() != std::size_t(r.numel()))
            throw io_error(at + " has " + std::to_string(r.numel()) + " elements, the output buffer " +
                           std::to_string(out.size()));
        if (r.dtype == DType::f8_e4m3 || r.dtype == DType::f8_e5m2) {
            const std::string scale_name = r.name + std::string(scale_suffix);
            if (!contains(scale_name))
                throw io_error(at + " is " + std::string(dtype_name(r.dtype)) + " but the checkpoint has no '" +
                               scale_name + "' to dequantise it");
            const SafetensorsFile& scale_file = shard(scale_name);
            try {
                dequantize_fp8(r, scale_file.at(scale_name), config_.fp8_block.value_or(default_fp8_block), out);
            } catch (const io_error& e) {
                throw io_error(file.path() + ": " + e.what());
            }
            used_.insert(scale_name);
        } else {
            detail::decode_to_f32(r.dtype, r.bytes, out);
        }
        used_.insert(r.name);
    }
    std::vector<float> read_f32(std::string_view name, std::span<const index_t> expected_shape) {
        index_t numel = 1;
        for (index_t d : expected_shape) numel *= d;
        std::vector<float> out(std::size_t(std::max<index_t>(numel, 0)));
        read_f32(name, expected_shape, out);
        return out;
    }
    std::vector<float> read_f32(std::string_view name, std::initializer_list<index_t> expected_shape) {
        return read_f32(name, std::span<const index_t>(expected_shape.begin(), expected_shape.size()));
    }

    /// Names never read, sorted; the `_scale_inv` of a weight that was read counts as read with it.
    std::vector<std::string> unused() const {
        std::vector<std::string> out;
        for (const auto& [name, shard] : shard_of_) {
            if (used_.count(name)) continue;
            const std::string_view n = name;
            if (n.ends_with(scale_suffix) && used_.count(n.substr(0, n.size() - scale_suffix.size()))) continue;
            out.push_back(name);
        }
        return out;
    }

private:
    const SafetensorsFile& shard(std::string_view name) const {
        auto it = shard_of_.find(name);
        if (it == shard_of_.end())
            throw io_error(dir_.string() + ": no tensor '" + std::string(name) + "' in the checkpoint" +
                           detail::closest_names(name, names()));
        return shards_[it->second];
    }

    void open_index(const std::filesystem::path& index_path) {
        const std::string where = index_path.string();
        std::ifstream in(index_path, std::ios::binary);
        std::ostringstream text;
        text << in.rdbuf();
        if (!in) throw io_error(where + ": cannot read");
        nlohmann::json index;
        try {
            index = nlohmann::json::parse(text.str());
        } catch (const nlohmann::json::exception& e) {
            throw io_error(where + ": not valid JSON: " + e.what());
        }
        if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
            throw io_error(where + ": no \"weight_map\" object");

        std::map<std::string, std::size_t, std::less<>> shard_index;  // shard file name -> position in shards_
        for (const auto& [name, file_json] : index["weight_map"].items()) {
            if (!file_json.is_string()) throw io_error(where + ": weight_map entry of '" + name + "' is not a file name");
            const std::string file = file_json.get<std::string>();
            const std::filesystem::path rel(file);
            if (rel.is_absolute() || rel.has_parent_path())
                throw io_error(where + ": shard '" + file + "' of tensor '" + name + "' is not a file in " + dir_.string());
            auto [it, inserted] = shard_index.emplace(file, shards_.size());
            if (inserted) {
                if (!std::filesystem::exists(dir_ / rel))
                    throw io_error(where + ": shard '" + file + "' (of tensor '" + name + "' and maybe others) is missing");
                shards_.emplace_back(dir_ / rel);
            }
            if (!shards_[it->second].contains(name))
                throw io_error(where + ": maps tensor '" + name + "' to shard '" + file + "', which does not hold it" +
                               detail::closest_names(name, shards_[it->second].names()));
            shard_of_.emplace(name, it->second);
        }
        // A shard must not hold tensors the index leaves out or assigns elsewhere: which copy would be meant?
        for (std::size_t i = 0; i < shards_.size(); ++i)
            for (const auto& r : shards_[i].records())
                if (auto it = shard_of_.find(r.name); it == shard_of_.end() || it->second != i)
                    throw io_error(shards_[i].path() + ": holds tensor '" + r.name + "', which " + where +
                                   (it == shard_of_.end() ? " does not list" : " maps to another shard"));
    }

    std::filesystem::path dir_;
    HFConfig config_;
    std::vector<SafetensorsFile> shards_;
    std::map<std::string, std::size_t, std::less<>> shard_of_;  // tensor name -> index into shards_
    std::set<std::string, std::less<>> used_;
};

/// One f32 tensor to save, by checkpoint name.
struct NamedTensor {
    std::string name;
    std::vector<index_t> shape;
    std::span<const float> values;
};

namespace detail {
inline std::string_view torch_dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "float32";
        case DType::bf16: return "bfloat16";
        case DType::f16: return "float16";
        default: return "";
    }
}
}  // namespace detail

/// Writes `tensors` to one safetensors file, stored as `store` (F32, or BF16 / F16 rounded to nearest even as
/// torch rounds), with the metadata transformers writes ({"format": "pt"}).
inline void write_tensors(const std::filesystem::path& file, std::span<const NamedTensor> tensors,
                          DType store = DType::f32) {
    if (detail::torch_dtype_name(store).empty())
        throw io_error(file.string() + ": cannot store tensors as " + std::string(dtype_name(store)) +
                       "; use F32, BF16 or F16");
    SafetensorsWriter writer;
    writer.metadata("format", "pt");
    std::vector<std::uint16_t> narrow;
    for (const NamedTensor& t : tensors) {
        try {
            if (store == DType::f32) {
                writer.add_f32(t.name, t.shape, t.values);
                continue;
            }
            narrow.resize(t.values.size());
            for (std::size_t i = 0; i < narrow.size(); ++i)
                narrow[i] = store == DType::bf16 ? bf16::from_float(t.values[i]).bits : f16::from_float(t.values[i]).bits;
            writer.add(t.name, store, t.shape, std::as_bytes(std::span<const std::uint16_t>(narrow)));
        } catch (const io_error& e) {
            throw io_error(file.string() + ": " + e.what());
        }
    }
    writer.write(file);
}

/// Writes a checkpoint directory that Checkpoint and transformers can load: model.safetensors (as write_tensors)
/// and config.json, the loaded document with quantization_config removed (the weights are no longer FP8, as
/// DeepSeek's fp8_cast_bf16.py does) and torch_dtype set to the stored type. Creates `dir` if needed.
inline void write_checkpoint(const std::filesystem::path& dir, const HFConfig& config,
                             std::span<const NamedTensor> tensors, DType store = DType::f32) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw io_error(dir.string() + ": cannot create directory: " + ec.message());
    write_tensors(dir / "model.safetensors", tensors, store);
    nlohmann::json json = config.json;
    json.erase("quantization_config");
    json[json.contains("dtype") && !json.contains("torch_dtype") ? "dtype" : "torch_dtype"] =
        std::string(detail::torch_dtype_name(store));
    const std::string text = json.dump(2) + "\n";
    const std::span<const std::byte> chunk = std::as_bytes(std::span(text.data(), text.size()));
    detail::write_file_atomically(dir / "config.json", std::span(&chunk, 1));
}

}  // namespace moonmoe
