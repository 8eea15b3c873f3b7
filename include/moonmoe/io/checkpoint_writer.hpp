// moonmoe/io/checkpoint_writer.hpp: save f32 tensors as one safetensors file, or as a whole checkpoint directory
// (one model.safetensors, or shards with their index).
//
// write_checkpoint replaces a directory as a whole or not at all. The new checkpoint is built in a hidden sibling
// directory with a random name (`.<dir>.tmp-<random>`), every file and that directory are fsync'ed, and one rename
// puts it in place: renameat2(RENAME_EXCHANGE) swaps it with an existing checkpoint atomically (where the kernel
// or filesystem cannot, the old one is renamed aside first, and back on failure). The parent is fsync'ed, then
// the old tree removed. Any failure before the swap removes the temporary directory and leaves the old checkpoint
// as it was; a reader that already mapped the old files keeps them. A writer holds an advisory lock (flock) on its
// temporary directory; the next save in the same parent removes the temporary directories of its name that nobody
// holds locked: what a save killed mid-write left behind.
//
// Replacing deletes the old directory, so an existing `dir` is replaced only if it holds nothing but checkpoint
// files, all regular files (no subdirectories, no symlinks):
//   - what the new checkpoint supersedes: config.json, model.safetensors, model.safetensors.index.json and the
//     shards model-<i>-of-<n>.safetensors;
//   - companions, copied into the new checkpoint unchanged: generation_config.json, the tokenizer files
//     (tokenizer.json, tokenizer_config.json, tokenizer.model, tiktoken.model, special_tokens_map.json,
//     added_tokens.json, vocab.json, merges.txt, chat_template.jinja / .json), remote code (configuration_*.py,
//     modeling_*.py, tokenization_*.py), README.md, LICENSE and .gitattributes.
// Anything else (an optimizer state, a log, a subdirectory) makes write_checkpoint refuse, naming the entry, and
// change nothing: it never deletes a file it does not know. A symlink `dir` is followed (its target is replaced);
// the parent directory must be writable, since the new tree is built there.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <stdio.h>  // renameat2, RENAME_EXCHANGE, RENAME_NOREPLACE (glibc >= 2.28 with _GNU_SOURCE)

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../config/named.hpp"
#include "../tensor/dtype.hpp"
#include "detail/atomic_file.hpp"
#include "detail/read_file.hpp"
#include "error.hpp"
#include "hf_config.hpp"
#include "safetensors_writer.hpp"

