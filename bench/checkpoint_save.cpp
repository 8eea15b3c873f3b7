// Saving a parallel run as one Hugging Face checkpoint, two ways, on the same parts in the same run: the measurement
// behind parallel::save_checkpoint's choice (docs/parallel.md, "Saving a parallel run"). Run under mpirun; rank 0
// reports.
//
//   mpirun -np 4 build/bench/bench_checkpoint_save [--benchmark_filter=...]
//
// Sharded (parallel/checkpoint.hpp, what the library does): every rank writes the tensors it owns into shard files
//   of its own, at once; rank 0 writes the index and config.json and renames the directory into place.
// Gather (one writer): rank 0 writes every shard; each shard's tensors are sent to it by their owner (one message
//   per tensor, a shard's at a time, received into buffers that live until the shard is written), then the same
//   index, config.json and rename. The shards are cut as the sharded way cuts them (each owner's tensors at
//   max_shard_bytes), so both ways write the same files, byte for byte (checked: same_files 1).
// Each row reports the slowest rank's seconds, the GB written, and the memory the save added above the resident
// model: the peak RSS during the save less the RSS before it (VmHWM reset through /proc/self/clear_refs), on rank
// 0 and on the rank where it was largest.
//
// Models: tiny (TinyK2), and k2_width: Kimi K2's widths (hidden 7168, 64 MLA heads with K2's ranks, experts of
// moe_intermediate 2048, a shared expert) with 2 MoE layers of 4 experts (top-2) and a vocabulary of 8192, so that
// every rank's part fits this machine: 3.05 GB of F32 weights. The layout follows the world: (1,1,1) on one
// process, (2,1,1) on two, (2,2,1) on four, (2,2,2) on eight.
//
// bench-mpi: 2
// bench-smoke-filter: /model:0/
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/checkpoint.hpp>

#include "support/mpi_bench.hpp"

