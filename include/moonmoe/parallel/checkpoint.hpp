// moonmoe/parallel/checkpoint.hpp: one Hugging Face checkpoint of the whole model from a parallel run, and each
// rank's part loaded from any checkpoint.
//
//   parallel::save_checkpoint(dir, part, groups);   every rank calls it (collective): one checkpoint directory of
//                                                   the whole model, as save_transformer writes for one process
//   parallel::load_checkpoint(dir, part);           each rank on its own: its part's tensors, from the shards
//                                                   that hold them (no other shard is opened, or needs to exist)
//
// The save is sharded by owner: every tensor is written by exactly one of the ranks that hold it, into shard files
// of its own, and rank 0 writes the index and config.json. The owner of a routed expert's tensors is the rank with
// dp 0 among those holding the expert; of every other tensor (attention, norms, router, shared expert, dense MLP;
// the embedding on the first stage, the final norm and lm_head on the last) the rank with ep 0 and dp 0 of its
// stage. A rank's shards are cut at max_shard_bytes as save_transformer cuts them and numbered in world rank
// order: model-00001-of-0000N.safetensors ... with model.safetensors.index.json, the names transformers writes
// (a run whose tensors fit one shard writes model.safetensors alone). No tensor crosses the network, so a rank's
// memory beyond its parameters is what save_transformer's is for its share, and the ranks write at once;
// docs/parallel.md ("Saving a parallel run") has the measurement against gathering to one writer.
//
// Atomic as save_transformer is (io/checkpoint_writer.hpp): rank 0 checks that `dir` may be replaced and makes the
// hidden temporary directory beside it; every rank writes its shards there (each file fsync'ed); the ranks agree
// that all of them succeeded; rank 0 writes the index and config.json, copies the replaced checkpoint's tokenizer
// files, syncs and renames the directory into place; the ranks agree again, so every rank returns once the
// checkpoint is in place. A failure on any rank throws io_error on every rank, naming each failing rank and what
// failed there, and leaves `dir` as it was (the temporary directory removed). `dir` must be on a file system every
// rank sees (one shared by the nodes of a multi-node run): a rank that does not see rank 0's temporary directory
// fails the save, saying so. Waits for the other ranks are bounded by SaveOptions::wait, for which the world
// communicator's timeout is raised during the save (a rank's write of its shards may take minutes at K2's size).
//
// config.json is rank 0's part's: the file its weights were loaded from (load_checkpoint, load_weights), every
// field kept (bos_token_id, eos_token_id, ...), or the configuration's (io/hf_config_writer.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "../io/model_io.hpp"
#include "comm.hpp"
#include "groups.hpp"