namespace moonmoe {

/// One tensor to save, by checkpoint name: f32 values, or bf16 ones (a parameter stored in bf16).
struct NamedTensor {
    std::string name;
    std::vector<index_t> shape;
    std::span<const float> values;
    std::span<const bf16> values16 = {};  ///< used when `values` is empty
    std::size_t numel() const { return values.empty() ? values16.size() : values.size(); }
};

namespace detail {

/// Throws io_error naming the first tensor of `tensors` that holds a NaN or an infinity (the element and its
/// value): a checkpoint of such weights loads into a model that computes NaN. `where` starts the message.
inline void refuse_non_finite(std::span<const NamedTensor> tensors, const std::string& where) {
    for (const NamedTensor& t : tensors) {
        const std::size_t n = t.numel();
        for (std::size_t i = 0; i < n; ++i) {
            const float v = t.values.empty() ? t.values16[i].to_float() : t.values[i];
            if (std::isfinite(v)) continue;
            throw io_error(where + ": tensor " + detail::quoted(t.name) + " holds " +
                           (std::isnan(v) ? "NaN"
                            : v > 0       ? "+inf"
                                          : "-inf") +
                           " at element " + std::to_string(i) + " of " + std::to_string(n) +
                           "; a checkpoint of non-finite weights is refused (SaveOptions::allow_non_finite keeps "
                           "them); nothing was written");
        }
    }
}

inline std::string_view torch_dtype_name(DType t) {
    switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    default: return "";
    }
}

/// `tensors` in a writer, converted to `store` and checked (shape, size, name); errors start with `file`. Values
/// already of the stored type are borrowed, not copied: `tensors` must outlive the writer's write().
inline SafetensorsWriter tensors_writer(const std::string& file, std::span<const NamedTensor> tensors, DType store) {
    if (torch_dtype_name(store).empty())
        throw io_error(file + ": cannot store tensors as " + std::string(dtype_name(store)) + "; use F32, BF16 or F16");
    SafetensorsWriter writer;
    writer.metadata("format", "pt");
    std::vector<std::uint16_t> narrow;
    for (const NamedTensor& t : tensors) {
        try {
            if (t.values.empty() && store == DType::bf16) {  // bf16 kept as it is
                writer.add_borrowed(t.name, store, t.shape, std::as_bytes(t.values16));
                continue;
            }
            std::vector<float> wide;  // bf16 values to store as f32 or f16: widened first (exact)
            if (t.values.empty()) {
                wide.resize(t.values16.size());
                for (std::size_t i = 0; i < wide.size(); ++i) wide[i] = t.values16[i].to_float();
            }
            const std::span<const float> values = t.values.empty() ? std::span<const float>(wide) : t.values;
            if (store == DType::f32) {
                if (t.values.empty()) writer.add_f32(t.name, t.shape, values);  // `wide` goes at the end of this loop
                else
                    writer.add_borrowed(t.name, store, t.shape, std::as_bytes(values));
                continue;
            }
            narrow.resize(values.size());
            for (std::size_t i = 0; i < narrow.size(); ++i)
                narrow[i] = store == DType::bf16 ? bf16::from_float(values[i]).bits : f16::from_float(values[i]).bits;
            writer.add(t.name, store, t.shape, std::as_bytes(std::span<const std::uint16_t>(narrow)));
        } catch (const io_error& e) {
            throw io_error(file + ": " + e.what());
        }
    }
    return writer;
}

/// What write_checkpoint does with an entry of the directory it replaces (see the top of this file).
enum class CheckpointEntry { superseded, companion, foreign };

inline CheckpointEntry classify_checkpoint_entry(std::string_view name) {
    const auto digits = [](std::string_view s) {
        return !s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos;
    };
    if (name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json")
        return CheckpointEntry::superseded;
    if (name.starts_with("model-") && name.ends_with(".safetensors")) {  // model-00001-of-00163.safetensors
        const std::string_view middle = name.substr(6, name.size() - 6 - 12);
        const std::size_t of = middle.find("-of-");
        if (of != std::string_view::npos && digits(middle.substr(0, of)) && digits(middle.substr(of + 4)))
            return CheckpointEntry::superseded;
    }
    for (std::string_view companion :
         {"generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model",
          "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja",
          "chat_template.json", "README.md", "LICENSE", ".gitattributes"})
        if (name == companion) return CheckpointEntry::companion;
    for (std::string_view prefix : {"configuration_", "modeling_", "tokenization_"})
        if (name.starts_with(prefix) && name.ends_with(".py")) return CheckpointEntry::companion;
    return CheckpointEntry::foreign;
}

/// The companions of the existing checkpoint `dir` (nullopt if `dir` does not exist); throws io_error naming
/// `where` and the entry if `dir` may not be replaced.
inline std::optional<std::vector<std::string>> replaceable_checkpoint(const std::filesystem::path& dir,
                                                                      const std::string& where) {
    namespace fs = std::filesystem;
    struct stat st{};
    if (::lstat(dir.c_str(), &st) != 0) {
        const int e = errno;
        if (e == ENOENT) return std::nullopt;
        throw_system_error(where, "cannot stat", e);
    }
    if (!S_ISDIR(st.st_mode))
        throw io_error(where + ": exists and is " + file_kind(st.st_mode) + ", not a checkpoint directory");
    std::vector<std::string> companions;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const auto refuse = [&](const std::string& why) {
            throw io_error(where + ": holds " + detail::quoted(name) + ", " + why +
                           "; write_checkpoint replaces a checkpoint " +
                           "directory as a whole and will not delete it (move it, or write elsewhere)");
        };
        if (::lstat(it->path().c_str(), &st) != 0) {
            const int e = errno;
            throw_system_error(it->path().string(), "cannot stat", e);
        }
        if (!S_ISREG(st.st_mode)) refuse(std::string("which is ") + file_kind(st.st_mode));
        const CheckpointEntry kind = classify_checkpoint_entry(name);
        if (kind == CheckpointEntry::foreign) refuse("which is not a checkpoint file");
        if (kind == CheckpointEntry::companion) companions.push_back(name);
    }
    if (ec) throw io_error(where + ": cannot list the directory: " + ec.message());
    return companions;
}

/// Copies the regular file `from` to the new file `to` and fsyncs it.
inline void copy_file_synced(const std::filesystem::path& from, const std::filesystem::path& to) {
    std::error_code ec;
    if (!std::filesystem::copy_file(from, to, ec) || ec)
        throw io_error(from.string() + ": cannot copy into the new checkpoint: " + ec.message());
    FileDescriptor fd(::open(to.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
        const int e = errno;
        throw_system_error(to.string(), "cannot sync", e);
    }
}

/// Puts the directory `temp` in place of `name` (both in `parent`) with one rename; returns the name where the old
/// directory now is (to be removed), or "" if there was none. On an error `name` is as before and `temp` is the
/// new tree still. `exchange` false skips renameat2, to test the rename-aside path.
inline std::string swap_in_directory(int parent, const std::string& temp, const std::string& name, bool existed,
                                     const std::string& where, bool exchange = true) {
    const auto unsupported = [](int e) { return e == EINVAL || e == ENOSYS || e == ENOTSUP; };
#if defined(RENAME_EXCHANGE) && defined(RENAME_NOREPLACE)
    if (exchange) {
        if (::renameat2(parent, temp.c_str(), parent, name.c_str(), existed ? RENAME_EXCHANGE : RENAME_NOREPLACE) == 0)
            return existed ? temp : std::string();
        if (const int e = errno; !unsupported(e))
            throw_system_error(where, "cannot rename the new checkpoint " + temp + " into place", e);
    }
#endif
    (void)exchange;
    (void)unsupported;
    if (!existed) {  // plain rename: at worst it replaces an empty directory made meanwhile
        if (::renameat(parent, temp.c_str(), parent, name.c_str()) != 0) {
            const int e = errno;
            throw_system_error(where, "cannot rename the new checkpoint " + temp + " into place", e);
        }
        return {};
    }
    std::string aside;
    for (int attempt = 0;; ++attempt) {
        aside = temporary_name(name + ".old");
        if (::renameat(parent, name.c_str(), parent, aside.c_str()) == 0) break;
        const int e = errno;
        if ((e != EEXIST && e != ENOTEMPTY && e != ENOTDIR) || attempt == 100)
            throw_system_error(where, "cannot move the old checkpoint aside", e);
    }
    if (::renameat(parent, temp.c_str(), parent, name.c_str()) != 0) {
        const int e = errno;
        ::renameat(parent, aside.c_str(), parent, name.c_str());
        throw_system_error(where, "cannot rename the new checkpoint " + temp + " into place", e);
    }
    return aside;
}

/// `dir` made absolute and without a trailing separator; a symlink is resolved to the directory it names.
inline std::filesystem::path checkpoint_target(const std::filesystem::path& dir, const std::string& where) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::path target = fs::absolute(dir, ec).lexically_normal();
    if (ec) throw io_error(where + ": " + ec.message());
    if (!target.has_filename()) target = target.parent_path();  // "ckpt/" names ckpt
    if (target.filename().empty() || target.filename() == "..")
        throw io_error(where + ": not a directory name that write_checkpoint can replace");
    if (fs::is_symlink(target, ec)) {
        target = fs::canonical(target, ec);
        if (ec) throw io_error(where + ": a symlink that does not resolve: " + ec.message());
    }
    return target;
}

}  // namespace detail