namespace {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::bench::slowest;
namespace fs = std::filesystem;

MpiCommunicator* world_ptr = nullptr;
const char* const model_names[] = {"tiny", "k2_width"};

ModelConfig model_config(int model, index_t ranks) {
    ModelConfig c = TinyK2::config;
    if (model == 1) {
        c = KimiK2::config;
        c.dims.layers = 2;
        c.dims.dense_layers = 0;
        c.dims.vocab = 8192;
        c.moe.experts = 4;
        c.moe.top_k = 2;
    }
    c.parallel.pp = ranks >= 2 ? 2 : 1;
    c.parallel.ep = ranks >= 4 ? 2 : 1;
    c.parallel.dp = ranks >= 8 ? 2 : 1;
    c.parallel.virtual_stages = 1;
    return c;
}

/// kB of the process's resident set now (VmRSS) or at its peak (VmHWM).
long status_kb(const char* field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(field, 0) == 0) return std::stol(line.substr(std::string(field).size() + 1));
    return 0;
}
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// The one-writer way: rank 0 receives each shard's tensors from their owners and writes every file.
void gather_save(const fs::path& dir, nn::Transformer<cpu>& part, ProcessGroups& groups,
                 std::uint64_t max_shard_bytes) {
    Communicator& world = groups.world;
    const bool root = world.rank() == 0;
    const std::vector<ParamRef> mine = parallel::detail::owned_params(part, groups.at);
    nlohmann::json listed = nlohmann::json::array();
    for (const ParamRef& p : mine) listed.push_back({p.name, p.shape});
    const std::vector<std::string> lists = parallel::detail::gather_strings(world, 0, listed.dump());
    if (!root) {
        for (std::size_t i = 0; i < mine.size(); ++i)  // in order: rank 0 receives in the same order
            world.send(std::span<const float>(mine[i].value, std::size_t(mine[i].numel())), 0, int(i));
        world.barrier();
        return;
    }
    struct Entry {
        int rank, index;
        std::string name;
        std::vector<index_t> shape;
        index_t numel;
    };
    std::vector<Entry> all;
    for (std::size_t r = 0; r < lists.size(); ++r) {
        int i = 0;
        for (const auto& e : nlohmann::json::parse(lists[r])) {
            std::vector<index_t> shape = e[1].get<std::vector<index_t>>();
            index_t n = 1;
            for (index_t d : shape) n *= d;
            all.push_back({int(r), i++, e[0].get<std::string>(), shape, n});
        }
    }
    // The files save_checkpoint writes: each owner's tensors cut at max_shard_bytes, numbered in rank order.
    std::vector<std::pair<std::size_t, std::size_t>> shards;
    std::uint64_t current = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
        const std::uint64_t bytes = std::uint64_t(all[i].numel) * 4;
        if (shards.empty() || all[i].rank != all[i - 1].rank || current + bytes > max_shard_bytes)
            shards.push_back({i, i}), current = 0;
        shards.back().second = i + 1;
        current += bytes;
    }
    moonmoe::detail::StagedCheckpoint staged(dir, dir.string());
    nlohmann::json weight_map = nlohmann::json::object();
    std::uint64_t parameters = 0;
    for (std::size_t s = 0; s < shards.size(); ++s) {
        const std::string file =
            shards.size() == 1 ? "model.safetensors" : moonmoe::detail::shard_file_name(s, shards.size());
        std::deque<std::vector<float>> received;
        std::vector<NamedTensor> tensors;
        std::vector<std::unique_ptr<Request>> pending;
        for (std::size_t i = shards[s].first; i < shards[s].second; ++i) {
            const Entry& e = all[i];
            weight_map[e.name] = file;
            parameters += std::uint64_t(e.numel);
            if (e.rank == 0) {
                tensors.push_back(
                    {e.name, e.shape, std::span<const float>(mine[std::size_t(e.index)].value, std::size_t(e.numel))});
                continue;
            }
            std::vector<float>& buffer = received.emplace_back(std::size_t(e.numel));
            pending.push_back(world.irecv(std::span<float>(buffer), e.rank, e.index));
            tensors.push_back({e.name, e.shape, buffer});
        }
        for (auto& r : pending) r->wait();
        moonmoe::detail::tensors_writer(file, tensors, DType::f32).write(staged.path() / file);
    }
    if (shards.size() > 1)
        staged.write_text("model.safetensors.index.json",
                          moonmoe::detail::index_text(weight_map, parameters, DType::f32, dir.string()));
    staged.write_text("config.json",
                      moonmoe::detail::saved_config_text(saved_hf_config(part), DType::f32, dir.string()));
    staged.finish();
    staged.commit();
    world.barrier();
}

/// Whether directories a and b hold the same files with the same bytes (compared 1 MB at a time).
bool same_files(const fs::path& a, const fs::path& b) {
    std::vector<std::string> names_a, names_b;
    for (const auto& e : fs::directory_iterator(a)) names_a.push_back(e.path().filename().string());
    for (const auto& e : fs::directory_iterator(b)) names_b.push_back(e.path().filename().string());
    std::sort(names_a.begin(), names_a.end());
    std::sort(names_b.begin(), names_b.end());
    if (names_a != names_b) return false;
    std::vector<char> x(1 << 20), y(1 << 20);
    for (const std::string& name : names_a) {
        if (fs::file_size(a / name) != fs::file_size(b / name)) return false;
        std::ifstream fa(a / name, std::ios::binary), fb(b / name, std::ios::binary);
        while (fa && fb) {
            fa.read(x.data(), std::streamsize(x.size()));
            fb.read(y.data(), std::streamsize(y.size()));
            if (fa.gcount() != fb.gcount() || std::memcmp(x.data(), y.data(), std::size_t(fa.gcount())) != 0)
                return false;
        }
    }
    return true;
}

struct Run {
    std::unique_ptr<ProcessGroups> groups;
    std::unique_ptr<nn::Transformer<cpu>> part;
};

/// The parts of `model` for this world, initialised once and kept for every row.
Run& run_of(int model) {
    // never destroyed: the communicators must not be freed after MPI_Finalize (mpi_benchmark_main's end)
    static auto& runs = *new std::map<int, Run>;
    auto it = runs.find(model);
    if (it != runs.end()) return it->second;
    MpiCommunicator& w = *world_ptr;
    const ModelConfig c = model_config(model, w.size());
    Run& r = runs[model];
    r.groups = std::make_unique<ProcessGroups>(w, c.parallel);
    r.part = std::make_unique<nn::Transformer<cpu>>(c, model_part(c, r.groups->at));
    nn::init_weights(*r.part, {.seed = 1});
    return r;
}

