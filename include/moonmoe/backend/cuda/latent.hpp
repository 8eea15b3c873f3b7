// moonmoe/backend/cuda/latent.hpp: AttentionOps<cuda>::latent_decode (backend/attention.hpp), MLA's absorbed decode
// over bf16 latent caches, many sequences of different lengths per call.
//
// Nothing here reads the lengths on the host: they stay on the device, so a decode step can be captured as a CUDA
// graph (cuda/graph.hpp) and replayed while the caches grow; the host shapes are the extents, which the caller keeps
// fixed over many steps (nn/mla.hpp rounds them up to a bucket).
//
// The portable path (both modes; the oracle, run emulated in CI): per sequence one launch appends its fresh rows at
// its device length, and one thread per (new row, head) runs the online softmax of cuda/attention_portable.hpp's
// OnlineSoftmax over the visible rows, every value widened from bf16, the sum of exponentials in double.
//
// The tensor-core path (nvcc): for all sequences at once,
//   append   one launch per sequence (as above)
//   scores   S_s = scale Q_s C_s^T, [rows_s * heads, extent_s] in f32: one grouped cuBLAS call over the sequences
//            (bf16 operands, f32 C: cuda/grouped_gemm.hpp's grouped_gemm_call), or one cuBLASLt product per
//            sequence where this cuBLAS refuses the mixed types in a group
//   softmax  one block per (row, head): the visible keys (lengths[s] + i + 1, from the device), the maximum, the sum
//            of exp(s - max) in f32, P = exp(s - max) / sum rounded to bf16 (tensor cores take bf16), zero past the
//            visible keys up to the extent
//   values   O_s = P_s C_s[:, :value_dim] in f32: the same grouped call (or products)
// The cache is read twice (the values are its first value_dim columns) and S, P once each way: for K2 (width 576,
// value_dim 512, 64 heads) and one new row per sequence, 2.33x the cache's bytes (1.78x once the second read of a
// sequence's cache hits L2). bench/decode.cpp measures it against the device's copy bandwidth.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../attention.hpp"
#include "attention_portable.hpp"  // OnlineSoftmax
#if !MOONMOE_CUDA_EMULATED
#include "blas.hpp"
#include "cross_entropy.hpp"  // block_reduce
#include "grouped_gemm.hpp"
#endif

namespace moonmoe::backend {

namespace cuda_detail {

/// Thread k: element k of the fresh rows of one sequence to its cache, at row lengths[s] + k / width.
struct LatentAppend {
    const bf16* fresh;
    index_t fresh_pitch;
    bf16* cache;
    index_t cache_pitch, width;
    const index_t* length;
    MOONMOE_HD void operator()(index_t k) const {
        const index_t i = k / width, d = k % width;
        cache[(*length + i) * cache_pitch + d] = fresh[i * fresh_pitch + d];
    }
};

/// Thread k = i * heads + h: new row i of one sequence, head h, against the rows of its cache it sees.
struct LatentRow {
    const bf16* q;  // the sequence's first row, [rows, heads, width] contiguous
    const bf16* cache;
    index_t cache_pitch, width, value_dim, heads;
    const index_t* length;
    float scale;
    float* o;  // the sequence's first row, [rows, heads, value_dim] contiguous

