// moonmoe/numeric/bf16.hpp: bfloat16, the one 16-bit float type of the library's compute path and of BF16
// checkpoints, and `convert<To>(x)`, the element conversion every backend's cast uses.
//
// bf16 is the top half of an IEEE binary32 (sign, 8-bit exponent, 7-bit mantissa): same range as float, 8 bits of
// precision. It holds raw bits (a trivially copyable 2-byte struct with 2-byte alignment), so an array of bf16 has
// the memory layout of CUDA's __nv_bfloat16 and of torch.bfloat16 and a pointer can be handed to cuBLAS as
// CUDA_R_16BF. The conversions are constexpr and MOONMOE_HD, so CUDA kernels, the CPU backend, io and the tests
// share one implementation:
//   float -> bf16   round to nearest, ties to even (as c10::BFloat16 and __float2bfloat16_rn); overflow past the
//                   largest finite value rounds to inf; inf stays inf; every NaN becomes the quiet NaN 0x7FC0
//                   (c10's scalar conversion; a NaN stays a NaN whatever its payload); subnormals are kept
//   bf16 -> float   exact (the 16 bits become the high half)
#pragma once

#include <cstdint>
#include <type_traits>

#include "../config/macros.hpp"

namespace moonmoe {

namespace detail {
MOONMOE_HD constexpr std::uint32_t float_bits(float x) { return __builtin_bit_cast(std::uint32_t, x); }
MOONMOE_HD constexpr float bits_float(std::uint32_t u) { return __builtin_bit_cast(float, u); }
}  // namespace detail

/// bfloat16 as raw bits: `bf16{0x3F80}` is 1.0; `bf16::from_float(x)` rounds, `b.to_float()` widens exactly.
struct bf16 {
    std::uint16_t bits;

    MOONMOE_HD constexpr float to_float() const { return detail::bits_float(std::uint32_t{bits} << 16); }
    MOONMOE_HD constexpr bool is_nan() const { return (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu) != 0; }

    /// Round to nearest even: add half an ulp of the kept part minus one, plus the kept part's last bit (so an
    /// exact tie goes to the even side), and drop the low 16 bits. A carry out of the mantissa moves the exponent
    /// up, which is right, and out of the largest finite value gives inf. NaN is handled first because adding to
    /// a NaN's payload could carry it into inf (0x7F80) or wrap the sign.
    MOONMOE_HD static constexpr bf16 from_float(float x) {
        const std::uint32_t u = detail::float_bits(x);
        if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16{0x7FC0};
        return bf16{std::uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
    }
};

static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2, "bf16 must have the layout of __nv_bfloat16 / torch.bfloat16");
static_assert(std::is_trivially_copyable_v<bf16> && std::is_standard_layout_v<bf16> &&
                  std::is_trivially_default_constructible_v<bf16>,
              "bf16 must be a plain 16-bit value (memcpy-able, allocatable without construction)");

/// y = x in the element type To, for the float types the backends store (float, double, bf16): narrowing to bf16
/// rounds to nearest even (a double goes through float first, as c10::BFloat16(double) does), widening is exact.
template <class To, class From>
MOONMOE_HD constexpr To convert(From x) {
    if constexpr (std::is_same_v<To, From>) return x;
    else if constexpr (std::is_same_v<To, bf16>)
        return bf16::from_float(float(x));
    else if constexpr (std::is_same_v<From, bf16>)
        return To(x.to_float());
    else
        return To(x);
}

}  // namespace moonmoe

#if defined(__CUDACC__)
#include <cuda_bf16.h>
static_assert(sizeof(moonmoe::bf16) == sizeof(__nv_bfloat16) && alignof(moonmoe::bf16) == alignof(__nv_bfloat16),
              "moonmoe::bf16 and __nv_bfloat16 must share their layout (cuBLAS reads bf16 arrays as CUDA_R_16BF)");
#endif
