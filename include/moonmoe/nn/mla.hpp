// moonmoe/nn/mla.hpp: Multi-head Latent Attention (DeepSeek-V2, arXiv 2405.04434, §2.1; transformers' DeepseekV3Attention), training (naive) form.
//
//   q  = q_b_proj(q_a_layernorm(q_a_proj(x)))  [or q_proj(x)]     -> per head [nope | rope]
//   ckv = kv_a_proj_with_mqa(x) = [c (kv_rank) | k_pe (rope, one head shared by all)]
//   kv = kv_b_proj(kv_a_layernorm(c))                              -> per head [k_nope | v]
//   RoPE on q_pe and k_pe; scores = softmax_scale * (q_nope.k_nope + q_pe.k_pe), causal; o = softmax(scores) v
//   out = o_proj(o)
// Attention runs per sequence of the token layout (packed sequences never see each other); the projections run on
// every row of the batch at once.
// Scores are two GEMMs per head (nope and rope parts; attention_core.hpp), so k is never materialised. Backward
// keeps the inputs of each projection and the per-row log-sum-exp of the scores, and recomputes the probabilities
// (no S x S tensor survives forward). Forward records the per-head maximum scaled logit for QK-Clip.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "../config/model_config.hpp"
#include "attention_core.hpp"
#include "layout.hpp"
#include "linear.hpp"
#include "rmsnorm.hpp"
#include "rope.hpp"

namespace moonmoe::nn {

/// Which rows of q_b_proj (or q_proj) and kv_b_proj belong to head h, and to its nope / rope / v parts.
struct MLAHeadLayout {
    index_t heads, nope, rope, v;
    index_t q_row(index_t h) const { return h * (nope + rope); }            ///< nope rows [q_row, q_row + nope)
    index_t q_rope_row(index_t h) const { return h * (nope + rope) + nope; }  ///< rope rows, `rope` of them
    index_t k_nope_row(index_t h) const { return h * (nope + v); }          ///< kv_b rows of k_nope, `nope`
    index_t v_row(index_t h) const { return h * (nope + v) + nope; }        ///< kv_b rows of v, `v` of them
};

template <class B = cpu>
struct MLA {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    AttentionConfig cfg{};
    index_t hidden = 0;
    float softmax_scale = 0;
    Linear<B> q_a_proj, q_b_proj, q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj;
    RMSNorm<B> q_a_layernorm, kv_a_layernorm;
    RotaryEmbedding rope;
    /// Maximum over every forward since reset_max_logits() of softmax_scale * q.k, per head (QK-Clip's S_max).
    std::vector<float> max_logit_per_head;

    struct Cache {
        Mat x, cq, cqn, c, cn, q, kv, kpe, o;
        std::vector<float> cq_rstd, c_rstd;
        std::vector<float> lse;  ///< [tokens * heads], per (sequence, head) at lse_offset()
        TokenLayout layout;
    };

    MLA() = default;
    MLA(const ModelConfig& c)
        : cfg(c.attention), hidden(c.dims.hidden),
          softmax_scale(float(moonmoe::softmax_scale(c.rope, c.attention.qk_head_dim()))),
          kv_a_proj_with_mqa(c.dims.hidden, c.attention.kv_rank + c.attention.rope_dim),
          kv_b_proj(c.attention.kv_rank, c.attention.heads * (c.attention.nope_dim + c.attention.v_dim)),
          o_proj(c.attention.heads * c.attention.v_dim, c.dims.hidden),
          kv_a_layernorm(c.attention.kv_rank, 1e-6),  // HF builds the latent norms with the default eps
          rope(c.rope, c.attention.rope_dim), max_logit_per_head(std::size_t(c.attention.heads), -INFINITY) {
        const index_t qdim = c.attention.heads * c.attention.qk_head_dim();
        if (cfg.q_rank > 0) {
            q_a_proj = Linear<B>(hidden, cfg.q_rank);
            q_a_layernorm = RMSNorm<B>(cfg.q_rank, 1e-6);
            q_b_proj = Linear<B>(cfg.q_rank, qdim);
        } else {
            q_proj = Linear<B>(hidden, qdim);
        }
    }

    index_t dqk() const { return cfg.nope_dim + cfg.rope_dim; }
    index_t kv_width() const { return cfg.nope_dim + cfg.v_dim; }
    MLAHeadLayout head_layout() const { return {cfg.heads, cfg.nope_dim, cfg.rope_dim, cfg.v_dim}; }
    void reset_max_logits() { std::fill(max_logit_per_head.begin(), max_logit_per_head.end(), -INFINITY); }

    // ---- projections shared by the naive and the absorbed forms ----

