// moonmoe/backend/cuda/attention.hpp: AttentionOps<cuda> (backend/attention.hpp).
//
// The portable path: Thrust functors over counting iterators (cuda/map.hpp's launch), which serve the emulated mode
// and are the reference a fused kernel is checked against. No S x S score matrix is ever formed:
//   forward   one thread per (query row, head) runs an online softmax over the keys it sees (Milakov & Gimelshein,
//             "Online normalizer calculation for softmax", arXiv:1805.02867): running maximum m, running sum l (in
//             double, as the CPU sums its exponentials), o accumulated in place and rescaled when m grows, then
//             o /= l and lse = m + log(l). Each row's maximum goes to a scratch tensor, and one thread per head
//             max-accumulates those into max_logit (a max does not depend on order: deterministic, no atomics).
//   backward  P is recomputed from lse. First rowsum(dO * O) per (row, head) (in double, as the CPU); then dQ per
//             (query row, head) over the keys it sees, and dK, dV per (key row, key/value head) over the query rows
//             that see it and the query heads of its group, in head order: every output has one writer, no atomics.
//   decode    the forward's per-(row, head) loop against each sequence's cache; MLA's absorbed decode over bf16
//             latent caches is cuda/latent.hpp's.
// Forward, backward and decode launch once per sequence (its first row and length go into the functor by value),
// so the host offsets never travel to the device and nothing waits on the host.
//
// Scores are scale * (q_nope . k_nope) + scale * (q_rope . k_rope), the dots in f32 in key-column order; MLA's rope
// key is one head read by all (a head stride of 0). The CPU forms the same scores with Eigen GEMMs (another
// summation order) and exponentiates with Eigen's vectorised exp, so results agree to rounding, not bitwise.
// test/unit/backend_attention.cpp holds both backends to the same tolerances against double loops: o and the
// gradients within 1e-4, lse and max_logit within 1e-5 (relative). Against the CPU directly (emulated mode, an MLA
// problem of sequences of 40 and 260 rows, 64 + 32 query/key dims with a shared rope key, 64 value dims, values
// of order 1 to 6) every output differed by at most 2.4e-6 absolute, a few f32 ulp. On a GPU, nvcc's FMA
// contraction and device expf (2 ulp) add differences of the same order. rope is bitwise the CPU's in the
// emulated mode (same f32 expressions, glibc's cosf / sinf).
//
// For speed, under nvcc, forward and backward can take the fused FlashAttention-2 kernels of fast/attention.hpp
// (opt-in: fast/select.hpp), which keep this contract and are checked against these functors by
// test/nvcc/fast_kernels.cu. The f32 decode stays here (Precision<F32>'s reference); the bf16 one runs on tensor cores
// (cuda/latent.hpp). This file stays the reference.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cmath>
#include <span>
#include <string>

#include "../../tensor/tensor.hpp"
#include "../attention.hpp"
#include "attention_portable.hpp"
#include "latent.hpp"  // latent_decode: MLA's absorbed decode over bf16 latent caches
#include "sdpa.hpp"    // the bf16 path on a fused engine (cuDNN: cuda/cudnn.hpp)
#if !MOONMOE_CUDA_EMULATED
#include "fast/attention.hpp"  // the fused kernels, opt-in (fast/select.hpp)
#include "fast/select.hpp"
#endif

namespace moonmoe::backend {

template <>
struct AttentionOps<cuda> {
    /// RoPE in place over x [rows, heads, dim], HF-exact in f32 (nn/rope.hpp): one thread per (row, head, pair).
    /// The half-split order reads and writes each pair in place; the interleaved one goes through a scratch copy.
    static void rope(View<float, 3, cuda> x, View<const index_t, 1, cuda> positions,
                     View<const float, 1, cuda> inv_freq, float attention_factor, bool interleave, bool transpose) {
        using namespace cuda_detail;
        contract::check_rope(x, positions, inv_freq);
        const index_t rows = x.shape[0], heads = x.shape[1], dim = x.shape[2], half = dim / 2;
        const index_t pairs = rows * heads * half;
        if (pairs == 0) return;
        const HeadRows<float> xs = head_rows(x);
        if (!interleave) {
            launch(pairs, RopePair{{xs.data, xs.row, xs.head, dim},
                                   xs,
                                   positions.data,
                                   inv_freq.data,
                                   attention_factor,
                                   false,
                                   transpose,
                                   heads,
                                   half});
            return;
        }
        Tensor<float, 3, cuda> tmp({rows, heads, dim});
        const HeadRows<float> ts = head_rows(tmp.view());
        launch(pairs, RopePair{{xs.data, xs.row, xs.head, dim},
                               ts,
                               positions.data,
                               inv_freq.data,
                               attention_factor,
                               true,
                               transpose,
                               heads,
                               half});
        launch(rows * heads * dim, CopyHeads{{ts.data, ts.row, ts.head, dim}, xs, heads});
    }