/// Writes `tensors` to one safetensors file, stored as `store` (F32, or BF16 / F16 rounded to nearest even as
/// torch rounds), with the metadata transformers writes ({"format": "pt"}). The file is replaced atomically.
inline void write_tensors(const std::filesystem::path& file, std::span<const NamedTensor> tensors,
                          DType store = DType::f32) {
    detail::tensors_writer(file.string(), tensors, store).write(file);
}

// Sharded checkpoints: tensors go into shards in the order given, a new shard starting when the next tensor would
// take the current one past max_shard_bytes, so a tensor larger than that has a shard of its own (huggingface_hub's
// split_state_dict_into_shards follows the same rule, but files an oversized tensor before the shard being filled).
// One shard is written as model.safetensors; several as model-00001-of-0000N.safetensors plus
// model.safetensors.index.json ({"metadata": {"total_parameters", "total_size"}, "weight_map": {tensor: shard}},
// the index transformers 5 writes). Shards are written one at a time, tensors already of the stored type straight
// from where they are (SafetensorsWriter::add_borrowed), so the memory beyond the tensors themselves is nothing, or
// one shard's converted values when the type changes (F32 parameters stored as BF16).

/// 5 GB, huggingface_hub's default shard size (transformers 5 passes 50 GB; the Kimi K2 and DeepSeek-V3
/// checkpoints use shards of about 5 GB, which tools that copy files one by one handle better).
inline constexpr std::uint64_t default_max_shard_bytes = 5'000'000'000ull;

