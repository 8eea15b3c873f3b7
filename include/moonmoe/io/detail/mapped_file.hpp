// moonmoe/io/detail/mapped_file.hpp: a whole file mapped read-only into memory (POSIX), unmapped on destruction.
//
// Checkpoints are read through the page cache instead of copied: a 1 TB K2 checkpoint costs only the pages a
// rank actually touches, and tensors are spans into the mapping.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>

#include <sys/mman.h>

#include "../error.hpp"
#include "read_file.hpp"

namespace moonmoe::detail {

class MappedFile {
public:
    MappedFile() = default;

    /// Maps `path` read-only; throws io_error naming the path and the system's reason, or what kind of file it is
    /// if it is not a regular file (a FIFO or device is refused without blocking: detail/read_file.hpp).
    /// With a directory descriptor `dir`, maps `name` in that directory; `path` names it in messages.
    explicit MappedFile(const std::string& path, int dir = AT_FDCWD, const char* name = nullptr) {
        const ReadableFile file(path, dir, name);
        size_ = std::size_t(file.size());
        if (size_ > 0) {  // mmap of length 0 is an error; an empty file is simply an empty span
            void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
            if (p == MAP_FAILED) file.fail("cannot mmap");
            data_ = static_cast<const std::byte*>(p);
        }
    }  // closing the descriptor leaves the mapping, which keeps the file alive

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
    void unmap() {
        if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
        data_ = nullptr;
        size_ = 0;
    }

    const std::byte* data_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace moonmoe::detail
