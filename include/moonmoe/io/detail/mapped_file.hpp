// moonmoe/io/detail/mapped_file.hpp: a whole file mapped read-only into memory (POSIX), unmapped on destruction.
//
// Checkpoints are read through the page cache instead of copied: a 1 TB K2 checkpoint costs only the pages a
// rank actually touches, and tensors are spans into the mapping.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../error.hpp"

namespace moonmoe::detail {

class MappedFile {
public:
    MappedFile() = default;

    /// Maps `path` read-only; throws io_error naming the path and the system's reason.
    explicit MappedFile(const std::string& path) {
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) fail(path, "cannot open");
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            const int e = errno;
            ::close(fd);
            fail(path, "cannot stat", e);
        }
        if (!S_ISREG(st.st_mode)) {
            ::close(fd);
            throw io_error(path + ": not a regular file");
        }
        size_ = std::size_t(st.st_size);
        if (size_ > 0) {  // mmap of length 0 is an error; an empty file is simply an empty span
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
            if (p == MAP_FAILED) {
                const int e = errno;
                ::close(fd);
                fail(path, "cannot mmap", e);
            }
            data_ = static_cast<const std::byte*>(p);
        }
        ::close(fd);  // the mapping keeps the file alive
    }

    MappedFile(MappedFile&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    MappedFile& operator=(MappedFile&& o) noexcept {
        if (this != &o) {
            unmap();
            data_ = std::exchange(o.data_, nullptr);
            size_ = std::exchange(o.size_, 0);
        }
        return *this;
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile() { unmap(); }

    std::span<const std::byte> bytes() const { return {data_, size_}; }
    std::size_t size() const { return size_; }

private:
    [[noreturn]] static void fail(const std::string& path, const char* what, int e = errno) {
        throw io_error(path + ": " + what + ": " + std::strerror(e));
    }
    void unmap() {
        if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
        data_ = nullptr;
        size_ = 0;
    }

    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace moonmoe::detail
