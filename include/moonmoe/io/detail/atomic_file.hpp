// moonmoe/io/detail/atomic_file.hpp: replace a file so that readers and crashes see the old one or the new one.
//
// The new bytes go to a temporary file created exclusively (O_CREAT | O_EXCL | O_NOFOLLOW) under a random name in
// the target's directory, so nothing planted there in advance, a symlink least of all, is ever opened; they are
// fsync'ed, renamed over the target, and the directory is fsync'ed so that the rename itself survives a crash.
// Every failure removes the temporary. The same exclusive naming makes temporary directories (checkpoint_writer).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../error.hpp"

namespace moonmoe::detail {

/// A file descriptor, closed on destruction.
class FileDescriptor {
public:
    FileDescriptor() = default;
    explicit FileDescriptor(int fd) : fd_(fd) {}
    FileDescriptor(FileDescriptor&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    FileDescriptor& operator=(FileDescriptor&& o) noexcept {
        if (this != &o) {
            reset();
            fd_ = std::exchange(o.fd_, -1);
        }
        return *this;
    }
    FileDescriptor(const FileDescriptor&) = delete;
    FileDescriptor& operator=(const FileDescriptor&) = delete;
    ~FileDescriptor() { reset(); }

    int get() const { return fd_; }
    /// Closes now and reports close()'s result (0, or -1 with errno): NFS reports write errors only here.
    int close() { return fd_ < 0 ? 0 : ::close(std::exchange(fd_, -1)); }

private:
    void reset() {
        if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    }
    int fd_ = -1;
};

/// Writes all of `data` to `fd`, across partial writes and interrupts; false on error (errno set).
inline bool write_all(int fd, const std::byte* data, std::size_t size) {
    while (size > 0) {
        const ssize_t n = ::write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        data += n;
        size -= std::size_t(n);
    }
    return true;
}

[[noreturn]] inline void throw_system_error(const std::string& where, const std::string& what, int e) {
    throw io_error(where + ": " + what + ": " + std::strerror(e));
}

/// `dir` opened for the *at calls and fsync; an error reads "<where>: <what> <dir>: <reason>".
inline FileDescriptor open_directory(const std::filesystem::path& dir, const std::string& where,
                                     const std::string& what = "cannot open the directory") {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;  // read before building the message can disturb it
        throw_system_error(where, what + " " + dir.string(), e);
    }
    return FileDescriptor(fd);
}

/// fsync of a directory, which makes the renames into it durable. A filesystem that cannot sync directories
/// answers EINVAL; there is nothing more to do on one.
inline void sync_directory(int dir_fd, const std::string& where) {
    if (::fsync(dir_fd) != 0 && errno != EINVAL) {
        const int e = errno;
        throw_system_error(where, "cannot sync its directory", e);
    }
}

/// ".<stem>.tmp-": what every temporary name of `stem` starts with (stem cut to 200 bytes, under NAME_MAX).
inline std::string temporary_prefix(std::string_view stem) {
    // appended piece by piece: "." + std::string(...) drew GCC 12's false -Wrestrict warning in programs using this
    std::string prefix = ".";
    prefix += stem.substr(0, 200);
    prefix += ".tmp-";
    return prefix;
}

/// ".<stem>.tmp-<16 random hex digits>": hidden, and unpredictable, so it cannot be prepared in advance.
inline std::string temporary_name(std::string_view stem) {
    static constexpr char hex[] = "0123456789abcdef";
    std::random_device random;
    std::uint64_t bits = (std::uint64_t(random()) << 32) ^ random();
    std::string name = temporary_prefix(stem);
    for (int i = 0; i < 16; ++i, bits >>= 4) name += hex[bits & 15];
    return name;
}

/// Calls `create(name)` (returning >= 0, or -1 with errno) with fresh temporary names until one does not exist
/// yet; returns the name and the result.
template <class Create>
std::pair<std::string, int> create_exclusively(std::string_view stem, const std::string& where, Create create) {
    for (int attempt = 0;; ++attempt) {
        std::string name = temporary_name(stem);
        const int r = create(name.c_str());
        if (r >= 0) return {std::move(name), r};
        const int e = errno;
        if (e != EEXIST || attempt == 100) throw_system_error(where, "cannot create a temporary " + name, e);
    }
}

/// A new, empty directory ".<stem>.tmp-<random>" in `dir_fd`, mode 0777 less the umask as mkdir gives; its name.
inline std::string create_temporary_directory(int dir_fd, std::string_view stem, const std::string& where) {
    return create_exclusively(stem, where, [&](const char* name) { return ::mkdirat(dir_fd, name, 0777); }).first;
}

/// Whether `entry` is a name temporary_name(stem) gives: "." + stem + ".tmp-" + 16 hex digits.
inline bool is_temporary_name(std::string_view entry, std::string_view stem) {
    const std::string prefix = temporary_prefix(stem);
    if (entry.size() != prefix.size() + 16 || !entry.starts_with(prefix)) return false;
    return std::all_of(entry.begin() + std::ptrdiff_t(prefix.size()), entry.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// An exclusive advisory lock (flock) on directory `name` in `dir_fd`, held while the result lives: a writer holds
/// one on each temporary directory it works in, so that another writer tells a live one from a stale one. Returns
/// an empty descriptor if the directory is gone or another process holds the lock (`wait` false).
inline FileDescriptor lock_directory(int dir_fd, const char* name, bool wait) {
    FileDescriptor fd(::openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) return {};
    int r;
    do r = ::flock(fd.get(), LOCK_EX | (wait ? 0 : LOCK_NB));
    while (r != 0 && errno == EINTR);
    return r == 0 ? std::move(fd) : FileDescriptor();
}

/// Removes the temporary directories of `stem` in `dir` (named as temporary_name(stem) names them) that no live
/// writer holds locked: what a save killed mid-write left. A directory locked by a running save is left alone.
inline void remove_stale_temporaries(const std::filesystem::path& dir, int dir_fd, std::string_view stem) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
        const std::string name = entry.path().filename().string();
        if (!is_temporary_name(name, stem) || !entry.is_directory(ec) || entry.is_symlink(ec)) continue;
        const FileDescriptor lock = lock_directory(dir_fd, name.c_str(), false);
        if (lock.get() >= 0) std::filesystem::remove_all(entry.path(), ec);  // best effort: the save goes on
    }
}

/// Writes `chunks` one after another to `path` so that a reader sees either the old file or the whole new one
/// (see the top of this file). The new file has mode 0644 less the umask, as open() gives. A symlink at `path`
/// is replaced, not followed. Throws io_error naming the path; the previous file is then untouched.
inline void write_file_atomically(const std::filesystem::path& path,
                                  std::span<const std::span<const std::byte>> chunks) {
    const std::string target = path.string();
    const std::string name = path.filename().string();
    if (name.empty() || name == "." || name == "..") throw io_error(target + ": not a file name");
    const FileDescriptor dir = open_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."),
                                              target, "cannot create it in the directory");
    const auto created = create_exclusively(name, target, [&](const char* n) {
        return ::openat(dir.get(), n, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    });
    const std::string& temp = created.first;
    FileDescriptor file(created.second);
    const auto fail = [&](std::string_view what, int e) {  // a string_view: nothing allocates before errno is read
        file.close();
        ::unlinkat(dir.get(), temp.c_str(), 0);
        throw_system_error(target, std::string(what), e);
    };
    for (const auto& chunk : chunks)
        if (!write_all(file.get(), chunk.data(), chunk.size())) fail("cannot write", errno);
    if (::fsync(file.get()) != 0) fail("cannot write (fsync)", errno);
    if (file.close() != 0) fail("cannot write (close)", errno);
    if (::renameat(dir.get(), temp.c_str(), dir.get(), name.c_str()) != 0) {
        const int e = errno;
        fail("cannot rename the temporary " + temp + " over it", e);
    }
    sync_directory(dir.get(), target);
}

}  // namespace moonmoe::detail
