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
#include <cstring>
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
#include "checkpoint_writer.hpp"
#include "convert.hpp"
#include "detail/read_file.hpp"
#include "error.hpp"
#include "hf_config.hpp"
#include "safetensors.hpp"
#include "safetensors_index.hpp"
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
        const std::string at = file.path() + ": tensor " + detail::quoted(r.name);
        if (!std::equal(r.shape.begin(), r.shape.end(), expected_shape.begin(), expected_shape.end()))
            throw io_error(at + " has shape " + detail::format_shape(r.shape) + ", expected " +
                           detail::format_shape(expected_shape));
        if (!is_floating(r.dtype))
            throw io_error(at + " is " + std::string(dtype_name(r.dtype)) + "; a weight must be a floating-point type");
        if (out.size() != std::size_t(r.numel()))
            throw io_error(at + " has " + std::to_string(r.numel()) + " elements, the output buffer " +
                           std::to_string(out.size()));
        const std::string scale_name = r.name + std::string(scale_suffix);
        // DeepSeek-V3 / K2 quantise to E4M3 only (quantization_config.fmt); E5M2 codes read as E4M3 scales would be
        // garbage, and a scale beside an unquantised weight means the file is not what config.json says.
        if (r.dtype == DType::f8_e5m2)
            throw io_error(at + " is F8_E5M2, but FP8 checkpoints of this architecture are E4M3 (quantization_config.fmt "
                           "e4m3); convert the tensor or the checkpoint");
        if (r.dtype != DType::f8_e4m3 && contains(scale_name))
            throw io_error(at + " is " + std::string(dtype_name(r.dtype)) + ", not FP8, but the checkpoint has a " +
                           detail::quoted(scale_name) + " for it; a block scale belongs only to an F8_E4M3 weight");
        if (r.dtype == DType::f8_e4m3) {
            if (!contains(scale_name))
                throw io_error(at + " is " + std::string(dtype_name(r.dtype)) + " but the checkpoint has no " +
                               detail::quoted(scale_name) + " to dequantise it");
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
    /// `name` as bf16, checked as read_f32 checks it: a BF16 tensor is copied as it is (no f32 copy of it
    /// exists at any time); another type is read as f32 (FP8 dequantised), one tensor at a time, and rounded to
    /// nearest even.
    void read_bf16(std::string_view name, std::span<const index_t> expected_shape, std::span<bf16> out) {
        const SafetensorsFile& file = shard(name);
        const TensorRecord& r = file.at(name);
        if (r.dtype != DType::bf16 || !std::equal(r.shape.begin(), r.shape.end(), expected_shape.begin(),
                                                  expected_shape.end()) || out.size() != std::size_t(r.numel())) {
            std::vector<float> wide(out.size());
            read_f32(name, expected_shape, wide);  // checks, names what is wrong
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16::from_float(wide[i]);
            return;
        }
        const std::string scale_name = r.name + std::string(scale_suffix);
        if (contains(scale_name))
            throw io_error(file.path() + ": tensor " + detail::quoted(r.name) + " is BF16, not FP8, but the checkpoint "
                           "has a " + detail::quoted(scale_name) + " for it; a block scale belongs only to an F8_E4M3 "
                           "weight");
        std::memcpy(out.data(), r.bytes.data(), out.size_bytes());  // little-endian bits, as bf16 holds them
        used_.insert(r.name);
    }

    std::vector<float> read_f32(std::string_view name, std::span<const index_t> expected_shape) {
        const auto numel = checked_product(expected_shape);
        if (!numel)
            throw io_error(dir_.string() + ": tensor " + detail::quoted(name) + ": expected shape " +
                           detail::format_shape(expected_shape) + " is negative or overflows");
        std::vector<float> out(static_cast<std::size_t>(*numel));
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
            throw io_error(dir_.string() + ": no tensor " + detail::quoted(name) + " in the checkpoint" +
                           detail::closest_names(name, names()));
        return shards_[it->second];
    }

    void open_index(const std::filesystem::path& index_path) {
        const std::string where = index_path.string();
        constexpr std::size_t max_index_bytes = std::size_t(256) << 20;  // K2's and DeepSeek-V3's are a few MB
        const WeightMap weight_map = parse_safetensors_index(detail::read_small_file(index_path, max_index_bytes), where);

        std::map<std::string, std::size_t, std::less<>> shard_index;  // shard file name -> position in shards_
        for (const auto& [name, file] : weight_map) {
            auto [it, inserted] = shard_index.emplace(file, shards_.size());
            if (inserted) {
                if (!std::filesystem::exists(dir_ / file))
                    throw io_error(where + ": shard " + detail::quoted(file) + " (of tensor " + detail::quoted(name) +
                                   " and maybe others) is missing");
                shards_.emplace_back(dir_ / file);
            }
            if (!shards_[it->second].contains(name))
                throw io_error(where + ": maps tensor " + detail::quoted(name) + " to shard " + detail::quoted(file) +
                               ", which does not hold it" + detail::closest_names(name, shards_[it->second].names()));
            shard_of_.emplace(name, it->second);
        }
        // A shard must not hold tensors the index leaves out or assigns elsewhere: which copy would be meant?
        for (std::size_t i = 0; i < shards_.size(); ++i)
            for (const auto& r : shards_[i].records())
                if (auto it = shard_of_.find(r.name); it == shard_of_.end() || it->second != i)
                    throw io_error(shards_[i].path() + ": holds tensor " + detail::quoted(r.name) + ", which " + where +
                                   (it == shard_of_.end() ? " does not list" : " maps to another shard"));
    }

    std::filesystem::path dir_;
    HFConfig config_;
    std::vector<SafetensorsFile> shards_;
    std::map<std::string, std::size_t, std::less<>> shard_of_;  // tensor name -> index into shards_
    std::set<std::string, std::less<>> used_;
};

}  // namespace moonmoe
