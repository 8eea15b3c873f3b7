// moonmoe/backend/cuda/fast/attention.hpp: fused causal attention forward and backward for AttentionOps<cuda>,
// FlashAttention-2 tiling without an S x S matrix (Dao, "FlashAttention-2", arXiv:2307.08691).
// header-check: nvcc-only
//
// The contract is AttentionOps' (backend/attention.hpp): the same operands, the same outputs, selected inside
// attention_forward / attention_backward when CudaFastKernels::attention is on (fast/select.hpp) and `supported`
// holds. One or two query/key parts (MLA's nope and rope), any head strides (0: MLA's one rope key read by every
// head), kv_heads dividing heads, packed sequences (one launch per sequence, as the portable path).
//
// Tiles of 32 rows on both sides, 128 threads, f32 operands in shared memory with the two parts side by side (one
// dot over dim_nope + dim_rope, times scale), f32 accumulation on the CUDA cores (no TF32: the portable path's
// precision). Two layouts of a block's work:
//   score tile   thread t owns rows 4 (t / 16) + i (i < 4) and columns t % 16 + 16 k (k < 2) of a 32 x 32 tile;
//                a row's 32 columns live in 16 lanes of one warp, so its max / sum is a 16-lane shuffle
//   row tile     thread t owns rows 8 warp + i (i < 8) and columns lane + 32 e of a [32, dim] accumulator (O, dQ,
//                dK, dV); the weights of a row are broadcast reads of shared memory
// forward    a block per (32 query rows, head): the online softmax over key tiles up to the diagonal (running
//            maximum m and sum l per row, O rescaled when m grows); O / l, lse = m + log l, and the block's largest
//            m max-accumulated into max_logit[head] with one atomic maximum (order-free, so deterministic)
// backward   delta = rowsum(dO * O), a warp per (row, head); then two kernels that recompute P = exp(s - lse) and
//            dS = P (dO V^T - delta) scale: a block per (32 query rows, head) sums dQ = dS K over key tiles, a block
//            per (32 key rows, key/value head) sums dV = P^T dO and dK = dS^T Q over the group's heads (in head
//            order) and the query tiles at or after the diagonal. Every output has one writer: no atomics, the
//            same bits on every run (FlashAttention-2's dQ by atomics is traded for a second recomputation).
// Sums run in another order than the portable path's (which is per row, in key order, with l in double), so the
// two agree to f32 rounding, not bitwise: test/nvcc/fast_kernels.cu compares them.
//
// Where speed is left: tensor cores (TF32 or bf16 operands with the precision policy), cp.async double buffering,
// and one block per query tile for all heads of MLA's shared rope key. The element type of the operands is a
// template parameter (shared memory and accumulation stay f32); only float is instantiated by the primitives.
#pragma once

#include "warp.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else warp.hpp has stopped with an #error

#include <cmath>
#include <cstddef>
#include <span>

#include "../../../tensor/tensor.hpp"
#include "../../attention.hpp"

