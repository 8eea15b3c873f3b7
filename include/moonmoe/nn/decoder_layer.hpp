// moonmoe/nn/decoder_layer.hpp: one transformer block, pre-norm with residuals (HF DeepseekV3DecoderLayer):
//   h1  = h + self_attn(input_layernorm(h))            self_attn: MLA, or MHA for Attention<MHA<...>>
//   out = h1 + mlp(post_attention_layernorm(h1))      mlp: dense SwiGLU for the first layers, MoE after
// The precision policy comes from the configuration (ModelConfig::precision); under bf16 the residual sums are
// rounded to bf16 too (nn/precision.hpp).
// The activation policy (ModelConfig::activations, config/activations.hpp) says what the caches keep. Under
// recompute_norms the two norms' outputs, which attention and the MLP would each keep a copy of as their input,
// are recomputed here in backward from the kept residual stream (h, h1) and handed to their backwards.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "mha.hpp"
#include "mla.hpp"
#include "moe.hpp"
#include "offload.hpp"
#include "rmsnorm.hpp"
#include "swiglu.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct DecoderLayer {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    index_t hidden = 0;
    bool dense = true;
    bool latent = true;  ///< MLA (self_attn) or MHA (mha)
    RMSNorm<B> input_layernorm, post_attention_layernorm;
    MLA<B> self_attn;
    MHA<B> mha;
    SwiGLU<B> mlp;  ///< dense layers
    MoE<B> moe;     ///< MoE layers
    NumberFormat compute = NumberFormat::f32;
    ActivationsConfig activations;

    struct Cache {
        KeptMatrix<B> h, h1;  ///< the norms' inputs (the residual stream)
        Tensor<float, 1, B> rstd1, rstd2;
        typename MLA<B>::Cache attn;
        typename MHA<B>::Cache mha;
        typename SwiGLU<B>::Cache mlp;
        typename MoE<B>::Cache moe;
        /// The bytes held for backward.
        std::size_t bytes() const {
            return h.bytes() + h1.bytes() + rstd1.bytes() + rstd2.bytes() + attn.bytes() + mha.bytes() + mlp.bytes() +
                   moe.bytes();
        }
        /// Calls f(KeptMatrix<B>&) on every kept matrix (what activation offload moves).
        template <class F>
        void for_each_kept(F&& f) {
            f(h), f(h1);
            attn.for_each_kept(f), mha.for_each_kept(f), mlp.for_each_kept(f), moe.for_each_kept(f);
        }
    };

    DecoderLayer() = default;
    /// Layer `index` of the model; MoE layers hold experts [first_expert, first_expert + expert_count) and move
    /// their pairs with `dispatcher` (null: local; nn/dispatch.hpp).
    DecoderLayer(const ModelConfig& c, index_t index, index_t first_expert = 0, index_t expert_count = -1,
                 std::shared_ptr<Dispatcher<B>> dispatcher = {})
        : hidden(c.dims.hidden),
          dense(index < c.dims.dense_layers),
          latent(c.attention.kind == AttentionKind::mla),
          input_layernorm(c.dims.hidden, c.dims.norm_eps),
          post_attention_layernorm(c.dims.hidden, c.dims.norm_eps) {
        check_precision(c.precision);
        if (latent) self_attn = MLA<B>(c);
        else
            mha = MHA<B>(c);
        if (dense) mlp = SwiGLU<B>(c.dims.hidden, c.dims.dense_hidden, ParamKind::matrix, c.precision);
        else
            moe = MoE<B>(c.moe, c.dims.hidden, first_expert, expert_count, c.precision, std::move(dispatcher));
        set_precision(c.precision);
        set_activations(c.activations);
    }

    /// What the caches keep (config/activations.hpp); checked against the compute format.
    /// Offload<true> is carried out by the owner of the caches (nn::Transformer's forward and backward, or
    /// parallel::Pipeline's schedule); refused
    /// here on a backend without offload.
    void set_activations(const ActivationsConfig& a) {
        check_activations(a, {compute, NumberFormat::f32});
        check_offload<B>(a.offload);
        activations = a;
        // attention's and the MLP's inputs are the norms' outputs: recomputed here in backward and handed to theirs
        const KeepInput keep_inputs = a.recompute_norms ? KeepInput::no : KeepInput::yes;
        if (latent) self_attn.set_activations(a, keep_inputs);
        else
            mha.set_activations(a, keep_inputs);
        if (dense) mlp.set_activations(a, keep_inputs);
        else
            moe.set_activations(a, keep_inputs);
    }
    KeptFormat kept_value() const { return activations.value_format(); }

    /// Sets the compute format and the weights' storage of every module (Param::set_precision).
    void set_precision(const PrecisionConfig& p) {
        check_precision(p);
        check_activations(activations, p);
        compute = p.compute;
        input_layernorm.set_precision(p);
        post_attention_layernorm.set_precision(p);
        if (latent) self_attn.set_precision(p);
        else
            mha.set_precision(p);
        if (dense) mlp.set_precision(p);
        else
            moe.set_precision(p);
    }
    /// Re-rounds the bf16 working copies of the weights from the masters (bf16 policy; nothing under f32).
    void refresh_working() {
        if (latent) self_attn.refresh_working();
        else
            mha.refresh_working();
        if (dense) mlp.refresh_working();
        else
            moe.refresh_working();
    }

    // ---- what the optimizer reaches: the attention's per-head maxima (QK-Clip), the router (bias balancing) ----

    /// Calls f(MLA<B>&) or f(MHA<B>&): this layer's attention module.
    template <class F>
    decltype(auto) visit_attention(F&& f) {
        return latent ? f(self_attn) : f(mha);
    }
    /// The maximum scaled logit per head of the training and measurement forwards since the last reset.
    Tensor<float, 1, B>& max_logits() { return latent ? self_attn.max_logit_per_head : mha.max_logit_per_head; }
    void reset_max_logits() { latent ? self_attn.reset_max_logits() : mha.reset_max_logits(); }
    /// The MoE layer's router (its load counts and bias), null for a dense layer.
    Router<B>* router() { return dense ? nullptr : &moe.gate; }

    /// out = a + b: a residual add (rounded to bf16 under the bf16 policy).
    void add(View<const float, 2, B> a, View<const float, 2, B> b, View<float, 2, B> out) const {
        add_rounded(compute, a, b, out);
    }

    /// out = the block applied to h; keeps what backward needs. `pass` says which training statistics it feeds
    /// (nn/pass.hpp). Collective over the expert group of an MoE layer whose dispatcher exchanges.
    void forward(View<const float, 2, B> h, const TokenLayout& layout, View<float, 2, B> out, Cache& c,
                 Pass pass = Pass::training) {
        const index_t T = h.shape[0];
        c = Cache{};  // drop the last forward's buffers first: a lower peak, blocks to reuse
        c.h = KeptMatrix<B>::copy(h, kept_value());
        Mat a_in({T, hidden}), h1({T, hidden});
        c.rstd1 = Tensor<float, 1, B>({T}), c.rstd2 = Tensor<float, 1, B>({T});
        input_layernorm.forward(h, a_in.view(), c.rstd1.view());
        Mat attn({T, hidden});
        if (latent) self_attn.forward(a_in.view(), layout, attn.view(), c.attn, pass);
        else
            mha.forward(a_in.view(), layout, attn.view(), c.mha, pass);
        a_in = Mat{};  // attention keeps its own copy of its input, if any
        add(h, attn.view(), h1.view());
        Mat m_in({T, hidden});
        post_attention_layernorm.forward(h1.view(), m_in.view(), c.rstd2.view());
        Mat m({T, hidden});
        if (dense) mlp.forward(m_in.view(), m.view(), c.mlp);
        else
            moe.forward(m_in.view(), m.view(), c.moe, pass);
        m_in = Mat{};  // the MLP / MoE keep their own copy, if any
        add(h1.view(), m.view(), out);
        c.h1 = KeptMatrix<B>(std::move(h1), kept_value());
    }

    /// dh = d out / d h applied to dout; accumulates parameter gradients.
    void backward(View<const float, 2, B> dout, Cache& c, View<float, 2, B> dh) {
        const index_t T = dout.shape[0];
        const Mat h = c.h.take("the layer's input"), h1 = c.h1.take("the layer's h1");
        Mat dm({T, hidden}), dh1({T, hidden}), da({T, hidden}), in;
        if (activations.recompute_norms) in = post_attention_layernorm.recompute(h1.view());
        if (dense) mlp.backward(dout, c.mlp, dm.view(), Accumulate::no, in.view());
        else
            moe.backward(dout, c.moe, dm.view(), Accumulate::no, in.view());
        in = Mat{};
        Ops::copy(dout, dh1.view());
        post_attention_layernorm.backward(h1.view(), c.rstd2.view(), dm.view(), dh1.view(), Accumulate::yes);
        if (activations.recompute_norms) in = input_layernorm.recompute(h.view());
        if (latent) self_attn.backward(dh1.view(), c.attn, da.view(), Accumulate::no, in.view());
        else
            mha.backward(dh1.view(), c.mha, da.view(), Accumulate::no, in.view());
        in = Mat{};
        Ops::copy(dh1.view(), dh);
        input_layernorm.backward(h.view(), c.rstd1.view(), da.view(), dh, Accumulate::yes);
        c = Cache{};
    }

    /// Per layer inference state: the latent cache (MLA) or the K/V cache (MHA).
    struct DecodeCache {
        typename MLA<B>::LatentCache latent;
        typename MHA<B>::KVCache kv;
        index_t length() const { return latent.capacity() ? latent.length : kv.length; }
    };
    DecodeCache make_decode_cache(index_t capacity) const {
        DecodeCache d;
        if (latent) d.latent = self_attn.make_latent_cache(capacity);
        else
            d.kv = typename MHA<B>::KVCache(capacity, mha.cfg);
        return d;
    }

    /// Inference on the next tokens of one sequence: absorbed MLA with the latent cache, or MHA with K/V.
    void forward_cached(View<const float, 2, B> h, DecodeCache& cache, View<float, 2, B> out) {
        DecodeCache* one[1] = {&cache};
        forward_cached(h, TokenLayout::sequences(1, h.shape[0], cache.length()), one, out);
    }

    /// Inference on the next tokens of several sequences (sequence s of `layout` continues caches[s]): attention
    /// per sequence against its own cache, everything else on all rows at once.
    void forward_cached(View<const float, 2, B> h, const TokenLayout& layout, std::span<DecodeCache* const> caches,
                        View<float, 2, B> out) {
        const index_t T = h.shape[0];
        Mat a_in({T, hidden}), attn({T, hidden}), h1({T, hidden}), m_in({T, hidden}), m({T, hidden});
        Tensor<float, 1, B> rstd({T});
        input_layernorm.forward(h, a_in.view(), rstd.view());
        if (latent) {
            std::vector<typename MLA<B>::LatentCache*> latents;
            for (DecodeCache* c : caches) latents.push_back(&c->latent);
            self_attn.forward_absorbed(a_in.view(), layout, latents, attn.view());
        } else {
            std::vector<typename MHA<B>::KVCache*> kvs;
            for (DecodeCache* c : caches) kvs.push_back(&c->kv);
            mha.forward_cached(a_in.view(), layout, kvs, attn.view());
        }
        add(h, attn.view(), h1.view());
        post_attention_layernorm.forward(h1.view(), m_in.view(), rstd.view());
        if (dense) {
            typename SwiGLU<B>::Cache unused;
            mlp.forward(m_in.view(), m.view(), unused);
        } else {
            typename MoE<B>::Cache unused;
            moe.forward(m_in.view(), m.view(), unused, Pass::inference);
        }
        add(h1.view(), m.view(), out);
    }

    void visit_params(const std::string& name, const ParamVisitor& f) {
        if (latent) self_attn.visit_params(name + ".self_attn", f);
        else
            mha.visit_params(name + ".self_attn", f);
        if (dense) mlp.visit_params(name + ".mlp", f);
        else
            moe.visit_params(name + ".mlp", f);
        input_layernorm.visit_params(name + ".input_layernorm", f);
        post_attention_layernorm.visit_params(name + ".post_attention_layernorm", f);
    }
};

}  // namespace moonmoe::nn
