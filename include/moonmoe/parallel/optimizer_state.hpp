// moonmoe/parallel/optimizer_state.hpp: a ZeRO-1 run's optimizer state, saved by one layout and resumed by any
// other.
//
//   parallel::save_optimizer_state(dir, opt, groups);  collective: world rank r writes the state of the parameters
//                                                      it owns into dir/optimizer-<r + 1>-of-<N>.safetensors
//   parallel::load_optimizer_state(dir, opt);          each rank on its own: the state of the parameters it owns in
//                                                      its layout, from whichever of the files holds it
//
// ZeRO-1 (parallel/zero.hpp) shares the parameters out whole, so a parameter's state (Muon's momentum, AdamW's two
// moments, the f32 master under Weights<BF16>) is whole on its owner and named by the parameter, as the one-process
// file of io/optimizer_state.hpp names it: `<param>.momentum`, `.exp_avg`, `.exp_avg_sq`, `.master`. Each tensor
// is written once (router biases have no state), and nothing in a file depends on the layout that wrote it: a run
// at Parallel<2, 2, 2> resumes at Parallel<1, 4, 2>, each rank of the new layout reading the parameters the new
// shares give it (with the weights from parallel::load_checkpoint). The step count is every file's "step"
// metadata, the same on every rank.
//
// Atomic: rank 0 makes a hidden temporary directory beside `dir`, every rank writes its file there, the ranks
// agree that all of them succeeded, and rank 0 moves the directory into place (a previous `dir` is replaced only
// then). A failure on any rank throws io_error on every rank, naming each failing rank and what failed there (the
// agreement of parallel/checkpoint.hpp), and leaves `dir` as it was.
#pragma once

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../io/optimizer_state.hpp"
#include "checkpoint.hpp"
#include "zero.hpp"

namespace moonmoe::parallel {

namespace detail {

inline std::string optimizer_file_name(int rank, int ranks) {
    char name[64];
    std::snprintf(name, sizeof name, "optimizer-%05d-of-%05d.safetensors", rank + 1, ranks);
    return name;
}

}  // namespace detail

/// Saves the state of the parameters this rank owns; every rank of groups.world calls it (see the header comment).
template <class Config, class B>
void save_optimizer_state(const std::filesystem::path& dir, DistributedOptimizer<Config, B>& opt,
                          ProcessGroups& groups) {
    namespace fs = std::filesystem;
    Communicator& world = groups.world;
    const bool root = world.rank() == 0;
    const std::string failed = dir.string() + ": cannot save the optimizer state; nothing changed: ";
    const auto agree = [&](const std::string& failure) { detail::agree(world, groups.layout, failure, failed); };
    const fs::path target = fs::absolute(dir).lexically_normal();
    const fs::path temp = target.parent_path() / ("." + target.filename().string() + ".tmp-optimizer");
    agree(root ? detail::failure_of([&] {
        if (fs::exists(target) && !fs::is_directory(target))
            throw io_error(target.string() + " exists and is not a directory");
        fs::remove_all(temp);
        fs::create_directories(temp);
    })
               : std::string());
    try {
        agree(detail::failure_of([&] {
            save_optimizer_state(temp / detail::optimizer_file_name(world.rank(), world.size()), opt.inner());
        }));
    } catch (...) {
        if (root) fs::remove_all(temp);
        throw;
    }
    agree(root ? detail::failure_of([&] {
        const fs::path aside = target.parent_path() / ("." + target.filename().string() + ".old-optimizer");
        fs::remove_all(aside);
        if (fs::exists(target)) fs::rename(target, aside);
        fs::rename(temp, target);
        fs::remove_all(aside);
    })
               : std::string());
}

/// Loads the state of the parameters `opt` steps (this rank's own under ZeRO-1: DistributedOptimizer::inner(); every
/// parameter in one process) from a directory save_optimizer_state wrote in any layout. Throws io_error naming the
/// directory, file and tensor when a file is missing, a tensor it needs is nowhere, a shape differs, or the files
/// disagree on the step.
template <class Config, class B>
void load_optimizer_state(const std::filesystem::path& dir, optim::Optimizer<Config, B>& inner) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(dir)) throw io_error(dir.string() + ": no such directory (an optimizer state directory)");
    int ranks = -1;
    for (const auto& entry : fs::directory_iterator(dir)) {
        const std::string name = entry.path().filename().string();
        int r = 0, n = 0;
        if (std::sscanf(name.c_str(), "optimizer-%d-of-%d.safetensors", &r, &n) == 2) ranks = std::max(ranks, n);
    }
    if (ranks < 1) throw io_error(dir.string() + ": no optimizer-<rank>-of-<ranks>.safetensors file");
    std::vector<std::unique_ptr<SafetensorsFile>> files;
    std::map<std::string, const SafetensorsFile*> holder;
    std::string step;
    for (int r = 0; r < ranks; ++r) {
        const fs::path file = dir / detail::optimizer_file_name(r, ranks);
        if (!fs::exists(file))
            throw io_error(dir.string() + ": " + file.filename().string() + " is missing (the state of rank " +
                           std::to_string(r) + " of the " + std::to_string(ranks) + " that saved it)");
        files.push_back(std::make_unique<SafetensorsFile>(file));
        const auto s = files.back()->metadata().find("step");
        if (s == files.back()->metadata().end())
            throw io_error(file.string() + ": no \"step\" in the metadata; not an optimizer state");
        if (r > 0 && s->second != step)
            throw io_error(file.string() + ": step " + s->second + ", " + detail::optimizer_file_name(0, ranks) +
                           " says " + step);
        step = s->second;
        for (const std::string& name : files.back()->names()) holder[name] = files.back().get();
    }
    const auto source = [&](const std::string& name) -> const SafetensorsFile& {
        const auto it = holder.find(name);
        if (it == holder.end())
            throw io_error(dir.string() + ": no file holds " + moonmoe::detail::quoted(name) +
                           ", the state of a parameter this rank owns (saved by another model or optimizer?)");
        return *it->second;
    };
    for (auto& s : inner.slots())
        moonmoe::detail::for_each_state(s, [&](const std::string& name, Tensor<float, 1, B>& state) {
            moonmoe::detail::read_state(source(name), name, s.param.shape, state);
        });
    inner.set_steps(std::stoll(step));
    inner.round_masters();
}
/// The state of the parameters this rank owns in its ZeRO-1 shares.
template <class Config, class B>
void load_optimizer_state(const std::filesystem::path& dir, DistributedOptimizer<Config, B>& opt) {
    load_optimizer_state(dir, opt.inner());
}

}  // namespace moonmoe::parallel
