// moonmoe/backend/cpu/fp8.hpp: Fp8Ops<cpu> (backend/fp8.hpp): FP8-E4M3 tiles, rows in parallel on the thread pool.
//
// Work is cut as MapOps' is (whole rows; rows longer than 4096 columns in blocks of 4096, 32 whole tiles). Each tile is
// two passes over at most 128 contiguous floats: the amax as an integer maximum, then the codes; both are plain
// loops that the compiler vectorises (the e4m3 rounding's branches become selects).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../../tensor/tensor.hpp"
#include "../fp8.hpp"
#include "map.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

namespace cpu_detail {
static_assert(map_block_columns % fp8_tile_width == 0, "for_each_block's column blocks must hold whole tiles");

/// Calls tile(row, lo, hi) for every tile [lo, hi) of the rows of an [rows, cols] matrix, in parallel.
template <class Tile>
void for_each_fp8_tile(index_t rows, index_t cols, const Tile& tile) {
    for_each_block(rows, cols, [&](index_t i, index_t lo, index_t hi) {
        for (index_t t = lo; t < hi; t += fp8_tile_width) tile(i, t, std::min(hi, t + fp8_tile_width));
    });
}

/// A full tile's length as a constant: loops of a fixed trip count, which GCC vectorises at -O2 as well as -O3.
using FullTile = std::integral_constant<index_t, fp8_tile_width>;

/// The n elements of one tile: its scale, returned, and its codes.
template <class N>
float quantize_tile(const float* __restrict in, f8_e4m3* __restrict out, N n) {
    std::uint32_t amax = 0;
    for (index_t j = 0; j < index_t(n); ++j) amax = std::max(amax, fp8_tiles::magnitude_bits(in[j]));
    const float s = fp8_tiles::tile_scale(amax);
    for (index_t j = 0; j < index_t(n); ++j) out[j] = fp8_tiles::encode(in[j], s);
    return s;
}

template <class N>
void dequantize_tile(const f8_e4m3* __restrict in, float s, float* __restrict out, N n) {
    for (index_t j = 0; j < index_t(n); ++j) out[j] = fp8_tiles::decode(in[j], s);
}
}  // namespace cpu_detail

template <>
struct Fp8Ops<cpu> {
    /// codes, scales = the 1 x 128 tiles of x (backend/fp8.hpp)
    static void quantize_fp8_tiles(View<const float, 2> x, View<f8_e4m3, 2> codes, View<float, 2> scales) {
        using namespace cpu_detail;
        contract::check_fp8_tiles("quantize_fp8_tiles", x, codes, scales);
        for_each_fp8_tile(x.shape[0], x.shape[1], [&](index_t i, index_t lo, index_t hi) {
            const float* in = x.data + i * x.strides[0] + lo;
            f8_e4m3* out = codes.data + i * codes.strides[0] + lo;
            scales.data[i * scales.strides[0] + lo / fp8_tile_width] =
                hi - lo == fp8_tile_width ? quantize_tile(in, out, FullTile{}) : quantize_tile(in, out, hi - lo);
        });
    }

    /// x = the values the tiles hold, float(code) * scale (backend/fp8.hpp)
    static void dequantize_fp8_tiles(View<const f8_e4m3, 2> codes, View<const float, 2> scales, View<float, 2> x) {
        using namespace cpu_detail;
        contract::check_fp8_tiles("dequantize_fp8_tiles", x, codes, scales);
        for_each_fp8_tile(x.shape[0], x.shape[1], [&](index_t i, index_t lo, index_t hi) {
            const f8_e4m3* in = codes.data + i * codes.strides[0] + lo;
            float* out = x.data + i * x.strides[0] + lo;
            const float s = scales.data[i * scales.strides[0] + lo / fp8_tile_width];
            if (hi - lo == fp8_tile_width) dequantize_tile(in, s, out, FullTile{});
            else
                dequantize_tile(in, s, out, hi - lo);
        });
    }
};

}  // namespace moonmoe::backend
