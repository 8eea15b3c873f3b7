// parallel::save_checkpoint and load_checkpoint in a world of one process (test/support/self_world.hpp): the save
// writes what save_transformer writes, byte for byte; a part loads from the shards holding its tensors alone.
// test/mpi/checkpoint.cpp runs both over MPI in every layout of 1-4 and 8 ranks.
#include <doctest/doctest.h>

#include <set>

#include <moonmoe/moonmoe.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/checkpoint.hpp>

#include "support/io_testing.hpp"
#include "support/self_world.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_parallel_checkpoint {

using namespace moonmoe;
using io_testing::read_file;
using io_testing::scratch_dir;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> entries(const fs::path& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
}

void check_same_files(const fs::path& a, const fs::path& b) {
    REQUIRE(entries(a) == entries(b));
    for (const std::string& f : entries(a)) {
        CAPTURE(f);
        CHECK(read_file(a / f) == read_file(b / f));
    }
}

}  // namespace

TEST_CASE("parallel::save_checkpoint in a world of one writes save_transformer's checkpoint byte for byte") {
    const fs::path root = scratch_dir("parallel_save_self");
    testing::SelfWorld world;
    {
        nn::Transformer<> model(TinyK2::config);
        nn::init_weights(model, {.seed = 7});
        parallel::ProcessGroups groups(world, model.config.parallel);
        save_transformer(root / "one", model, {.max_shard_bytes = 200'000});
        parallel::SaveOptions options;
        options.max_shard_bytes = 200'000;
        parallel::save_checkpoint(root / "parallel", model, groups, options);
        CHECK(entries(root / "parallel").size() == 5);  // three shards, the index, config.json
        check_same_files(root / "one", root / "parallel");
        // the committed checkpoint of the same model, saved by one process
        check_same_files(io_testing::test_data("saved_tiny/checkpoint"), root / "parallel");
    }
    {
        auto model = load_transformer(io_testing::test_data("tiny_v3"));  // config.json kept, bos / eos ids and all
        parallel::ProcessGroups groups(world, model.config.parallel);
        save_transformer(root / "v3_one", model, {.store = DType::bf16});
        parallel::SaveOptions options;
        options.store = DType::bf16;
        parallel::save_checkpoint(root / "v3_parallel", model, groups, options);
        CHECK(entries(root / "v3_parallel") == std::vector<std::string>{"config.json", "model.safetensors"});
        check_same_files(root / "v3_one", root / "v3_parallel");
        // over an existing checkpoint, keeping its tokenizer: replaced as a whole, as save_transformer replaces
        io_testing::write_file(root / "v3_parallel" / "tokenizer.json", "{}");
        parallel::save_checkpoint(root / "v3_parallel", model, groups);
        CHECK(entries(root / "v3_parallel") ==
              std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"});
        CHECK(entries(root) == std::vector<std::string>{"one", "parallel", "v3_one", "v3_parallel"});
    }
}

TEST_CASE(
    "parallel::load_checkpoint reads a part from the shards that hold it, a missing other shard does not matter") {
    const fs::path root = scratch_dir("parallel_load_part");
    nn::Transformer<> whole(TinyV3::config);
    nn::init_weights(whole, {.seed = 21});
    save_transformer(root / "ck", whole, {.max_shard_bytes = 60'000});
    nn::ModelPart p;
    p.layers = {3};
    p.embedding = false;
    p.first_expert = 8, p.expert_count = 8;
    nn::Transformer<> part(TinyV3::config, p);
    const WeightMap map = parse_safetensors_index(read_file(root / "ck" / "model.safetensors.index.json"), "index");
    std::set<std::string> needed, all;
    for (const auto& [name, file] : map) all.insert(file);
    part.visit_params([&](const ParamRef& q) { needed.insert(map.at(q.name)); });
    REQUIRE(needed.size() < all.size());
    for (const std::string& f : all)
        if (!needed.count(f)) fs::remove(root / "ck" / f);
    parallel::load_checkpoint(root / "ck", part);
    std::map<std::string, std::vector<float>> want;
    whole.visit_params([&](const ParamRef& q) { want[q.name].assign(q.value, q.value + q.numel()); });
    part.visit_params([&](const ParamRef& q) {
        CAPTURE(q.name);
        CHECK(std::equal(q.value, q.value + q.numel(), want.at(q.name).begin()));
    });
    CHECK_FALSE(part.hf_config_json.empty());  // kept for the save
    CHECK_THROWS_WITH_AS(load_transformer(root / "ck"), doctest::Contains("is missing"), io_error);
}

}  // namespace unit_parallel_checkpoint
