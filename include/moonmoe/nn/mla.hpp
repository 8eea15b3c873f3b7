// moonmoe/nn/mla.hpp: Multi-head Latent Attention (DeepSeek-V2, arXiv 2405.04434, §2.1; transformers'
// DeepseekV3Attention), training (naive) form.
//
//   q  = q_b_proj(q_a_layernorm(q_a_proj(x)))  [or q_proj(x)]     -> per head [nope | rope]
//   ckv = kv_a_proj_with_mqa(x) = [c (kv_rank) | k_pe (rope, one head shared by all)]
//   kv = kv_b_proj(kv_a_layernorm(c))                              -> per head [k_nope | v]
//   RoPE on q_pe and k_pe; scores = softmax_scale * (q_nope.k_nope + q_pe.k_pe), causal; o = softmax(scores) v
//   out = o_proj(o)
// Attention runs per sequence of the token layout (packed sequences never see each other); the projections run on
// every row of the batch at once.
// Scores are two GEMMs per head (nope and rope query parts of the attention primitives, backend/attention.hpp),
// so k is never materialised. Backward
// keeps the inputs of each projection and the per-row log-sum-exp of the scores, and recomputes the probabilities
// (no S x S tensor survives forward). Under the activation policy (config/activations.hpp) the latent norms'
// outputs cqn and cn are recomputed from the kept cq and c, and the up-projections' outputs q (RoPE applied) and
// kv from cqn and cn, by the forward's operations (the same bits); kept values may be stored in bf16 (nn/kept.hpp).
// Forward records the per-head maximum scaled logit for QK-Clip. Under the bf16 policy (nn/precision.hpp) the
// projections are bf16 products, the rotated q and k_pe and the attention output are rounded to bf16, and attention
// itself runs in f32 on those bf16 values (scores, softmax and the maxima in f32, as fused attention kernels do).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "../config/model_config.hpp"
#include "attention_core.hpp"
#include "kept.hpp"
#include "layout.hpp"
#include "linear.hpp"
#include "pass.hpp"
#include "rmsnorm.hpp"
#include "rope.hpp"

namespace moonmoe::nn {

/// Which rows of q_b_proj (or q_proj) and kv_b_proj belong to head h, and to its nope / rope / v parts.
struct MLAHeadLayout {
    index_t heads, nope, rope, v;
    index_t q_row(index_t h) const { return h * (nope + rope); }              ///< nope rows [q_row, q_row + nope)
    index_t q_rope_row(index_t h) const { return h * (nope + rope) + nope; }  ///< rope rows, `rope` of them
    index_t k_nope_row(index_t h) const { return h * (nope + v); }            ///< kv_b rows of k_nope, `nope`
    index_t v_row(index_t h) const { return h * (nope + v) + nope; }          ///< kv_b rows of v, `v` of them
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
    RotaryEmbedding<B> rope;
    /// Maximum over every forward since reset_max_logits() of softmax_scale * q.k, per head (QK-Clip's S_max), on
    /// the backend: QK-Clip reads it to the host once per step (optim/qk_clip.hpp).
    Tensor<float, 1, B> max_logit_per_head;
    NumberFormat compute = NumberFormat::f32;
    ActivationsConfig kept{};  ///< what forward keeps, and in which formats (nn/kept.hpp)
    bool keep_input = true;    ///< false: backward is handed x (a recomputed norm output)
    bool recompute_norms = false, recompute_up_projections = false, recompute_kv = false;  ///< q's, kv's

    struct Cache {
        KeptMatrix<B> x, cq, cqn, c, cn, q, kv, kpe, o;  ///< cqn, cn, q, kv: unless recomputed
        Tensor<float, 1, B> cq_rstd, c_rstd;
        Tensor<float, 1, B> lse;  ///< [tokens * heads], per (sequence, head) at lse_offset()
        std::shared_ptr<const Tensor<index_t, 1, B>> positions;  ///< the layout's, shared by its layers
        TokenLayout layout;
        std::size_t bytes() const {
            std::size_t n = cq_rstd.bytes() + c_rstd.bytes() + lse.bytes();  // not the positions: the layout's, shared
            for (const KeptMatrix<B>* m : {&x, &cq, &cqn, &c, &cn, &q, &kv, &kpe, &o}) n += m->bytes();
            return n;
        }
        template <class F>
        void for_each_kept(F&& f) {
            for (KeptMatrix<B>* m : {&x, &cq, &cqn, &c, &cn, &q, &kv, &kpe, &o}) f(*m);
        }
    };

