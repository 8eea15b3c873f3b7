// moonmoe/tensor/fp8_tiles.hpp: `Fp8Tiles<B>`, a matrix stored in FP8-E4M3 with one f32 scale per 1 x 128 tile.
//
// Kimi K2 stores the inputs of the MoE up-projections and of SwiGLU this way (technical report §2.4.3, "FP8
// storage for insensitive activations"); the tiles are DeepSeek-V3's "tile-wise" activation groups (DeepSeek-V3
// technical report §3.3.2), where weights use 128 x 128 blocks (default_fp8_block, tensor/dtype.hpp). FP8 is storage
// only: what is computed on the values is computed in f32 after dequantizing.
//
// A tile is 128 consecutive elements of one row; the last tile of a row is shorter when the row length is not a
// multiple of 128. Per tile, scale = amax(|x|) / 448 (f32, 448 = f8_e4m3::max_finite), or 1 when that is 0 (a tile
// of zeros); code = f8_e4m3::from_float(x / scale) (IEEE division, round to nearest even); the value read back is
// code.to_float() * scale. Fp8Ops<B> (backend/fp8.hpp) quantizes and dequantizes; docs/activation_memory.md states
// the error bound.
#pragma once

#include <cstddef>

#include "dtype.hpp"
#include "tensor.hpp"

namespace moonmoe {

/// Elements of one tile: 128 consecutive elements of a row.
inline constexpr index_t fp8_tile_width = 128;

/// Tiles (and scales) per row of `cols` elements: ceil(cols / 128).
constexpr index_t fp8_tiles_per_row(index_t cols) { return (cols + fp8_tile_width - 1) / fp8_tile_width; }

/// Bytes of an [rows, cols] matrix as Fp8Tiles: a byte per element and a 4-byte scale per tile,
/// rows * cols + 4 * rows * ceil(cols / 128).
constexpr std::size_t fp8_tiles_bytes(index_t rows, index_t cols) {
    const auto r = std::size_t(rows);
    return r * std::size_t(cols) + sizeof(float) * r * std::size_t(fp8_tiles_per_row(cols));
}

/// An FP8-E4M3 matrix [rows, cols] in 1 x 128 tiles: codes [rows, cols] and scales [rows, ceil(cols / 128)], both
/// contiguous on backend B (zeroed on construction).
template <class B = cpu>
struct Fp8Tiles {
    Tensor<f8_e4m3, 2, B> codes;
    Tensor<float, 2, B> scales;

    Fp8Tiles() = default;
    Fp8Tiles(index_t rows, index_t cols) : codes({rows, cols}), scales({rows, fp8_tiles_per_row(cols)}) {}
    explicit Fp8Tiles(Shape<2> shape) : Fp8Tiles(shape[0], shape[1]) {}

    index_t rows() const { return codes.size(0); }
    index_t cols() const { return codes.size(1); }
    const Shape<2>& shape() const { return codes.shape(); }
    /// The bytes held: fp8_tiles_bytes(rows(), cols()).
    std::size_t bytes() const { return codes.bytes() + scales.bytes(); }
};

}  // namespace moonmoe
