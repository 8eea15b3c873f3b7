// moonmoe/tensor/dtype.hpp: element types of stored tensors, and the 16- and 8-bit floats as value types.
//
// DType names the element type of a tensor on disk or in memory, spelled as safetensors spells it ("BF16",
// "F8_E4M3", ...). bf16 (numeric/bf16.hpp), f16 and f8_e4m3 hold raw bits and convert to and from float exactly as
// PyTorch's c10::BFloat16, c10::Half and c10::Float8_e4m3fn do (round to nearest, ties to even), so a checkpoint
// written by torch decodes to the same floats here. The conversions are constexpr and host-and-device (MOONMOE_HD), so
// CUDA kernels and the CPU reference share them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "../config/macros.hpp"
#include "../numeric/bf16.hpp"

namespace moonmoe {

/// Element types of the safetensors format (the subset without sub-byte and complex types).
enum class DType { f64, f32, f16, bf16, f8_e4m3, f8_e5m2, i64, i32, i16, i8, u64, u32, u16, u8, boolean };

inline constexpr DType all_dtypes[] = {DType::f64,     DType::f32, DType::f16, DType::bf16, DType::f8_e4m3,
                                       DType::f8_e5m2, DType::i64, DType::i32, DType::i16,  DType::i8,
                                       DType::u64,     DType::u32, DType::u16, DType::u8,   DType::boolean};

/// Bytes per element.
MOONMOE_HD constexpr std::size_t dtype_size(DType t) {
    switch (t) {
    case DType::f64:
    case DType::i64:
    case DType::u64: return 8;
    case DType::f32:
    case DType::i32:
    case DType::u32: return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
    case DType::u16: return 2;
    case DType::f8_e4m3:
    case DType::f8_e5m2:
    case DType::i8:
    case DType::u8:
    case DType::boolean: return 1;
    }
    return 0;
}

/// True for the floating-point types (those a weight may be stored in).
MOONMOE_HD constexpr bool is_floating(DType t) {
    return t == DType::f64 || t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f8_e4m3 ||
           t == DType::f8_e5m2;
}

/// The safetensors spelling: "F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I64", ..., "U8", "BOOL".
constexpr std::string_view dtype_name(DType t) {
    switch (t) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f8_e4m3: return "F8_E4M3";
    case DType::f8_e5m2: return "F8_E5M2";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::i16: return "I16";
    case DType::i8: return "I8";
    case DType::u64: return "U64";
    case DType::u32: return "U32";
    case DType::u16: return "U16";
    case DType::u8: return "U8";
    case DType::boolean: return "BOOL";
    }
    return "?";
}

/// The DType a safetensors spelling names, or nothing for an unknown one (case-sensitive, as the format is).
constexpr std::optional<DType> parse_dtype(std::string_view name) {
    for (DType t : all_dtypes)
        if (dtype_name(t) == name) return t;
    return std::nullopt;
}

namespace detail {
/// v / 2^shift rounded to nearest, ties to even; 0 < shift < 32.
MOONMOE_HD constexpr std::uint32_t shift_round_even(std::uint32_t v, int shift) {
    const std::uint32_t q = v >> shift, rest = v & ((std::uint32_t{1} << shift) - 1),
                        half = std::uint32_t{1} << (shift - 1);
    return q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
}

/// Magnitude bits |x| (no sign) of a finite float below 2^e_min of a narrow format, in units of its smallest
/// subnormal 2^unit_exp, rounded to nearest even. Float subnormals are far below every unit here and give 0.
MOONMOE_HD constexpr std::uint32_t subnormal_units(std::uint32_t magnitude, int unit_exp) {
    const int e = int(magnitude >> 23);
    if (e == 0) return 0;
    const std::uint32_t mant = (magnitude & 0x7FFFFFu) | 0x800000u;  // value = mant * 2^(e - 150)
    const int shift = unit_exp + 150 - e;                            // units = mant / 2^shift
    if (shift > 24) return 0;                                        // below half a unit
    return shift_round_even(mant, shift);
}
}  // namespace detail

// bf16 (bfloat16) is numeric/bf16.hpp: the compute path and io share it.

/// IEEE binary16 (5-bit exponent, bias 15, 10-bit mantissa, max 65504, with infinities).
struct f16 {
    std::uint16_t bits;

    MOONMOE_HD constexpr float to_float() const {
        const std::uint32_t sign = std::uint32_t(bits & 0x8000u) << 16;
        const std::uint32_t e = (bits >> 10) & 0x1Fu;
        std::uint32_t m = bits & 0x3FFu;
        if (e == 0x1F) return detail::bits_float(sign | 0x7F800000u | (m << 13));  // inf, NaN keeps its payload
        if (e != 0) return detail::bits_float(sign | ((e + 112u) << 23) | (m << 13));
        if (m == 0) return detail::bits_float(sign);
        int shift = 0;  // subnormal m * 2^-24: normalise so the leading one becomes the implicit bit
        while ((m & 0x400u) == 0) m <<= 1, ++shift;
        return detail::bits_float(sign | (std::uint32_t(113 - shift) << 23) | ((m & 0x3FFu) << 13));
    }
    MOONMOE_HD constexpr bool is_nan() const { return (bits & 0x7C00u) == 0x7C00u && (bits & 0x3FFu) != 0; }