namespace moonmoe::backend::cuda_fast {

inline constexpr int attention_tile = 32;  // rows per tile, queries and keys alike
inline constexpr int attention_threads = 128;
inline constexpr int attention_max_qk = 256;  // dim_nope + dim_rope (K2: 128 + 64)
inline constexpr int attention_max_v = 128;   // dim_v (K2: 128)

/// A [rows, heads, dim] operand with a unit last stride, as a kernel sees it.
template <class T>
struct HeadsOf {
    T* data = nullptr;
    index_t row = 0, head = 0;
    __device__ T* at(index_t r, index_t h) const { return data + r * row + h * head; }
};

template <class T>
HeadsOf<T> heads_of(const View<T, 3, cuda>& v) {
    return {v.data, v.strides[0], v.strides[1]};
}

/// What every attention kernel reads: queries and keys in parts (dims d0 and d1, d1 = 0 for one part), values,
/// the sequence (first row t0, length S), heads per key/value head and the scale.
template <class T>
struct AttentionArgs {
    HeadsOf<const T> q[2], k[2], v;
    int d0, d1, dv;
    index_t t0, S, heads, group;
    float scale;
};

/// Shared-memory row pitch of a tile of `dim` columns: one float of padding, so the rows of a column fall in
/// different banks.
__host__ __device__ constexpr int pitch(int dim) { return dim + 1; }

/// Rows [first, first + 32) of head h of an operand in two parts into tile [32, d0 + d1] as f32; rows at or past
/// `valid` are zero.
template <class T>
__device__ void load_tile(float* tile, const HeadsOf<const T>& a, int da, const HeadsOf<const T>& b, int db,
                          index_t first, int valid, index_t h) {
    const int D = da + db, ld = pitch(D);
    for (int x = threadIdx.x; x < attention_tile * D; x += blockDim.x) {
        const int r = x / D, c = x % D;
        float value = 0.0f;
        if (r < valid) value = c < da ? float(a.at(first + r, h)[c]) : float(b.at(first + r, h)[c - da]);
        tile[r * ld + c] = value;
    }
}

/// Score-tile layout: acc[i][k] = sum over d < D of X[4 (t / 16) + i][d] * Y[t % 16 + 16 k][d].
__device__ __forceinline__ void tile_dots(const float* X, const float* Y, int D, float (&acc)[4][2]) {
    const int ld = pitch(D), a = threadIdx.x / 16 * 4, b = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i][0] = acc[i][1] = 0.0f;
    for (int d = 0; d < D; ++d) {
        float x[4], y[2];
#pragma unroll
        for (int i = 0; i < 4; ++i) x[i] = X[(a + i) * ld + d];
#pragma unroll
        for (int k = 0; k < 2; ++k) y[k] = Y[(b + 16 * k) * ld + d];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < 2; ++k) acc[i][k] = fmaf(x[i], y[k], acc[i][k]);
    }
}

/// Row-tile layout: acc[i][e] += sum over b < 32 of W[8 warp + i][b] * Z[b][lane + 32 e] for the columns < n;
/// W is [32, 32] with pitch(32), Z is [32, n] with pitch(n).
template <int E>
__device__ __forceinline__ void tile_accumulate(const float* W, const float* Z, int n, float (&acc)[8][E]) {
    const int lane = threadIdx.x % 32, a = threadIdx.x / 32 * 8, ldw = pitch(attention_tile), ldz = pitch(n);
#pragma unroll 4
    for (int b = 0; b < attention_tile; ++b) {
        float z[E], w[8];
#pragma unroll
        for (int e = 0; e < E; ++e) z[e] = lane + 32 * e < n ? Z[b * ldz + lane + 32 * e] : 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = W[(a + i) * ldw + b];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[i][e] = fmaf(w[i], z[e], acc[i][e]);
    }
}

/// Writes a row-tile accumulator times scale[row] (null: 1) to rows [first, first + valid) of head h, columns
/// below da to `a`, the rest to `b`.
template <class T, int E>
__device__ void store_rows(const float (&acc)[8][E], const float* scale, const HeadsOf<T>& a, int da,
                           const HeadsOf<T>& b, int db, index_t first, int valid, index_t h) {
    const int lane = threadIdx.x % 32, r0 = threadIdx.x / 32 * 8;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        if (r0 + i >= valid) continue;
        const float s = scale ? scale[r0 + i] : 1.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int c = lane + 32 * e;
            if (c < da) a.at(first + r0 + i, h)[c] = T(acc[i][e] * s);
            else if (c < da + db)
                b.at(first + r0 + i, h)[c - da] = T(acc[i][e] * s);
        }
    }
}

template <int E>
__device__ __forceinline__ void clear(float (&acc)[8][E]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[i][e] = 0.0f;
}

/// Shared memory of the forward: Q, K [32, D], V [32, dv], P [32, 32], and 64 row values.
inline std::size_t forward_shared_bytes(int D, int dv) {
    return sizeof(float) * std::size_t(2 * attention_tile * pitch(D) + attention_tile * pitch(dv) +
                                       attention_tile * pitch(attention_tile) + 2 * attention_tile);
}
/// Shared memory of each backward kernel: Q, K [32, D], dO, V [32, dv], P and dS [32, 32], lse and delta.
inline std::size_t backward_shared_bytes(int D, int dv) {
    return sizeof(float) * std::size_t(2 * attention_tile * pitch(D) + 2 * attention_tile * pitch(dv) +
                                       2 * attention_tile * pitch(attention_tile) + 2 * attention_tile);
}

