// The io layer against hostile or broken file systems: symlinks planted at temporary names, writes that fail
// midway, directories that are not checkpoints, and FIFOs, sockets, devices or directories where a file belongs.
// Everything is built in the binary dir from a copy of test/data/tiny_k2.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <moonmoe/config.hpp>
#include <moonmoe/io/checkpoint.hpp>

#include "support/io_testing.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_io_files {

using namespace moonmoe;
using namespace io_testing;

namespace {

/// Every entry of `dir` (not recursive): a file's bytes, "<dir>", "<link to T>" or "<other>".
std::map<std::string, std::string> snapshot(const fs::path& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) {
        const std::string name = e.path().filename().string();
        if (e.is_symlink()) out[name] = "<link to " + fs::read_symlink(e.path()).string() + ">";
        else if (e.is_directory())
            out[name] = "<dir>";
        else if (e.is_regular_file())
            out[name] = read_file(e.path());
        else
            out[name] = "<other>";
    }
    return out;
}

std::set<std::string> entries(const fs::path& dir) {
    std::set<std::string> out;
    for (const auto& [name, content] : snapshot(dir)) out.insert(name);
    return out;
}

/// A writable copy of test/data/tiny_k2 at `dir`.
void copy_tiny_k2(const fs::path& dir) {
    fs::create_directories(dir);
    for (const char* file : {"config.json", "model.safetensors"}) {
        fs::copy_file(test_data("tiny_k2") / file, dir / file, fs::copy_options::overwrite_existing);
        fs::permissions(dir / file, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
    }
}

/// tiny_k2's tensors as f32, to write back.
struct TinyTensors {
    Checkpoint source{test_data("tiny_k2")};
    std::vector<std::vector<float>> values;
    std::vector<NamedTensor> tensors;
    TinyTensors() {
        const auto names = source.names();
        values.reserve(names.size());
        for (const std::string& name : names) {
            const auto& shape = source.record(name).shape;
            values.push_back(source.read_f32(name, shape));
            tensors.push_back({name, shape, values.back()});
        }
    }
};

/// The process umask (set back at once; the tests are single-threaded).
mode_t current_umask() {
    const mode_t m = ::umask(022);
    ::umask(m);
    return m;
}

/// Limits the size of files this process may write (writes past it fail with EFBIG) while it lives.
class FileSizeLimit {
public:
    explicit FileSizeLimit(rlim_t bytes) {
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_) == 0);
        old_handler_ = std::signal(SIGXFSZ, SIG_IGN);  // the default action ends the process
        rlimit limited = old_;
        limited.rlim_cur = bytes;
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
    }
    FileSizeLimit(const FileSizeLimit&) = delete;
    FileSizeLimit& operator=(const FileSizeLimit&) = delete;
    ~FileSizeLimit() {
        ::setrlimit(RLIMIT_FSIZE, &old_);
        std::signal(SIGXFSZ, old_handler_);
    }

private:
    rlimit old_{};
    void (*old_handler_)(int) = nullptr;
};

/// The error `f` throws, failing the check (instead of hanging) if it has not returned within 20 s. A call that
/// blocks in open() on the FIFO `fifo` is released by opening the FIFO for writing, so the test can end.
template <class F>
std::string error_without_blocking(F f, const fs::path& fifo) {
    auto result = std::async(std::launch::async, [f] { return error_of(f); });
    if (result.wait_for(std::chrono::seconds(20)) == std::future_status::ready) return result.get();
    FAIL_CHECK("blocked opening the FIFO " << fifo.string());
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // wakes the reader's open()
    if (writer >= 0) ::close(writer);  // and its read() then sees the end of the file
    return result.get();
}

void check_message(const std::string& message, std::initializer_list<std::string_view> parts) {
    CAPTURE(message);
    for (std::string_view part : parts) {
        CAPTURE(part);
        CHECK(message.find(part) != std::string::npos);
    }
}