namespace moonmoe::parallel {

/// How save_checkpoint writes: moonmoe::SaveOptions (stored type, shard size, initializer_range), and how long a
/// rank waits for the others.
struct SaveOptions : moonmoe::SaveOptions {
    /// The longest a rank waits for the others (their shards written, rank 0's rename); the world communicator's
    /// timeout is at least this during the save.
    std::chrono::milliseconds wait = std::chrono::hours(1);
};

/// Whether the rank at `at` writes the tensor `name` of its part in save_checkpoint (the owner rule at the top of
/// this file).
inline bool writes_tensor(Coordinates at, std::string_view name) {
    return at.dp == 0 && (at.ep == 0 || moonmoe::detail::expert_of(name).has_value());
}

namespace detail {

inline std::string describe_rank(const RankLayout& layout, index_t rank) {
    const Coordinates c = layout.coordinates(rank);
    return "rank " + std::to_string(rank) + " (pp " + std::to_string(c.pp) + ", ep " + std::to_string(c.ep) + ", dp " +
           std::to_string(c.dp) + ")";
}

/// Every rank's `mine`, in rank order (host memory on every communicator: exchange_counts and host_all_to_all_v).
inline std::vector<std::string> all_gather_strings(Communicator& world, const std::string& mine) {
    const std::size_t n = std::size_t(world.size());
    const std::vector<index_t> send_counts(n, index_t(mine.size()));
    const std::vector<index_t> recv_counts = world.exchange_counts(send_counts);
    std::vector<std::byte> send;
    send.reserve(mine.size() * n);
    for (std::size_t r = 0; r < n; ++r)
        for (char ch : mine) send.push_back(std::byte(ch));
    index_t total = 0;
    for (index_t c : recv_counts) total += c;
    std::vector<std::byte> recv(static_cast<std::size_t>(total));
    world.host_all_to_all_v(std::span<const std::byte>(send), send_counts, std::span<std::byte>(recv), recv_counts);
    std::vector<std::string> out(n);
    std::size_t at = 0;
    for (std::size_t r = 0; r < n; ++r) {
        out[r].assign(reinterpret_cast<const char*>(recv.data()) + at, std::size_t(recv_counts[r]));
        at += std::size_t(recv_counts[r]);
    }
    return out;
}

/// Every rank's `mine` on rank `root` (rank order; empty strings elsewhere).
inline std::vector<std::string> gather_strings(Communicator& world, int root, const std::string& mine) {
    const std::size_t n = std::size_t(world.size());
    std::vector<index_t> send_counts(n, 0);
    send_counts[std::size_t(root)] = index_t(mine.size());
    const std::vector<index_t> recv_counts = world.exchange_counts(send_counts);
    index_t total = 0;
    for (index_t c : recv_counts) total += c;
    std::vector<std::byte> recv(static_cast<std::size_t>(total));
    const auto bytes = std::as_bytes(std::span<const char>(mine.data(), mine.size()));
    world.host_all_to_all_v(bytes, send_counts, std::span<std::byte>(recv), recv_counts);
    std::vector<std::string> out(world.rank() == root ? n : 0);
    std::size_t at = 0;
    for (std::size_t r = 0; r < out.size(); ++r) {
        out[r].assign(reinterpret_cast<const char*>(recv.data()) + at, std::size_t(recv_counts[r]));
        at += std::size_t(recv_counts[r]);
    }
    return out;
}

/// Rank `root`'s `text` on every rank.
inline std::string broadcast_string(Communicator& world, int root, const std::string& text) {
    const std::size_t n = std::size_t(world.size());
    const bool sender = world.rank() == root;
    const std::vector<index_t> send_counts(n, sender ? index_t(text.size()) : 0);
    const std::vector<index_t> recv_counts = world.exchange_counts(send_counts);
    std::vector<std::byte> send;
    if (sender)
        for (std::size_t r = 0; r < n; ++r)
            for (char ch : text) send.push_back(std::byte(ch));
    std::vector<std::byte> recv(static_cast<std::size_t>(recv_counts[std::size_t(root)]));
    world.host_all_to_all_v(std::span<const std::byte>(send), send_counts, std::span<std::byte>(recv), recv_counts);
    return std::string(reinterpret_cast<const char*>(recv.data()), recv.size());
}

/// Every rank calls it with "" (this rank's step succeeded) or what failed; if any rank failed, throws io_error
/// on every rank: `prefix` and each failing rank with its message.
inline void agree(Communicator& world, const RankLayout& layout, const std::string& failure,
                  const std::string& prefix) {
    const std::vector<std::string> all = all_gather_strings(world, failure);
    std::string message;
    index_t failed = 0;
    for (std::size_t r = 0; r < all.size(); ++r) {
        if (all[r].empty()) continue;
        if (++failed <= 4) message += (failed > 1 ? "; " : "") + describe_rank(layout, index_t(r)) + ": " + all[r];
    }
    if (failed == 0) return;
    if (failed > 4) message += "; and " + std::to_string(failed - 4) + " more ranks";
    throw io_error(prefix + message);
}

/// Runs `f`, returning "" or what it threw.
template <class F>
std::string failure_of(F&& f) {
    try {
        f();
        return {};
    } catch (const std::exception& e) {
        const std::string what = e.what();
        return what.empty() ? std::string("an exception with no message") : what;
    } catch (...) {
        return "an exception that is not a std::exception";
    }
}

/// Raises a communicator's timeout for a scope, restoring it after.
class TimeoutAtLeast {
public:
    TimeoutAtLeast(Communicator& c, std::chrono::milliseconds t) : c_(c), old_(c.timeout()) {
        if (t > old_) c_.set_timeout(t);
    }
    ~TimeoutAtLeast() { c_.set_timeout(old_); }
    TimeoutAtLeast(const TimeoutAtLeast&) = delete;
    TimeoutAtLeast& operator=(const TimeoutAtLeast&) = delete;

private:
    Communicator& c_;
    std::chrono::milliseconds old_;
};

/// The tensors of `part` this rank writes, in the part's order.
template <class B>
std::vector<ParamRef> owned_params(nn::Transformer<B>& part, Coordinates at) {
    std::vector<ParamRef> out;
    part.visit_params([&](const ParamRef& p) {
        if (writes_tensor(at, p.name)) out.push_back(p);
    });
    return out;
}

/// [first, last) of `params` per shard: a new shard where the next tensor would take the current one past
/// max_shard_bytes (io/checkpoint_writer.hpp's rule).
inline std::vector<std::pair<std::size_t, std::size_t>> owned_shards(const std::vector<ParamRef>& params,
                                                                     std::size_t element_bytes,
                                                                     std::uint64_t max_shard_bytes) {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::uint64_t current = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
        const std::uint64_t bytes = std::uint64_t(params[i].numel()) * element_bytes;
        if (out.empty() || current + bytes > max_shard_bytes) out.push_back({i, i}), current = 0;
        out.back().second = i + 1;
        current += bytes;
    }
    return out;
}

/// Rank 0's check of the gathered index: each tensor written once, and every piece of the model present.
inline void check_coverage(const std::map<std::string, index_t>& writer_of, const ModelConfig& c) {
    std::vector<bool> layer(std::size_t(c.dims.layers), false);
    std::vector<std::vector<bool>> expert(std::size_t(c.dims.layers),
                                          std::vector<bool>(std::size_t(c.moe.experts), false));
    for (const auto& [name, rank] : writer_of) {
        const auto l = moonmoe::detail::layer_of(name);
        if (!l || *l < 0 || *l >= c.dims.layers) continue;
        layer[std::size_t(*l)] = true;
        if (const auto e = moonmoe::detail::expert_of(name); e && *e >= 0 && *e < c.moe.experts)
            expert[std::size_t(*l)][std::size_t(*e)] = true;
    }
    const std::string fix = " (every rank must hold model_part(config, groups.at))";
    for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})
        if (!writer_of.count(name)) throw io_error(std::string("no rank wrote ") + name + fix);
    for (index_t l = 0; l < c.dims.layers; ++l) {
        if (!layer[std::size_t(l)]) throw io_error("no rank wrote a tensor of layer " + std::to_string(l) + fix);
        if (l < c.dims.dense_layers) continue;
        for (index_t e = 0; e < c.moe.experts; ++e)
            if (!expert[std::size_t(l)][std::size_t(e)])
                throw io_error("no rank wrote routed expert " + std::to_string(e) + " of layer " + std::to_string(l) +
                               fix);
    }
}

}  // namespace detail

