// One Hugging Face checkpoint from a parallel run, and parts loaded from any checkpoint (parallel/checkpoint.hpp).
//
// For every layout the world size allows (1 rank: (1,1,1); 2: (2,1,1), (1,2,1), (1,1,2); 3: (3,1,1), (1,1,3);
// 4: (2,2,1), (1,2,2), (2,1,2), (4,1,1); 8: (2,2,2), (1,4,2), (2,4,1) V=2), on the tiny Kimi K2 and DeepSeek-V3
// models: the parts (loaded from the committed transformers checkpoint where the layout keeps its layer count, so
// config.json's bos / eos ids must survive; seeded otherwise) train two ZeRO-1 MuonClip steps through the pipeline
// beside one process stepping the whole model on the same micro-batches, and parallel::save_checkpoint writes the
// run. Checked: the directory holds config.json, the index and model-0000i-of-0000N.safetensors and nothing else
// (no temporary directory beside it); the index lists every tensor of the whole model once; every rank loads the
// checkpoint whole (load_transformer) and finds its part's tensors in it bit for bit; its logits are the one
// process's (bitwise where test/mpi/model.cpp finds the run bitwise, otherwise within 1e-5 of the largest logit);
// every rank loads its part back (parallel::load_checkpoint) opening only the shards that hold its tensors, and
// from a copy of the directory that lacks every other shard; every layout of the world loads every other layout's
// checkpoint (same model sizes) and equals the whole model loaded from it.
//
// test/data/saved_parallel: the seeded TinyK2 (no training) saved by the (2,2,2) run, and transformers' logits on
// it (tools/make_saved_reference.py --data test/data/saved_parallel). On 8 ranks the run saves it again, byte for
// byte, and the checkpoint's logits are compared with transformers' (1e-5). To regenerate:
//     MOONMOE_SAVE_PARALLEL_TO=test/data/saved_parallel mpirun -np 8 build/test/moonmoe_mpi_tests
//     -tc='*saved_parallel*' python tools/make_saved_reference.py --data test/data/saved_parallel
// With MOONMOE_TRAINED_CHECKPOINTS_TO=<dir>, the trained TinyK2 of the (2,2,2) layout is saved there too
// (parallel_2_2_2) with the one process's model (one_process), for make_saved_reference.py --compare.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/checkpoint.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/zero.hpp>

#include "mpi_support.hpp"
#include "support/reference.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace mpi_checkpoint {

using namespace moonmoe;
using namespace moonmoe::parallel;
using moonmoe::testing::random_ids;
using moonmoe::testing::scaled_error;
using moonmoe::testing::world;
namespace fs = std::filesystem;