/// Forward of query rows [32 blockIdx.x, + 32) of head blockIdx.y; lse is the sequence's (at h * S + i).
template <class T>
__global__ void __launch_bounds__(attention_threads)
    attention_forward_kernel(AttentionArgs<T> a, HeadsOf<T> o, float* lse, float* max_logit) {
    extern __shared__ float smem[];
    const int D = a.d0 + a.d1;
    float* Qs = smem;
    float* Ks = Qs + attention_tile * pitch(D);
    float* Vs = Ks + attention_tile * pitch(D);
    float* Ps = Vs + attention_tile * pitch(a.dv);
    float* row_alpha = Ps + attention_tile * pitch(attention_tile);
    float* row_l = row_alpha + attention_tile;

    const index_t h = blockIdx.y, g = h / a.group, i0 = index_t(blockIdx.x) * attention_tile;
    const int qn = int(a.S - i0 < attention_tile ? a.S - i0 : attention_tile);
    const int ra = threadIdx.x / 16 * 4, cb = threadIdx.x % 16;
    load_tile(Qs, a.q[0], a.d0, a.q[1], a.d1, a.t0 + i0, qn, h);

    float m[4], l[4], acc[8][attention_max_v / 32];
#pragma unroll
    for (int i = 0; i < 4; ++i) m[i] = -INFINITY, l[i] = 0.0f;
    clear(acc);
    const index_t last = i0 + qn - 1;  // the tile's last row sees keys up to it
    for (index_t j0 = 0; j0 <= last; j0 += attention_tile) {
        const int kn = int(a.S - j0 < attention_tile ? a.S - j0 : attention_tile);
        __syncthreads();  // the previous tile's K, V and P are read by every thread before they are replaced
        load_tile(Ks, a.k[0], a.d0, a.k[1], a.d1, a.t0 + j0, kn, g);
        load_tile(Vs, a.v, a.dv, a.v, 0, a.t0 + j0, kn, g);
        __syncthreads();
        float s[4][2];
        tile_dots(Qs, Ks, D, s);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const index_t row = i0 + ra + i;
            float mx = -INFINITY;
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const index_t col = j0 + cb + 16 * k;
                const bool seen = ra + i < qn && cb + 16 * k < kn && col <= row;
                s[i][k] = seen ? s[i][k] * a.scale : -INFINITY;
                mx = fmaxf(mx, s[i][k]);
            }
            mx = group_max<16>(mx);
            const float m_new = fmaxf(m[i], mx);
            // Rows that have seen no key yet keep m = -inf: no rescale, and their P is zero.
            const float alpha = m_new == -INFINITY ? 1.0f : expf(m[i] - m_new);
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const float p = s[i][k] == -INFINITY ? 0.0f : expf(s[i][k] - m_new);
                Ps[(ra + i) * pitch(attention_tile) + cb + 16 * k] = p;
                sum += p;
            }
            sum = group_sum<16>(sum);
            l[i] = l[i] * alpha + sum;
            m[i] = m_new;
            if (cb == 0) row_alpha[ra + i] = alpha;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float alpha = row_alpha[threadIdx.x / 32 * 8 + i];
#pragma unroll
            for (int e = 0; e < attention_max_v / 32; ++e) acc[i][e] *= alpha;
        }
        tile_accumulate(Ps, Vs, a.dv, acc);
    }
    if (cb == 0)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            row_l[ra + i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            if (ra + i < qn) lse[h * a.S + i0 + ra + i] = m[i] + logf(l[i]);
        }
    __syncthreads();
    store_rows(acc, row_l, o, a.dv, o, 0, a.t0 + i0, qn, h);

    // The block's largest scaled score (rows past the sequence hold -inf), then one atomic maximum. fmaxf drops a NaN
    // score as the portable path's `if (s > m)` does (its row's o and lse are NaN on both), and atomic_max keeps a NaN
    // already in max_logit, as HeadMax does.
    float mx = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
    mx = group_max<32>(mx);
    __syncthreads();  // row_alpha is reused for the warps' maxima
    if (threadIdx.x % 32 == 0) row_alpha[threadIdx.x / 32] = mx;
    __syncthreads();
    if (threadIdx.x == 0 && max_logit) {  // null: no maxima wanted
        for (int w = 1; w < attention_threads / 32; ++w) mx = fmaxf(mx, row_alpha[w]);
        atomic_max(max_logit + h, mx);
    }
}

