// moonmoe/nn/mha.hpp: plain multi-head attention, the other attention policy (Attention<MHA<...>>), with
// grouped-query key/value heads.
//
//   q = q_proj(x) [T, heads * d], k = k_proj(x), v = v_proj(x) [T, kv_heads * d]; RoPE on the last rope_dim of
//   each q and k head; head h attends with key/value head h / (heads / kv_heads); out = o_proj(o).
// Same contracts as MLA: attention per sequence of the token layout (packed sequences never see each other), the
// per-head maximum scaled logit for QK-Clip, log-sum-exp kept for backward, and a K/V cache per sequence for
// incremental decoding of several sequences at once.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "../config/model_config.hpp"
#include "attention_core.hpp"
#include "layout.hpp"
#include "linear.hpp"
#include "rope.hpp"

namespace moonmoe::nn {

/// Rows of q_proj / k_proj / v_proj that belong to head h (query) or key/value head g.
struct MHAHeadLayout {
    index_t heads, kv_heads, head_dim;
    index_t q_row(index_t h) const { return h * head_dim; }
    index_t kv_row(index_t g) const { return g * head_dim; }
    index_t group_of(index_t h) const { return h / (heads / kv_heads); }
};

template <class B = cpu>
struct MHA {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    AttentionConfig cfg{};
    index_t hidden = 0;
    float softmax_scale = 0;
    Linear<B> q_proj, k_proj, v_proj, o_proj;
    RotaryEmbedding rope;
    std::vector<float> max_logit_per_head;

    struct Cache {
        Mat x, q, k, v, o;
        std::vector<float> lse;  ///< [tokens * heads], per (sequence, head) at lse_offset()
        TokenLayout layout;
    };
    struct KVCache {
        Mat k, v;  ///< [capacity, kv_heads * head_dim], keys already rotated
        index_t length = 0;
        KVCache() = default;
        KVCache(index_t capacity, const AttentionConfig& a)
            : k({capacity, a.kv_heads * (a.nope_dim + a.rope_dim)}), v({capacity, a.kv_heads * a.v_dim}) {}
        index_t capacity() const { return k.size(0); }
    };

    MHA() = default;
    explicit MHA(const ModelConfig& c)
        : cfg(c.attention), hidden(c.dims.hidden),
          softmax_scale(float(moonmoe::softmax_scale(c.rope, c.attention.qk_head_dim()))),
          q_proj(c.dims.hidden, c.attention.heads * c.attention.qk_head_dim()),
          k_proj(c.dims.hidden, c.attention.kv_heads * c.attention.qk_head_dim()),
          v_proj(c.dims.hidden, c.attention.kv_heads * c.attention.v_dim),
          o_proj(c.attention.heads * c.attention.v_dim, c.dims.hidden), rope(c.rope, c.attention.rope_dim),
          max_logit_per_head(static_cast<std::size_t>(c.attention.heads), -INFINITY) {}

    index_t d() const { return cfg.nope_dim + cfg.rope_dim; }
    index_t group() const { return cfg.heads / cfg.kv_heads; }
    MHAHeadLayout head_layout() const { return {cfg.heads, cfg.kv_heads, d()}; }
    void reset_max_logits() { std::fill(max_logit_per_head.begin(), max_logit_per_head.end(), -INFINITY); }