    /// q [T, heads * dqk] with RoPE applied; keeps what backward needs in `c` when given.
    void project_q(View<const float, 2, B> x, const index_t* positions, Mat& q, Cache* c) const {
        const index_t T = x.shape[0];
        q = Mat({T, cfg.heads * dqk()});
        if (cfg.q_rank > 0) {
            Mat cq({T, cfg.q_rank}), cqn({T, cfg.q_rank});
            std::vector<float> rstd(static_cast<std::size_t>(T));
            q_a_proj.forward(x, cq.view());
            q_a_layernorm.forward(cq.view(), cqn.view(), rstd.data());
            q_b_proj.forward(cqn.view(), q.view());
            if (c) c->cq = std::move(cq), c->cqn = std::move(cqn), c->cq_rstd = std::move(rstd);
        } else {
            q_proj.forward(x, q.view());
        }
        rope.apply(q_rope_part(q.view()), positions);
    }

    /// The normalised latent cn [T, kv_rank] and the rotated shared key kpe [T, rope].
    void project_latent(View<const float, 2, B> x, const index_t* positions, Mat& cn, Mat& kpe, Cache* c) const {
        const index_t T = x.shape[0], r = cfg.kv_rank;
        Mat ckv({T, r + cfg.rope_dim}), latent({T, r});
        kv_a_proj_with_mqa.forward(x, ckv.view());
        kpe = Mat({T, cfg.rope_dim});
        Ops::for_each(T, [&](index_t t) {
            for (index_t j = 0; j < r; ++j) latent(t, j) = ckv(t, j);
            for (index_t j = 0; j < cfg.rope_dim; ++j) kpe(t, j) = ckv(t, r + j);
        });
        std::vector<float> rstd(static_cast<std::size_t>(T));
        cn = Mat({T, r});
        kv_a_layernorm.forward(latent.view(), cn.view(), rstd.data());
        rope.apply(kpe.view().template reshape<3>({T, 1, cfg.rope_dim}), positions);
        if (c) c->c = std::move(latent), c->c_rstd = std::move(rstd);
    }

