// moonmoe/backend/fp8.hpp: FP8-E4M3 storage of activations in 1 x 128 tiles (tensor/fp8_tiles.hpp).
//
// Fp8Ops<B>:
//   quantize_fp8_tiles(x, codes, scales)
//                                for each tile (128 consecutive elements of a row of x, the last one of a row
//                                shorter): scales[i, k] = amax / 448, or 1 when that is 0; codes = f8_e4m3(x / scale),
//                                rounded to nearest even. x [rows, cols] f32, codes [rows, cols],
//                                scales [rows, ceil(cols / 128)]
//   dequantize_fp8_tiles(codes, scales, x)
//                                x[i, j] = float(codes[i, j]) * scales[i, j / 128]
// Every view has unit column stride and any row pitch (an Fp8Tiles' tensors, or slices of larger ones). The arithmetic
// is that of torch (tools/make_fp8_reference.py): x / scale is a division, not a product by 1 / scale, so the codes
// are torch's bit for bit. A NaN in a tile makes its scale and every code of it NaN (as torch's amax propagates
// it); an inf makes the scale inf, the tile's finite values 0 and the inf NaN. Each tile is computed on its own, and
// its amax is a maximum (no order), so results never depend on the thread or block split.
#pragma once

#include <cstdint>
#include <string>

#include "../config/macros.hpp"
#include "../tensor/dtype.hpp"
#include "../tensor/fp8_tiles.hpp"
#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct Fp8Ops {
    static_assert(missing_backend<B>,
                  "moonmoe: no fp8 primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// The per-tile arithmetic both backends share.
namespace fp8_tiles {

/// |x| as bits. Non-negative floats order as their bits do, and a NaN's bits lie above inf's, so the maximum of
/// these over a tile is its amax with a NaN winning: an integer maximum, which vectorises and needs no NaN test.
MOONMOE_HD constexpr std::uint32_t magnitude_bits(float x) { return detail::float_bits(x) & 0x7FFFFFFFu; }

/// The scale of a tile from its amax bits: amax / 448, or 1 when that is 0 (all zeros, or amax below 448 times
/// the smallest float), so no 0 / 0 arises.
MOONMOE_HD constexpr float tile_scale(std::uint32_t amax_bits) {
    const float s = detail::bits_float(amax_bits) / f8_e4m3::max_finite;
    return s == 0.0f ? 1.0f : s;
}

MOONMOE_HD constexpr f8_e4m3 encode(float x, float scale) { return f8_e4m3::from_float(x / scale); }
MOONMOE_HD constexpr float decode(f8_e4m3 code, float scale) { return code.to_float() * scale; }

}  // namespace fp8_tiles

/// The argument checks every backend's Fp8Ops runs before touching data (shapes and strides only), so both
/// backends reject the same calls with the same messages.
namespace contract {

template <class X, class C, class S>
void check_fp8_tiles(const char* op, const X& x, const C& codes, const S& scales) {
    const auto fail = [&](const std::string& what) { throw shape_error(std::string(op) + ": " + what); };
    if (codes.shape != x.shape)
        fail("codes are " + shape_string(codes.shape) + ", expected " + shape_string(x.shape) + " (the shape of x)");
    const Shape<2> want{x.shape[0], fp8_tiles_per_row(x.shape[1])};
    if (scales.shape != want)
        fail("scales are " + shape_string(scales.shape) + ", expected " + shape_string(want) + " (one per " +
             std::to_string(fp8_tile_width) + " columns of x " + shape_string(x.shape) + ")");
    const auto unit_columns = [&](const char* name, const auto& v) {
        if (v.strides[1] != 1 && v.shape[1] > 1)
            fail(std::string(name) + " " + shape_string(v.shape) + " must have contiguous rows (column stride " +
                 std::to_string(v.strides[1]) + ")");
    };
    unit_columns("x", x);
    unit_columns("codes", codes);
    unit_columns("scales", scales);
}

}  // namespace contract

}  // namespace moonmoe::backend