namespace {

using Clipped = moonmoe::Optimizer<Muon<>, QKClip<0.001>>;

struct Layout {
    index_t pp, ep, dp, v;
};

std::vector<Layout> layouts_for(int world_size) {
    switch (world_size) {
    case 1: return {{1, 1, 1, 1}};
    case 2: return {{2, 1, 1, 1}, {1, 2, 1, 1}, {1, 1, 2, 1}};
    case 3: return {{3, 1, 1, 1}, {1, 1, 3, 1}};
    case 4: return {{2, 2, 1, 1}, {1, 2, 2, 1}, {2, 1, 2, 1}, {4, 1, 1, 1}};
    case 8: return {{2, 2, 2, 1}, {1, 4, 2, 1}, {2, 4, 1, 2}};
    default: return {};
    }
}

std::string name_of(const Layout& l) {
    return std::to_string(l.pp) + "_" + std::to_string(l.ep) + "_" + std::to_string(l.dp) + "_v" + std::to_string(l.v);
}

ModelConfig configure(ModelConfig c, const Layout& l) {
    c.parallel.pp = l.pp, c.parallel.ep = l.ep, c.parallel.dp = l.dp, c.parallel.virtual_stages = l.v;
    c.parallel.micro_batches = std::max<index_t>(2, l.pp);
    c.dims.layers = std::max(c.dims.layers, l.pp * l.v);
    return c;
}

/// A directory all ranks share, empty: made by rank 0 (per world size, so that the mpi.npN runs do not meet).
fs::path shared_scratch(const std::string& name) {
    const fs::path dir =
        fs::path(MOONMOE_TEST_BINARY_DIR) / "mpi_scratch" / ("np" + std::to_string(world().size())) / name;
    if (world().rank() == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    world().barrier();
    return dir;
}

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<std::string> entries(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<index_t> batch_of(index_t vocab, index_t replica, index_t micro_batch, int step) {
    return random_ids(vocab,
                      9100 + std::uint64_t(replica) * 131 + std::uint64_t(micro_batch) * 17 + std::uint64_t(step));
}

Tensor<float, 2, cpu> logits_of(nn::Transformer<cpu>& model, const std::vector<index_t>& ids, index_t sequences) {
    nn::Transformer<cpu>::Cache cache;
    const index_t length = index_t(ids.size()) / sequences;
    return model.forward(ids.data(), nn::TokenLayout::sequences(sequences, length), cache);
}

/// The whole model in one process, stepped on every replica's micro-batches (test/mpi/model.cpp's reference).
void reference_step(nn::Transformer<cpu>& model, optim::Optimizer<Clipped, cpu>& opt,
                    const std::vector<std::vector<std::vector<index_t>>>& batches, const nn::TokenLayout& layout) {
    std::map<std::string, std::vector<float>> grad;
    for (std::size_t q = 0; q < batches.size(); ++q) {
        model.zero_grad();
        const float scale = 1.0f / float(batches[q].size());
        for (const std::vector<index_t>& ids : batches[q]) {
            nn::Transformer<cpu>::Cache cache;
            Tensor<float, 2, cpu> logits = model.forward(ids.data(), layout, cache, nn::Pass::training);
            Tensor<float, 2, cpu> dlogits(logits.shape());
            const std::vector<index_t> targets = nn::causal_targets(ids.data(), layout);
            nn::cross_entropy<cpu>(logits.view(), targets.data(), dlogits.view());
            for (index_t i = 0; i < dlogits.numel(); ++i) dlogits.data()[i] *= scale;
            model.backward(dlogits.view(), cache);
        }
        model.visit_params([&](const ParamRef& p) {
            if (!p.grad) return;
            auto& g = grad[p.name];
            if (q == 0) g.assign(p.grad, p.grad + p.numel());
            else
                for (index_t i = 0; i < p.numel(); ++i) g[std::size_t(i)] += p.grad[i];
        });
    }
    const float mean = 1.0f / float(batches.size());
    model.visit_params([&](const ParamRef& p) {
        if (!p.grad) return;
        auto& g = grad[p.name];
        for (index_t i = 0; i < p.numel(); ++i) p.grad[i] = g[std::size_t(i)] * mean;
    });
    opt.step();
}

/// Every tensor of `part` equal, bit for bit, to the one of the same name in `whole`.
void check_part_in(nn::Transformer<cpu>& part, nn::Transformer<cpu>& whole) {
    std::map<std::string, ParamRef> want;
    whole.visit_params([&](const ParamRef& p) { want.emplace(p.name, p); });
    part.visit_params([&](const ParamRef& p) {
        INFO(p.name);
        const auto it = want.find(p.name);
        REQUIRE(it != want.end());
        CHECK(it->second.shape == p.shape);
        CHECK(std::memcmp(it->second.value, p.value, std::size_t(p.numel()) * sizeof(float)) == 0);
    });
}

/// The shard files of `dir`'s index that hold a tensor of `part`.
std::set<std::string> shards_of(nn::Transformer<cpu>& part, const fs::path& dir) {
    if (!fs::exists(dir / "model.safetensors.index.json")) return {"model.safetensors"};
    const WeightMap map = parse_safetensors_index(read_file(dir / "model.safetensors.index.json"), "index");
    std::set<std::string> out;
    part.visit_params([&](const ParamRef& p) { out.insert(map.at(p.name)); });
    return out;
}

/// What `f` throws as io_error ("" if nothing).
template <class F>
std::string message_of(F&& f) {
    try {
        f();
    } catch (const io_error& e) {
        return e.what();
    }
    return {};
}

struct Saved {
    std::string model;
    Layout layout;
    ModelConfig config;
    fs::path dir;
};

/// Trains the layout's parts two steps beside one process, saves the run, and checks the checkpoint (the top of
/// this file). Returns where it is.
Saved train_and_save(const std::string& model_name, const ModelConfig& base, const fs::path& hf_source, const Layout& l,
                     const fs::path& root) {
    Communicator& w = world();
    const ModelConfig c = configure(base, l);
    const bool loaded = c.dims.layers == base.dims.layers;  // this layout keeps the checkpoint's sizes
    const bool bitwise = l.ep == 1 && l.ep * l.dp <= 2;
    INFO(model_name << " Parallel<" << l.pp << ", " << l.ep << ", " << l.dp << "> V=" << l.v << ", rank " << w.rank()
                    << (loaded ? " (loaded)" : " (seeded)"));
    ProcessGroups g(w, c.parallel);
    nn::Transformer<cpu> part(c, model_part(c, g.at), expert_dispatcher<cpu>(g));
    nn::Transformer<cpu> ref(c);
    if (loaded) {
        parallel::load_checkpoint(hf_source, part);
        Checkpoint ck(hf_source);
        load_weights(ref, ck);
    } else {
        nn::init_weights(part, {.seed = 11});
        nn::init_weights(ref, {.seed = 11});
    }
    const index_t M = c.parallel.micro_batches;
    Pipeline<cpu> pipeline(part, g, M);
    DistributedOptimizer<Clipped, cpu> opt(part, g);
    optim::Optimizer<Clipped, cpu> ref_opt(ref);
    const auto layout = nn::TokenLayout::sequences(2, 8);
    for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<std::vector<index_t>>> batches(std::size_t(g.replicas()));
        for (index_t q = 0; q < g.replicas(); ++q)
            for (index_t m = 0; m < M; ++m) batches[std::size_t(q)].push_back(batch_of(c.dims.vocab, q, m, step));
        pipeline.run(batches[std::size_t(g.replica())], layout);
        opt.step();
        reference_step(ref, ref_opt, batches, layout);
    }

    const fs::path dir = root / (model_name + "_" + name_of(l));
    parallel::save_checkpoint(dir, part, g);
    if (const char* to = std::getenv("MOONMOE_TRAINED_CHECKPOINTS_TO");
        to && model_name == "TinyK2" && l.pp == 2 && l.ep == 2 && l.dp == 2) {  // for make_saved_reference.py --compare
        parallel::save_checkpoint(fs::path(to) / "parallel_2_2_2", part, g);
        if (w.rank() == 0) save_transformer(fs::path(to) / "one_process", ref);
    }

    // The directory: config.json, the index, the shards numbered 1..N (or model.safetensors alone where one rank
    // writes every tensor and they fit one shard); nothing left beside it.
    const std::vector<std::string> files = entries(dir);
    const bool single = files == std::vector<std::string>{"config.json", "model.safetensors"};
    const index_t shards = single ? 1 : index_t(files.size()) - 2;
    if (!single) {
        std::vector<std::string> expected = {"config.json"};
        for (index_t s = 0; s < shards; ++s)
            expected.push_back(moonmoe::detail::shard_file_name(std::size_t(s), std::size_t(shards)));
        expected.push_back("model.safetensors.index.json");
        CHECK(files == expected);
    }
    for (const std::string& f : entries(root)) CHECK_FALSE(f.starts_with("."));  // no temporary directory left

    // The index: every tensor of the whole model, once; the shards hold exactly what it lists (Checkpoint checks).
    {
        Checkpoint ck(dir);
        std::vector<std::string> names;
        ref.visit_params([&](const ParamRef& p) { names.push_back(p.name); });
        std::sort(names.begin(), names.end());
        CHECK(std::adjacent_find(names.begin(), names.end()) == names.end());
        CHECK(ck.names() == names);
        CHECK(ck.files().size() == std::size_t(shards));
        if (!single) {
            const auto index = nlohmann::json::parse(read_file(dir / "model.safetensors.index.json"));
            std::uint64_t parameters = 0;
            ref.visit_params([&](const ParamRef& p) { parameters += std::uint64_t(p.numel()); });
            CHECK(index["weight_map"].size() == names.size());
            CHECK(index["metadata"]["total_parameters"].get<std::uint64_t>() == parameters);
            CHECK(index["metadata"]["total_size"].get<std::uint64_t>() == 4 * parameters);
        }
    }

    // config.json: the loaded file's (bos / eos ids and all), or the configuration's.
    {
        auto saved = nlohmann::json::parse(read_file(dir / "config.json"));
        if (loaded) {
            auto original = nlohmann::json::parse(read_file(hf_source / "config.json"));
            CHECK(saved["dtype"] == "float32");
            CHECK(saved["bos_token_id"] == original["bos_token_id"]);
            CHECK(saved["eos_token_id"] == original["eos_token_id"]);
            CHECK(saved == original);
        } else {
            CHECK(saved == hf_config_json(c));
        }
    }

    // Loaded whole: this rank's tensors bit for bit, and the one process's logits.
    nn::Transformer<cpu> whole = load_transformer<AnyDeepSeekV3>(dir);
    check_part_in(part, whole);
    const std::vector<index_t> ids = batch_of(c.dims.vocab, 99, 0, 0);
    const Tensor<float, 2, cpu> got = logits_of(whole, ids, 2), want = logits_of(ref, ids, 2);
    const double error = scaled_error(got.data(), want.data(), got.numel());
    if (bitwise) CHECK(error == 0.0);
    else
        CHECK(error <= 1e-5);
    if (w.rank() == 0)
        MESSAGE(model_name << " Parallel<" << l.pp << ", " << l.ep << ", " << l.dp << "> V=" << l.v << ": " << shards
                           << " shards; logits of the saved checkpoint against one process: " << error);

    // This rank's part loaded back: the shards holding its tensors and no other, and from a copy holding only those.
    {
        nn::Transformer<cpu> again(c, model_part(c, g.at));
        Checkpoint ck(dir, Checkpoint::Shards::as_needed);
        CHECK(ck.files().size() == (single ? 1u : 0u));  // a single model.safetensors is opened at once
        load_weights(again, ck);
        check_part_in(again, part);
        const std::set<std::string> needed = shards_of(part, dir);
        std::set<std::string> opened;
        for (const std::string& f : ck.files()) opened.insert(fs::path(f).filename().string());
        CHECK(opened == needed);

        const fs::path mine = root.parent_path() / (root.filename().string() + "_rank" + std::to_string(w.rank()));
        fs::remove_all(mine);
        fs::create_directories(mine);
        for (const std::string& f : {std::string("config.json"), std::string("model.safetensors.index.json")})
            if (fs::exists(dir / f)) fs::copy_file(dir / f, mine / f);
        for (const std::string& f : needed) fs::copy_file(dir / f, mine / f);
        nn::Transformer<cpu> from_copy(c, model_part(c, g.at));
        parallel::load_checkpoint(mine, from_copy);
        check_part_in(from_copy, part);
        if (needed.size() < std::size_t(shards))
            CHECK_THROWS_WITH_AS(Checkpoint{mine}, doctest::Contains("is missing"), io_error);
        fs::remove_all(mine);
    }
    w.barrier();  // every rank done with the directory before the next layout's save beside it
    return {model_name, l, c, dir};
}

}  // namespace

TEST_CASE("A parallel run saves one checkpoint of the whole model, and every layout loads every layout's") {
    const std::vector<Layout> layouts = layouts_for(world().size());
    if (layouts.empty()) {
        MESSAGE("no layout listed for " << world().size() << " ranks");
        return;
    }
    const fs::path root = shared_scratch("parallel_checkpoints");
    const fs::path data = fs::path(MOONMOE_TEST_SOURCE_DIR) / "data";
    std::vector<Saved> saved;
    for (const Layout& l : layouts) {
        saved.push_back(train_and_save("TinyK2", TinyK2::config, data / "tiny_k2", l, root));
        saved.push_back(train_and_save("TinyV3", TinyV3::config, data / "tiny_v3", l, root));
    }
    // Into any layout: each layout's parts from each checkpoint of the same sizes, against the whole loaded from it.
    for (const Saved& from : saved)
        for (const Layout& l : layouts) {
            const ModelConfig c = configure(from.model == "TinyK2" ? TinyK2::config : TinyV3::config, l);
            if (c.dims.layers != from.config.dims.layers) continue;
            INFO(from.dir.string() << " into Parallel<" << l.pp << ", " << l.ep << ", " << l.dp << "> V=" << l.v);
            ProcessGroups g(world(), c.parallel);
            nn::Transformer<cpu> part(c, model_part(c, g.at));
            parallel::load_checkpoint(from.dir, part);
            nn::Transformer<cpu> whole = load_transformer<AnyDeepSeekV3>(from.dir);
            check_part_in(part, whole);
        }
}

TEST_CASE(
    "saved_parallel: the (2,2,2) run saves the committed checkpoint byte for byte; transformers reads it as we do") {
    if (world().size() != 8) return;
    Communicator& w = world();
    const Layout l{2, 2, 2, 1};
    const ModelConfig c = configure(TinyK2::config, l);
    ProcessGroups g(w, c.parallel);
    nn::Transformer<cpu> part(c, model_part(c, g.at));
    nn::init_weights(part, {.seed = 7});  // saved_tiny's seed: the same weights as test/data/saved_tiny
    const parallel::SaveOptions options{{.max_shard_bytes = 200'000}, std::chrono::minutes(5)};
    if (const char* to = std::getenv("MOONMOE_SAVE_PARALLEL_TO"))
        parallel::save_checkpoint(fs::path(to) / "checkpoint", part, g, options);
    const fs::path dir = shared_scratch("saved_parallel") / "checkpoint";
    parallel::save_checkpoint(dir, part, g, options);
    const fs::path committed = fs::path(MOONMOE_TEST_SOURCE_DIR) / "data" / "saved_parallel";
    const std::vector<std::string> files = entries(dir);
    CHECK(entries(committed / "checkpoint") == files);
    for (const std::string& f : files) {
        INFO(f);
        CHECK(read_file(dir / f) == read_file(committed / "checkpoint" / f));
    }
    if (w.rank() != 0) return;
    nn::Transformer<cpu> model = load_transformer<TinyK2>(committed / "checkpoint");
    nn::Transformer<cpu> one(TinyK2::config);
    nn::init_weights(one, {.seed = 7});
    check_part_in(one, model);  // the one process's weights
    const moonmoe::testing::Reference ref((committed / "reference.safetensors").string());
    const std::vector<index_t> ids = ref.i64("input_ids"), shape = ref.shape("input_ids");
    nn::Transformer<cpu>::Cache cache;
    const Tensor<float, 2, cpu> logits =
        model.forward(ids.data(), nn::TokenLayout::sequences(shape[0], shape[1]), cache);
    const std::vector<float> want = ref.f32("logits");
    const double error = scaled_error(logits.data(), want.data(), logits.numel());
    MESSAGE("saved_parallel: logits against transformers " << error);
    CHECK(error < 1e-5);
}

TEST_CASE("A failure on one rank fails the save on every rank and leaves the directory as it was") {
    Communicator& w = world();
    const Layout l =
        layouts_for(w.size()).empty() ? Layout{1, 1, std::max<index_t>(1, w.size()), 1} : layouts_for(w.size()).front();
    const ModelConfig c = configure(TinyK2::config, l);
    ProcessGroups g(w, c.parallel);
    nn::Transformer<cpu> part(c, model_part(c, g.at));
    nn::init_weights(part, {.seed = 3});
    const fs::path root = shared_scratch("failed_save");
    const fs::path dir = root / "checkpoint";
    parallel::save_checkpoint(dir, part, g);
    const std::string before = read_file(dir / "config.json");
    w.barrier();

    // A foreign file in the directory: rank 0 refuses to replace it; every rank hears why.
    if (w.rank() == 0) std::ofstream(dir / "notes.txt") << "mine";
    w.barrier();
    std::string message = message_of([&] { parallel::save_checkpoint(dir, part, g); });
    CHECK(message.find("cannot save the parallel checkpoint; nothing changed: rank 0 (pp 0, ep 0, dp 0)") !=
          std::string::npos);
    CHECK(message.find("notes.txt") != std::string::npos);
    w.barrier();
    if (w.rank() == 0) fs::remove(dir / "notes.txt");
    w.barrier();

    // The last rank asks for a type no checkpoint holds: every rank fails, naming it, and nothing changes.
    const int last = w.size() - 1;
    parallel::SaveOptions options;
    if (w.rank() == last) options.store = DType::i32;
    message = message_of([&] { parallel::save_checkpoint(dir, part, g, options); });
    CHECK(message.find(moonmoe::parallel::detail::describe_rank(g.layout, last) + ": cannot store tensors as I32") !=
          std::string::npos);
    w.barrier();
    CHECK(read_file(dir / "config.json") == before);
    CHECK(entries(root) == std::vector<std::string>{"checkpoint"});  // no temporary directory left

    // A NaN in a weight the last rank writes (issue 29: non-finite weights reached saved checkpoints): every rank
    // refuses, naming the tensor, and nothing changes.
    bool writes = false;  // the NaN goes into the last rank that writes tensors (at DP > 1 the last ranks write none)
    part.visit_params([&](const ParamRef& p) { writes = writes || writes_tensor(g.at, p.name); });
    std::vector<index_t> writer = {writes ? index_t(w.rank()) : index_t(-1)};
    w.all_reduce(std::span<index_t>(writer), ReduceOp::max);
    std::string bad_name;
    part.visit_params([&](const ParamRef& p) {
        if (bad_name.empty() && writes_tensor(g.at, p.name) && w.rank() == int(writer[0]))
            bad_name = p.name, p.value[0] = NAN;
    });
    message = message_of([&] { parallel::save_checkpoint(dir, part, g); });
    CHECK(message.find("cannot save the parallel checkpoint; nothing changed") != std::string::npos);
    CHECK(message.find("holds NaN at element 0") != std::string::npos);
    CHECK(message.find("allow_non_finite") != std::string::npos);
    w.barrier();
    CHECK(read_file(dir / "config.json") == before);
    CHECK(entries(root) == std::vector<std::string>{"checkpoint"});
}

}  // namespace mpi_checkpoint
