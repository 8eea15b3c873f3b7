// moonmoe/io/convert.hpp: stored tensor bytes to f32, and FP8 block dequantisation.
//
// Decoding is element-exact: F16 / BF16 / F8 widen exactly (tensor/dtype.hpp, torch's conversions); F64 and the
// 64-bit integers round to nearest as static_cast<float> does. FP8 weights of DeepSeek-V3 / Kimi K2 checkpoints are
// dequantised as their reference does (DeepSeek-V3 inference/kernel.py `weight_dequant`):
//   W[i, j] = float(W8[i, j]) * scale_inv[i / B0, j / B1]      (one f32 product, no other rounding)
// with scale_inv of shape [ceil(rows / B0), ceil(cols / B1)] and B = quantization_config.weight_block_size.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../config/named.hpp"
#include "../tensor/dtype.hpp"
#include "error.hpp"
#include "safetensors.hpp"

namespace moonmoe {

namespace detail {

template <class T>
T load_unaligned(const std::byte* p) {  // the data section need not be aligned for T
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

template <class T, class F>
void decode_each(std::span<const std::byte> bytes, std::span<float> out, F to_float) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_float(load_unaligned<T>(bytes.data() + i * sizeof(T)));
}

/// Widens `bytes` holding `out.size()` elements of `dtype` into floats.
inline void decode_to_f32(DType dtype, std::span<const std::byte> bytes, std::span<float> out) {
    if (out.empty()) return;  // an empty tensor's span may be null, and memcpy(nullptr, ...) is undefined
    if (bytes.size() < out.size() * dtype_size(dtype))
        throw io_error("decode: " + std::to_string(bytes.size()) + " bytes cannot hold " + std::to_string(out.size()) +
                       " elements of " + std::string(dtype_name(dtype)));
    switch (dtype) {
    case DType::f32: std::memcpy(out.data(), bytes.data(), out.size() * 4); return;
    case DType::f64: return decode_each<double>(bytes, out, [](double v) { return float(v); });
    case DType::f16: return decode_each<std::uint16_t>(bytes, out, [](std::uint16_t v) { return f16{v}.to_float(); });
    case DType::bf16: return decode_each<std::uint16_t>(bytes, out, [](std::uint16_t v) { return bf16{v}.to_float(); });
    case DType::f8_e4m3:
        return decode_each<std::uint8_t>(bytes, out, [](std::uint8_t v) { return f8_e4m3{v}.to_float(); });
    case DType::f8_e5m2:  // e5m2 is the top byte of an IEEE half
        return decode_each<std::uint8_t>(bytes, out,
                                         [](std::uint8_t v) { return f16{std::uint16_t(v << 8)}.to_float(); });
    case DType::i64: return decode_each<std::int64_t>(bytes, out, [](std::int64_t v) { return float(v); });
    case DType::i32: return decode_each<std::int32_t>(bytes, out, [](std::int32_t v) { return float(v); });
    case DType::i16: return decode_each<std::int16_t>(bytes, out, [](std::int16_t v) { return float(v); });
    case DType::i8: return decode_each<std::int8_t>(bytes, out, [](std::int8_t v) { return float(v); });
    case DType::u64: return decode_each<std::uint64_t>(bytes, out, [](std::uint64_t v) { return float(v); });
    case DType::u32: return decode_each<std::uint32_t>(bytes, out, [](std::uint32_t v) { return float(v); });
    case DType::u16: return decode_each<std::uint16_t>(bytes, out, [](std::uint16_t v) { return float(v); });
    case DType::u8: return decode_each<std::uint8_t>(bytes, out, [](std::uint8_t v) { return float(v); });
    case DType::boolean: return decode_each<std::uint8_t>(bytes, out, [](std::uint8_t v) { return v ? 1.0f : 0.0f; });
    }
}

inline void check_output_size(const TensorRecord& r, std::size_t out_size) {
    if (out_size != std::size_t(r.numel()))
        throw io_error("tensor " + detail::quoted(r.name) + " " + format_shape(r.shape) + " has " +
                       std::to_string(r.numel()) + " elements, the output buffer " + std::to_string(out_size));
}

}  // namespace detail

/// The values of any record as floats (integers and booleans too), in row-major order; F8 codes are decoded
/// without any scale (see dequantize_fp8 for block-scaled weights).
inline void to_f32(const TensorRecord& r, std::span<float> out) {
    detail::check_output_size(r, out.size());
    detail::decode_to_f32(r.dtype, r.bytes, out);
}
inline std::vector<float> to_f32(const TensorRecord& r) {
    std::vector<float> out(std::size_t(r.numel()));
    to_f32(r, out);
    return out;
}

/// The shape scale_inv must have for a [rows, cols] weight in blocks of `block` (both positive): a ceiling
/// division written so that no sum can overflow, whatever block size a config.json states.
inline std::array<index_t, 2> fp8_scale_shape(std::span<const index_t> weight_shape, std::array<index_t, 2> block) {
    const auto blocks = [](index_t n, index_t b) { return n / b + (n % b != 0); };
    return {blocks(weight_shape[0], block[0]), blocks(weight_shape[1], block[1])};
}

/// Dequantises a 2-D F8 weight with its F32 `scale_inv` (block-wise inverse scales) into `out` (rows * cols).
/// Throws io_error naming the tensors on a wrong dtype or shape.
inline void dequantize_fp8(const TensorRecord& weight, const TensorRecord& scale_inv, std::array<index_t, 2> block,
                           std::span<float> out) {
    if (weight.dtype != DType::f8_e4m3 && weight.dtype != DType::f8_e5m2)
        throw io_error("tensor " + detail::quoted(weight.name) + " is " + std::string(dtype_name(weight.dtype)) +
                       ", not an FP8 weight");
    if (weight.shape.size() != 2)
        throw io_error("FP8 tensor " + detail::quoted(weight.name) + " has shape " +
                       detail::format_shape(weight.shape) + "; block dequantisation needs a 2-D [out, in] weight");
    if (block[0] <= 0 || block[1] <= 0)
        throw io_error("FP8 block size " + detail::format_shape(block) + " must be positive");
    const auto want = fp8_scale_shape(weight.shape, block);
    if (scale_inv.dtype != DType::f32 || scale_inv.shape.size() != 2 || scale_inv.shape[0] != want[0] ||
        scale_inv.shape[1] != want[1])
        throw io_error("tensor " + detail::quoted(scale_inv.name) + " is " + std::string(dtype_name(scale_inv.dtype)) +
                       " " + detail::format_shape(scale_inv.shape) + " but FP8 weight " + detail::quoted(weight.name) +
                       " " + detail::format_shape(weight.shape) + " in " + detail::format_shape(block) +
                       " blocks needs F32 " + detail::format_shape(want));
    detail::check_output_size(weight, out.size());

    detail::decode_to_f32(weight.dtype, weight.bytes, out);
    const index_t rows = weight.shape[0], cols = weight.shape[1], scale_cols = want[1];
    // want[0] * want[1] <= rows * cols, which the header check bounded; the record's own size is checked anyway.
    std::vector<float> scale(std::size_t(scale_inv.numel()));
    detail::decode_to_f32(DType::f32, scale_inv.bytes, scale);
    // a non-finite scale would make its whole block non-finite: name the scale, not the weight
    for (std::size_t k = 0; k < scale.size(); ++k)
        if (!std::isfinite(scale[k]))
            throw io_error("tensor " + detail::quoted(scale_inv.name) + " holds " +
                           (std::isnan(scale[k]) ? "NaN" : "an infinity") + " at [" +
                           std::to_string(index_t(k) / scale_cols) + ", " + std::to_string(index_t(k) % scale_cols) +
                           "], the inverse scale of a " + std::to_string(block[0]) + " x " + std::to_string(block[1]) +
                           " block of FP8 weight " + detail::quoted(weight.name) + "; a block scale must be finite");
    for (index_t i = 0; i < rows; ++i) {
        const float* scale_row = scale.data() + (i / block[0]) * scale_cols;
        float* row = out.data() + i * cols;
        for (index_t j = 0; j < cols; ++j) row[j] *= scale_row[j / block[1]];
    }
}

inline std::vector<float> dequantize_fp8(const TensorRecord& weight, const TensorRecord& scale_inv,
                                         std::array<index_t, 2> block = default_fp8_block) {
    std::vector<float> out(std::size_t(weight.numel()));
    dequantize_fp8(weight, scale_inv, block, out);
    return out;
}

}  // namespace moonmoe