/// A Unix socket bound at `path`, closed (the socket file stays) when this returns. Bound by its name in the
/// working directory of the moment, since a socket address holds at most 107 bytes of path.
void make_socket(const fs::path& path) {
    const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(s >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string name = path.filename().string();
    REQUIRE(name.size() < sizeof(addr.sun_path));
    std::copy(name.begin(), name.end(), addr.sun_path);
    const fs::path cwd = fs::current_path();
    fs::current_path(path.parent_path());
    const int bound = ::bind(s, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    fs::current_path(cwd);
    ::close(s);
    REQUIRE(bound == 0);
}

}  // namespace

TEST_CASE("io files: writing never follows a symlink planted at a temporary's name") {
    const auto dir = scratch_dir("files_symlink");
    const std::string pid = std::to_string(::getpid());
    write_file(dir / "victim", "precious");
    // The writer used to open the predictable "<target>.tmp.<pid>" with O_CREAT | O_TRUNC.
    for (const char* target : {"x.safetensors", "config.json"})
        fs::create_symlink(dir / "victim", dir / (std::string(target) + ".tmp." + pid));
    const std::vector<float> values{1.0f, 2.0f};
    const NamedTensor tensors[] = {{"w", {2}, values}};
    write_tensors(dir / "x.safetensors", tensors);
    const std::string config = "{}\n";
    const std::span<const std::byte> chunk = std::as_bytes(std::span(config.data(), config.size()));
    detail::write_file_atomically(dir / "config.json", std::span(&chunk, 1));

    CHECK(read_file(dir / "victim") == "precious");
    CHECK(!fs::is_symlink(dir / "x.safetensors"));
    CHECK(SafetensorsFile(dir / "x.safetensors").at("w").shape == std::vector<index_t>{2});
    CHECK(read_file(dir / "config.json") == config);
    CHECK(entries(dir) == std::set<std::string>{"victim", "x.safetensors", "config.json",  // no temporaries left
                                                "x.safetensors.tmp." + pid, "config.json.tmp." + pid});
    // Mode 0644 less the umask, as open() gives.
    struct stat st{};
    REQUIRE(::stat((dir / "x.safetensors").c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == (0644 & ~current_umask()));
}

TEST_CASE("io files: a write that fails removes its temporary and keeps the old file") {
    const auto dir = scratch_dir("files_failed_write");
    const std::vector<float> big(64 * 1024, 0.5f), small{1.0f};
    const NamedTensor old_tensors[] = {{"w", {1}, small}};
    write_tensors(dir / "x.safetensors", old_tensors);
    const std::string old_bytes = read_file(dir / "x.safetensors");
    const NamedTensor new_tensors[] = {{"w", {64 * 1024}, big}};
    {
        const FileSizeLimit limit(16 * 1024);  // the write fails with EFBIG
        check_error([&] { write_tensors(dir / "x.safetensors", new_tensors); },
                    {(dir / "x.safetensors").string(), "cannot write"});
    }
    CHECK(read_file(dir / "x.safetensors") == old_bytes);
    CHECK(entries(dir) == std::set<std::string>{"x.safetensors"});

    // The rename fails: the target is a directory that is not empty.
    fs::create_directories(dir / "d.safetensors" / "inside");
    check_error([&] { write_tensors(dir / "d.safetensors", new_tensors); },
                {(dir / "d.safetensors").string(), "cannot rename the temporary"});
    CHECK(entries(dir) == std::set<std::string>{"x.safetensors", "d.safetensors"});
    check_error([&] { write_tensors(dir / "missing" / "x.safetensors", new_tensors); },
                {(dir / "missing").string(), "cannot create it in the directory"});
}

TEST_CASE("io files: write_checkpoint replaces a checkpoint as a whole, keeping tokenizer files") {
    const TinyTensors tiny;
    const auto parent = scratch_dir("files_replace");
    const auto dir = parent / "ckpt";
    copy_tiny_k2(dir);
    // An older, sharded save: its index and shards must not survive next to the new model.safetensors.
    write_file(dir / "model.safetensors.index.json", R"({"weight_map": {}})");
    write_file(dir / "model-00001-of-00002.safetensors", "old shard");
    write_file(dir / "tokenizer_config.json", R"({"model_max_length": 128})");
    write_file(dir / "tiktoken.model", "tokens");

    write_checkpoint(dir, tiny.source.config(), tiny.tensors, DType::bf16);
    CHECK(entries(dir) ==
          std::set<std::string>{"config.json", "model.safetensors", "tokenizer_config.json", "tiktoken.model"});
    CHECK(read_file(dir / "tokenizer_config.json") == R"({"model_max_length": 128})");
    CHECK(read_file(dir / "tiktoken.model") == "tokens");
    CHECK(entries(parent) == std::set<std::string>{"ckpt"});  // no temporary or old tree left
    Checkpoint written(dir);
    CHECK(written.config().torch_dtype == "bfloat16");
    CHECK(written.names() == tiny.source.names());
    struct stat st{};
    REQUIRE(::stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == (0777 & ~current_umask()));

    // Into a directory that does not exist yet (parents created), an empty one, and through a symlink.
    write_checkpoint(parent / "a" / "b", tiny.source.config(), tiny.tensors);
    CHECK(entries(parent / "a" / "b") == std::set<std::string>{"config.json", "model.safetensors"});
    fs::create_directory(parent / "empty");
    write_checkpoint(parent / "empty" / "", tiny.source.config(), tiny.tensors);  // a trailing separator too
    CHECK(entries(parent / "empty") == std::set<std::string>{"config.json", "model.safetensors"});
    fs::create_directory_symlink("ckpt", parent / "latest");
    write_checkpoint(parent / "latest", tiny.source.config(), tiny.tensors);
    CHECK(fs::is_symlink(parent / "latest"));
    CHECK(Checkpoint(parent / "latest").config().torch_dtype == "float32");
    CHECK(Checkpoint(dir).config().torch_dtype == "float32");
    CHECK(entries(parent) == std::set<std::string>{"ckpt", "a", "empty", "latest"});
}

TEST_CASE("io files: a write_checkpoint that fails leaves the old checkpoint byte for byte") {
    const TinyTensors tiny;
    const auto parent = scratch_dir("files_replace_failed");
    const auto dir = parent / "ckpt";
    copy_tiny_k2(dir);
    write_file(dir / "generation_config.json", "{}");
    const auto before = snapshot(dir);
    const auto unchanged = [&] {
        CHECK(snapshot(dir) == before);
        CHECK(entries(parent) == std::set<std::string>{"ckpt"});
    };

    SUBCASE("a tensor fails validation midway") {
        std::vector<NamedTensor> tensors = tiny.tensors;
        tensors[tensors.size() / 2].shape = {-1, 4};
        check_error([&] { write_checkpoint(dir, tiny.source.config(), tensors); },
                    {(dir / "model.safetensors").string(), "negative size"});
        unchanged();
        tensors[tensors.size() / 2] = tiny.tensors[tensors.size() / 2];
        tensors.back().shape.push_back(2);
        check_error([&] { write_checkpoint(dir, tiny.source.config(), tensors); }, {"needs", "bytes, got"});
        unchanged();
    }
    SUBCASE("the config cannot be serialised after the weights were") {
        HFConfig config = tiny.source.config();
        config.json["note"] = std::string("\xff\xfe");  // not UTF-8: json::dump throws
        // BF16: a model.safetensors that differs from the old one, which was F32.
        check_error([&] { write_checkpoint(dir, config, tiny.tensors, DType::bf16); },
                    {"config.json", "cannot be written"});
        unchanged();
    }
    SUBCASE("the disk fills up while the new checkpoint is written") {
        {
            const FileSizeLimit limit(64 * 1024);  // model.safetensors is 537 kB
            check_error([&] { write_checkpoint(dir, tiny.source.config(), tiny.tensors, DType::bf16); },
                        {dir.string() + ": cannot write the new checkpoint; nothing changed: ", "model.safetensors",
                         "File too large"});
        }
        unchanged();
    }
    SUBCASE("a store type write_checkpoint cannot write") {
        check_error([&] { write_checkpoint(dir, tiny.source.config(), tiny.tensors, DType::i32); },
                    {"cannot store tensors as I32"});
        unchanged();
    }
}

TEST_CASE("io files: write_checkpoint refuses to replace what is not a checkpoint, and changes nothing") {
    const TinyTensors tiny;
    const auto parent = scratch_dir("files_refuse");
    const auto dir = parent / "ckpt";
    copy_tiny_k2(dir);
    const auto refused = [&](std::initializer_list<std::string_view> parts) {
        const auto before = snapshot(dir);
        check_error([&] { write_checkpoint(dir, tiny.source.config(), tiny.tensors); }, parts);
        CHECK(snapshot(dir) == before);
        CHECK(entries(parent) == std::set<std::string>{"ckpt"});
    };
    SUBCASE("an unknown file") {
        write_file(dir / "notes.txt", "mine");
        refused({dir.string(), "holds 'notes.txt'", "not a checkpoint file", "will not delete it"});
    }
    SUBCASE("a safetensors file that is not a weight shard") {
        write_file(dir / "optimizer.safetensors", "state");
        refused({"holds 'optimizer.safetensors'", "not a checkpoint file"});
    }
    SUBCASE("a subdirectory") {
        fs::create_directory(dir / "figures");
        refused({"holds 'figures'", "which is a directory"});
    }
    SUBCASE("a symlink, even with a checkpoint file's name") {
        write_file(parent / "tok", "t");
        fs::create_symlink(parent / "tok", dir / "tokenizer.json");
        const auto before = snapshot(dir);
        check_error([&] { write_checkpoint(dir, tiny.source.config(), tiny.tensors); },
                    {"holds 'tokenizer.json'", "which is a symlink"});
        CHECK(snapshot(dir) == before);
    }
    SUBCASE("a file where the directory should be") {
        fs::remove_all(dir);
        write_file(dir, "a file");
        check_error([&] { write_checkpoint(dir, tiny.source.config(), tiny.tensors); },
                    {dir.string(), "exists and is a regular file, not a checkpoint directory"});
        CHECK(read_file(dir) == "a file");
        CHECK(entries(parent) == std::set<std::string>{"ckpt"});
    }
}

TEST_CASE("io files: the rename-aside fallback swaps a checkpoint directory in, and back on failure") {
    const auto parent = scratch_dir("files_rename_aside");
    fs::create_directories(parent / "old");
    fs::create_directories(parent / "new");
    write_file(parent / "old" / "config.json", "old");
    write_file(parent / "new" / "config.json", "new");
    const detail::FileDescriptor fd = detail::open_directory(parent, "test");
    const std::string aside = detail::swap_in_directory(fd.get(), "new", "old", true, "test", false);
    CHECK(read_file(parent / "old" / "config.json") == "new");
    CHECK(read_file(parent / aside / "config.json") == "old");
    CHECK(aside.starts_with(".old.old.tmp-"));
    CHECK(!fs::exists(parent / "new"));

    // The new tree cannot be moved in (it is gone): the old one is put back.
    check_error([&] { detail::swap_in_directory(fd.get(), "gone", "old", true, "test", false); },
                {"cannot rename the new checkpoint"});
    CHECK(read_file(parent / "old" / "config.json") == "new");
    CHECK(entries(parent) == std::set<std::string>{"old", aside});
}

TEST_CASE("io files: a FIFO, socket, device or directory as config.json or model.safetensors is refused at once") {
    const auto dir = scratch_dir("files_special") / "ckpt";
    copy_tiny_k2(dir);
    const auto load = [&] { Checkpoint c(dir); };

    SUBCASE("FIFO as config.json") {
        fs::remove(dir / "config.json");
        REQUIRE(::mkfifo((dir / "config.json").c_str(), 0644) == 0);
        check_message(error_without_blocking(load, dir / "config.json"),
                      {(dir / "config.json").string(), "is a FIFO, not a regular file"});
        check_message(error_without_blocking([&] { read_hf_config(dir / "config.json"); }, dir / "config.json"),
                      {"is a FIFO"});
    }
    SUBCASE("FIFO as model.safetensors") {
        fs::remove(dir / "model.safetensors");
        REQUIRE(::mkfifo((dir / "model.safetensors").c_str(), 0644) == 0);
        check_message(error_without_blocking(load, dir / "model.safetensors"),
                      {(dir / "model.safetensors").string(), "is a FIFO, not a regular file"});
        check_message(
            error_without_blocking([&] { SafetensorsFile f(dir / "model.safetensors"); }, dir / "model.safetensors"),
            {"is a FIFO"});
    }
    SUBCASE("FIFO as model.safetensors.index.json") {
        fs::remove(dir / "model.safetensors");
        REQUIRE(::mkfifo((dir / "model.safetensors.index.json").c_str(), 0644) == 0);
        check_message(error_without_blocking(load, dir / "model.safetensors.index.json"),
                      {(dir / "model.safetensors.index.json").string(), "is a FIFO, not a regular file"});
    }
    SUBCASE("socket as model.safetensors") {
        fs::remove(dir / "model.safetensors");
        make_socket(dir / "model.safetensors");
        check_error(load, {(dir / "model.safetensors").string(), "is a socket, not a regular file"});
    }
    SUBCASE("character device as config.json, through a symlink") {
        fs::remove(dir / "config.json");
        fs::create_symlink("/dev/null", dir / "config.json");
        check_error(load, {(dir / "config.json").string(), "is a character device, not a regular file"});
        check_error([&] { SafetensorsFile f("/dev/zero"); }, {"/dev/zero: is a character device"});
    }
    SUBCASE("directory as config.json") {
        fs::remove(dir / "config.json");
        fs::create_directory(dir / "config.json");
        check_error(load, {(dir / "config.json").string(), "is a directory, not a regular file"});
    }
    SUBCASE("directory as model.safetensors") {
        fs::remove(dir / "model.safetensors");
        fs::create_directory(dir / "model.safetensors");
        check_error(load, {(dir / "model.safetensors").string(), "is a directory, not a regular file"});
    }
}

TEST_CASE("io files: read_small_file reads a whole file up to its limit") {
    const auto dir = scratch_dir("files_small");
    write_file(dir / "f", std::string(100, 'x'));
    CHECK(detail::read_small_file(dir / "f", 100) == std::string(100, 'x'));
    check_error([&] { detail::read_small_file(dir / "f", 99); },
                {(dir / "f").string(), "is 100 bytes, more than the limit of 99 bytes"});
    write_file(dir / "empty", "");
    CHECK(detail::read_small_file(dir / "empty", 10).empty());
    check_error([&] { detail::read_small_file(dir / "none", 10); },
                {(dir / "none").string(), "cannot open", "No such file"});
}

}  // namespace unit_io_files

namespace unit_io_files {

TEST_CASE("loads beside a concurrent save read one save, never two (config.json of one, shards of another)") {
    // issue 29: 783 of 11,064 loads beside a writer paired one save's config.json with another's weights. Save k
    // holds rms_norm_eps = k * 1e-6 and eight tensors of value k, each in a shard of its own; a load must find one
    // k everywhere.
    namespace fs = std::filesystem;
    const fs::path dir = scratch_dir("concurrent_save") / "ck";
    nlohmann::json base =
        nlohmann::json::parse(read_file(fs::path(MOONMOE_TEST_SOURCE_DIR) / "data/tiny_k2/config.json"));
    constexpr int tensors = 8, saves = 120;
    const auto tensor_name = [](int t) {  // "t" + to_string(t) drew GCC 12's false -Wrestrict warning
        std::string name = "t";
        name += std::to_string(t);
        return name;
    };
    const auto save = [&](int k) {
        nlohmann::json config = base;
        config["rms_norm_eps"] = k * 1e-6;
        std::vector<std::vector<float>> values(tensors, std::vector<float>(256, float(k)));
        std::vector<NamedTensor> named;
        for (int t = 0; t < tensors; ++t) named.push_back({tensor_name(t), {256}, values[std::size_t(t)]});
        write_sharded_checkpoint(dir, parse_hf_config(config.dump()), named, DType::f32, 1024);
    };
    save(1);
    std::atomic<bool> done{false};
    auto writer = std::async(std::launch::async, [&] {
        for (int k = 2; k <= saves; ++k) save(k);
        done = true;
    });
    int loads = 0, mixed = 0, failed = 0;
    std::string first_failure;
    while (!done || loads < 10) {
        try {
            Checkpoint ck(dir);
            const int k = int(std::lround(ck.config().model.dims.norm_eps / 1e-6));
            bool same = true;
            for (int t = 0; t < tensors; ++t)
                for (float v : ck.read_f32(tensor_name(t), {256})) same = same && v == float(k);
            ++loads, mixed += !same;
        } catch (const io_error& e) {
            if (failed++ == 0) first_failure = e.what();
        }
    }
    writer.get();
    MESSAGE(loads << " loads beside " << saves - 1 << " saves: " << mixed << " mixed two saves, " << failed << " failed"
                  << (failed ? " (first: " + first_failure + ")" : std::string()));
    CHECK(mixed == 0);
    CHECK(failed == 0);
    CHECK(loads >= 10);
}

}  // namespace unit_io_files

namespace unit_io_files {

TEST_CASE("a save removes the temporary directories of saves killed mid-write, never a live save's") {
    // issue 29: a save killed mid-write left a hidden .<dir>.tmp-* directory that no later save removed
    namespace fs = std::filesystem;
    const fs::path root = scratch_dir("stale_temporaries");
    const fs::path stale = root / ".ck.tmp-0123456789abcdef", live = root / ".ck.tmp-fedcba9876543210";
    const fs::path other = root / ".other.tmp-0123456789abcdef", unlike = root / ".ck.tmp-notmine";
    for (const fs::path& d : {stale, live, other, unlike}) {
        fs::create_directories(d);
        std::ofstream(d / "model.safetensors") << "half";
    }
    const detail::FileDescriptor parent = detail::open_directory(root, "test");
    const detail::FileDescriptor held = detail::lock_directory(parent.get(), live.filename().c_str(), true);
    REQUIRE(held.get() >= 0);  // a save still writing there holds this lock
    const std::vector<float> v(4, 1.0f);
    const std::vector<NamedTensor> tensors = {{"t", {4}, v}};
    write_sharded_checkpoint(root / "ck",
                             parse_hf_config(read_file(fs::path(MOONMOE_TEST_SOURCE_DIR) / "data/tiny_k2/config.json")),
                             tensors);
    CHECK_FALSE(fs::exists(stale));
    CHECK(fs::exists(live / "model.safetensors"));  // locked: a live save's
    CHECK(fs::exists(other));                       // another checkpoint's name
    CHECK(fs::exists(unlike));                      // not a name our saves make
    CHECK(detail::is_temporary_name(".ck.tmp-0123456789abcdef", "ck"));
    CHECK_FALSE(detail::is_temporary_name(".ck.tmp-0123456789ABCDEF", "ck"));
    CHECK_FALSE(detail::is_temporary_name(".ck.tmp-0123456789abcde", "ck"));
}

}  // namespace unit_io_files
