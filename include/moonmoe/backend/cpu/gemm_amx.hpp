// moonmoe/backend/cpu/gemm_amx.hpp: the library's bf16 GEMM on AMX tiles, C = alpha op(A) op(B) + beta C with bf16
// operands and an f32 C, on the pool.
//
// Intel's Advanced Matrix Extensions (Intel 64 and IA-32 Architectures Software Developer's Manual, vol. 1, chapter
// 20; the instructions in vol. 2: LDTILECFG, TILELOADD, TDPBF16PS, TILESTORED) hold eight tiles of 16 rows x 64
// bytes; TDPBF16PS adds to a 16 x 16 f32 tile the products of a 16 x 32 bf16 tile of A with a 32 x 16 bf16 tile of B,
// B given as 16 rows of k-pairs ("VNNI" order: row p holds (B[2p][j], B[2p+1][j]) for j = 0..15). The blocking is
// gemm_packed.hpp's (Goto and van de Geijn's) with AMX's tiles: op(A) packed once in micro-panels of 32 rows x kc
// (rows contiguous), op(B) in blocks of kc x nc cut into micro-panels of kc x 32 in k-pair order; the micro-kernel
// holds a 32 x 32 tile of C in four accumulator tiles and, per 32 values of k, loads two tiles of A and two of B for
// four TDPBF16PS. Between k blocks a tile's sums wait in an f32 scratch whose rows are apart by a stride that spreads
// them over L1's sets, and come back into the tiles at the next block, so every element is summed in one order
// whatever the cut; after the last, alpha times them plus beta C goes to C, rounded once where C is bf16
// (Newton-Schulz's products, as torch's bf16 mm and addmm: one rounding of alpha A B + beta C), and a large f32 C
// is written by non-temporal stores. A symmetric product X X^T (Newton-Schulz's X X^T and A A) computes only the tiles
// on and below the diagonal and writes each also transposed above it: half the products, and C exactly symmetric.
//
// X W^T with few rows of X (up to amx_weight_rows) is computed the other way round, C^T = W X^T: W's rows are already
// what a tile of A is (16 rows of 32 consecutive k), so W, the large operand, is read once, as stored, straight into
// the tiles, and only X^T is packed; each 32 x 32 tile of C^T sums all of k in the tiles and is written to C
// transposed. A decoded token's products and a sparse expert's few tokens read their weight at the memory's rate.
// Up to 256 rows of X (one block of op(B)'s columns) and a wider W, X W^T is the general kernel's W X^T transposed
// back: W's rows are read in place as A, X^T is the one block of op(B), and W, read once, is not transposed in
// packing as op(B) = W^T would be (an expert's 192 tokens: 1.4x faster).
//
// Before a process may use the tiles, Linux must grant it their state (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA: Documentation/arch/x86/xstate.rst in the kernel's sources); amx_gemm_available() asks once. Each thread
// loads the tile configuration before its part and releases the tiles after.
//
// TDPBF16PS multiplies bf16 exactly and sums in f32 with denormal inputs and results flushed to zero (SDM vol. 2,
// TDPBF16PS), so results differ from the widened f32 kernels' in rounding only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "cpu_features.hpp"
#include "gemm_packed.hpp"
#include "memory.hpp"
#include "threads.hpp"

#if MOONMOE_PACKED_GEMM_AVX512 && defined(__linux__) && ((defined(__GNUC__) && __GNUC__ >= 11) || defined(__clang__))
#define MOONMOE_AMX_GEMM 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MOONMOE_TARGET_AMX __attribute__((target("avx512f,avx512bw,amx-tile,amx-bf16")))
#else
#define MOONMOE_AMX_GEMM 0
#endif