/// Saves the whole model of a parallel run as one Hugging Face checkpoint directory `dir` (the top of this file):
/// every rank of groups.world calls it with its part. Throws io_error on every rank if any rank fails, and then
/// leaves `dir` as it was.
template <class B>
void save_checkpoint(const std::filesystem::path& dir, nn::Transformer<B>& part, ProcessGroups& groups,
                     const SaveOptions& options = {}) {
    namespace fs = std::filesystem;
    Communicator& world = groups.world;
    const detail::TimeoutAtLeast patient(world, options.wait);
    const std::string where = dir.string();
    const std::string failed = where + ": cannot save the parallel checkpoint; nothing changed: ";
    const auto agree = [&](const std::string& failure) { detail::agree(world, groups.layout, failure, failed); };
    const bool root = world.rank() == 0;

    // 1. What this rank writes, its shards, and their numbers among every rank's.
    std::vector<ParamRef> mine;
    std::vector<std::pair<std::size_t, std::size_t>> shards;
    std::string config_text;
    agree(detail::failure_of([&] {
        if (options.max_shard_bytes == 0) throw io_error("max_shard_bytes must be positive");
        if (moonmoe::detail::torch_dtype_name(options.store).empty())
            throw io_error("cannot store tensors as " + std::string(dtype_name(options.store)) +
                           "; use F32, BF16 or F16");
        if (groups.layout.world_size() != index_t(world.size()) ||
            !(part.config.parallel.pp == groups.layout.pp && part.config.parallel.ep == groups.layout.ep &&
              part.config.parallel.dp == groups.layout.dp))
            throw io_error("the part's configuration is for another layout than the process groups'");
        mine = detail::owned_params(part, groups.at);
        shards = detail::owned_shards(mine, dtype_size(options.store), options.max_shard_bytes);
        if (root)
            config_text = moonmoe::detail::saved_config_text(saved_hf_config(part, options.initializer_range),
                                                             options.store, where);
    }));
    const std::vector<index_t> counts =
        world.exchange_counts(std::vector<index_t>(std::size_t(world.size()), index_t(shards.size())));
    std::size_t first = 0, total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
        if (int(r) < world.rank()) first += std::size_t(counts[r]);
        total += std::size_t(counts[r]);
    }
    const bool single = total == 1;  // model.safetensors, no index, as save_transformer writes a model that fits
    const auto file_name = [&](std::size_t s) {
        return single ? std::string("model.safetensors") : moonmoe::detail::shard_file_name(first + s, total);
    };

    // 2. Rank 0 stages the new directory beside `dir`; every rank must see it.
    std::optional<moonmoe::detail::StagedCheckpoint> staged;
    try {
        std::string temp;
        agree(detail::failure_of([&] {
            if (!root) return;
            staged.emplace(dir, where);
            temp = staged->path().string();
        }));
        const fs::path temp_path = detail::broadcast_string(world, 0, temp);
        agree(detail::failure_of([&] {
            if (!fs::is_directory(temp_path))
                throw io_error("does not see rank 0's new directory " + temp_path.string() +
                               ": every rank must see `dir`'s file system (one shared by the nodes)");
        }));

        // 3. Every rank writes its shards (for a device backend, one shard's values on the host at a time).
        agree(detail::failure_of([&] {
            for (std::size_t s = 0; s < shards.size(); ++s) {
                std::deque<std::vector<float>> copies;
                std::deque<std::vector<bf16>> copies16;
                std::vector<NamedTensor> tensors;
                for (std::size_t i = shards[s].first; i < shards[s].second; ++i)
                    tensors.push_back(moonmoe::detail::stored_values<B>(mine[i], copies, copies16));
                if (!options.allow_non_finite)
                    moonmoe::detail::refuse_non_finite(tensors, "rank " + std::to_string(world.rank()));
                const std::string file = file_name(s);
                moonmoe::detail::tensors_writer((dir / file).string(), tensors, options.store).write(temp_path / file);
            }
        }));

        // 4. Rank 0: the index of every rank's tensors, config.json, the companions; then the rename.
        nlohmann::json listed = nlohmann::json::array();
        for (std::size_t s = 0; s < shards.size(); ++s)
            for (std::size_t i = shards[s].first; i < shards[s].second; ++i)
                listed.push_back({mine[i].name, file_name(s), mine[i].numel()});
        std::string text;
        agree(detail::failure_of([&] { text = listed.dump(); }));  // a name that is not UTF-8
        const std::vector<std::string> lists = detail::gather_strings(world, 0, text);
        agree(detail::failure_of([&] {
            if (!root) return;
            std::map<std::string, index_t> writer_of;
            nlohmann::json weight_map = nlohmann::json::object();
            std::uint64_t parameters = 0;
            for (std::size_t r = 0; r < lists.size(); ++r)
                for (const auto& entry : nlohmann::json::parse(lists[r])) {
                    const std::string name = entry[0].get<std::string>();
                    if (const auto [it, fresh] = writer_of.emplace(name, index_t(r)); !fresh)
                        throw io_error("tensor " + moonmoe::detail::quoted(name) + " was written by " +
                                       detail::describe_rank(groups.layout, it->second) + " and " +
                                       detail::describe_rank(groups.layout, index_t(r)) +
                                       " (every rank must hold model_part(config, groups.at))");
                    weight_map[name] = entry[1];
                    parameters += entry[2].get<std::uint64_t>();
                }
            detail::check_coverage(writer_of, part.config);
            if (!single)
                staged->write_text("model.safetensors.index.json",
                                   moonmoe::detail::index_text(weight_map, parameters, options.store, where));
            staged->write_text("config.json", config_text);
            staged->finish();
        }));
        // 5. The rename (its errors say whether the new checkpoint is in place); every rank returns after it.
        detail::agree(world, groups.layout, detail::failure_of([&] {
                          if (root) staged->commit();
                      }),
                      where + ": ");
    } catch (...) {
        staged.reset();  // rank 0: removes the new directory unless it was renamed into place
        throw;
    }
}

/// Loads this rank's part of the model from the checkpoint `dir` (any layout's, or one process's): every tensor of
/// `part` with its expected shape, from the shards that hold them; the other shards are never opened and need not
/// exist. Tensors of the checkpoint that belong to no part of the model are refused (load_weights' rules); the
/// part keeps config.json, so that save_checkpoint writes it back. Not collective.
template <class B>
void load_checkpoint(const std::filesystem::path& dir, nn::Transformer<B>& part, const LoadOptions& options = {}) {
    Checkpoint ck(dir, Checkpoint::Shards::as_needed);
    load_weights(part, ck, options);
}

}  // namespace moonmoe::parallel