    static View<const float, 2, B> cols(const Mat& m, index_t row0, index_t rows, index_t col0, index_t n) {
        return View<const float, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, n}, {m.size(1), 1});
    }
    static View<float, 2, B> cols(Mat& m, index_t row0, index_t rows, index_t col0, index_t n) {
        return View<float, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, n}, {m.size(1), 1});
    }
    View<float, 3, B> rope_part(Mat& m, index_t heads) const {
        return View<float, 3, B>(m.data() + cfg.nope_dim, {m.size(0), heads, cfg.rope_dim}, {m.size(1), d(), 1});
    }

    void project(View<const float, 2, B> x, const index_t* positions, Mat& q, Mat& k, Mat& v) const {
        const index_t T = x.shape[0];
        q = Mat({T, cfg.heads * d()}), k = Mat({T, cfg.kv_heads * d()}), v = Mat({T, cfg.kv_heads * cfg.v_dim});
        q_proj.forward(x, q.view());
        k_proj.forward(x, k.view());
        v_proj.forward(x, v.view());
        rope.apply(rope_part(q, cfg.heads), positions);
        rope.apply(rope_part(k, cfg.kv_heads), positions);
    }

    /// Query head h of sequence b with its key/value head.
    HeadViews<B> head(const Cache& c, index_t b, index_t h) const {
        const index_t t0 = c.layout.begin(b), S = c.layout.length(b), g = h / group();
        HeadViews<B> hv;
        hv.q[0] = cols(c.q, t0, S, h * d(), d());
        hv.k[0] = cols(c.k, t0, S, g * d(), d());
        hv.v = cols(c.v, t0, S, g * cfg.v_dim, cfg.v_dim);
        return hv;
    }

    /// out = attention(x), x [T, hidden] with T = layout.tokens(); fills the cache for backward.
    void forward(View<const float, 2, B> x, const TokenLayout& layout, View<float, 2, B> out, Cache& c) {
        const index_t T = x.shape[0], H = cfg.heads, N = layout.sequences();
        layout.check_rows(T, "MHA.forward");
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        c.layout = layout;
        c.x = Mat({T, hidden});
        Ops::copy(x, c.x.view());
        project(x, layout.positions.data(), c.q, c.k, c.v);
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

    void backward(View<const float, 2, B> dout, Cache& c, View<float, 2, B> dx, bool accumulate_dx = false) {
        const TokenLayout& layout = c.layout;
        const index_t T = layout.tokens(), G = cfg.kv_heads;
        Mat d_o({T, cfg.heads * cfg.v_dim}), dq(c.q.shape()), dk(c.k.shape()), dv(c.v.shape());
        o_proj.backward(c.o.view(), dout, d_o.view());
        // one task per (sequence, key/value head): the query heads of a group add into the same dK, dV in order
        Ops::for_each(layout.sequences() * G, [&](index_t task) {
            const index_t b = task / G, g = task % G, t0 = layout.begin(b), S = layout.length(b);
            for (index_t i = 0; i < group(); ++i) {
                const index_t h = g * group() + i;
                View<float, 2, B> dq_h[1] = {cols(dq, t0, S, h * d(), d())};
                View<float, 2, B> dk_g[1] = {cols(dk, t0, S, g * d(), d())};
                attention_head_backward<B>(head(c, b, h), softmax_scale, cols(c.o, t0, S, h * cfg.v_dim, cfg.v_dim),
                                           c.lse.data() + lse_offset(layout, cfg.heads, b, h),
                                           cols(d_o, t0, S, h * cfg.v_dim, cfg.v_dim), dq_h, dk_g,
                                           cols(dv, t0, S, g * cfg.v_dim, cfg.v_dim), i > 0);
            }
        });
        rope.apply(rope_part(dq, cfg.heads), layout.positions.data(), true);
        rope.apply(rope_part(dk, G), layout.positions.data(), true);
        q_proj.backward(c.x.view(), dq.view(), dx, accumulate_dx);
        k_proj.backward(c.x.view(), dk.view(), dx, true);
        v_proj.backward(c.x.view(), dv.view(), dx, true);
        c = Cache{};
    }

    /// The next n tokens of one sequence against everything cached so far (causal); appends them to the cache.
    void forward_cached(View<const float, 2, B> x, KVCache& cache, View<float, 2, B> out) const {
        KVCache* one[1] = {&cache};
        forward_cached(x, TokenLayout::sequences(1, x.shape[0], cache.length), one, out);
    }

    /// Several sequences at once: the rows of sequence s of `layout` are its next tokens, at positions
    /// caches[s]->length, ...; each attends to its own cache and, causally, to itself, then is appended to it.
    void forward_cached(View<const float, 2, B> x, const TokenLayout& layout, std::span<KVCache* const> caches,
                        View<float, 2, B> out) const {
        using backend::Trans;
        const index_t T = x.shape[0], N = layout.sequences(), H = cfg.heads;
        layout.check_rows(T, "MHA.forward_cached");
        if (index_t(caches.size()) != N)
            throw std::invalid_argument("MHA.forward_cached: " + std::to_string(caches.size()) + " K/V caches for " +
                                        std::to_string(N) + " sequences");
        for (index_t s = 0; s < N; ++s) {
            const KVCache& cache = *caches[std::size_t(s)];
            if (cache.length + layout.length(s) > cache.capacity())
                throw std::length_error("MHA K/V cache of sequence " + std::to_string(s) + ": " +
                                        std::to_string(cache.length + layout.length(s)) +
                                        " tokens exceed its capacity of " + std::to_string(cache.capacity()));
            layout.check_continues(s, cache.length, "MHA.forward_cached");
        }
        Mat q, k, v;
        project(x, layout.positions.data(), q, k, v);
        for (index_t s = 0; s < N; ++s) {
            KVCache& cache = *caches[std::size_t(s)];
            const index_t t0 = layout.begin(s), n = layout.length(s);
            Ops::copy(cols(std::as_const(k), t0, n, 0, k.size(1)), cols(cache.k, cache.length, n, 0, k.size(1)));
            Ops::copy(cols(std::as_const(v), t0, n, 0, v.size(1)), cols(cache.v, cache.length, n, 0, v.size(1)));
            cache.length += n;
        }
        Mat o({T, H * cfg.v_dim});
        Ops::for_each(N * H, [&](index_t task) {
            const index_t s = task / H, h = task % H, g = h / group(), t0 = layout.begin(s), n = layout.length(s);
            const KVCache& cache = *caches[std::size_t(s)];
            const index_t L = cache.length;
            Mat scores({n, L});
            Ops::gemm(Trans::no, Trans::yes, softmax_scale, cols(q, t0, n, h * d(), d()), cols(cache.k, 0, L, g * d(), d()),
                      0.0f, scores.view());
            Ops::softmax_rows(scores.view(), L - n);
            Ops::gemm(Trans::no, Trans::no, 1.0f, scores.view(), cols(cache.v, 0, L, g * cfg.v_dim, cfg.v_dim), 0.0f,
                      cols(o, t0, n, h * cfg.v_dim, cfg.v_dim));
        });
        o_proj.forward(o.view(), out);
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        q_proj.visit_params(name + ".q_proj", f);
        k_proj.visit_params(name + ".k_proj", f);
        v_proj.visit_params(name + ".v_proj", f);
        o_proj.visit_params(name + ".o_proj", f);
    }
};

}  // namespace moonmoe::nn