fs::path scratch(const std::string& name) {
    return fs::path(std::getenv("MOONMOE_BENCH_SCRATCH") ? std::getenv("MOONMOE_BENCH_SCRATCH") : "/tmp") /
           ("moonmoe_checkpoint_save_np" + std::to_string(world_ptr->size())) / name;
}

void checkpoint_save(benchmark::State& state, bool sharded) {
    MpiCommunicator& w = *world_ptr;
    const int model = int(state.range(0));
    Run& run = run_of(model);
    const std::uint64_t shard_bytes = std::uint64_t(state.range(1)) * 1'000'000;
    const std::string name = std::string(model_names[model]) + "_" + std::to_string(state.range(1)) + "MB";
    const fs::path dir = scratch(name + (sharded ? "_sharded" : "_gather"));
    double seconds = 0, added_max = 0, added_root = 0;
    for (auto _ : state) {
        if (w.rank() == 0) fs::remove_all(dir), fs::create_directories(dir.parent_path());
        w.barrier();
        const long before = status_kb("VmRSS:");
        reset_peak();
        const double s = slowest(w, [&] {
            if (sharded) {
                parallel::SaveOptions options;
                options.max_shard_bytes = shard_bytes;
                save_checkpoint(dir, *run.part, *run.groups, options);
            } else {
                gather_save(dir, *run.part, *run.groups, shard_bytes);
            }
        });
        std::vector<double> added = {double(status_kb("VmHWM:") - before) / 1e6};  // GB
        const double mine = added[0];
        w.all_reduce(std::span<double>(added), ReduceOp::max);
        state.SetIterationTime(s);
        seconds += s, added_max = std::max(added_max, added[0]);
        if (w.rank() == 0) added_root = std::max(added_root, mine);
    }
    std::vector<double> resident = {double(status_kb("VmRSS:")) / 1e6};
    w.all_reduce(std::span<double>(resident), ReduceOp::max);
    double bytes = 0;
    if (w.rank() == 0)
        for (const auto& e : fs::directory_iterator(dir)) bytes += double(fs::file_size(e.path()));
    // the two ways' files are the same bytes (checked once both exist)
    const fs::path other = scratch(name + (sharded ? "_gather" : "_sharded"));
    std::vector<double> same = {-1};
    if (w.rank() == 0 && fs::exists(other)) {
        same[0] = same_files(dir, other) ? 1 : 0;
        fs::remove_all(dir), fs::remove_all(other);  // gigabytes: gone once compared
    }
    w.barrier();
    state.SetLabel(std::string(model_names[model]) + " (" + std::to_string(run.groups->layout.pp) + "," +
                   std::to_string(run.groups->layout.ep) + "," + std::to_string(run.groups->layout.dp) + ")");
    state.counters["GB_written"] = bytes / 1e9;
    state.counters["GB_per_s"] = bytes / 1e9 / (seconds / double(state.iterations()));
    state.counters["GB_added_rank0"] = added_root;
    state.counters["GB_added_max_rank"] = added_max;
    state.counters["GB_resident_max_rank"] = resident[0];
    state.counters["same_files"] = same[0];
}

void shapes(benchmark::internal::Benchmark* b) {
    b->ArgNames({"model", "shard_MB"})->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);
    b->Args({0, 5000});  // the default shard size, 5 GB
    b->Args({1, 5000});
    b->Args({1, 1000});
}
BENCHMARK_CAPTURE(checkpoint_save, sharded, true)->Apply(shapes);
BENCHMARK_CAPTURE(checkpoint_save, gather, false)->Apply(shapes);

}  // namespace

int main(int argc, char** argv) {
    return moonmoe::bench::mpi_benchmark_main(argc, argv, [](MpiCommunicator& world) {
        world_ptr = &world;
        return "saving one checkpoint from " + std::to_string(world.size()) +
               " ranks: sharded (every owner writes its shards) against gather (rank 0 writes them all); F32; "
               "GB_added: the save's peak RSS above the resident model";
    });
}