    MLA() = default;
    MLA(const ModelConfig& c)
        : cfg(c.attention),
          hidden(c.dims.hidden),
          softmax_scale(float(moonmoe::softmax_scale(c.rope, c.attention.qk_head_dim()))),
          kv_a_proj_with_mqa(c.dims.hidden, c.attention.kv_rank + c.attention.rope_dim, ParamKind::matrix, c.precision),
          kv_b_proj(c.attention.kv_rank, c.attention.heads * (c.attention.nope_dim + c.attention.v_dim),
                    ParamKind::matrix, c.precision),
          o_proj(c.attention.heads * c.attention.v_dim, c.dims.hidden, ParamKind::matrix, c.precision),
          kv_a_layernorm(c.attention.kv_rank, 1e-6),  // HF builds the latent norms with the default eps
          rope(c.rope, c.attention.rope_dim),
          max_logit_per_head(Shape<1>{c.attention.heads}) {
        reset_max_logits();
        const index_t qdim = c.attention.heads * c.attention.qk_head_dim();
        if (cfg.q_rank > 0) {
            q_a_proj = Linear<B>(hidden, cfg.q_rank, ParamKind::matrix, c.precision);
            q_a_layernorm = RMSNorm<B>(cfg.q_rank, 1e-6);
            q_b_proj = Linear<B>(cfg.q_rank, qdim, ParamKind::matrix, c.precision);
        } else {
            q_proj = Linear<B>(hidden, qdim, ParamKind::matrix, c.precision);
        }
        set_precision(c.precision);
        set_activations(c.activations);
    }

    void set_precision(const PrecisionConfig& p) {
        compute = p.compute;
        for (Linear<B>* l : linears()) l->set_precision(p);
        q_a_layernorm.set_precision(p);
        kv_a_layernorm.set_precision(p);
    }
    /// What forward keeps (config/activations.hpp), and whether it keeps x (KeepInput::no: backward is handed it).
    void set_activations(const ActivationsConfig& a, KeepInput keep = KeepInput::yes) {
        kept = a;
        keep_input = keep == KeepInput::yes;
        recompute_norms = a.recompute_norms;
        recompute_up_projections = a.recompute_up_projections && cfg.q_rank > 0;  // else q is q_proj(x): kept
        recompute_kv = a.recompute_up_projections;
    }
    void refresh_working() {
        for (Linear<B>* l : linears()) l->refresh_working();
    }
    std::vector<Linear<B>*> linears() {
        if (cfg.q_rank > 0) return {&q_a_proj, &q_b_proj, &kv_a_proj_with_mqa, &kv_b_proj, &o_proj};
        return {&q_proj, &kv_a_proj_with_mqa, &kv_b_proj, &o_proj};
    }

    index_t dqk() const { return cfg.nope_dim + cfg.rope_dim; }
    index_t kv_width() const { return cfg.nope_dim + cfg.v_dim; }
    MLAHeadLayout head_layout() const { return {cfg.heads, cfg.nope_dim, cfg.rope_dim, cfg.v_dim}; }
    /// The projections QK-Clip rescales (optim/qk_clip.hpp): q's (q_b_proj, or q_proj without query
    /// compression) and the one holding k_nope (kv_b_proj).
    Linear<B>& query_projection() { return cfg.q_rank > 0 ? q_b_proj : q_proj; }
    Linear<B>& key_projection() { return kv_b_proj; }
    void reset_max_logits() {
        if (!max_logit_per_head.empty()) Ops::fill(max_logit_per_head.template reshape<2>({1, cfg.heads}), -INFINITY);
    }

    // ---- projections shared by the naive and the absorbed forms ----

    /// q [T, heads * dqk] with RoPE applied; keeps what backward needs in `c` when given.
    void project_q(View<const float, 2, B> x, View<const index_t, 1, B> positions, Mat& q, Cache* c) const {
        const index_t T = x.shape[0];
        if (cfg.q_rank > 0) {
            Mat cq({T, cfg.q_rank}), cqn({T, cfg.q_rank});
            Tensor<float, 1, B> rstd({T});
            q_a_proj.forward(x, cq.view());
            q_a_layernorm.forward(cq.view(), cqn.view(), rstd.view());
            q = up_q(cqn.view(), positions);
            if (!c) return;
            c->cq = KeptMatrix<B>(std::move(cq), kept.value_format());
            if (!recompute_norms) c->cqn = KeptMatrix<B>(std::move(cqn), kept.value_format());
            c->cq_rstd = std::move(rstd);
            return;
        }
        q = Mat({T, cfg.heads * dqk()});
        q_proj.forward(x, q.view());
        rope.apply(q_rope_part(q.view()), positions);
        round_to(compute, q.view());
    }

