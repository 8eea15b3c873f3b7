// moonmoe/nn/transformer.hpp: the whole causal LM (HF DeepseekV3ForCausalLM): embed_tokens, the decoder layers
// (the first DenseLayers dense, MoE after), the final norm and an untied lm_head.
#pragma once

#include <string>
#include <vector>

#include "cross_entropy.hpp"
#include "decoder_layer.hpp"
#include "embedding.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct Transformer {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    ModelConfig config{};
    Embedding<B> embed_tokens;
    std::vector<DecoderLayer<B>> layers;
    RMSNorm<B> norm;
    Linear<B> lm_head;

    struct Cache {
        std::vector<index_t> ids;
        TokenLayout layout;
        std::vector<typename DecoderLayer<B>::Cache> layers;
        Mat h_last;  ///< input of the final norm
        Mat h_normed;  ///< input of lm_head
        std::vector<float> rstd;
    };

    /// Inference state of one sequence: a latent (MLA) or K/V (MHA) cache per layer.
    struct DecodeState {
        std::vector<typename DecoderLayer<B>::DecodeCache> caches;
        index_t length() const { return caches.empty() ? 0 : caches[0].length(); }
    };

    Transformer() = default;
    explicit Transformer(const ModelConfig& c)
        : config(c), embed_tokens(c.dims.vocab, c.dims.hidden), norm(c.dims.hidden, c.dims.norm_eps),
          lm_head(c.dims.hidden, c.dims.vocab, ParamKind::output_head) {
        if (!c.is_static()) throw config_error("Transformer: every size must be known (resolve Dynamic sizes first)");
        validate(c);
        layers.reserve(static_cast<std::size_t>(c.dims.layers));
        for (index_t l = 0; l < c.dims.layers; ++l) layers.emplace_back(c, l);
    }

    /// logits [tokens, vocab] of `ids` laid out as `layout`; keeps what backward needs.
    Mat forward(const index_t* ids, const TokenLayout& layout, Cache& c) {
        const index_t T = layout.tokens(), H = config.dims.hidden;
        c.ids.assign(ids, ids + T);
        c.layout = layout;
        Mat h({T, H}), next({T, H});
        embed_tokens.forward(ids, h.view());
        c.layers.resize(layers.size());
        for (std::size_t l = 0; l < layers.size(); ++l) {
            layers[l].forward(h.view(), layout, next.view(), c.layers[l]);
            std::swap(h, next);
        }
        c.rstd.resize(static_cast<std::size_t>(T));
        c.h_normed = Mat({T, H});
        norm.forward(h.view(), c.h_normed.view(), c.rstd.data());
        c.h_last = std::move(h);
        Mat logits({T, config.dims.vocab});
        lm_head.forward(c.h_normed.view(), logits.view());
        return logits;
    }

    /// Accumulates every parameter gradient from the gradient of the loss with respect to the logits.
    void backward(View<const float, 2, B> dlogits, Cache& c) {
        const index_t T = c.layout.tokens(), H = config.dims.hidden;
        Mat dn({T, H}), dh({T, H}), dprev({T, H});
        lm_head.backward(c.h_normed.view(), dlogits, dn.view());
        norm.backward(c.h_last.view(), c.rstd.data(), dn.view(), dh.view());
        for (std::size_t l = layers.size(); l-- > 0;) {
            layers[l].backward(dh.view(), c.layers[l], dprev.view());
            std::swap(dh, dprev);
        }
        embed_tokens.backward(c.ids.data(), dh.view());
        c = Cache{};
    }

    /// Forward + cross-entropy on the causal targets + backward: HF's loss with labels = input_ids.
    float train_step(const index_t* ids, const TokenLayout& layout) {
        Cache c;
        Mat logits = forward(ids, layout, c);
        const std::vector<index_t> targets = causal_targets(ids, layout);
        Mat dlogits(logits.shape());
        const float loss = cross_entropy<B>(logits.view(), targets.data(), dlogits.view());
        backward(dlogits.view(), c);
        return loss;
    }

    DecodeState start_decoding(index_t capacity) const {
        DecodeState s;
        for (const auto& layer : layers) s.caches.push_back(layer.make_decode_cache(capacity));
        return s;
    }

    /// Logits [n, vocab] of the next n tokens of the sequence in `state` (absorbed MLA with its latent cache).
    Mat decode(const index_t* ids, index_t n, DecodeState& state) {
        const index_t H = config.dims.hidden;
        Mat h({n, H}), next({n, H});
        embed_tokens.forward(ids, h.view());
        for (std::size_t l = 0; l < layers.size(); ++l) {
            layers[l].forward_cached(h.view(), state.caches[l], next.view());
            std::swap(h, next);
        }
        std::vector<float> rstd(static_cast<std::size_t>(n));
        norm.forward(h.view(), next.view(), rstd.data());
        Mat logits({n, config.dims.vocab});
        lm_head.forward(next.view(), logits.view());
        return logits;
    }

    void zero_grad() {
        visit_params([](const ParamRef& p) {
            if (p.grad) std::fill(p.grad, p.grad + p.numel(), 0.0f);
        });
    }

    /// Every parameter under its Hugging Face checkpoint name.
    void visit_params(const ParamVisitor& f) {
        embed_tokens.visit_params("model.embed_tokens", f);
        for (std::size_t l = 0; l < layers.size(); ++l) layers[l].visit_params("model.layers." + std::to_string(l), f);
        norm.visit_params("model.norm", f);
        lm_head.visit_params("lm_head", f);
    }
};

}  // namespace moonmoe::nn