    MOONMOE_HD void operator()(index_t k) const {
        const bf16* qr = q + k * width;
        OnlineSoftmax acc(o + k * value_dim, value_dim);
        const index_t visible = *length + k / heads + 1;
        for (index_t j = 0; j < visible; ++j) {
            const bf16* kj = cache + j * cache_pitch;
            float dot = 0.0f;
            for (index_t c = 0; c < width; ++c) dot += qr[c].to_float() * kj[c].to_float();
            acc.add(scale * dot, kj);  // the values: the first value_dim columns of the row
        }
        acc.finish();
    }
};

/// Whether latent_decode takes the tensor-core path under nvcc (default) or the portable one (tests compare them).
inline bool& latent_on_tensor_cores() {
    static bool on = true;
    return on;
}

#if !MOONMOE_CUDA_EMULATED
inline constexpr int latent_max_sequences = 256;  // per grouped call: the tables below travel as kernel parameters

/// What the softmax kernel and the pointer kernel need of up to latent_max_sequences sequences.
struct LatentTable {
    int count;
    index_t heads, width, value_dim;
    index_t first_row[latent_max_sequences + 1];  // new rows, as offsets (relative to the chunk's first)
    index_t extent[latent_max_sequences];
    index_t scores[latent_max_sequences];  // where S_s and P_s begin
    const bf16* cache[latent_max_sequences];
    index_t cache_pitch[latent_max_sequences];
};

/// Row blockIdx.x = (new row t, head h) of the chunk: softmax over the visible keys of its sequence.
template <int Threads>
__global__ void __launch_bounds__(Threads)
    latent_softmax_kernel(LatentTable table, const index_t* lengths, const float* S, bf16* P) {
    const index_t r = blockIdx.x, t = r / table.heads;
    int s = 0;
    while (table.first_row[s + 1] <= t) ++s;
    const index_t i = t - table.first_row[s], E = table.extent[s];
    const index_t local = r - table.first_row[s] * table.heads;  // row of S_s
    const float* row = S + table.scores[s] + local * E;
    bf16* prow = P + table.scores[s] + local * E;
    const index_t visible = min(lengths[s] + i + 1, E);
    float m = -INFINITY;
    for (index_t j = threadIdx.x; j < visible; j += Threads) m = fmaxf(m, row[j]);
    m = block_reduce<true>(m);
    float sum = 0.0f;
    for (index_t j = threadIdx.x; j < visible; j += Threads) sum += ::expf(row[j] - m);
    sum = block_reduce<false>(sum);
    const float inv = 1.0f / sum;
    for (index_t j = threadIdx.x; j < E; j += Threads)
        prow[j] = bf16::from_float(j < visible ? ::expf(row[j] - m) * inv : 0.0f);
}

/// The operand pointers of both grouped calls: [Q_s], [C_s], [S_s] then [P_s], [C_s], [O_s] (column-major order:
/// the first operand of each column-major product is the row-major call's B).
template <int Threads>
__global__ void __launch_bounds__(Threads)
    latent_pointers_kernel(LatentTable table, const bf16* q, const float* S, const bf16* P, float* o, void** out) {
    const int n = table.count;
    for (int s = threadIdx.x; s < n; s += Threads) {
        const index_t row = table.first_row[s] * table.heads;
        auto* cache = const_cast<bf16*>(table.cache[s]);
        out[s] = cache, out[n + s] = const_cast<bf16*>(q + row * table.width);
        out[2 * n + s] = const_cast<float*>(S + table.scores[s]);
        out[3 * n + s] = cache, out[4 * n + s] = const_cast<bf16*>(P + table.scores[s]);
        out[5 * n + s] = o + row * table.value_dim;
    }
}

/// The tensor-core path for sequences [s0, s0 + count) (at most latent_max_sequences).
inline void latent_decode_library(const View<const bf16, 3, cuda>& q, std::span<const LatentRows<cuda>> caches,
                                  const index_t* lengths, std::span<const index_t> offsets,
                                  std::span<const index_t> extents, index_t value_dim, float scale,
                                  const View<float, 3, cuda>& o, index_t s0, int count) {
    const index_t H = q.shape[1], W = q.shape[2], row0 = offsets[s0];
    LatentTable table{};
    table.count = count, table.heads = H, table.width = W, table.value_dim = value_dim;
    index_t total = 0;
    GroupedPlan scores, values;
    for (int c = 0; c < count; ++c) {
        const index_t s = s0 + c, M = (offsets[s + 1] - offsets[s]) * H, E = extents[std::size_t(s)];
        const LatentRows<cuda>& cache = caches[std::size_t(s)];
        table.first_row[c] = offsets[s] - row0, table.extent[c] = E, table.scores[c] = total;
        table.cache[c] = cache.data, table.cache_pitch[c] = cache.strides[0];
        total += M * E;
        // Row-major S_s [M, E] = Q_s [M, W] C_s[:E]^T, O_s [M, value_dim] = P_s [M, E] C_s[:E, :value_dim].
        const CublasGemm a = to_cublas({Trans::no, Trans::yes, M, E, W, W, cache.strides[0], E});
        const CublasGemm b = to_cublas({Trans::no, Trans::no, M, value_dim, E, E, cache.strides[0], value_dim});
        for (auto [plan, g] : {std::pair{&scores, a}, std::pair{&values, b}}) {
            plan->op_first.push_back(cublas_op(g.op_first)), plan->op_second.push_back(cublas_op(g.op_second));
            plan->m.push_back(g.m), plan->n.push_back(g.n), plan->k.push_back(g.k);
            plan->ld_first.push_back(g.ld_first), plan->ld_second.push_back(g.ld_second), plan->ldc.push_back(g.ldc);
        }
    }
    table.first_row[count] = offsets[s0 + count] - row0;
    const bf16* qs = q.data + row0 * H * W;
    float* os = o.data + row0 * H * value_dim;
    Tensor<float, 1, cuda> S({total});
    Tensor<bf16, 1, cuda> P({total});
    Tensor<void*, 1, cuda> pointers({6 * index_t(count)});
    latent_pointers_kernel<256><<<1, 256, 0, current_stream()>>>(table, qs, S.data(), P.data(), os, pointers.data());
    check(cudaGetLastError(), "latent_pointers_kernel<<<1, 256, 0, current_stream()>>>", __FILE__, __LINE__);
    void** ptr = pointers.data();
    // Each product as one grouped call, or where the mixed types are refused, one product per sequence.
    auto products = [&](const GroupedPlan& plan, void** p, float alpha, auto per_sequence) {
        if (grouped_gemm_call<bf16, float>(plan, p, count, alpha, 0.0f)) return;
        for (int c = 0; c < count; ++c) per_sequence(c);
    };
    products(scores, ptr, scale, [&](int c) {
        const index_t s = s0 + c, M = (offsets[s + 1] - offsets[s]) * H, E = extents[std::size_t(s)];
        BlasOps<cuda>::gemm_bf16<float>(Trans::no, Trans::yes, scale,
                                        View<const bf16, 2, cuda>(qs + table.first_row[c] * H * W, {M, W}, {W, 1}),
                                        View<const bf16, 2, cuda>(table.cache[c], {E, W}, {table.cache_pitch[c], 1}),
                                        0.0f, View<float, 2, cuda>(S.data() + table.scores[c], {M, E}, {E, 1}));
    });
    const index_t rows = (offsets[s0 + count] - row0) * H;
    latent_softmax_kernel<cross_entropy_threads>
        <<<unsigned(rows), cross_entropy_threads, 0, current_stream()>>>(table, lengths + s0, S.data(), P.data());
    cuda_fast::check_launch("latent_softmax_kernel<<<rows, 256, 0, current_stream()>>>");
    products(values, ptr + 3 * count, 1.0f, [&](int c) {
        const index_t s = s0 + c, M = (offsets[s + 1] - offsets[s]) * H, E = extents[std::size_t(s)];
        BlasOps<cuda>::gemm_bf16<float>(
            Trans::no, Trans::no, 1.0f, View<const bf16, 2, cuda>(P.data() + table.scores[c], {M, E}, {E, 1}),
            View<const bf16, 2, cuda>(table.cache[c], {E, value_dim}, {table.cache_pitch[c], 1}), 0.0f,
            View<float, 2, cuda>(os + table.first_row[c] * H * value_dim, {M, value_dim}, {value_dim, 1}));
    });
}
#endif

}  // namespace cuda_detail

/// latent_decode (backend/attention.hpp) for AttentionOps<cuda>: every check first, then the appends, then the
/// attention on tensor cores (nvcc) or the portable functors.
inline void cuda_latent_decode(View<const bf16, 3, cuda> q, View<const bf16, 2, cuda> fresh,
                               std::span<const LatentRows<cuda>> caches, View<const index_t, 1, cuda> lengths,
                               std::span<const index_t> offsets, std::span<const index_t> extents, index_t value_dim,
                               float scale, View<float, 3, cuda> o) {
    using namespace cuda_detail;
    contract::check_latent_decode<cuda>(q, fresh, caches, lengths, offsets, extents, value_dim, o);
    const index_t H = q.shape[1], W = q.shape[2], N = index_t(offsets.size()) - 1;
    for (index_t s = 0; s < N; ++s) {
        const index_t t0 = offsets[s], n = offsets[s + 1] - t0;
        const LatentRows<cuda>& c = caches[std::size_t(s)];
        launch(n * W, LatentAppend{fresh.data + t0 * fresh.strides[0], fresh.strides[0], c.data, c.strides[0], W,
                                   lengths.data + s});
    }
#if !MOONMOE_CUDA_EMULATED
    if (latent_on_tensor_cores()) {
        for (index_t s0 = 0; s0 < N; s0 += latent_max_sequences)
            latent_decode_library(q, caches, lengths.data, offsets, extents, value_dim, scale, o, s0,
                                  int(std::min<index_t>(latent_max_sequences, N - s0)));
        return;
    }
#endif
    for (index_t s = 0; s < N; ++s) {
        const index_t t0 = offsets[s], n = offsets[s + 1] - t0;
        const LatentRows<cuda>& c = caches[std::size_t(s)];
        launch(n * H, LatentRow{q.data + t0 * H * W, c.data, c.strides[0], W, value_dim, H, lengths.data + s, scale,
                                o.data + t0 * H * value_dim});
    }
}

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