    /// q = q_b_proj(cqn) with RoPE applied: the up-projection, in forward and when backward recomputes it.
    Mat up_q(View<const float, 2, B> cqn, View<const index_t, 1, B> positions) const {
        Mat q({cqn.shape[0], cfg.heads * dqk()});
        q_b_proj.forward(cqn, q.view());
        rope.apply(q_rope_part(q.view()), positions);
        round_to(compute, q.view());
        return q;
    }

    /// The normalised latent cn [T, kv_rank] and the rotated shared key kpe [T, rope].
    void project_latent(View<const float, 2, B> x, View<const index_t, 1, B> positions, Mat& cn, Mat& kpe,
                        Cache* c) const {
        const index_t T = x.shape[0], r = cfg.kv_rank;
        Mat ckv({T, r + cfg.rope_dim}), latent({T, r});
        kv_a_proj_with_mqa.forward(x, ckv.view());
        kpe = Mat({T, cfg.rope_dim});
        Ops::copy(cols(std::as_const(ckv), 0, T, 0, r), latent.view());
        Ops::copy(cols(std::as_const(ckv), 0, T, r, cfg.rope_dim), kpe.view());
        Tensor<float, 1, B> rstd({T});
        cn = Mat({T, r});
        kv_a_layernorm.forward(latent.view(), cn.view(), rstd.view());
        rope.apply(kpe.view().template reshape<3>({T, 1, cfg.rope_dim}), positions);
        round_to(compute, kpe.view());
        if (c) c->c = KeptMatrix<B>(std::move(latent), kept.value_format()), c->c_rstd = std::move(rstd);
    }