/// delta[t * heads + h] = rowsum(dO * O) of row t, head h: a warp per (row, head).
template <class T>
__global__ void __launch_bounds__(128) attention_delta_kernel(HeadsOf<const T> d_o, HeadsOf<const T> o, int dv,
                                                              index_t rows, index_t heads, float* delta) {
    const index_t k = index_t(blockIdx.x) * 4 + threadIdx.x / 32;
    if (k >= rows * heads) return;  // the whole warp leaves together
    const index_t t = k / heads, h = k % heads;
    const T *x = d_o.at(t, h), *y = o.at(t, h);
    float sum = 0.0f;
    for (int c = threadIdx.x % 32; c < dv; c += 32) sum = fmaf(float(x[c]), float(y[c]), sum);
    sum = group_sum(sum);
    if (threadIdx.x % 32 == 0) delta[k] = sum;
}

/// What the backward kernels add to AttentionArgs: dO, the sequence's lse (at h * S + i), every row's delta.
template <class T>
struct BackwardArgs {
    HeadsOf<const T> d_o;
    const float* lse;
    const float* delta;  // [tokens * heads]
};

/// Loads rows [i0, i0 + 32) of head h of dO, lse and delta (rows past n: zero).
template <class T>
__device__ void load_query_side(float* dOs, float* lse_s, float* delta_s, const AttentionArgs<T>& a,
                                const BackwardArgs<T>& b, index_t i0, int n, index_t h) {
    load_tile(dOs, b.d_o, a.dv, b.d_o, 0, a.t0 + i0, n, h);
    for (int r = threadIdx.x; r < attention_tile; r += blockDim.x) {
        lse_s[r] = r < n ? b.lse[h * a.S + i0 + r] : 0.0f;
        delta_s[r] = r < n ? b.delta[(a.t0 + i0 + r) * a.heads + h] : 0.0f;
    }
}

/// dQ of query rows [32 blockIdx.x, + 32) of head blockIdx.y.
template <class T>
__global__ void __launch_bounds__(attention_threads)
    attention_dq_kernel(AttentionArgs<T> a, BackwardArgs<T> b, HeadsOf<T> dq0, HeadsOf<T> dq1) {
    extern __shared__ float smem[];
    const int D = a.d0 + a.d1;
    float* Qs = smem;
    float* Ks = Qs + attention_tile * pitch(D);
    float* dOs = Ks + attention_tile * pitch(D);
    float* Vs = dOs + attention_tile * pitch(a.dv);
    float* dSs = Vs + attention_tile * pitch(a.dv);
    float* lse_s = dSs + 2 * attention_tile * pitch(attention_tile);
    float* delta_s = lse_s + attention_tile;

    const index_t h = blockIdx.y, g = h / a.group, i0 = index_t(blockIdx.x) * attention_tile;
    const int qn = int(a.S - i0 < attention_tile ? a.S - i0 : attention_tile);
    const int ra = threadIdx.x / 16 * 4, cb = threadIdx.x % 16;
    load_tile(Qs, a.q[0], a.d0, a.q[1], a.d1, a.t0 + i0, qn, h);
    load_query_side(dOs, lse_s, delta_s, a, b, i0, qn, h);

    float acc[8][attention_max_qk / 32];
    clear(acc);
    const index_t last = i0 + qn - 1;
    for (index_t j0 = 0; j0 <= last; j0 += attention_tile) {
        const int kn = int(a.S - j0 < attention_tile ? a.S - j0 : attention_tile);
        __syncthreads();  // K and dS of the previous tile are no longer read
        load_tile(Ks, a.k[0], a.d0, a.k[1], a.d1, a.t0 + j0, kn, g);
        load_tile(Vs, a.v, a.dv, a.v, 0, a.t0 + j0, kn, g);
        __syncthreads();
        float s[4][2], dp[4][2];
        tile_dots(Qs, Ks, D, s);
        tile_dots(dOs, Vs, a.dv, dp);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                const index_t row = i0 + ra + i, col = j0 + cb + 16 * k;
                const bool seen = ra + i < qn && cb + 16 * k < kn && col <= row;
                const float p = seen ? expf(s[i][k] * a.scale - lse_s[ra + i]) : 0.0f;
                dSs[(ra + i) * pitch(attention_tile) + cb + 16 * k] = p * (dp[i][k] - delta_s[ra + i]) * a.scale;
            }
        __syncthreads();
        tile_accumulate(dSs, Ks, D, acc);
    }
    store_rows(acc, nullptr, dq0, a.d0, dq1, a.d1, a.t0 + i0, qn, h);
}

