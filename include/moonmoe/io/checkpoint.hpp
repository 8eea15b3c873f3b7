// moonmoe/io/checkpoint.hpp: a Hugging Face checkpoint directory, read tensor by tensor as f32; and saving one.
//
// A directory holds config.json and either model.safetensors or model.safetensors.index.json, whose "weight_map"
// names the shard of every tensor (transformers prefers the single file when both exist, and so do we). Shards are
// memory-mapped once each: all of them when the Checkpoint is made (the default: every shard is checked against the
// index up front), or, with Checkpoint::Shards::as_needed, each when a tensor in it is first read, so that a
// process loading a part of the model (a rank of a parallel run) opens only the shards holding its tensors and
// needs no other shard to exist. read_f32 converts BF16 / F16 / F64 exactly and dequantises FP8 weights with their
// `<name>_scale_inv` companions (io/convert.hpp). Every tensor read is remembered, so that a loader can ask for
// unused() afterwards and refuse a checkpoint that holds tensors its model does not know.
// Not thread-safe: read from one thread, or give each thread its own Checkpoint.
//
// One save, never two: the directory is opened once and config.json, the index and every shard are opened through
// that handle (openat), so a load beside a concurrent save_transformer (which swaps a whole new directory in,
// io/checkpoint_writer.hpp) reads the checkpoint that was there when it began, or, where that save removed it before
// every file was opened, starts again on the new one; a shard opened as needed after the checkpoint was replaced is
// refused by name rather than read from the other save. What no reader can guard against: a file overwritten in
// place by someone else (`cp` over a shard) while it is mapped; a page of it read after it was truncated ends the
// process with SIGBUS (README.md, "Loading checkpoints").
#pragma once

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
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
#include "detail/atomic_file.hpp"
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

    /// When the shards of a sharded checkpoint are opened (see the top of this file).
    enum class Shards { all, as_needed };

    explicit Checkpoint(const std::filesystem::path& dir, Shards opening = Shards::all) : dir_(dir) {
        if (!std::filesystem::is_directory(dir_)) throw io_error(dir_.string() + ": not a checkpoint directory");
        // One save's files, never two saves' (the top of this file): a save that removed the directory opened here
        // while it was read makes the load start again on the checkpoint now at `dir`.
        for (int attempt = 1;; ++attempt) {
            try {
                open_directory_files(opening);
                return;
            } catch (const io_error&) {
                if (attempt >= max_attempts || !replaced()) throw;
                shards_.clear(), opened_.clear(), shard_of_.clear(), index_path_.clear();
            }
        }
    }

    const std::filesystem::path& directory() const { return dir_; }
    const HFConfig& config() const { return config_; }
    /// Paths of the safetensors files opened so far, in the order opened (with Shards::all, every file: in the
    /// order the index first names them).
    std::vector<std::string> files() const {
        std::vector<std::string> out;
        for (std::size_t i : opened_) out.push_back(shards_[i].file->path());
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
        const TensorRecord& r = record(name);
        used_.emplace(name);
        // an F8 weight's block scale goes with it, as read_f32 counts the scale it dequantises with
        const std::string scale = std::string(name) + std::string(scale_suffix);
        if (r.dtype == DType::f8_e4m3 && contains(scale)) used_.insert(scale);
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
            throw io_error(at +
                           " is F8_E5M2, but FP8 checkpoints of this architecture are E4M3 (quantization_config.fmt "
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
        if (r.dtype != DType::bf16 ||
            !std::equal(r.shape.begin(), r.shape.end(), expected_shape.begin(), expected_shape.end()) ||
            out.size() != std::size_t(r.numel())) {
            std::vector<float> wide(out.size());
            read_f32(name, expected_shape, wide);  // checks, names what is wrong
            for (std::size_t i = 0; i < out.size(); ++i) out[i] = bf16::from_float(wide[i]);
            return;
        }
        const std::string scale_name = r.name + std::string(scale_suffix);
        if (contains(scale_name))
            throw io_error(file.path() + ": tensor " + detail::quoted(r.name) +
                           " is BF16, not FP8, but the checkpoint "
                           "has a " +
                           detail::quoted(scale_name) +
                           " for it; a block scale belongs only to an F8_E4M3 "
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

    /// Names never read, sorted; the `_scale_inv` an F8 weight was dequantised with counts as read with it (and
    /// nothing else does: a `_scale_inv` of a scale is unused).
    std::vector<std::string> unused() const {
        std::vector<std::string> out;
        for (const auto& [name, shard] : shard_of_)
            if (!used_.count(name)) out.push_back(name);
        return out;
    }

private:
    /// Loads that find their directory replaced by a concurrent save before they opened every file start again,
    /// at most this many times in all.
    static constexpr int max_attempts = 8;

    /// The directory opened once, config.json read and the weights' files opened through that handle.
    void open_directory_files(Shards opening) {
        dir_fd_ = detail::open_directory(dir_, dir_.string(), "cannot open the checkpoint directory");
        constexpr std::size_t max_config_bytes = std::size_t(64) << 20;  // a config.json is a few kB
        config_ = parse_hf_config(
            detail::read_small_file(dir_ / "config.json", max_config_bytes, dir_fd_.get(), "config.json"),
            (dir_ / "config.json").string());
        if (exists("model.safetensors")) {
            shards_.emplace_back(Shard{"model.safetensors", {}});
            open(0, "");
            for (const auto& r : shards_[0].file->records()) shard_of_.emplace(r.name, 0);
        } else if (exists("model.safetensors.index.json")) {
            open_index(dir_ / "model.safetensors.index.json", opening);
        } else {
            throw io_error(dir_.string() + ": no model.safetensors or model.safetensors.index.json");
        }
    }

    /// Whether `name` is an entry of the directory opened.
    bool exists(const std::string& name) const {
        struct stat st{};
        return ::fstatat(dir_fd_.get(), name.c_str(), &st, 0) == 0;
    }

    /// Whether `dir` now names another directory than the one opened (a save swapped a new checkpoint in).
    bool replaced() const {
        struct stat now{}, opened{};
        if (::fstat(dir_fd_.get(), &opened) != 0) return false;
        return ::stat(dir_.c_str(), &now) != 0 || now.st_dev != opened.st_dev || now.st_ino != opened.st_ino;
    }

    struct Shard {
        std::string name;                     ///< the file name in the directory
        std::optional<SafetensorsFile> file;  ///< once opened
    };

    const SafetensorsFile& shard(std::string_view name) const {
        auto it = shard_of_.find(name);
        if (it == shard_of_.end())
            throw io_error(dir_.string() + ": no tensor " + detail::quoted(name) + " in the checkpoint" +
                           detail::closest_names(name, names()));
        if (!shards_[it->second].file) open_checked(it->second, name);
        return *shards_[it->second].file;
    }

    /// Maps shard i; `tensor` (one of its tensors, if known) names it when the file is missing.
    void open(std::size_t i, std::string_view tensor) const {
        Shard& s = shards_[i];
        if (!index_path_.empty() && !exists(s.name)) {
            if (replaced())  // opened as needed, after another save replaced the checkpoint this load began with
                throw io_error(dir_.string() + ": shard " + detail::quoted(s.name) + " (of tensor " +
                               detail::quoted(tensor) +
                               ") is gone: another save replaced the checkpoint while it was being read; its "
                               "tensors would mix two saves, so none is read: load it again");
            throw io_error(index_path_ + ": shard " + detail::quoted(s.name) + " (of tensor " + detail::quoted(tensor) +
                           " and maybe others) is missing");
        }
        s.file.emplace(dir_ / s.name, dir_fd_.get(), s.name.c_str());
        opened_.push_back(i);
    }

    /// The index maps `name` to shard i: the shard must hold it.
    void check_holds(std::size_t i, const std::string& name) const {
        const SafetensorsFile& file = *shards_[i].file;
        if (!file.contains(name))
            throw io_error(index_path_ + ": maps tensor " + detail::quoted(name) + " to shard " +
                           detail::quoted(shards_[i].name) + ", which does not hold it" +
                           detail::closest_names(name, file.names()));
    }

    /// A shard must not hold tensors the index leaves out or assigns elsewhere: which copy would be meant?
    void check_nothing_else(std::size_t i) const {
        const SafetensorsFile& file = *shards_[i].file;
        for (const auto& r : file.records())
            if (auto it = shard_of_.find(r.name); it == shard_of_.end() || it->second != i)
                throw io_error(file.path() + ": holds tensor " + detail::quoted(r.name) + ", which " + index_path_ +
                               (it == shard_of_.end() ? " does not list" : " maps to another shard"));
    }

    /// Opens shard i when a tensor in it is first read (Shards::as_needed), checked against the index.
    void open_checked(std::size_t i, std::string_view tensor) const {
        open(i, tensor);
        try {
            for (const auto& [name, shard] : shard_of_)
                if (shard == i) check_holds(i, name);
            check_nothing_else(i);
        } catch (...) {
            shards_[i].file.reset();
            opened_.pop_back();
            throw;
        }
    }

    void open_index(const std::filesystem::path& index_path, Shards opening) {
        index_path_ = index_path.string();
        constexpr std::size_t max_index_bytes = std::size_t(256) << 20;  // K2's and DeepSeek-V3's are a few MB
        const WeightMap weight_map = parse_safetensors_index(
            detail::read_small_file(index_path, max_index_bytes, dir_fd_.get(), "model.safetensors.index.json"),
            index_path_);

        std::map<std::string, std::size_t, std::less<>> shard_index;  // shard file name -> position in shards_
        for (const auto& [name, file] : weight_map) {
            auto [it, inserted] = shard_index.emplace(file, shards_.size());
            if (inserted) shards_.push_back(Shard{file, {}});
            shard_of_.emplace(name, it->second);
        }
        if (opening == Shards::as_needed) return;
        for (const auto& [name, file] : weight_map) {  // in the index's order: the first problem is named
            const std::size_t i = shard_of_.find(name)->second;
            if (!shards_[i].file) open(i, name);
            check_holds(i, name);
        }
        for (std::size_t i = 0; i < shards_.size(); ++i) check_nothing_else(i);
    }

    std::filesystem::path dir_;
    detail::FileDescriptor dir_fd_;  // the directory as opened: every file is read through it
    std::string index_path_;         // "" for a single model.safetensors
    HFConfig config_;
    // Opened on first use (a const read may open one); the vector is filled once, so the files never move.
    mutable std::vector<Shard> shards_;
    mutable std::vector<std::size_t> opened_;                   // indices into shards_, in the order opened
    std::map<std::string, std::size_t, std::less<>> shard_of_;  // tensor name -> index into shards_
    std::set<std::string, std::less<>> used_;
};

}  // namespace moonmoe