namespace detail {

/// The index ranges [first, last) of `tensors` that form each shard.
inline std::vector<std::pair<std::size_t, std::size_t>> shard_ranges(std::span<const NamedTensor> tensors,
                                                                     std::size_t element_bytes,
                                                                     std::uint64_t max_shard_bytes) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::uint64_t current = 0;  // bytes in the last shard
    for (std::size_t i = 0; i < tensors.size(); ++i) {
        const std::uint64_t bytes = std::uint64_t(tensors[i].numel()) * element_bytes;
        if (out.empty() || current + bytes > max_shard_bytes) out.push_back({i, i}), current = 0;
        out.back().second = i + 1;
        current += bytes;
    }
    if (out.empty()) out.push_back({0, 0});
    return out;
}

inline std::string shard_file_name(std::size_t index, std::size_t count) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
    return name;
}

}  // namespace detail

namespace detail {

/// config.json as a checkpoint of `store` tensors gets it: `config`'s document with quantization_config removed
/// (the weights are no longer FP8) and torch_dtype (or transformers 5's dtype, whichever the file spells) set.
inline std::string saved_config_text(const HFConfig& config, DType store, const std::string& where) {
    nlohmann::json json = config.json;
    json.erase("quantization_config");
    json[json.contains("dtype") && !json.contains("torch_dtype") ? "dtype" : "torch_dtype"] =
        std::string(torch_dtype_name(store));
    try {
        return json.dump(2) + "\n";
    } catch (const nlohmann::json::exception& e) {  // a string that is not UTF-8
        throw io_error(where + ": config.json cannot be written: " + e.what());
    }
}

/// model.safetensors.index.json for `weight_map` (tensor -> shard file), `parameters` elements of `store`.
inline std::string index_text(const nlohmann::json& weight_map, std::uint64_t parameters, DType store,
                              const std::string& where) {
    nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}};
    index["metadata"]["total_parameters"] = parameters;
    index["metadata"]["total_size"] = parameters * dtype_size(store);
    try {
        return index.dump(2) + "\n";
    } catch (const nlohmann::json::exception& e) {  // a name that is not UTF-8
        throw io_error(where + ": the index cannot be written: " + e.what());
    }
}

/// A new checkpoint directory built beside `dir` and put in its place as a whole (the rules at the top of this
/// file). The constructor checks that `dir` may be replaced (creating its parents) and makes the hidden temporary
/// directory; files go into path(); commit() copies the old checkpoint's companions, syncs, and swaps the new tree
/// in. Until commit() has swapped, destruction removes the temporary directory and leaves `dir` as it was.
class StagedCheckpoint {
public:
    StagedCheckpoint(const std::filesystem::path& dir, const std::string& where) : where_(where) {
        namespace fs = std::filesystem;
        target_ = checkpoint_target(dir, where);
        std::error_code ec;
        fs::create_directories(target_.parent_path(), ec);
        if (ec)
            throw io_error(where + ": cannot create the directory " + target_.parent_path().string() + ": " +
                           ec.message());
        companions_ = replaceable_checkpoint(target_, where);
        name_ = target_.filename().string();
        parent_ = open_directory(target_.parent_path(), where);
        remove_stale_temporaries(target_.parent_path(), parent_.get(), name_);  // left by saves killed mid-write
        temp_ = create_temporary_directory(parent_.get(), name_, where);
        temp_lock_ = lock_directory(parent_.get(), temp_.c_str(), true);  // live: no other save removes it
        temp_path_ = target_.parent_path() / temp_;
    }
    StagedCheckpoint(const StagedCheckpoint&) = delete;
    StagedCheckpoint& operator=(const StagedCheckpoint&) = delete;
    ~StagedCheckpoint() {
        if (swapped_) return;
        std::error_code ec;
        std::filesystem::remove_all(temp_path_, ec);
    }

    /// The temporary directory the new checkpoint is written into.
    const std::filesystem::path& path() const { return temp_path_; }

    /// Writes `text` as the file `name` of the new checkpoint.
    void write_text(const std::string& name, const std::string& text) const {
        const std::span<const std::byte> chunk = std::as_bytes(std::span(text.data(), text.size()));
        write_file_atomically(temp_path_ / name, std::span(&chunk, 1));
    }

    /// Copies the companions of the checkpoint being replaced and syncs the new tree (errors name the file).
    void finish() const {
        for (const std::string& file : companions_.value_or(std::vector<std::string>{}))
            copy_file_synced(target_ / file, temp_path_ / file);
        sync_directory(open_directory(temp_path_, where_).get(), where_);
    }

