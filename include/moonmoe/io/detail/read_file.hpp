// moonmoe/io/detail/read_file.hpp: open a file for reading only if it is a regular file, without ever blocking.
//
// A FIFO named config.json or model.safetensors would make a plain open() wait for a writer forever, and a device
// may do anything when opened. So the path is stat'ed and refused by kind first, then opened with O_NONBLOCK (a
// FIFO swapped in meanwhile opens at once instead of blocking) and O_NOCTTY, and checked again on the descriptor.
// Symlinks are followed: Hugging Face's cache links snapshot files to blobs.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../error.hpp"

namespace moonmoe::detail {

/// "a directory", "a FIFO", ... for a stat mode.
inline const char* file_kind(mode_t mode) {
    if (S_ISREG(mode)) return "a regular file";
    if (S_ISLNK(mode)) return "a symlink";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    return "a special file";
}

/// Throws "<path>: is a FIFO, not a regular file" (directory, socket, device ...) unless `mode` is a regular file.
inline void require_regular_file(const std::string& path, mode_t mode) {
    if (!S_ISREG(mode)) throw io_error(path + ": is " + file_kind(mode) + ", not a regular file");
}

/// A read-only descriptor of a regular file and the file's size; closes the descriptor when destroyed.
class ReadableFile {
public:
    /// Opens `path`; throws io_error naming the path ("cannot open: <reason>", or what kind of file it is). With a
    /// directory descriptor `dir`, opens `name` in that directory (openat): `path` then only names it in messages.
    explicit ReadableFile(const std::string& path, int dir = AT_FDCWD, const char* name = nullptr) : path_(path) {
        const char* at = name ? name : path.c_str();
        struct stat st{};
        if (::fstatat(dir, at, &st, 0) != 0) fail("cannot open");
        require_regular_file(path, st.st_mode);
        do fd_ = ::openat(dir, at, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        while (fd_ < 0 && errno == EINTR);
        if (fd_ < 0) fail("cannot open");
        const bool stat_ok = ::fstat(fd_, &st) == 0;
        if (!stat_ok || !S_ISREG(st.st_mode)) {  // the destructor does not run for a throwing constructor
            const int e = errno;
            ::close(fd_);
            if (!stat_ok) fail("cannot stat", e);
            require_regular_file(path, st.st_mode);  // replaced between stat and open
        }
        size_ = std::uint64_t(st.st_size);
    }
    ReadableFile(const ReadableFile&) = delete;
    ReadableFile& operator=(const ReadableFile&) = delete;
    ~ReadableFile() {
        if (fd_ >= 0) ::close(fd_);
    }

    int fd() const { return fd_; }
    /// The size when opened.
    std::uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }

    /// Reads up to `size` bytes at the current position, across interrupts and short reads; the count read (less
    /// only at end of file). Throws io_error naming the path on an error.
    std::size_t read_some(char* out, std::size_t size) const {
        std::size_t done = 0;
        while (done < size) {
            const ssize_t n = ::read(fd_, out + done, size - done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) fail("cannot read");
            if (n == 0) break;
            done += std::size_t(n);
        }
        return done;
    }

    [[noreturn]] void fail(const char* what, int e = errno) const {
        throw io_error(path_ + ": " + what + ": " + std::strerror(e));
    }

private:
    std::string path_;
    int fd_ = -1;
    std::uint64_t size_ = 0;
};

/// The whole of a small regular file (config.json, an index) as bytes; refuses anything that is not a regular
/// file, and a file over `max_bytes` (it may be growing, so the limit holds for what is read, not just the size).
inline std::string read_small_file(const std::filesystem::path& path, std::size_t max_bytes, int dir = AT_FDCWD,
                                   const char* name = nullptr) {
    const ReadableFile file(path.string(), dir, name);
    const std::string limit = "the limit of " + std::to_string(max_bytes) + " bytes for this file";
    if (file.size() > max_bytes)
        throw io_error(file.path() + ": is " + std::to_string(file.size()) + " bytes, more than " + limit);
    std::string text(std::size_t(file.size()) + 1, '\0');  // one more byte tells a file that grew since fstat
    std::size_t got = file.read_some(text.data(), text.size());
    while (got == text.size()) {
        if (text.size() > max_bytes) throw io_error(file.path() + ": grew past " + limit + " while being read");
        text.resize(std::min(text.size() * 2, max_bytes + 1));
        got += file.read_some(text.data() + got, text.size() - got);
    }
    text.resize(got);
    return text;
}

}  // namespace moonmoe::detail