/// dK and dV of key rows [32 blockIdx.x, + 32) of key/value head blockIdx.y: the query heads of its group in
/// order, each over the query tiles from the diagonal to the end of the sequence.
template <class T>
__global__ void __launch_bounds__(attention_threads)
    attention_dkv_kernel(AttentionArgs<T> a, BackwardArgs<T> b, HeadsOf<T> dk0, HeadsOf<T> dk1, HeadsOf<T> dv) {
    extern __shared__ float smem[];
    const int D = a.d0 + a.d1;
    float* Ks = smem;
    float* Qs = Ks + attention_tile * pitch(D);
    float* Vs = Qs + attention_tile * pitch(D);
    float* dOs = Vs + attention_tile * pitch(a.dv);
    float* Ps = dOs + attention_tile * pitch(a.dv);
    float* dSs = Ps + attention_tile * pitch(attention_tile);
    float* lse_s = dSs + attention_tile * pitch(attention_tile);
    float* delta_s = lse_s + attention_tile;

    const index_t g = blockIdx.y, j0 = index_t(blockIdx.x) * attention_tile;
    const int kn = int(a.S - j0 < attention_tile ? a.S - j0 : attention_tile);
    const int ra = threadIdx.x / 16 * 4, cb = threadIdx.x % 16;
    load_tile(Ks, a.k[0], a.d0, a.k[1], a.d1, a.t0 + j0, kn, g);
    load_tile(Vs, a.v, a.dv, a.v, 0, a.t0 + j0, kn, g);

    float acc_v[8][attention_max_v / 32], acc_k[8][attention_max_qk / 32];
    clear(acc_v);
    clear(acc_k);
    for (index_t h = g * a.group; h < (g + 1) * a.group; ++h)
        for (index_t i0 = j0; i0 < a.S; i0 += attention_tile) {  // tiles are aligned: the diagonal tile is i0 = j0
            const int qn = int(a.S - i0 < attention_tile ? a.S - i0 : attention_tile);
            __syncthreads();  // Q, dO, P and dS of the previous tile are no longer read
            load_tile(Qs, a.q[0], a.d0, a.q[1], a.d1, a.t0 + i0, qn, h);
            load_query_side(dOs, lse_s, delta_s, a, b, i0, qn, h);
            __syncthreads();
            float s[4][2], dp[4][2];  // transposed: rows are keys, columns queries
            tile_dots(Ks, Qs, D, s);
            tile_dots(Vs, dOs, a.dv, dp);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int k = 0; k < 2; ++k) {
                    const index_t key = j0 + ra + i, query = i0 + cb + 16 * k;
                    const bool seen = ra + i < kn && cb + 16 * k < qn && key <= query;
                    const float p = seen ? expf(s[i][k] * a.scale - lse_s[cb + 16 * k]) : 0.0f;
                    Ps[(ra + i) * pitch(attention_tile) + cb + 16 * k] = p;
                    dSs[(ra + i) * pitch(attention_tile) + cb + 16 * k] =
                        p * (dp[i][k] - delta_s[cb + 16 * k]) * a.scale;
                }
            __syncthreads();
            tile_accumulate(Ps, dOs, a.dv, acc_v);
            tile_accumulate(dSs, Qs, D, acc_k);
        }
    store_rows(acc_v, nullptr, dv, a.dv, dv, 0, a.t0 + j0, kn, g);
    store_rows(acc_k, nullptr, dk0, a.d0, dk1, a.d1, a.t0 + j0, kn, g);
}

/// The kernels' arguments for the sequence [t0, t0 + S).
template <class T>
AttentionArgs<T> attention_args(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv, float scale, index_t t0,
                                index_t S) {
    AttentionArgs<T> a{};
    a.q[0] = heads_of(q.q[0]), a.k[0] = heads_of(kv.k[0]), a.v = heads_of(kv.v);
    a.q[1] = a.q[0], a.k[1] = a.k[0];  // never read when d1 = 0
    if (q.parts == 2) a.q[1] = heads_of(q.q[1]), a.k[1] = heads_of(kv.k[1]);
    a.d0 = int(q.q[0].shape[2]), a.d1 = q.parts == 2 ? int(q.q[1].shape[2]) : 0, a.dv = int(kv.v.shape[2]);
    a.t0 = t0, a.S = S, a.heads = q.q[0].shape[1], a.group = a.heads / kv.k[0].shape[1];
    a.scale = scale;
    return a;
}

