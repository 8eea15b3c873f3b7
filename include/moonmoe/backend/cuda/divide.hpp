// moonmoe/backend/cuda/divide.hpp: the row and column of a flat element index without a 64-bit division.
//
// An element-wise kernel maps its thread's flat index k to (k / cols, k % cols). A 64-bit integer division is a
// long software sequence on a GPU (there is no hardware divide), tens of instructions per element for a map that
// otherwise does a load, an add and a store. For a divisor fixed per launch, a quotient is one multiply-high, an add
// and a shift of 32-bit values (Granlund and Montgomery, "Division by Invariant Integers using Multiplication",
// PLDI 1994, section 4: with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(m, n) + n) >> l
// for every 32-bit n). IndexDivider precomputes m and l on the host; kernels whose element count passes 2^32 - 1
// (16 GiB of f32 in one map) keep the 64-bit division. Plain C++ with MOONMOE_HD: the emulated backend runs the
// same arithmetic, and test/unit/backend_map.cpp checks it against the division.
#pragma once

#include <cstdint>

#include "../../config/macros.hpp"
#include "../../tensor/shape.hpp"

namespace moonmoe::backend::cuda_detail {

class IndexDivider {
public:
    IndexDivider() = default;
    /// Divides by d, 1 <= d < 2^32.
    explicit IndexDivider(std::uint32_t d) : divisor_(d) {
        while (shift_ < 32 && (std::uint64_t(1) << shift_) < d) ++shift_;
        multiplier_ = std::uint32_t((std::uint64_t(1) << 32) * ((std::uint64_t(1) << shift_) - d) / d + 1);
    }

    MOONMOE_HD std::uint32_t quotient(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
        const std::uint32_t high = __umulhi(n, multiplier_);
#else
        const std::uint32_t high = std::uint32_t((std::uint64_t(n) * multiplier_) >> 32);
#endif
        return std::uint32_t((std::uint64_t(high) + n) >> shift_);
    }
    MOONMOE_HD std::uint32_t divisor() const { return divisor_; }

private:
    std::uint32_t divisor_ = 1, multiplier_ = 1;
    std::uint32_t shift_ = 0;
};

/// The largest element count whose flat indices an IndexDivider divides.
inline constexpr index_t divider_limit = index_t(0xffffffffu);

/// (k / cols, k % cols) of a launch over count = rows * cols elements: by the divider when count <= divider_limit
/// (the launch's choice, the same for every thread), else by 64-bit division.
struct FlatIndex {
    IndexDivider by_cols;
    index_t cols;
    bool narrow;

    FlatIndex() = default;
    FlatIndex(index_t count, index_t columns)
        : by_cols(std::uint32_t(columns > 0 && columns <= divider_limit ? columns : 1)),
          cols(columns),
          narrow(count <= divider_limit) {}

    MOONMOE_HD void split(index_t k, index_t& i, index_t& j) const {
        if (narrow) {
            const std::uint32_t q = by_cols.quotient(std::uint32_t(k));
            i = index_t(q), j = k - index_t(q) * cols;
        } else {
            i = k / cols, j = k % cols;
        }
    }
};

}  // namespace moonmoe::backend::cuda_detail