    View<float, 3, B> q_rope_part(View<float, 2, B> q) const {
        return View<float, 3, B>(q.data + cfg.nope_dim, {q.shape[0], cfg.heads, cfg.rope_dim},
                                 {q.strides[0], dqk(), 1});
    }
    static View<const float, 2, B> cols(const Mat& m, index_t row0, index_t rows, index_t col0, index_t ncols) {
        return View<const float, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, ncols}, {m.size(1), 1});
    }
    static View<float, 2, B> cols(Mat& m, index_t row0, index_t rows, index_t col0, index_t ncols) {
        return View<float, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, ncols}, {m.size(1), 1});
    }

    // ---- naive (training) form ----

    /// out = attention(x), x [T, hidden] with T = layout.tokens(); fills the cache for backward.
    void forward(View<const float, 2, B> x, const TokenLayout& layout, View<float, 2, B> out, Cache& c) {
        const index_t T = x.shape[0], H = cfg.heads, N = layout.sequences();
        layout.check_rows(T, "MLA.forward");
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        c.layout = layout;
        c.x = Mat({T, hidden});
        Ops::copy(x, c.x.view());
        project_q(x, layout.positions.data(), c.q, &c);
        project_latent(x, layout.positions.data(), c.cn, c.kpe, &c);
        c.kv = Mat({T, H * kv_width()});
        kv_b_proj.forward(c.cn.view(), c.kv.view());
        c.o = Mat({T, H * cfg.v_dim});
        c.lse.assign(static_cast<std::size_t>(T * H), 0.0f);
        std::vector<float> task_max(static_cast<std::size_t>(N * H), -INFINITY);
        Ops::for_each(N * H, [&](index_t task) {
            const index_t b = task / H, h = task % H;
            task_max[task] = attention_head_forward<B>(head(c, b, h), softmax_scale,
                                                       cols(c.o, layout.begin(b), layout.length(b), h * cfg.v_dim, cfg.v_dim),
                                                       c.lse.data() + lse_offset(layout, H, b, h));
        });
        for (index_t task = 0; task < N * H; ++task)
            max_logit_per_head[task % H] = std::max(max_logit_per_head[task % H], task_max[task]);
        o_proj.forward(c.o.view(), out);
    }

    /// Head h of sequence b: two parts, (q_nope, k_nope) and (q_pe, the shared k_pe), and its values.
    HeadViews<B> head(const Cache& c, index_t b, index_t h) const {
        const index_t t0 = c.layout.begin(b), S = c.layout.length(b);
        HeadViews<B> hv;
        hv.parts = 2;
        hv.q[0] = cols(c.q, t0, S, h * dqk(), cfg.nope_dim);
        hv.k[0] = cols(c.kv, t0, S, h * kv_width(), cfg.nope_dim);
        hv.q[1] = cols(c.q, t0, S, h * dqk() + cfg.nope_dim, cfg.rope_dim);
        hv.k[1] = cols(c.kpe, t0, S, 0, cfg.rope_dim);
        hv.v = cols(c.kv, t0, S, h * kv_width() + cfg.nope_dim, cfg.v_dim);
        return hv;
    }

    /// Accumulates parameter gradients; writes dx (or adds to it when accumulate_dx).
    void backward(View<const float, 2, B> dout, Cache& c, View<float, 2, B> dx, bool accumulate_dx = false) {
        using backend::Trans;
        const TokenLayout& layout = c.layout;
        const index_t T = layout.tokens(), H = cfg.heads, R = cfg.rope_dim;
        Mat d_o({T, H * cfg.v_dim});
        o_proj.backward(c.o.view(), dout, d_o.view());
        Mat dq({T, H * dqk()}), dkv({T, H * kv_width()}), dkpe_heads({T, H * R});
        Ops::for_each(layout.sequences() * H, [&](index_t task) {
            const index_t b = task / H, h = task % H, t0 = layout.begin(b), S = layout.length(b);
            View<float, 2, B> dq_parts[2] = {cols(dq, t0, S, h * dqk(), cfg.nope_dim),
                                             cols(dq, t0, S, h * dqk() + cfg.nope_dim, R)};
            View<float, 2, B> dk_parts[2] = {cols(dkv, t0, S, h * kv_width(), cfg.nope_dim),
                                             cols(dkpe_heads, t0, S, h * R, R)};  // summed over heads below
            attention_head_backward<B>(head(c, b, h), softmax_scale, cols(c.o, t0, S, h * cfg.v_dim, cfg.v_dim),
                                       c.lse.data() + lse_offset(layout, H, b, h), cols(d_o, t0, S, h * cfg.v_dim, cfg.v_dim),
                                       dq_parts, dk_parts, cols(dkv, t0, S, h * kv_width() + cfg.nope_dim, cfg.v_dim),
                                       false);
        });
        // the shared key: sum over heads in order, then undo RoPE
        const index_t r = cfg.kv_rank;
        Mat dckv({T, r + R});
        Ops::for_each(T, [&](index_t t) {
            for (index_t j = 0; j < R; ++j) {
                float s = 0.0f;
                for (index_t h = 0; h < H; ++h) s += dkpe_heads(t, h * R + j);
                dckv(t, r + j) = s;
            }
        });
        rope.apply(View<float, 3, B>(dckv.data() + r, {T, 1, R}, {r + R, R, 1}), layout.positions.data(), true);
        rope.apply(q_rope_part(dq.view()), layout.positions.data(), true);
        // latent path: kv_b_proj, kv_a_layernorm, into the first kv_rank columns of dckv
        Mat dcn({T, r});
        kv_b_proj.backward(c.cn.view(), dkv.view(), dcn.view());
        kv_a_layernorm.backward(c.c.view(), c.c_rstd.data(), dcn.view(), cols(dckv, 0, T, 0, r));
        kv_a_proj_with_mqa.backward(c.x.view(), dckv.view(), dx, accumulate_dx);
        if (cfg.q_rank > 0) {
            Mat dcqn({T, cfg.q_rank}), dcq({T, cfg.q_rank});
            q_b_proj.backward(c.cqn.view(), dq.view(), dcqn.view());
            q_a_layernorm.backward(c.cq.view(), c.cq_rstd.data(), dcqn.view(), dcq.view());
            q_a_proj.backward(c.x.view(), dcq.view(), dx, true);
        } else {
            q_proj.backward(c.x.view(), dq.view(), dx, true);
        }
        c = Cache{};
    }

    // ---- absorbed (inference) form with a latent KV cache ----

    /// Per token and layer the cache holds kv_a_layernorm(c) (kv_rank values) and the rotated k_pe (rope values):
    /// 576 values for K2, against heads * (dqk + v) = 20480 for a plain K/V cache.
    struct LatentCache {
        Mat kv, pe;  ///< [capacity, kv_rank], [capacity, rope]
        index_t length = 0;
        LatentCache() = default;
        LatentCache(index_t capacity, const AttentionConfig& a) : kv({capacity, a.kv_rank}), pe({capacity, a.rope_dim}) {}
        index_t capacity() const { return kv.size(0); }
    };

    /// Attends `x` [n, hidden] (the next n tokens of one sequence, at positions cache.length ...) to everything
    /// cached so far and to itself, causally; appends the n tokens to the cache.
    void forward_absorbed(View<const float, 2, B> x, LatentCache& cache, View<float, 2, B> out) const {
        LatentCache* one[1] = {&cache};
        forward_absorbed(x, TokenLayout::sequences(1, x.shape[0], cache.length), one, out);
    }

    /// Several sequences at once: the rows of sequence s of `layout` are its next tokens, at positions
    /// caches[s]->length, ... (layout.positions must say so). Each attends to its own cache and, causally, to
    /// itself, then is appended to it; caches may hold different lengths. The projections run on all rows together;
    /// q_nope is absorbed into the latent space (q_lat = q_nope W_UK) and the output leaves it through W_UV, so
    /// keys and values are never formed.
    void forward_absorbed(View<const float, 2, B> x, const TokenLayout& layout, std::span<LatentCache* const> caches,
                          View<float, 2, B> out) const {
        using backend::Trans;
        const index_t T = x.shape[0], N = layout.sequences(), H = cfg.heads, r = cfg.kv_rank, R = cfg.rope_dim;
        layout.check_rows(T, "MLA.forward_absorbed");
        if (index_t(caches.size()) != N)
            throw std::invalid_argument("MLA.forward_absorbed: " + std::to_string(caches.size()) + " latent caches for " +
                                        std::to_string(N) + " sequences");
        for (index_t s = 0; s < N; ++s) {
            const LatentCache& cache = *caches[std::size_t(s)];
            if (cache.length + layout.length(s) > cache.capacity())
                throw std::length_error("MLA latent cache of sequence " + std::to_string(s) + ": " +
                                        std::to_string(cache.length + layout.length(s)) +
                                        " tokens exceed its capacity of " + std::to_string(cache.capacity()));
            layout.check_continues(s, cache.length, "MLA.forward_absorbed");
        }
        Mat q, cn, kpe;
        project_q(x, layout.positions.data(), q, nullptr);
        project_latent(x, layout.positions.data(), cn, kpe, nullptr);
        for (index_t s = 0; s < N; ++s) {
            LatentCache& cache = *caches[std::size_t(s)];
            const index_t t0 = layout.begin(s), n = layout.length(s);
            Ops::copy(cols(std::as_const(cn), t0, n, 0, r), cols(cache.kv, cache.length, n, 0, r));
            Ops::copy(cols(std::as_const(kpe), t0, n, 0, R), cols(cache.pe, cache.length, n, 0, R));
            cache.length += n;
        }
        Mat o({T, H * cfg.v_dim});
        const Mat& Wkvb = kv_b_proj.weight.value;
        Ops::for_each(N * H, [&](index_t task) {
            const index_t s = task / H, h = task % H, t0 = layout.begin(s), n = layout.length(s);
            const LatentCache& cache = *caches[std::size_t(s)];
            const index_t L = cache.length;
            Mat q_lat({n, r}), scores({n, L}), o_lat({n, r});
            // q_lat = q_nope W_UK[h], W_UK[h] = kv_b rows [h*(nope+v), +nope) : [nope, kv_rank]
            Ops::gemm(Trans::no, Trans::no, 1.0f, cols(q, t0, n, h * dqk(), cfg.nope_dim),
                      cols(Wkvb, h * kv_width(), cfg.nope_dim, 0, r), 0.0f, q_lat.view());
            Ops::gemm(Trans::no, Trans::yes, softmax_scale, q_lat.view(), cols(cache.kv, 0, L, 0, r), 0.0f, scores.view());
            Ops::gemm(Trans::no, Trans::yes, softmax_scale, cols(q, t0, n, h * dqk() + cfg.nope_dim, R),
                      cols(cache.pe, 0, L, 0, R), 1.0f, scores.view());
            Ops::softmax_rows(scores.view(), L - n);
            Ops::gemm(Trans::no, Trans::no, 1.0f, scores.view(), cols(cache.kv, 0, L, 0, r), 0.0f, o_lat.view());
            // o = o_lat W_UV[h]^T, W_UV[h] = kv_b rows [h*(nope+v)+nope, +v) : [v, kv_rank]
            Ops::gemm(Trans::no, Trans::yes, 1.0f, o_lat.view(), cols(Wkvb, h * kv_width() + cfg.nope_dim, cfg.v_dim, 0, r),
                      0.0f, cols(o, t0, n, h * cfg.v_dim, cfg.v_dim));
        });
        o_proj.forward(o.view(), out);
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        if (cfg.q_rank > 0) {
            q_a_proj.visit_params(name + ".q_a_proj", f);
            q_a_layernorm.visit_params(name + ".q_a_layernorm", f);
            q_b_proj.visit_params(name + ".q_b_proj", f);
        } else {
            q_proj.visit_params(name + ".q_proj", f);
        }
        kv_a_proj_with_mqa.visit_params(name + ".kv_a_proj_with_mqa", f);
        kv_a_layernorm.visit_params(name + ".kv_a_layernorm", f);
        kv_b_proj.visit_params(name + ".kv_b_proj", f);
        o_proj.visit_params(name + ".o_proj", f);
    }
};

}  // namespace moonmoe::nn