/// Whether the fused kernels take this problem: query/key dims up to 256 in all, value dims up to 128, heads within
/// a grid's second dimension, and the backward's shared memory within what the device grants a block.
inline bool attention_supported(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv) {
    const index_t D = q.q[0].shape[2] + (q.parts == 2 ? q.q[1].shape[2] : 0), dv = kv.v.shape[2], H = q.q[0].shape[1];
    if (H < 1 || H > 65535 || D < 1 || D > attention_max_qk || dv < 1 || dv > attention_max_v) return false;
    static const std::size_t limit = max_shared_bytes();  // the first device asked; sm_90 grants 227 KiB
    return backward_shared_bytes(int(D), int(dv)) <= limit;
}

/// attention_forward (backend/attention.hpp) by the fused kernel; arguments already checked by the primitive.
inline void attention_forward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                              std::span<const index_t> offsets, float scale, View<float, 3, cuda> o,
                              View<float, 1, cuda> lse, View<float, 1, cuda> max_logit) {
    const index_t H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
    for (index_t s = 0; s < N; ++s) {
        const index_t t0 = offsets[s], S = offsets[s + 1] - t0;
        const AttentionArgs<float> a = attention_args<float>(q, kv, scale, t0, S);
        const std::size_t bytes = forward_shared_bytes(a.d0 + a.d1, a.dv);
        allow_shared(attention_forward_kernel<float>, bytes);
        const dim3 grid(unsigned((S + attention_tile - 1) / attention_tile), unsigned(H));
        attention_forward_kernel<float>
            <<<grid, attention_threads, bytes, current_stream()>>>(a, heads_of(o), lse.data + t0 * H, max_logit.data);
        check_launch("attention_forward_kernel<<<...>>>");
    }
}

/// attention_backward (backend/attention.hpp) by the fused kernels; arguments already checked by the primitive.
inline void attention_backward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                               std::span<const index_t> offsets, float scale, View<const float, 3, cuda> o,
                               View<const float, 1, cuda> lse, View<const float, 3, cuda> d_o,
                               const AttentionGrads<cuda>& grads) {
    const index_t T = q.q[0].shape[0], H = q.q[0].shape[1], KV = kv.k[0].shape[1], N = index_t(offsets.size()) - 1;
    const int dv = int(kv.v.shape[2]);
    Tensor<float, 1, cuda> delta({T * H});  // released in stream order, after the kernels below
    attention_delta_kernel<float>
        <<<unsigned((T * H + 3) / 4), 128, 0, current_stream()>>>(heads_of(d_o), heads_of(o), dv, T, H, delta.data());
    check_launch("attention_delta_kernel<<<...>>>");
    const HeadsOf<float> dq0 = heads_of(grads.dq[0]), dk0 = heads_of(grads.dk[0]);
    const HeadsOf<float> dq1 = q.parts == 2 ? heads_of(grads.dq[1]) : dq0,
                         dk1 = q.parts == 2 ? heads_of(grads.dk[1]) : dk0;
    for (index_t s = 0; s < N; ++s) {
        const index_t t0 = offsets[s], S = offsets[s + 1] - t0;
        const AttentionArgs<float> a = attention_args<float>(q, kv, scale, t0, S);
        const BackwardArgs<float> b{heads_of(d_o), lse.data + t0 * H, delta.data()};
        const std::size_t bytes = backward_shared_bytes(a.d0 + a.d1, a.dv);
        const unsigned tiles = unsigned((S + attention_tile - 1) / attention_tile);
        allow_shared(attention_dq_kernel<float>, bytes);
        attention_dq_kernel<float>
            <<<dim3(tiles, unsigned(H)), attention_threads, bytes, current_stream()>>>(a, b, dq0, dq1);
        check_launch("attention_dq_kernel<<<...>>>");
        allow_shared(attention_dkv_kernel<float>, bytes);
        attention_dkv_kernel<float><<<dim3(tiles, unsigned(KV)), attention_threads, bytes, current_stream()>>>(
            a, b, dk0, dk1, heads_of(grads.dv));
        check_launch("attention_dkv_kernel<<<...>>>");
    }
}

}  // namespace moonmoe::backend::cuda_fast

#endif  // defined(MOONMOE_CUDA_EMULATED)