    /// o = softmax(causal scores) V for every (sequence, head); lse and max_logit as in backend/attention.hpp.
    static void attention_forward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                                  std::span<const index_t> offsets, float scale, View<float, 3, cuda> o,
                                  View<float, 1, cuda> lse, View<float, 1, cuda> max_logit) {
        using namespace cuda_detail;
        const index_t G = contract::check_forward(q, kv, offsets, o, lse, max_logit);
        if (sdpa_takes(q, kv)) return sdpa_forward(q, kv, offsets, scale, o, lse, max_logit);
#if !MOONMOE_CUDA_EMULATED
        if (cuda_fast_kernels().attention && cuda_fast::attention_supported(q, kv))
            return cuda_fast::attention_forward(q, kv, offsets, scale, o, lse, max_logit);
#endif
        portable_attention_forward(q, kv, offsets, scale, o, lse, max_logit, G);
    }

    /// Gradients of attention_forward, P recomputed from lse.
    static void attention_backward(const AttentionQueries<cuda>& q, const AttentionKeys<cuda>& kv,
                                   std::span<const index_t> offsets, float scale, View<const float, 3, cuda> o,
                                   View<const float, 1, cuda> lse, View<const float, 3, cuda> d_o,
                                   const AttentionGrads<cuda>& grads) {
        using namespace cuda_detail;
        const index_t KV = contract::check_backward(q, kv, offsets, o, lse, d_o, grads);
        if (sdpa_takes(q, kv)) return sdpa_backward(q, kv, offsets, scale, o, lse, d_o, grads);
#if !MOONMOE_CUDA_EMULATED
        if (cuda_fast_kernels().attention && cuda_fast::attention_supported(q, kv))
            return cuda_fast::attention_backward(q, kv, offsets, scale, o, lse, d_o, grads);
#endif
        portable_attention_backward(q, kv, offsets, scale, o, lse, d_o, grads, KV);
    }

    /// Decoding: the rows of sequence s attend to caches[s], of which they are the last rows.
    static void attention_decode(const AttentionQueries<cuda>& q, std::span<const AttentionKeys<cuda>> caches,
                                 std::span<const index_t> offsets, float scale, View<float, 3, cuda> o) {
        using namespace cuda_detail;
        const index_t H = q.q[0].shape[1], N = index_t(offsets.size()) - 1;
        contract::check_decode(q, caches, offsets, o);  // every check before the first launch, as the CPU
        for (index_t s = 0; s < N; ++s) {
            const AttentionKeys<cuda>& kv = caches[std::size_t(s)];
            const index_t t0 = offsets[s], n = offsets[s + 1] - t0, L = kv.k[0].shape[0];
            launch(n * H, ForwardRow{scores(q, kv, scale), head_rows(kv.v), head_rows(o), Span{t0, n, 0, L, L - n}, H,
                                     H / kv.k[0].shape[1], nullptr, nullptr});
        }
    }

    /// MLA's absorbed decode over bf16 latent caches (cuda/latent.hpp: tensor cores under nvcc).
    static void latent_decode(View<const bf16, 3, cuda> q, View<const bf16, 2, cuda> fresh,
                              std::span<const LatentRows<cuda>> caches, View<const index_t, 1, cuda> lengths,
                              std::span<const index_t> offsets, std::span<const index_t> extents, index_t value_dim,
                              float scale, View<float, 3, cuda> o) {
        cuda_latent_decode(q, fresh, caches, lengths, offsets, extents, value_dim, scale, o);
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
