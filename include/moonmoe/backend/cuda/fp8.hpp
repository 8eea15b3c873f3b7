// moonmoe/backend/cuda/fp8.hpp: Fp8Ops<cuda> (backend/fp8.hpp): FP8-E4M3 tiles on the device.
//
// quantize_fp8_tiles is, under nvcc, a kernel with a warp per tile: lane l loads elements l, l + 32, l + 64 and
// l + 96 of its tile (coalesced), one __reduce_max_sync of their magnitude bits gives the amax, then each lane
// encodes its elements. The emulated mode runs a functor with a thread per tile on Thrust's OpenMP system instead.
// Both compute each code from x and the tile's scale alone with the arithmetic of backend/fp8.hpp (nvcc's float
// division is IEEE unless -prec-div=false or --use_fast_math), and an amax is a maximum, so the two give the same
// bits, the CPU's and torch's. dequantize_fp8_tiles is a map with a thread per element.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cstdint>

#include "../../tensor/tensor.hpp"
#include "../fp8.hpp"
#if !MOONMOE_CUDA_EMULATED
#include "fast/warp.hpp"
#endif

namespace moonmoe::backend {

namespace cuda_fp8_detail {

using cuda_detail::Strided;

#if MOONMOE_CUDA_EMULATED
/// Tile k = i * tiles + t (row i, columns [128 t, 128 t + 128) cut at cols), by one thread.
struct QuantizeTile {
    Strided<const float> x;
    Strided<f8_e4m3> codes;
    Strided<float> scales;
    index_t cols, tiles;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k / tiles, t = k % tiles, lo = t * fp8_tile_width;
        const index_t n = cols - lo < fp8_tile_width ? cols - lo : fp8_tile_width;
        const float* in = x.data + i * x.pitch + lo;
        f8_e4m3* out = codes.data + i * codes.pitch + lo;
        std::uint32_t amax = 0;
        for (index_t j = 0; j < n; ++j) {
            const std::uint32_t m = fp8_tiles::magnitude_bits(in[j]);
            amax = m > amax ? m : amax;
        }
        const float s = fp8_tiles::tile_scale(amax);
        for (index_t j = 0; j < n; ++j) out[j] = fp8_tiles::encode(in[j], s);
        scales.data[i * scales.pitch + t] = s;
    }
};
#else
inline constexpr int quantize_warps_per_block = 8;
inline constexpr int quantize_per_lane = int(fp8_tile_width) / 32;
static_assert(fp8_tile_width % 32 == 0, "a warp covers a tile in whole strides of 32 elements");

/// A warp per tile, quantize_warps_per_block tiles per block.
// A template (of nothing) so that every translation unit that includes this header may define it: a plain
// __global__ function defined in a header is defined again by each .cu file, and the link fails.
template <class = void>
__global__ void __launch_bounds__(32 * quantize_warps_per_block)
    quantize_fp8_tiles_kernel(const float* x, index_t x_pitch, f8_e4m3* codes, index_t codes_pitch, float* scales,
                              index_t scales_pitch, index_t rows, index_t cols, index_t tiles) {
    const index_t tile = index_t(blockIdx.x) * quantize_warps_per_block + threadIdx.x / 32;
    if (tile >= rows * tiles) return;  // the whole warp leaves together
    const index_t lane = threadIdx.x % 32, i = tile / tiles, t = tile % tiles, lo = t * fp8_tile_width;
    const index_t n = cols - lo < fp8_tile_width ? cols - lo : fp8_tile_width;
    const float* in = x + i * x_pitch + lo;
    float v[quantize_per_lane];
    std::uint32_t amax = 0;
#pragma unroll
    for (int u = 0; u < quantize_per_lane; ++u) {
        const index_t j = lane + 32 * u;
        v[u] = j < n ? in[j] : 0.0f;
        amax = max(amax, fp8_tiles::magnitude_bits(v[u]));
    }
    amax = __reduce_max_sync(cuda_fast::full_warp, amax);
    const float s = fp8_tiles::tile_scale(amax);
    f8_e4m3* out = codes + i * codes_pitch + lo;
#pragma unroll
    for (int u = 0; u < quantize_per_lane; ++u) {
        const index_t j = lane + 32 * u;
        if (j < n) out[j] = fp8_tiles::encode(v[u], s);
    }
    if (lane == 0) scales[i * scales_pitch + t] = s;
}
#endif

/// x = float(code) * scale of the code's tile (map_indexed over x and codes).
struct DequantizeElement {
    const float* scales;
    index_t scales_pitch;
    MOONMOE_HD void operator()(index_t i, index_t j, float& x, f8_e4m3 code) const {
        x = fp8_tiles::decode(code, scales[i * scales_pitch + j / fp8_tile_width]);
    }
};

}  // namespace cuda_fp8_detail

template <>
struct Fp8Ops<cuda> {
    /// codes, scales = the 1 x 128 tiles of x (backend/fp8.hpp)
    static void quantize_fp8_tiles(View<const float, 2, cuda> x, View<f8_e4m3, 2, cuda> codes,
                                   View<float, 2, cuda> scales) {
        contract::check_fp8_tiles("quantize_fp8_tiles", x, codes, scales);
        const index_t rows = x.shape[0], cols = x.shape[1], tiles = fp8_tiles_per_row(cols);
        if (rows == 0 || cols == 0) return;
#if MOONMOE_CUDA_EMULATED
        using cuda_detail::strided;
        cuda_detail::launch(rows * tiles,
                            cuda_fp8_detail::QuantizeTile{strided(x), strided(codes), strided(scales), cols, tiles});
#else
        using namespace cuda_fp8_detail;
        const index_t blocks = (rows * tiles + quantize_warps_per_block - 1) / quantize_warps_per_block;
        quantize_fp8_tiles_kernel<><<<unsigned(blocks), 32 * quantize_warps_per_block, 0, current_stream()>>>(
            x.data, x.strides[0], codes.data, codes.strides[0], scales.data, scales.strides[0], rows, cols, tiles);
        cuda_fast::check_launch("quantize_fp8_tiles_kernel<<<...>>>");
#endif
    }

    /// x = the values the tiles hold, float(code) * scale (backend/fp8.hpp)
    static void dequantize_fp8_tiles(View<const f8_e4m3, 2, cuda> codes, View<const float, 2, cuda> scales,
                                     View<float, 2, cuda> x) {
        contract::check_fp8_tiles("dequantize_fp8_tiles", x, codes, scales);
        MapOps<cuda>::map_indexed(cuda_fp8_detail::DequantizeElement{scales.data, scales.strides[0]}, x, codes);
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