    /// Round to nearest even; beyond 65520 (the midpoint above 65504) becomes inf; NaN becomes sign | 0x7E00.
    MOONMOE_HD static constexpr f16 from_float(float x) {
        const std::uint32_t u = detail::float_bits(x);
        const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
        const std::uint32_t a = u & 0x7FFFFFFFu;
        if (a > 0x7F800000u) return f16{std::uint16_t(sign | 0x7E00u)};
        if (a >= 0x477FF000u) return f16{std::uint16_t(sign | 0x7C00u)};
        if (a < 0x38800000u) return f16{std::uint16_t(sign | detail::subnormal_units(a, -24))};  // below 2^-14
        // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits; a carry moves the exponent up.
        return f16{std::uint16_t(sign | detail::shift_round_even(a - (std::uint32_t(127 - 15) << 23), 13))};
    }
};

/// FP8 E4M3 in the OCP "e4m3fn" variant DeepSeek and Kimi checkpoints use (torch.float8_e4m3fn): 4-bit exponent,
/// bias 7, 3-bit mantissa, no infinities; 0x7F and 0xFF are NaN; the largest finite value is 448 (0x7E).
struct f8_e4m3 {
    std::uint8_t bits;

    static constexpr float max_finite = 448.0f;

    MOONMOE_HD constexpr float to_float() const {
        const std::uint32_t sign = std::uint32_t(bits & 0x80u) << 24;
        const std::uint32_t e = (bits >> 3) & 0xFu, m = bits & 0x7u;
        if (e == 0xF && m == 0x7) return detail::bits_float(sign | 0x7FF00000u);  // the NaN bits torch produces
        if (e != 0) return detail::bits_float(sign | ((e + 120u) << 23) | (m << 20));
        if (m == 0) return detail::bits_float(sign);
        const int shift = m >= 4 ? 1 : m >= 2 ? 2 : 3;  // subnormal m * 2^-9: bring the leading one to bit 3
        return detail::bits_float(sign | (std::uint32_t(121 - shift) << 23) | (((m << shift) & 0x7u) << 20));
    }
    MOONMOE_HD constexpr bool is_nan() const { return (bits & 0x7Fu) == 0x7Fu; }

    /// Round to nearest even, exactly as torch's `.to(torch.float8_e4m3fn)` (c10 fp8e4m3fn_from_fp32_value in
    /// torch 2.15, the version that made test/data): it saturates. Finite values beyond ±448 and ±inf become ±448
    /// (0x7E / 0xFE), including those in (464, 480) whose rounding would carry into the NaN code; NaN stays NaN
    /// (0x7F with the input's sign). Older c10 (e.g. pytorch @0316fdce) turned |x| >= 480 into NaN instead.
    MOONMOE_HD static constexpr f8_e4m3 from_float(float x) {
        const std::uint32_t u = detail::float_bits(x);
        const std::uint8_t sign = std::uint8_t((u >> 24) & 0x80u);
        const std::uint32_t a = u & 0x7FFFFFFFu;
        if (a > 0x7F800000u) return f8_e4m3{std::uint8_t(sign | 0x7Fu)};  // NaN
        if (a > 0x43E80000u) return f8_e4m3{std::uint8_t(sign | 0x7Eu)};  // above 464: saturate
        if (a < 0x3C800000u) return f8_e4m3{std::uint8_t(sign | detail::subnormal_units(a, -9))};  // below 2^-6
        // Rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits; a carry moves the exponent up.
        // 464 (0x43E80000), the tie between 448 and 480, rounds to 448's even mantissa.
        return f8_e4m3{std::uint8_t(sign | detail::shift_round_even(a - (std::uint32_t(127 - 7) << 23), 20))};
    }
};

/// Block size of FP8 weights when a checkpoint does not state one: each [128, 128] block of a weight shares one
/// f32 scale (DeepSeek-V3 and Kimi K2 `quantization_config.weight_block_size`).
inline constexpr std::array<std::int64_t, 2> default_fp8_block{128, 128};

/// The DType of a C++ element type: dtype_of<float> == DType::f32.
template <class T>
inline constexpr bool has_dtype = false;
template <class T>
inline constexpr DType dtype_of = [] {
    static_assert(has_dtype<T>,
                  "dtype_of<T>: T is not a stored element type (float, double, bf16, f16, f8_e4m3, "
                  "std::int8_t ... std::uint64_t, bool)");
    return DType::f32;
}();

#define MOONMOE_DTYPE_OF(T, D)                                                                                         \
    template <>                                                                                                        \
    inline constexpr bool has_dtype<T> = true;                                                                         \
    template <>                                                                                                        \
    inline constexpr DType dtype_of<T> = D;
MOONMOE_DTYPE_OF(double, DType::f64)
MOONMOE_DTYPE_OF(float, DType::f32)
MOONMOE_DTYPE_OF(f16, DType::f16)
MOONMOE_DTYPE_OF(bf16, DType::bf16)
MOONMOE_DTYPE_OF(f8_e4m3, DType::f8_e4m3)
MOONMOE_DTYPE_OF(std::int64_t, DType::i64)
MOONMOE_DTYPE_OF(std::int32_t, DType::i32)
MOONMOE_DTYPE_OF(std::int16_t, DType::i16)
MOONMOE_DTYPE_OF(std::int8_t, DType::i8)
MOONMOE_DTYPE_OF(std::uint64_t, DType::u64)
MOONMOE_DTYPE_OF(std::uint32_t, DType::u32)
MOONMOE_DTYPE_OF(std::uint16_t, DType::u16)
MOONMOE_DTYPE_OF(std::uint8_t, DType::u8)
MOONMOE_DTYPE_OF(bool, DType::boolean)
#undef MOONMOE_DTYPE_OF

}  // namespace moonmoe