namespace moonmoe::backend::cpu_detail {

/// Whether gemm_amx may be called: the CPU has AMX-TILE and AMX-BF16 with their state enabled by the operating
/// system, it has AVX-512 (the packing and the epilogue), and Linux granted this process the tile data (asked once).
inline bool amx_gemm_available() noexcept {
#if MOONMOE_AMX_GEMM
    static const bool granted = [] {
        if (!cpu_features().amx_bf16 || !packed_gemm_available()) return false;
        constexpr long request_permission = 0x1023, tile_data = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
        return ::syscall(SYS_arch_prctl, request_permission, tile_data) == 0;
    }();
    return granted;
#else
    return false;
#endif
}

/// The AMX kernel's blocking: a micro-tile of C of mr x nr (2 x 2 tiles of 16 x 16), op(A) packed in micro-panels
/// of mr rows x kc (128 KiB, from L2), op(B) in blocks of kc x nc (1 MiB: half of L2 on the Sapphire Rapids Xeons,
/// 2 MiB per core). All of op(A) passes through L2 once for every block of nc columns, from L3 where it is larger than
/// L2: nc 256 measured 10-20 % faster than 128 on the K2 products of 1024 rows, 384 and 512 slower (docs/cpu_gemm.md).
struct AmxBlocking {
    static constexpr index_t mr = 32, nr = 32, kc = 2048, nc = 256, tile_k = 32;
    /// An A micro-panel's rows 4 KiB + 64 bytes apart: at 4 KiB, the 16 rows of a tile load all fall in one set of
    /// L1 (of 64 sets of 64-byte lines)
    static constexpr index_t a_ld = kc + 32;
    /// The rows of C's sums between k blocks 1 KiB + 64 bytes apart, for the same reason (K2's C rows are 6-48 KiB
    /// apart, each a multiple of 2 KiB: kept in C itself, a tile's 16 rows fell in one or two sets)
    static constexpr index_t acc_ld = nc + 16;
    /// An f32 C of at least this many bytes (twice a core's L2) is written past the caches (non-temporal stores, no
    /// read of its lines first): it would not stay in L2, and a tile's rows far apart in C thrash L1's sets as they
    /// are stored
    static constexpr std::size_t stream_c_bytes = std::size_t(4) << 20;
};

/// Whether gemm_amx reads op(A)'s rows where they are, as the tiles of A, instead of packing them: A not transposed,
/// its rows whole tiles (m a multiple of 32, k of 32), and every row starting on a 64-byte line (a tile row across
/// two lines costs two: 25-30 % on the K2 products, where packing costs a few percent).
inline bool amx_reads_a_in_place(Trans ta, View<const bf16, 2> A, index_t m, index_t k) {
    const auto line = [](std::uintptr_t bytes) { return bytes % 64 == 0; };
    return ta == Trans::no && m % AmxBlocking::mr == 0 && k % AmxBlocking::tile_k == 0 &&
           line(reinterpret_cast<std::uintptr_t>(A.data)) && line(std::uintptr_t(A.strides[0]) * sizeof(bf16));
}

#if MOONMOE_AMX_GEMM

namespace amx {

using P = AmxBlocking;

/// LDTILECFG's 64 bytes (SDM vol. 1, section 20.5): palette 1, and per tile its rows and bytes per row.
struct alignas(64) TileConfig {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t bytes_per_row[16] = {};
    std::uint8_t rows[16] = {};
};

/// Tiles 0-3 hold C's four 16 x 16 f32 quarters, 4-5 two 16 x 32 bf16 tiles of A, 6-7 two tiles of B in k-pairs:
/// all 16 rows of 64 bytes.
inline TileConfig tile_config() {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
        c.bytes_per_row[t] = 64;
        c.rows[t] = 16;
    }
    return c;
}

/// The kc values of a block rounded up to whole tiles (the packed operands are zero past kc).
inline index_t padded(index_t kc) { return (kc + P::tile_k - 1) / P::tile_k * P::tile_k; }

/// Rows of op(A) the micro-kernel brings into L2 as it runs, one line of each per 32 values of k: `rows` rows from
/// `first`, `ld` elements apart (none where rows is 0).
struct RowsAhead {
    const bf16* first = nullptr;
    index_t ld = 0, rows = 0;
};

/// The micro-kernel: out [32][w] (f32, rows ld_out apart) = in + a b over kcp (a multiple of 32), in [32][w] (rows
/// ld_in apart; may be out itself) or zero (in null); a 32 rows of bf16, lda apart (an A micro-panel, or 32 rows of a
/// weight as stored), b a B micro-panel in k-pairs ([kcp / 2][32][2]) of which the first w columns (32, or 16: half
/// the tiles of B and of C, for X W^T of up to 16 tokens); `ahead`'s rows prefetched over the same k, and the sums
/// the next call starts from (`next_in`, [32][32], rows ld_in apart; none where null) brought into L1, a share of
/// their 64 lines per step of k.
template <index_t w = P::nr>
MOONMOE_TARGET_AMX inline void micro_kernel(index_t kcp, const bf16* a, index_t lda, const bf16* b, const float* in,
                                            index_t ld_in, float* out, index_t ld_out, RowsAhead ahead = {},
                                            const float* next_in = nullptr) {
    static_assert(w == P::nr || w == P::nr / 2);
    constexpr bool both = w == P::nr;  // the second tile of B's columns, and C's tiles 1 and 3
    if (in) {
        const std::size_t in_stride = std::size_t(ld_in) * sizeof(float);
        _tile_loadd(0, in, in_stride);
        if (both) _tile_loadd(1, in + 16, in_stride);
        _tile_loadd(2, in + 16 * ld_in, in_stride);
        if (both) _tile_loadd(3, in + 16 * ld_in + 16, in_stride);
    } else {
        _tile_zero(0);
        if (both) _tile_zero(1);
        _tile_zero(2);
        if (both) _tile_zero(3);
    }
    const std::size_t a_stride = std::size_t(lda) * sizeof(bf16);
    constexpr std::size_t b_stride = 2 * P::nr * sizeof(bf16);
    // each product issued as soon as its two tiles are loaded, the next load behind it (all four loads first was
    // 4-11 % slower on K2's products of 1024 tokens: docs/cpu_gemm.md)
    constexpr index_t next_lines = 2 * P::mr;
    const index_t per_step = (next_lines + kcp / P::tile_k - 1) / (kcp / P::tile_k);  // of next_in's lines
    for (index_t k = 0, l0 = 0; k < kcp; k += P::tile_k, l0 += per_step) {
        for (index_t r = 0; r < ahead.rows; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(ahead.first + r * ahead.ld + k), _MM_HINT_T2);
        if (next_in)
            for (index_t l = l0; l < std::min(next_lines, l0 + per_step); ++l)
                _mm_prefetch(reinterpret_cast<const char*>(next_in + (l / 2) * ld_in + (l % 2) * 16), _MM_HINT_T0);
        _tile_loadd(4, a + k, a_stride);
        _tile_loadd(6, b + k * P::nr, b_stride);  // pair-rows k/2 .. k/2 + 15, columns 0-15
        _tile_dpbf16ps(0, 4, 6);
        if (both) {
            _tile_loadd(7, b + k * P::nr + 32, b_stride);  // columns 16-31
            _tile_dpbf16ps(1, 4, 7);
        }
        _tile_loadd(5, a + 16 * lda + k, a_stride);
        _tile_dpbf16ps(2, 5, 6);
        if (both) _tile_dpbf16ps(3, 5, 7);
    }
    const std::size_t out_stride = std::size_t(ld_out) * sizeof(float);
    _tile_stored(0, out, out_stride);
    if (both) _tile_stored(1, out + 16, out_stride);
    _tile_stored(2, out + 16 * ld_out, out_stride);
    if (both) _tile_stored(3, out + 16 * ld_out + 16, out_stride);
}

// GCC 12 warns that the _mm512_undefined_*() inside intrinsics (the unpacks of transpose16 (gemm_small.hpp), the cast
// of load_c) "may be used" or "is used uninitialized" where they are inlined below (a false positive: those lanes are
// all overwritten or never read); the same transpose in gemm_packed.hpp draws no warning.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

/// 16 elements of C at c (the lanes of mask; the others read as zero), widened to f32 from a bf16 C.
MOONMOE_TARGET_AMX inline __m512 load_c(const float* c, __mmask16 mask) { return _mm512_maskz_loadu_ps(mask, c); }
MOONMOE_TARGET_AMX inline __m512 load_c(const bf16* c, __mmask16 mask) {
    const __m256i raw = _mm512_castsi512_si256(_mm512_maskz_loadu_epi16(__mmask32(mask), c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

/// Stores the lanes of mask of v at c, rounded to a bf16 C as bf16::from_float rounds (to nearest even, every NaN
/// as 0x7FC0).
MOONMOE_TARGET_AMX inline void store_c(float* c, __mmask16 mask, __m512 v) { _mm512_mask_storeu_ps(c, mask, v); }
MOONMOE_TARGET_AMX inline void store_c(bf16* c, __mmask16 mask, __m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm512_mask_cvtepi32_storeu_epi16(c, mask, r);
}

/// Stores alpha v + beta C at c (the lanes of mask; C unread when beta is 0), rounded once where C is bf16, and
/// returns the f32 value stored. With `stream` (an f32 C and beta 0), 16 lanes that fill a line of C go there by a
/// non-temporal store, which reads no line of C first (and would fault off a line).
template <class TC>
MOONMOE_TARGET_AMX inline __m512 scale_to_c(TC* c, __mmask16 mask, __m512 v, float alpha, float beta,
                                            bool stream = false) {
    __m512 r = _mm512_mul_ps(_mm512_set1_ps(alpha), v);
    if constexpr (std::is_same_v<TC, float>)
        if (stream && mask == __mmask16(0xffff) && reinterpret_cast<std::uintptr_t>(c) % 64 == 0) {
            _mm512_stream_ps(c, r);
            return r;
        }
    if (beta != 0.0f) r = _mm512_fmadd_ps(_mm512_set1_ps(beta), load_c(c, mask), r);
    store_c(c, mask, r);
    return r;
}

/// The 16 x 16 quarter (qi, qj) of a tile's sums in buf ([32][32]) transposed: r[y] holds its column y, its rows as
/// the lanes.
MOONMOE_TARGET_AMX inline void transposed_quarter(const float* buf, index_t qi, index_t qj, __m512 (&r)[16]) {
    for (index_t x = 0; x < 16; ++x) r[x] = _mm512_load_ps(buf + (16 * qi + x) * P::nr + 16 * qj);
    transpose16(r);
}

/// A view of C [m, n] as C^T [n, m]: its rows C's columns, element (j, i) at C's (i, j).
template <class TC>
View<TC, 2> transposed(View<TC, 2> C) {
    return View<TC, 2>(C.data, {C.shape[1], C.shape[0]}, {C.strides[1], C.strides[0]});
}

/// The last step of a tile whose sums are all in buf ([32][32]): C's tile at (i0, j0) (its first `rows` rows and `w`
/// columns) = alpha buf + beta C (C unread when beta is 0), rounded once where C is bf16, through scale_to_c (so
/// streamed where `stream` and a line is whole). C given as transposed(C) (its columns contiguous: a product computed
/// as C^T = op(B)^T op(A)^T) takes the tile's quarters transposed in registers, written along C's own rows. With
/// `mirror` (a symmetric product), only its elements on and below C's diagonal, each written also at its mirror image
/// above the diagonal (the tile transposed in registers), so that C comes out exactly symmetric; C is read on and
/// below it only.
template <class TC>
MOONMOE_TARGET_AMX void finish_tile(float* buf, View<TC, 2> C, index_t i0, index_t j0, index_t rows, index_t w,
                                    float alpha, float beta, bool mirror, bool stream = false) {
    if (C.strides[1] != 1) {  // row i0 + x of C^T is column i0 + x of C
        const index_t ldc = C.strides[1];
        for (index_t qi = 0; qi < 2 && 16 * qi < rows; ++qi)
            for (index_t qj = 0; qj < 2 && 16 * qj < w; ++qj) {
                __m512 r[16];
                transposed_quarter(buf, qi, qj, r);  // r[y]: row j0 + 16 qj + y of C, from column i0 + 16 qi
                const __mmask16 lanes = packed::lanes(rows - 16 * qi);
                for (index_t y = 0; y < std::min<index_t>(16, w - 16 * qj); ++y)
                    scale_to_c(C.data + (j0 + 16 * qj + y) * ldc + i0 + 16 * qi, lanes, r[y], alpha, beta, stream);
            }
        return;
    }
    const index_t ldc = C.strides[0];
    for (index_t i = 0; i < rows; ++i)
        for (index_t h = 0; h < 2; ++h) {
            const index_t width = mirror ? std::min(w, i0 + i - j0 + 1) : w;  // columns j0 + j <= row i0 + i
            const __mmask16 mask = packed::lanes(width - 16 * h);
            if (!mask) continue;
            float* sums = buf + i * P::nr + 16 * h;
            const __m512 r =
                scale_to_c(C.data + (i0 + i) * ldc + j0 + 16 * h, mask, _mm512_load_ps(sums), alpha, beta, stream);
            if (mirror) _mm512_store_ps(sums, r);
        }
    if (!mirror) return;
    for (index_t qi = 0; qi < 2; ++qi)
        for (index_t qj = 0; qj < 2; ++qj) {
            const index_t r0 = i0 + 16 * qi, c0 = j0 + 16 * qj;              // the quarter's first row and column in C
            if (16 * qi >= rows || 16 * qj >= w || r0 + 15 <= c0) continue;  // nothing strictly below the diagonal
            __m512 r[16];
            transposed_quarter(buf, qi, qj, r);  // r[y]: column c0 + y of the quarter, rows r0 .. r0 + 15
            const __mmask16 valid = packed::lanes(rows - 16 * qi);
            for (index_t y = 0; y < std::min<index_t>(16, w - 16 * qj); ++y) {
                const __mmask16 below = valid & __mmask16(~packed::lanes(c0 + y - r0 + 1));  // rows r0 + x > c0 + y
                if (below) store_c(C.data + (c0 + y) * ldc + r0, below, r[y]);
            }
        }
}

/// Lanes 0 .. w - 1 of a 32-lane mask (none where w <= 0).
inline __mmask32 first_lanes(index_t w) { return w >= 32 ? ~__mmask32(0) : w <= 0 ? 0 : (__mmask32(1) << w) - 1; }

/// Rows k and k + 1 of 32 bf16 each (r0, r1) as k-pairs, the 32-bit words (r0[j], r1[j]) in the order of j: those of
/// columns 0-15 in `low`, of 16-31 in `high`.
MOONMOE_TARGET_AMX inline void k_pairs(__m512i r0, __m512i r1, __m512i& low, __m512i& high) {
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37,
                                        5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    low = _mm512_permutex2var_epi16(r0, lo, r1);
    high = _mm512_permutex2var_epi16(r0, _mm512_add_epi16(lo, _mm512_set1_epi16(16)), r1);
}

/// Packs rows [i0, i0 + rows) x columns [k0, k0 + kc) of op(A) into an A micro-panel at dst (32 rows P::a_ld apart,
/// zero past `rows` and past kc up to whole tiles; dst on a line).
MOONMOE_TARGET_AMX inline void pack_a(Trans ta, View<const bf16, 2> A, index_t i0, index_t rows, index_t k0, index_t kc,
                                      bf16* dst) {
    const index_t lda = A.strides[0], kcp = padded(kc);
    if (ta == Trans::yes) {
        // row k of A holds column k of op(A): rows k and k + 1 as k-pairs (a 32-bit word per row of op(A)), then 16
        // pairs x 16 rows transposed as words, so that each row of the panel takes 32 values of k in one store (one
        // element at a time was 8 % of dY^T X's time, 2048 x 7168 x 1024 at one thread)
        const std::uint16_t* raw = reinterpret_cast<const std::uint16_t*>(A.data) + k0 * lda + i0;
        const __mmask32 cols = first_lanes(rows);
        for (index_t kk = 0; kk < kcp; kk += P::tile_k) {
            __m512 words[2][16];  // [h][p]: pair p of rows 16 h .. 16 h + 15
            for (index_t p = 0; p < 16; ++p) {
                const index_t k = kk + 2 * p;  // rows of A past kc read as zero
                const __m512i r0 = k < kc ? _mm512_maskz_loadu_epi16(cols, raw + k * lda) : _mm512_setzero_si512();
                const __m512i r1 =
                    k + 1 < kc ? _mm512_maskz_loadu_epi16(cols, raw + (k + 1) * lda) : _mm512_setzero_si512();
                __m512i low, high;
                k_pairs(r0, r1, low, high);
                words[0][p] = _mm512_castsi512_ps(low), words[1][p] = _mm512_castsi512_ps(high);
            }
            for (index_t h = 0; h < 2 && 16 * h < rows; ++h) {
                transpose16(words[h]);  // words[h][x]: the 16 pairs of row 16 h + x
                for (index_t x = 0; x < std::min<index_t>(16, rows - 16 * h); ++x)
                    _mm512_store_si512(dst + (16 * h + x) * P::a_ld + kk, _mm512_castps_si512(words[h][x]));
            }
        }
    }
    for (index_t i = 0; i < P::mr; ++i) {
        bf16* d = dst + i * P::a_ld;
        if (i >= rows) {
            std::fill(d, d + kcp, bf16{});
        } else if (ta == Trans::no) {
            std::memcpy(d, A.data + (i0 + i) * lda + k0, std::size_t(kc) * sizeof(bf16));
            std::fill(d + kc, d + kcp, bf16{});
        }
    }
}

/// Packs rows [k0, k0 + kc) x columns [j0, j0 + nc) of op(B) into B micro-panels in k-pairs ([kcp / 2][32][2] each,
/// zero past kc and past nc) at dst.
MOONMOE_TARGET_AMX inline void pack_b(Trans tb, View<const bf16, 2> B, index_t k0, index_t kc, index_t j0, index_t nc,
                                      bf16* dst) {
    const index_t ldb = B.strides[0], kcp = padded(kc);
    const auto* raw = reinterpret_cast<const std::uint16_t*>(B.data);
    const auto panel = [&](index_t jp) { return reinterpret_cast<std::uint16_t*>(dst + jp * kcp); };
    if (tb == Trans::yes) {
        // column j of op(B) is row j0 + j of B, contiguous in k: a k-pair is one 32-bit word of that row, so 16 rows
        // x 16 pairs transposed as 32-bit words give 16 pair-rows of 16 columns
        for (index_t jp = 0; jp < nc; jp += P::nr) {
            const index_t w = std::min(P::nr, nc - jp);
            std::uint16_t* d = panel(jp);
            for (index_t kk = 0; kk < kcp; kk += P::tile_k) {
                const __mmask32 mask = first_lanes(kc - kk);
                for (index_t h = 0; h < 2; ++h) {
                    __m512 r[16];
                    for (int i = 0; i < 16; ++i) {  // rows past w (columns of op(B) past nc) read as zero
                        const index_t j = std::min(16 * h + i, w - 1);
                        const __mmask32 row_mask = 16 * h + i < w ? mask : __mmask32(0);
                        r[i] = _mm512_castsi512_ps(
                            _mm512_maskz_loadu_epi16(row_mask, raw + (j0 + jp + j) * ldb + k0 + kk));
                    }
                    transpose16(r);
                    for (int p = 0; p < 16; ++p)
                        _mm512_store_si512(d + (kk / 2 + p) * 2 * P::nr + 32 * h, _mm512_castps_si512(r[p]));
                }
            }
        }
        return;
    }
    // row k of op(B) is row k of B: rows k and k + 1 interleaved element by element, both rows' nc columns at a time,
    // each micro-panel's 32 to their own place (a micro-panel at a time read 64 bytes of each of kc rows far apart:
    // X W, 1024 x 7168 x 2048, 7-17 % slower at one thread; docs/cpu_gemm.md)
    for (index_t p = 0; p < kcp / 2; ++p) {
        const index_t k = 2 * p;
        const std::uint16_t* row = raw + (k0 + std::min(k, kc - 1)) * ldb + j0;  // row k (k < kc where read)
        for (index_t jp = 0; jp < nc; jp += P::nr) {
            const __mmask32 mask = first_lanes(nc - jp);
            const __m512i r0 = k < kc ? _mm512_maskz_loadu_epi16(mask, row + jp) : _mm512_setzero_si512();
            const __m512i r1 = k + 1 < kc ? _mm512_maskz_loadu_epi16(mask, row + ldb + jp) : _mm512_setzero_si512();
            __m512i low, high;
            k_pairs(r0, r1, low, high);
            std::uint16_t* d = panel(jp) + p * 2 * P::nr;
            _mm512_store_si512(d, low);
            _mm512_store_si512(d + 32, high);
        }
    }
}

/// Columns [lo, hi) of C over all its m rows, with op(A) packed whole at ap (for each k block, its micro-panels in
/// turn): for each nc columns and each k block, that block of op(B) packed into bp, then the micro-kernel over every
/// A micro-panel and every B micro-panel (with `lower`, those on or below C's diagonal only, finished by
/// finish_tile's mirror). Each tile's sums stay in acc between k blocks (m rounded up to tiles x P::acc_ld, f32; only
/// needed with more than one k block) and the tile is finished after the last, streamed to C where `stream`. Loads
/// the tile configuration first and releases the tiles after (and fences the streamed stores).
template <class TC>
MOONMOE_TARGET_AMX void columns(View<const bf16, 2> A, Trans tb, View<const bf16, 2> B, index_t k, float alpha,
                                const bf16* ap, float beta, View<TC, 2> C, index_t lo, index_t hi, bf16* bp, float* acc,
                                bool lower, bool stream) {
    const TileConfig config = tile_config();
    _tile_loadconfig(&config);
    alignas(64) float buf[P::mr * P::nr];
    const index_t m = C.shape[0], panels = (m + P::mr - 1) / P::mr;
    const index_t lda = A.strides[0], a_ld = ap ? P::a_ld : lda;  // an A micro-panel's rows: packed, or A's own
    // blocks of equal width (whole micro-panels, at most P::nc), so that no last block is a narrow one that reads
    // all of op(A) again for a few columns
    const index_t blocks = (hi - lo + P::nc - 1) / P::nc;
    const index_t width = ((hi - lo + blocks - 1) / blocks + P::nr - 1) / P::nr * P::nr;
    for (index_t j0 = lo; j0 < hi; j0 += width) {
        const index_t nc = std::min(width, hi - j0);
        for (index_t k0 = 0; k0 < k; k0 += P::kc) {
            const index_t kc = std::min(P::kc, k - k0), kcp = padded(kc);
            const bool last = k0 + kc == k;
            pack_b(tb, B, k0, kc, j0, nc, bp);
            const bf16* a_block = ap ? ap + (k0 / P::kc) * panels * P::mr * P::a_ld : nullptr;
            for (index_t p = lower ? j0 / P::mr : 0; p < panels; ++p) {  // with lower, from the first that reaches j0
                const index_t i0 = p * P::mr;
                for (index_t jp = 0; jp < nc; jp += P::nr) {
                    if (lower && i0 + P::mr <= j0 + jp) continue;  // wholly above the diagonal
                    const index_t w = std::min(P::nr, nc - jp);
                    const index_t rows = std::min(P::mr, m - i0);
                    const bf16* b_panel = bp + jp * kcp;
                    const bf16* a_panel = ap ? a_block + p * P::mr * P::a_ld : A.data + i0 * lda + k0;
                    // the next A micro-panel, which comes from L3 or memory (op(A) is larger than L2, or read in
                    // place), brought into L2 while the B micro-panels pass this one, a share of its rows per B
                    // micro-panel (the micro-kernel alone, its tiles loaded from L3: 0.4-0.6 TFLOP/s, from L2 1.8-1.9;
                    // an expert's W of 2048 x 7168 against 192 tokens 6-8 % faster at one thread, 3-5 % at two, K2's
                    // products of 1024 tokens 0-9 % at one thread and level at two: docs/cpu_gemm.md)
                    RowsAhead ahead;
                    if (p + 1 < panels) {
                        const index_t q = jp / P::nr, micro_panels = (nc + P::nr - 1) / P::nr;
                        const index_t r0 = q * P::mr / micro_panels, r1 = (q + 1) * P::mr / micro_panels;
                        ahead = {a_panel + P::mr * a_ld + r0 * a_ld, a_ld, r1 - r0};
                    }
                    // the tile's sums over the k blocks so far in acc, not in C (rows 6-48 KiB apart in K2's
                    // products; C's tile kept in C between k blocks and written with ordinary stores: q_b, o_proj,
                    // X W and 2048^3 1-12 % slower at one thread, docs/cpu_gemm.md); after the first k block, the
                    // next tile's sums, which the A micro-panels read since have pushed out to L3, brought into L1
                    // during this tile (one thread, paired alternations: q_a and kv_a 4 % faster in one run of
                    // eight, q_a level in another of ten; o_proj and the 192-token expert level)
                    float* sums = acc + i0 * P::acc_ld + jp;
                    const float* in = k0 > 0 ? sums : nullptr;
                    const float* next = nullptr;
                    if (in) {
                        if (jp + P::nr < nc) next = sums + P::nr;
                        else if (p + 1 < panels)
                            next = acc + (i0 + P::mr) * P::acc_ld;
                    }
                    if (!last) {
                        micro_kernel(kcp, a_panel, a_ld, b_panel, in, P::acc_ld, sums, P::acc_ld, ahead, next);
                        continue;
                    }
                    micro_kernel(kcp, a_panel, a_ld, b_panel, in, P::acc_ld, buf, P::nr, ahead, next);
                    finish_tile(buf, C, i0, j0 + jp, rows, w, alpha, beta, lower, stream);
                }
            }
        }
    }
    _tile_release();
    if (stream) _mm_sfence();  // the streamed stores seen by whichever thread reads C next
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/// C = alpha op(A) op(B) + beta C on packed_driver::run: op(A) packed once (none where A's own rows fill whole tiles
/// on whole lines), then columns() on each part of C's columns, with a scratch for its tiles' sums between k blocks.
template <class TC>
void blocked(Trans ta, Trans tb, float alpha, View<const bf16, 2> A, View<const bf16, 2> B, float beta, View<TC, 2> C,
             bool symmetric, bool stream) {
    const index_t m = C.shape[0], n = C.shape[1], k = ta == Trans::no ? A.shape[1] : A.shape[0];
    const index_t sums = (m + P::mr - 1) / P::mr * P::mr * P::acc_ld;
    const auto part = [&](const bf16* ap, index_t lo, index_t hi, bf16* bp) {
        auto acc = Tensor<float, 1>::for_overwrite(Shape<1>{k > P::kc ? sums : 0});  // sums between k blocks
        columns<TC>(A, tb, B, k, alpha, ap, beta, C, lo, hi, bp, acc.data(), symmetric, stream);
    };
    if (amx_reads_a_in_place(ta, A, m, k)) return packed_driver::run<P, bf16>(m, n, k, nullptr, part, symmetric);
    packed_driver::run<P, bf16>(
        m, n, k,
        [&](index_t k0, index_t p, bf16* dst) {
            pack_a(ta, A, p * P::mr, std::min(P::mr, m - p * P::mr), k0, std::min(P::kc, k - k0), dst);
        },
        part, symmetric);
}

/// Rows [r0, r0 + 32) of the weight W [n, k] (as stored) against every token of X, X^T packed whole at xp (token
/// micro-panels of 32, k-pairs, kp = k padded to tiles): each 32 x 32 tile of C^T summed over all of k in the tiles
/// (W's whole tiles of k read in place, its last part tile and any rows past n from a zero-padded copy), then
/// finished into C transposed (finish_tile). w: the tiles' columns of tokens (16 where there are at most 16 tokens).
template <class TC, index_t w>
MOONMOE_TARGET_AMX void weight_rows(View<const bf16, 2> W, index_t r0, const bf16* xp, index_t m, float alpha,
                                    float beta, View<TC, 2> C) {
    const index_t n = W.shape[0], k = W.shape[1], kp = padded(k), rows = std::min(P::mr, n - r0);
    const index_t whole = rows == P::mr ? k / P::tile_k * P::tile_k : 0;  // k read in place
    alignas(64) float buf[P::mr * P::nr];
    alignas(64) bf16 part[P::mr * P::tile_k];
    for (index_t t0 = 0; t0 < m; t0 += P::nr) {
        const bf16* b = xp + t0 * kp;
        if (whole > 0) micro_kernel<w>(whole, W.data + r0 * W.strides[0], W.strides[0], b, nullptr, 0, buf, P::nr);
        for (index_t k0 = whole; k0 < kp; k0 += P::tile_k) {  // the rest, through a zero-padded copy
            for (index_t i = 0; i < P::mr; ++i)
                for (index_t q = 0; q < P::tile_k; ++q)
                    part[i * P::tile_k + q] =
                        i < rows && k0 + q < k ? W.data[(r0 + i) * W.strides[0] + k0 + q] : bf16{};
            micro_kernel<w>(P::tile_k, part, P::tile_k, b + k0 * P::nr, k0 > 0 ? buf : nullptr, P::nr, buf, P::nr);
        }
        finish_tile(buf, transposed(C), r0, t0, rows, std::min(w, m - t0), alpha, beta, false);
    }
}

/// The tokens' side of gemm_amx_weights on this thread: the tile configuration, then weight_rows for every 32 rows
/// of W in [lo, hi), on half the tiles of B and C where there are at most 16 tokens (one token against o_proj's W
/// 8-15 % faster at one and two threads: the tiles' products and X^T's reads from L2 halved; docs/cpu_gemm.md).
template <class TC>
MOONMOE_TARGET_AMX void weight_part(View<const bf16, 2> W, index_t lo, index_t hi, const bf16* xp, index_t m,
                                    float alpha, float beta, View<TC, 2> C) {
    const TileConfig config = tile_config();
    _tile_loadconfig(&config);
    for (index_t r0 = lo; r0 < hi; r0 += P::mr) {
        if (m <= P::nr / 2) weight_rows<TC, P::nr / 2>(W, r0, xp, m, alpha, beta, C);
        else
            weight_rows<TC, P::nr>(W, r0, xp, m, alpha, beta, C);
    }
    _tile_release();
}

}  // namespace amx

/// The most rows of X for which gemm_amx runs X W^T with W's rows as the tiles of A (gemm_amx_weights).
inline constexpr index_t amx_weight_rows = 64;

/// C [m, n] = alpha X [m, k] W [n, k]^T + beta C with few rows of X: computed as C^T = W X^T, so that W, the large
/// operand, is read once, as stored, straight into the tiles (no packing), and only X^T is packed (k-pairs; more
/// than 32 tokens on the pool); each 32 x 32 tile of C^T sums all of k in the tiles. The rows of W are cut into parts
/// of whole 32-row panels on the pool. What a decoded token's projections and a sparse expert's few tokens need.
template <class TC>
void gemm_amx_weights(float alpha, View<const bf16, 2> X, View<const bf16, 2> W, float beta, View<TC, 2> C) {
    using P = AmxBlocking;
    const index_t m = X.shape[0], n = W.shape[0], kp = amx::padded(X.shape[1]);
    const index_t tokens = (m + P::nr - 1) / P::nr * P::nr;
    // the workers woken now, so that they are up when the parts of W start (two threads, 16 tokens: 0.655 -> 0.58 ms
    // median, where their wake followed the pack)
    wake_workers(50e-6);
    auto xp = Tensor<bf16, 1>::for_overwrite(Shape<1>{tokens * kp});
    // one micro-panel of tokens whole on this thread, more on the pool by micro-panel and 1024 k (two threads, 64
    // tokens: the whole product 1.12 -> 0.99 ms)
    const bool one = tokens == P::nr;
    const index_t k = X.shape[1], chunk = one ? k : 1024, chunks = (k + chunk - 1) / chunk;
    const auto pack = [&](index_t q) {
        const index_t t0 = q / chunks * P::nr, k0 = q % chunks * chunk;
        amx::pack_b(Trans::yes, X, k0, std::min(chunk, k - k0), t0, std::min(P::nr, m - t0),
                    xp.data() + t0 * kp + k0 * P::nr);
    };
    if (one) {
        pack(0);
    } else {
        parallel_for(tokens / P::nr * chunks, pack);
    }
    const int t = parallel_depth > 0 ? 1 : threads();
    const index_t panels = (n + P::mr - 1) / P::mr, parts = std::min<index_t>(panels, 4 * index_t(t));
    const index_t per = (panels + parts - 1) / parts * P::mr;
    parallel_chunks((n + per - 1) / per, [&](index_t c) {
        amx::weight_part(W, c * per, std::min(n, c * per + per), xp.data(), m, alpha, beta, C);
    });
}

/// C [m, n] = alpha op(A) op(B) + beta C, A and B bf16, C f32 or bf16 (each element rounded once, from f32 sums), rows
/// of every operand contiguous, on the pool: op(A) packed once (its micro-panels shared out), then the columns of C
/// cut into parts of whole micro-panels, each part packing its own blocks of op(B), as gemm_packed cuts them
/// (packed_driver; with few columns, rows are cut instead). `symmetric`: C = alpha X X^T + beta C (A = B = X, Trans
/// no and yes) with a symmetric C, of which only the tiles on and below the diagonal are computed (half the FLOPs),
/// and C read there only; it comes out exactly symmetric. Call only when amx_gemm_available().
template <class TC = float>
void gemm_amx(Trans ta, Trans tb, float alpha, View<const bf16, 2> A, View<const bf16, 2> B, float beta, View<TC, 2> C,
              bool symmetric = false) {
    using P = AmxBlocking;
    const index_t m = C.shape[0], n = C.shape[1], k = ta == Trans::no ? A.shape[1] : A.shape[0];
    if (m == 0 || n == 0) return;
    if (k == 0) return packed_driver::scale(beta, C);
    if (ta == Trans::no && tb == Trans::yes && m <= amx_weight_rows) {
        gemm_amx_weights(alpha, A, B, beta, C);
        if (symmetric) mirror_lower(C);  // computed whole: the lower triangle mirrored, as the larger products' are
        return;
    }
    if (ta == Trans::no && tb == Trans::yes && !symmetric && m <= P::nc && n > P::nc) {
        // X W^T of up to 256 tokens as C^T = W X^T: W's rows are the tiles of A (in place where they start on lines),
        // X^T is packed, k-pairs, as one block of op(B) whose columns are all the tokens, so W is read once and not
        // transposed (192 tokens x 2048 x 7168, one thread: 7.2 -> 5.1 ms); the tiles of C^T are transposed in
        // registers into C's rows (finish_tile). With more tokens, X's packing in place of W's did not pay for those
        // transposes: o_proj's 7168 x 8192 against 1024 tokens 5-11 % slower, kv_b's 16384 x 512 28 %, q_a level,
        // q_b's 12288 x 1536 alone 8 % faster (docs/cpu_gemm.md)
        return gemm_amx<TC>(Trans::no, Trans::yes, alpha, B, A, beta, amx::transposed(C));
    }
    // an f32 C of stream_c_bytes or more as a whole goes past the caches, also where its rows are cut into smaller
    // parts for the threads
    const bool stream = std::is_same_v<TC, float> && !symmetric && beta == 0.0f &&
                        std::size_t(m) * std::size_t(n) * sizeof(float) >= P::stream_c_bytes;
    const auto blocked = [&](View<const bf16, 2> a, View<TC, 2> c) {
        amx::blocked<TC>(ta, tb, alpha, a, B, beta, c, symmetric, stream);
    };
    // one part of C's rows per thread: each part brings every block of op(B) into L2 again (an expert's W of 2048 x
    // 7168 against 96-192 tokens at two threads 4-10 % faster than with two parts per thread, 10-15 % than four)
    if (!symmetric && packed_driver::cut_rows<P>(ta, A, k, C, blocked, 1)) return;
    blocked(A, C);
}

#undef MOONMOE_TARGET_AMX
#else
template <class TC = float>
void gemm_amx(Trans, Trans, float, View<const bf16, 2>, View<const bf16, 2>, float, View<TC, 2>, bool = false) {}
#endif

}  // namespace moonmoe::backend::cpu_detail
