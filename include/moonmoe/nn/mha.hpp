// moonmoe/nn/mha.hpp: plain multi-head attention, the other attention policy (Attention<MHA<...>>), with
// grouped-query key/value heads.
//
//   q = q_proj(x) [T, heads * d], k = k_proj(x), v = v_proj(x) [T, kv_heads * d]; RoPE on the last rope_dim of
//   each q and k head; head h attends with key/value head h / (heads / kv_heads); out = o_proj(o).
// Same contracts as MLA: attention per sequence of the token layout (packed sequences never see each other), the
// per-head maximum scaled logit for QK-Clip, log-sum-exp kept for backward, and a K/V cache per sequence for
// incremental decoding of several sequences at once. The bf16 policy rounds as MLA does (nn/mla.hpp); kept values
// are stored as the activation policy says (nn/kept.hpp), and x is not kept when the caller recomputes it.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>
#include <vector>

#include "../config/model_config.hpp"
#include "attention_core.hpp"
#include "kept.hpp"
#include "layout.hpp"
#include "linear.hpp"
#include "pass.hpp"
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
    RotaryEmbedding<B> rope;
    /// Maximum scaled logit per head since reset_max_logits(), on the backend (as MLA's; optim/qk_clip.hpp).
    Tensor<float, 1, B> max_logit_per_head;
    NumberFormat compute = NumberFormat::f32;

    void set_precision(const PrecisionConfig& p) {
        compute = p.compute;
        for (Linear<B>* l : {&q_proj, &k_proj, &v_proj, &o_proj}) l->set_precision(p);
    }
    void refresh_working() {
        for (Linear<B>* l : {&q_proj, &k_proj, &v_proj, &o_proj}) l->refresh_working();
    }
    ActivationsConfig kept{};  ///< what forward keeps, and in which formats (nn/kept.hpp)
    bool keep_input = true;    ///< false: backward is handed x (a recomputed norm output)
    /// What forward keeps (config/activations.hpp), and whether it keeps x (KeepInput::no: backward is handed it).
    void set_activations(const ActivationsConfig& a, KeepInput keep = KeepInput::yes) {
        kept = a;
        keep_input = keep == KeepInput::yes;
    }

    struct Cache {
        KeptMatrix<B> x, q, k, v, o;
        Tensor<float, 1, B> lse;  ///< [tokens * heads], per (sequence, head) at lse_offset()
        std::shared_ptr<const Tensor<index_t, 1, B>> positions;  ///< the layout's, shared by its layers
        TokenLayout layout;
        std::size_t bytes() const {
            std::size_t n = lse.bytes();  // not the positions: the layout's, shared
            for (const KeptMatrix<B>* m : {&x, &q, &k, &v, &o}) n += m->bytes();
            return n;
        }
        template <class F>
        void for_each_kept(F&& f) {
            for (KeptMatrix<B>* m : {&x, &q, &k, &v, &o}) f(*m);
        }
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
        : cfg(c.attention),
          hidden(c.dims.hidden),
          softmax_scale(float(moonmoe::softmax_scale(c.rope, c.attention.qk_head_dim()))),
          q_proj(c.dims.hidden, c.attention.heads * c.attention.qk_head_dim(), ParamKind::matrix, c.precision),
          k_proj(c.dims.hidden, c.attention.kv_heads * c.attention.qk_head_dim(), ParamKind::matrix, c.precision),
          v_proj(c.dims.hidden, c.attention.kv_heads * c.attention.v_dim, ParamKind::matrix, c.precision),
          o_proj(c.attention.heads * c.attention.v_dim, c.dims.hidden, ParamKind::matrix, c.precision),
          rope(c.rope, c.attention.rope_dim),
          max_logit_per_head(Shape<1>{c.attention.heads}),
          compute(c.precision.compute) {
        reset_max_logits();
        set_activations(c.activations);
    }

    index_t d() const { return cfg.nope_dim + cfg.rope_dim; }
    index_t group() const { return cfg.heads / cfg.kv_heads; }
    MHAHeadLayout head_layout() const { return {cfg.heads, cfg.kv_heads, d()}; }
    /// The projections QK-Clip rescales (optim/qk_clip.hpp).
    Linear<B>& query_projection() { return q_proj; }
    Linear<B>& key_projection() { return k_proj; }
    void reset_max_logits() {
        if (!max_logit_per_head.empty()) Ops::fill(max_logit_per_head.template reshape<2>({1, cfg.heads}), -INFINITY);
    }

    static View<const float, 2, B> cols(const Mat& m, index_t row0, index_t rows, index_t col0, index_t n) {
        return View<const float, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, n}, {m.size(1), 1});
    }
    static View<float, 2, B> cols(Mat& m, index_t row0, index_t rows, index_t col0, index_t n) {
        return View<float, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, n}, {m.size(1), 1});
    }
    View<float, 3, B> rope_part(Mat& m, index_t heads) const {
        return View<float, 3, B>(m.data() + cfg.nope_dim, {m.size(0), heads, cfg.rope_dim}, {m.size(1), d(), 1});
    }

    void project(View<const float, 2, B> x, View<const index_t, 1, B> positions, Mat& q, Mat& k, Mat& v) const {
        const index_t T = x.shape[0];
        q = Mat({T, cfg.heads * d()}), k = Mat({T, cfg.kv_heads * d()}), v = Mat({T, cfg.kv_heads * cfg.v_dim});
        q_proj.forward(x, q.view());
        k_proj.forward(x, k.view());
        v_proj.forward(x, v.view());
        rope.apply(rope_part(q, cfg.heads), positions);
        rope.apply(rope_part(k, cfg.kv_heads), positions);
        round_to(compute, q.view());
        round_to(compute, k.view());
    }

    /// Every query head, and the key / value heads they read (query head h reads h / group()).
    backend::AttentionQueries<B> queries(const Mat& q) const { return {1, {heads_view(q, 0, cfg.heads, d(), d())}}; }
    backend::AttentionKeys<B> keys(const Mat& k, const Mat& v) const {
        return {{heads_view(k, 0, cfg.kv_heads, d(), d())}, heads_view(v, 0, cfg.kv_heads, cfg.v_dim, cfg.v_dim)};
    }

    /// out = attention(x), x [T, hidden] with T = layout.tokens(); fills the cache for backward. Training and
    /// measurement forwards record the per-head maxima (nn/pass.hpp).
    void forward(View<const float, 2, B> x, const TokenLayout& layout, View<float, 2, B> out, Cache& c,
                 Pass pass = Pass::training) {
        const index_t T = x.shape[0], H = cfg.heads;
        layout.check_rows(T, "MHA.forward");
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        c.layout = layout;
        c.positions = layout.template device_positions<B>();
        if (keep_input) c.x = KeptMatrix<B>::copy(x, kept.value_format());
        Mat q, k, v, o({T, H * cfg.v_dim});
        project(x, c.positions->view(), q, k, v);
        c.lse = Tensor<float, 1, B>({T * H});
        Ops::attention_forward(
            queries(q), keys(k, v), layout.offsets(), softmax_scale, heads_view(o, 0, H, cfg.v_dim, cfg.v_dim),
            c.lse.view(),
            records_max_logits(pass) ? max_logit_per_head.view() : View<float, 1, B>{});  // none unless recorded
        round_to(compute, o.view());
        o_proj.forward(o.view(), out);
        c.q = KeptMatrix<B>(std::move(q), kept.value_format());
        c.k = KeptMatrix<B>(std::move(k), kept.value_format());
        c.v = KeptMatrix<B>(std::move(v), kept.value_format());
        c.o = KeptMatrix<B>(std::move(o), kept.value_format());
    }

    /// Accumulates parameter gradients; writes dx (or adds to it under Accumulate::yes). `x` is the forward's
    /// input, required when the input is not kept (KeepInput::no; ignored otherwise).
    void backward(View<const float, 2, B> dout, Cache& c, View<float, 2, B> dx,
                  Accumulate accumulate_dx = Accumulate::no, View<const float, 2, B> x = {}) {
        const TokenLayout& layout = c.layout;
        const index_t T = layout.tokens(), H = cfg.heads, G = cfg.kv_heads;
        Mat kept_x;
        x = input_for_backward(c.x, kept_x, x, T, "MHA");
        const Mat q = c.q.take("MHA's q"), k = c.k.take("MHA's k"), v = c.v.take("MHA's v"), o = c.o.take("MHA's o");
        Mat d_o({T, H * cfg.v_dim}), dq(q.shape()), dk(k.shape()), dv(v.shape());
        o_proj.backward(o.view(), dout, d_o.view());
        backend::AttentionGrads<B> grads;
        grads.dq[0] = heads_view(dq, 0, H, d(), d());
        grads.dk[0] = heads_view(dk, 0, G, d(), d());
        grads.dv = heads_view(dv, 0, G, cfg.v_dim, cfg.v_dim);
        Ops::attention_backward(queries(q), keys(k, v), layout.offsets(), softmax_scale,
                                heads_view(o, 0, H, cfg.v_dim, cfg.v_dim), c.lse.view(),
                                heads_view(std::as_const(d_o), 0, H, cfg.v_dim, cfg.v_dim), grads);
        rope.apply(rope_part(dq, H), c.positions->view(), Rotation::transposed);
        rope.apply(rope_part(dk, G), c.positions->view(), Rotation::transposed);
        q_proj.backward(x, dq.view(), dx, accumulate_dx);
        k_proj.backward(x, dk.view(), dx, Accumulate::yes);
        v_proj.backward(x, dv.view(), dx, Accumulate::yes);
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
        const auto positions = layout.template device_positions<B>();
        Mat q, k, v;
        project(x, positions->view(), q, k, v);
        std::vector<backend::AttentionKeys<B>> cached;
        const index_t G = cfg.kv_heads;
        for (index_t s = 0; s < N; ++s) {
            KVCache& cache = *caches[std::size_t(s)];
            const index_t t0 = layout.begin(s), n = layout.length(s);
            Ops::copy(cols(std::as_const(k), t0, n, 0, k.size(1)), cols(cache.k, cache.length, n, 0, k.size(1)));
            Ops::copy(cols(std::as_const(v), t0, n, 0, v.size(1)), cols(cache.v, cache.length, n, 0, v.size(1)));
            cache.length += n;
            const index_t L = cache.length;
            cached.push_back(
                {{heads_view<const float, B>(cols(std::as_const(cache.k), 0, L, 0, k.size(1)), 0, G, d(), d())},
                 heads_view<const float, B>(cols(std::as_const(cache.v), 0, L, 0, v.size(1)), 0, G, cfg.v_dim,
                                            cfg.v_dim)});
        }
        Mat o({T, H * cfg.v_dim});
        Ops::attention_decode(queries(q), cached, layout.offsets(), softmax_scale,
                              heads_view(o, 0, H, cfg.v_dim, cfg.v_dim));
        round_to(compute, o.view());
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