    /// Puts the new checkpoint in place of `dir` with one rename, makes that durable, then removes the old tree.
    void commit() {
        namespace fs = std::filesystem;
        // the old checkpoint takes the temporary name: locked, no other save takes it for a stale one
        const FileDescriptor old_lock = lock_directory(parent_.get(), name_.c_str(), false);
        const std::string old = swap_in_directory(parent_.get(), temp_, name_, companions_.has_value(), where_);
        swapped_ = true;  // the temporary name now holds the old checkpoint, or nothing
        std::error_code ec;
        const fs::path old_path = target_.parent_path() / old;
        try {
            sync_directory(parent_.get(), where_);
        } catch (...) {
            if (!old.empty()) fs::remove_all(old_path, ec);
            throw;
        }
        if (!old.empty()) {
            fs::remove_all(old_path, ec);
            if (ec)
                throw io_error(where_ + ": the new checkpoint is in place, but the old one, moved to " +
                               old_path.string() + ", could not be removed: " + ec.message());
        }
    }

private:
    std::string where_;
    std::filesystem::path target_, temp_path_;
    std::optional<std::vector<std::string>> companions_;
    std::string name_, temp_;
    FileDescriptor parent_, temp_lock_;
    bool swapped_ = false;
};

}  // namespace detail

/// Writes a checkpoint directory of `tensors` stored as `store` (F32, BF16 or F16) in shards of at most
/// `max_shard_bytes` (rules at the top of this file), with config.json from `config` (quantization_config
/// removed, torch_dtype set to the stored type). Creates `dir` and its parents if needed; an existing checkpoint
/// there is replaced as a whole or not at all, as write_checkpoint does.
inline void write_sharded_checkpoint(const std::filesystem::path& dir, const HFConfig& config,
                                     std::span<const NamedTensor> tensors, DType store = DType::f32,
                                     std::uint64_t max_shard_bytes = default_max_shard_bytes) {
    const std::string where = dir.string();
    if (max_shard_bytes == 0) throw io_error(where + ": max_shard_bytes must be positive");
    if (detail::torch_dtype_name(store).empty())
        throw io_error(where + ": cannot store tensors as " + std::string(dtype_name(store)) +
                       "; use F32, BF16 or F16");
    const auto ranges = detail::shard_ranges(tensors, dtype_size(store), max_shard_bytes);
    const bool sharded = ranges.size() > 1;

    nlohmann::json weight_map = nlohmann::json::object();
    std::uint64_t parameters = 0;
    for (std::size_t s = 0; s < ranges.size(); ++s)
        for (std::size_t i = ranges[s].first; i < ranges[s].second; ++i) {
            parameters += tensors[i].numel();
            weight_map[tensors[i].name] = detail::shard_file_name(s, ranges.size());
        }
    const std::string config_text = detail::saved_config_text(config, store, where);
    const std::string index_text = detail::index_text(weight_map, parameters, store, where);

    detail::StagedCheckpoint staged(dir, where);
    try {
        for (std::size_t s = 0; s < ranges.size(); ++s) {
            const std::string file = sharded ? detail::shard_file_name(s, ranges.size()) : "model.safetensors";
            const auto part = tensors.subspan(ranges[s].first, ranges[s].second - ranges[s].first);
            detail::tensors_writer((dir / file).string(), part, store).write(staged.path() / file);
        }
        if (sharded) staged.write_text("model.safetensors.index.json", index_text);
        staged.write_text("config.json", config_text);
        staged.finish();
    } catch (const io_error& e) {  // e names the temporary directory or the tensor
        throw io_error(where + ": cannot write the new checkpoint; nothing changed: " + e.what());
    }
    staged.commit();
}

/// Writes a checkpoint directory that Checkpoint and transformers can load: model.safetensors (as write_tensors)
/// and config.json, the loaded document with quantization_config removed (the weights are no longer FP8, as
/// DeepSeek's fp8_cast_bf16.py does) and torch_dtype set to the stored type. Creates `dir` and its parents if
/// needed, and replaces an existing checkpoint there as a whole or not at all (rules at the top of this file).
inline void write_checkpoint(const std::filesystem::path& dir, const HFConfig& config,
                             std::span<const NamedTensor> tensors, DType store = DType::f32) {
    write_sharded_checkpoint(dir, config, tensors, store, std::numeric_limits<std::uint64_t>::max());
}

}  // namespace moonmoe