    View<float, 3, B> q_rope_part(View<float, 2, B> q) const {
        return View<float, 3, B>(q.data + cfg.nope_dim, {q.shape[0], cfg.heads, cfg.rope_dim},
                                 {q.strides[0], dqk(), 1});
    }
    template <class T>
    static View<const T, 2, B> cols(const Tensor<T, 2, B>& m, index_t row0, index_t rows, index_t col0, index_t ncols) {
        return View<const T, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, ncols}, {m.size(1), 1});
    }
    template <class T>
    static View<T, 2, B> cols(Tensor<T, 2, B>& m, index_t row0, index_t rows, index_t col0, index_t ncols) {
        return View<T, 2, B>(m.data() + row0 * m.size(1) + col0, {rows, ncols}, {m.size(1), 1});
    }

    // ---- naive (training) form ----

    /// out = attention(x), x [T, hidden] with T = layout.tokens(); fills the cache for backward. Training and
    /// measurement forwards record the per-head maxima (nn/pass.hpp).
    void forward(View<const float, 2, B> x, const TokenLayout& layout, View<float, 2, B> out, Cache& c,
                 Pass pass = Pass::training) {
        const index_t T = x.shape[0], H = cfg.heads;
        layout.check_rows(T, "MLA.forward");
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        c.layout = layout;
        c.positions = layout.template device_positions<B>();
        if (keep_input) c.x = KeptMatrix<B>::copy(x, kept.value_format());
        Mat q, cn, kpe, kv({T, H * kv_width()}), o({T, H * cfg.v_dim});
        project_q(x, c.positions->view(), q, &c);
        project_latent(x, c.positions->view(), cn, kpe, &c);
        kv_b_proj.forward(cn.view(), kv.view());
        c.lse = Tensor<float, 1, B>({T * H});
        Ops::attention_forward(
            queries(q), keys(kv, kpe), layout.offsets(), softmax_scale, heads_view(o, 0, H, cfg.v_dim, cfg.v_dim),
            c.lse.view(),
            records_max_logits(pass) ? max_logit_per_head.view() : View<float, 1, B>{});  // none unless recorded
        round_to(compute, o.view());
        o_proj.forward(o.view(), out);
        if (!recompute_up_projections) c.q = KeptMatrix<B>(std::move(q), kept.value_format());
        if (!recompute_norms) c.cn = KeptMatrix<B>(std::move(cn), kept.value_format());
        if (!recompute_kv) c.kv = KeptMatrix<B>(std::move(kv), kept.value_format());
        c.kpe = KeptMatrix<B>(std::move(kpe), kept.value_format());
        c.o = KeptMatrix<B>(std::move(o), kept.value_format());
    }

    /// Every head's two query parts: q_nope and q_pe.
    backend::AttentionQueries<B> queries(const Mat& q) const {
        const index_t H = cfg.heads;
        return {2,
                {heads_view(q, 0, H, dqk(), cfg.nope_dim), heads_view(q, cfg.nope_dim, H, dqk(), cfg.rope_dim)},
                compute};  // under bf16 the backend may attend in bf16 (a fused engine), as torch's bf16 attention
    }
    /// The matching keys, k_nope per head and the one k_pe all heads share (head stride 0), and the values.
    backend::AttentionKeys<B> keys(const Mat& kv, const Mat& kpe) const {
        const index_t H = cfg.heads;
        return {{heads_view(kv, 0, H, kv_width(), cfg.nope_dim), heads_view(kpe, 0, H, 0, cfg.rope_dim)},
                heads_view(kv, cfg.nope_dim, H, kv_width(), cfg.v_dim)};
    }

    /// Accumulates parameter gradients; writes dx (or adds to it under Accumulate::yes). `x` is the forward's
    /// input, required when the input is not kept (KeepInput::no; ignored otherwise).
    void backward(View<const float, 2, B> dout, Cache& c, View<float, 2, B> dx,
                  Accumulate accumulate_dx = Accumulate::no, View<const float, 2, B> x = {}) {
        const TokenLayout& layout = c.layout;
        const index_t T = layout.tokens(), H = cfg.heads, R = cfg.rope_dim;
        // what forward kept, and what it did not, recomputed as forward computed it
        Mat kept_x;
        x = input_for_backward(c.x, kept_x, x, T, "MLA");
        const Mat o = c.o.take("MLA's o_proj input"), kpe = c.kpe.take("MLA's kpe");
        Mat cq, cqn;
        if (cfg.q_rank > 0) {
            cq = c.cq.take("MLA's cq");
            cqn = recompute_norms ? q_a_layernorm.recompute(cq.view()) : c.cqn.take("MLA's cqn");
        }
        const Mat q = recompute_up_projections ? up_q(cqn.view(), c.positions->view()) : c.q.take("MLA's q");
        const Mat latent = c.c.take("MLA's latent c");
        const Mat cn = recompute_norms ? kv_a_layernorm.recompute(latent.view()) : c.cn.take("MLA's cn");
        Mat kv;
        if (recompute_kv) {
            kv = Mat({T, H * kv_width()});
            kv_b_proj.forward(cn.view(), kv.view());
        } else {
            kv = c.kv.take("MLA's kv");
        }
        Mat d_o({T, H * cfg.v_dim});
        o_proj.backward(o.view(), dout, d_o.view());
        Mat dq({T, H * dqk()}), dkv({T, H * kv_width()}), dkpe_heads({T, H * R});
        backend::AttentionGrads<B> grads;
        grads.dq[0] = heads_view(dq, 0, H, dqk(), cfg.nope_dim);
        grads.dq[1] = heads_view(dq, cfg.nope_dim, H, dqk(), R);
        grads.dk[0] = heads_view(dkv, 0, H, kv_width(), cfg.nope_dim);
        grads.dk[1] = heads_view(dkpe_heads, 0, H, R, R);  // per head, summed over heads below
        grads.dv = heads_view(dkv, cfg.nope_dim, H, kv_width(), cfg.v_dim);
        Ops::attention_backward(queries(q), keys(kv, kpe), layout.offsets(), softmax_scale,
                                heads_view(o, 0, H, cfg.v_dim, cfg.v_dim), c.lse.view(),
                                heads_view(std::as_const(d_o), 0, H, cfg.v_dim, cfg.v_dim), grads);
        // the shared key: sum over heads in order, then undo RoPE
        const index_t r = cfg.kv_rank;
        Mat dckv({T, r + R});
        Ops::sum_heads(heads_view(std::as_const(dkpe_heads), 0, H, R, R), cols(dckv, 0, T, r, R));
        rope.apply(View<float, 3, B>(dckv.data() + r, {T, 1, R}, {r + R, R, 1}), c.positions->view(),
                   Rotation::transposed);
        rope.apply(q_rope_part(dq.view()), c.positions->view(), Rotation::transposed);
        // latent path: kv_b_proj, kv_a_layernorm, into the first kv_rank columns of dckv
        Mat dcn({T, r});
        kv_b_proj.backward(cn.view(), dkv.view(), dcn.view());
        kv_a_layernorm.backward(latent.view(), c.c_rstd.view(), dcn.view(), cols(dckv, 0, T, 0, r));
        kv_a_proj_with_mqa.backward(x, dckv.view(), dx, accumulate_dx);
        if (cfg.q_rank > 0) {
            Mat dcqn({T, cfg.q_rank}), dcq({T, cfg.q_rank});
            q_b_proj.backward(cqn.view(), dq.view(), dcqn.view());
            q_a_layernorm.backward(cq.view(), c.cq_rstd.view(), dcqn.view(), dcq.view());
            q_a_proj.backward(x, dcq.view(), dx, Accumulate::yes);
        } else {
            q_proj.backward(x, dq.view(), dx, Accumulate::yes);
        }
        c = Cache{};
    }

    // ---- absorbed (inference) form with a latent KV cache ----

    /// Per token and layer the cache holds kv_a_layernorm(c) (kv_rank values) and the rotated k_pe (rope values):
    /// 576 values for K2, against heads * (dqk + v) = 20480 for a plain K/V cache. Under f32 compute in two f32
    /// matrices; under bf16 compute, whose latent and rope key are bf16 values already, as one bf16 row per token
    /// (the latent, then the rope key), which the absorbed decode reads on tensor cores (backend latent_decode).
    struct LatentCache {
        Mat kv, pe;               ///< f32: [capacity, kv_rank], [capacity, rope]
        Tensor<bf16, 2, B> rows;  ///< bf16: [capacity, kv_rank + rope]
        NumberFormat values = NumberFormat::f32;
        index_t length = 0;
        LatentCache() = default;
        LatentCache(index_t capacity, const AttentionConfig& a, NumberFormat format = NumberFormat::f32)
            : values(format) {
            if (format == NumberFormat::bf16) rows = Tensor<bf16, 2, B>({capacity, a.kv_rank + a.rope_dim});
            else
                kv = Mat({capacity, a.kv_rank}), pe = Mat({capacity, a.rope_dim});
        }
        index_t capacity() const { return values == NumberFormat::bf16 ? rows.size(0) : kv.size(0); }
    };

    /// An empty latent cache of `capacity` tokens in this attention's compute format.
    LatentCache make_latent_cache(index_t capacity) const { return LatentCache(capacity, cfg, compute); }

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
        const index_t T = x.shape[0], N = layout.sequences();
        layout.check_rows(T, "MLA.forward_absorbed");
        check_latent_caches(layout.offsets(), caches, "MLA.forward_absorbed");
        for (index_t s = 0; s < N; ++s)
            layout.check_continues(s, caches[std::size_t(s)]->length, "MLA.forward_absorbed");
        if (compute == NumberFormat::bf16) {
            std::vector<index_t> lengths, extents;
            for (index_t s = 0; s < N; ++s) {
                lengths.push_back(caches[std::size_t(s)]->length);
                extents.push_back(lengths.back() + layout.length(s));
            }
            const Tensor<index_t, 1, B> device_lengths = to_device<B>(lengths);
            absorbed_bf16(x, layout.template device_positions<B>()->view(), layout.offsets(), caches,
                          device_lengths.view(), extents, out);
        } else {
            absorbed_f32(x, layout, caches, out);
        }
        for (index_t s = 0; s < N; ++s) caches[std::size_t(s)]->length += layout.length(s);
    }

    /// The checks of an absorbed forward's caches: one per sequence, in the compute format, with room for the rows.
    void check_latent_caches(std::span<const index_t> offsets, std::span<LatentCache* const> caches,
                             const char* op) const {
        const index_t N = index_t(offsets.size()) - 1;
        if (index_t(caches.size()) != N)
            throw std::invalid_argument(std::string(op) + ": " + std::to_string(caches.size()) + " latent caches for " +
                                        std::to_string(N) + " sequences");
        for (index_t s = 0; s < N; ++s) {
            const LatentCache& cache = *caches[std::size_t(s)];
            if (cache.values != compute)
                throw std::invalid_argument(std::string(op) + ": the latent cache of sequence " + std::to_string(s) +
                                            " holds " + format_name(cache.values) +
                                            " values, the attention computes in " + format_name(compute) +
                                            " (make caches with make_latent_cache or Transformer::start_decoding)");
            const index_t n = offsets[s + 1] - offsets[s];
            if (cache.length + n > cache.capacity())
                throw std::length_error("MLA latent cache of sequence " + std::to_string(s) + ": " +
                                        std::to_string(cache.length + n) + " tokens exceed its capacity of " +
                                        std::to_string(cache.capacity()));
        }
    }

    /// The bf16 absorbed forward (the caches' lengths stay as they are: the caller adds the rows): everything the
    /// device does reads the positions and the caches' lengths from the device, and the host shapes are the
    /// offsets and extents (extents[s] >= length + rows, <= capacity: the keys sequence s's products span). A
    /// captured decode step (nn/latent_step.hpp) replays it.
    void absorbed_bf16(View<const float, 2, B> x, View<const index_t, 1, B> positions, std::span<const index_t> offsets,
                       std::span<LatentCache* const> caches, View<const index_t, 1, B> lengths,
                       std::span<const index_t> extents, View<float, 2, B> out) const {
        const index_t T = x.shape[0], H = cfg.heads, r = cfg.kv_rank, R = cfg.rope_dim, W = r + R;
        absorbed(x, positions, offsets, out,
                 [&](const Mat& q, const Mat& cn, const Mat& kpe, const Mat& q_lat, Mat& o_lat) {
                     // The new rows of the caches, and the queries [T, heads, kv_rank + rope]: q_lat, then q_pe.
                     Tensor<bf16, 2, B> fresh({T, W}), q16({T * H, W});
                     Ops::template cast<bf16, float>(cn.view(), cols(fresh, 0, T, 0, r));
                     Ops::template cast<bf16, float>(kpe.view(), cols(fresh, 0, T, r, R));
                     Ops::template cast<bf16, float>(q_lat.view().template reshape<2>({T * H, r}),
                                                     cols(q16, 0, T * H, 0, r));
                     Ops::template cast<bf16, float>(
                         View<const float, 2, B>(q.data() + cfg.nope_dim, {T * H, R}, {dqk(), 1}),
                         cols(q16, 0, T * H, r, R));
                     std::vector<backend::LatentRows<B>> rows;
                     for (LatentCache* c : caches) rows.push_back(c->rows.view());
                     Ops::latent_decode(std::as_const(q16).view().template reshape<3>({T, H, W}),
                                        std::as_const(fresh).view(), rows, lengths, offsets, extents, r, softmax_scale,
                                        o_lat.view().template reshape<3>({T, H, r}));
                 });
    }

    /// The f32 absorbed forward (Precision<F32>'s reference): latent and rope key in f32 caches, attention_decode.
    void absorbed_f32(View<const float, 2, B> x, const TokenLayout& layout, std::span<LatentCache* const> caches,
                      View<float, 2, B> out) const {
        const index_t N = layout.sequences(), H = cfg.heads, r = cfg.kv_rank, R = cfg.rope_dim;
        absorbed(
            x, layout.template device_positions<B>()->view(), layout.offsets(), out,
            [&](const Mat& q, const Mat& cn, const Mat& kpe, const Mat& q_lat, Mat& o_lat) {
                std::vector<backend::AttentionKeys<B>> keys;
                for (index_t s = 0; s < N; ++s) {
                    LatentCache& cache = *caches[std::size_t(s)];
                    const index_t t0 = layout.begin(s), n = layout.length(s), L = cache.length + n;
                    Ops::copy(cols(cn, t0, n, 0, r), cols(cache.kv, cache.length, n, 0, r));
                    Ops::copy(cols(kpe, t0, n, 0, R), cols(cache.pe, cache.length, n, 0, R));
                    // one latent key / value and one rope key for all heads: head stride 0
                    const auto latent =
                        heads_view<const float, B>(cols(std::as_const(cache.kv), 0, L, 0, r), 0, H, 0, r);
                    keys.push_back(
                        {{latent, heads_view<const float, B>(cols(std::as_const(cache.pe), 0, L, 0, R), 0, H, 0, R)},
                         latent});
                }
                Ops::attention_decode({2, {heads_view(q_lat, 0, H, r, r), heads_view(q, cfg.nope_dim, H, dqk(), R)}},
                                      keys, layout.offsets(), softmax_scale, heads_view(o_lat, 0, H, r, r));
            });
    }

    /// The absorbed form around its attention: the projections on all rows, q_lat = q_nope W_UK[h] per head
    /// (W_UK[h] = kv_b rows [h*(nope+v), +nope) : [nope, kv_rank]), attend(q, cn, kpe, q_lat, o_lat) writing the
    /// latent outputs o_lat [T, heads * kv_rank], then o = o_lat W_UV[h]^T (W_UV[h] = kv_b rows [h*(nope+v)+nope,
    /// +v) : [v, kv_rank]) and o_proj. The per-head products run as one batched GEMM over the heads per sequence, not
    /// one over every row: a sequence's GEMMs then have the same shapes whether it decodes alone or with others, so
    /// batched decoding gives the same bits (test/unit/nn_packed.cpp).
    template <class Attend>
    void absorbed(View<const float, 2, B> x, View<const index_t, 1, B> positions, std::span<const index_t> offsets,
                  View<float, 2, B> out, Attend&& attend) const {
        const index_t T = x.shape[0], N = index_t(offsets.size()) - 1, H = cfg.heads, r = cfg.kv_rank,
                      nope = cfg.nope_dim, vd = cfg.v_dim;
        Mat q, cn, kpe;
        project_q(x, positions, q, nullptr);
        project_latent(x, positions, cn, kpe, nullptr);
        Mat q_lat({T, H * r}), o_lat({T, H * r}), o({T, H * vd});
        for (index_t s = 0; s < N; ++s)
            per_head_products(backend::Trans::no, q, offsets[s], offsets[s + 1] - offsets[s], 0, nope, dqk(), 0, nope,
                              q_lat, r);
        round_to(compute, q_lat.view());
        attend(std::as_const(q), std::as_const(cn), std::as_const(kpe), std::as_const(q_lat), o_lat);
        round_to(compute, o_lat.view());
        for (index_t s = 0; s < N; ++s)
            per_head_products(backend::Trans::yes, o_lat, offsets[s], offsets[s + 1] - offsets[s], 0, r, r, nope, vd, o,
                              vd);
        round_to(compute, o.view());
        o_proj.forward(o.view(), out);
    }

    /// For every head h, out[t0 : t0+n, h*out_w : +out_w] = a[t0 : t0+n, h*a_stride + a_col : +a_w] op(W_h), W_h the
    /// kv_b_proj rows [h*(nope+v) + w_row, +w_rows) : [w_rows, kv_rank]: one strided-batched GEMM over the heads,
    /// bf16 operands (kv_b_proj's bf16 values) under bf16 compute.
    void per_head_products(backend::Trans tw, const Mat& a, index_t t0, index_t n, index_t a_col, index_t a_w,
                           index_t a_stride, index_t w_row, index_t w_rows, Mat& out, index_t out_w) const {
        using backend::Trans;
        const index_t H = cfg.heads, r = cfg.kv_rank, w_stride = kv_width() * r;
        const View<float, 2, B> c(out.data() + t0 * out.size(1), {n, out_w}, {out.size(1), 1});
        if (compute == NumberFormat::f32) {
            Ops::gemm_strided_batched(H, Trans::no, tw, 1.0f, cols(a, t0, n, a_col, a_w), a_stride,
                                      cols(kv_b_proj.weight.value, w_row, w_rows, 0, r), w_stride, 0.0f, c, out_w);
            return;
        }
        const Tensor<bf16, 2, B> a16 = bf16_copy(cols(a, t0, n, 0, a.size(1)));
        Ops::template gemm_bf16_strided_batched<float>(H, Trans::no, tw, 1.0f, cols(a16, 0, n, a_col, a_w), a_stride,
                                                       cols(kv_b_proj.weight.value16, w_row, w_rows, 0, r), w_stride,
                                                       0.0f, c, out_w);
    }

    /// Calls f with the address of every weight a forward reads (f32 values and bf16 working copies): what a
    /// captured decode step (nn/latent_step.hpp) holds on to.
    template <class F>
    void for_each_weight(F&& f) const {
        f(this);
        for (const Linear<B>* l : {&q_a_proj, &q_b_proj, &q_proj, &kv_a_proj_with_mqa, &kv_b_proj, &o_proj})
            f(l->weight.value.data()), f(l->weight.value16.data());
        for (const RMSNorm<B>* n : {&q_a_layernorm, &kv_a_layernorm}) f(n->weight.value.data());
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
