// moonmoe/nn/transformer.hpp: the whole causal LM (HF DeepseekV3ForCausalLM): embed_tokens, the decoder layers
// (the first DenseLayers dense, MoE after), the final norm and an untied lm_head.
//
// The precision policy is the configuration's (ModelConfig::precision, from the model type's Precision<...>). Under
// bf16 (nn/precision.hpp) the weights' masters stay f32 and the products read bf16 working copies of them: whatever
// writes the masters other than this library's optimizer, QK-Clip and checkpoint loading (which refresh them) calls
// refresh_working_weights() before the next forward.
//
// A Transformer can also hold a part of the model (ModelPart): the pieces one process of a parallel run owns
// (parallel/model.hpp builds them from the rank layout). Its parameters keep their whole-model names, so the
// optimizer, the initialisation and the checkpoint code work on it unchanged. Forward, backward and decoding need
// every layer: a part holding all of them whose MoE layers reach the other experts through an expert group's
// dispatcher (expert parallelism without a pipeline) runs them; the pipeline runtime (parallel/pipeline.hpp)
// drives a pipeline stage's pieces instead.
#pragma once

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "cross_entropy.hpp"
#include "decoder_layer.hpp"
#include "embedding.hpp"
#include "offload.hpp"

namespace moonmoe::nn {

/// Which pieces of the model a Transformer holds: decoder layers (whole-model indices, ascending), the embedding,
/// the final norm with lm_head, and of every MoE layer the routed experts [first_expert, first_expert +
/// expert_count) (-1: all of them).
struct ModelPart {
    std::vector<index_t> layers;
    bool embedding = true, head = true;
    index_t first_expert = 0, expert_count = -1;

    static ModelPart whole(const ModelConfig& c) {
        ModelPart p;
        for (index_t l = 0; l < c.dims.layers; ++l) p.layers.push_back(l);
        return p;
    }
    bool is_whole(const ModelConfig& c) const {
        return embedding && head && index_t(layers.size()) == c.dims.layers && first_expert == 0 &&
               (expert_count < 0 || expert_count == c.moe.experts);
    }
};

template <class B = cpu>
struct Transformer {
    using Ops = backend::Ops<B>;
    using Mat = Tensor<float, 2, B>;

    ModelConfig config{};
    /// The config.json text this model was loaded from (load_transformer), so that save_transformer writes its
    /// fields back, those moonmoe does not model included; empty for a model built from a configuration.
    std::string hf_config_json;
    Embedding<B> embed_tokens;
    std::vector<DecoderLayer<B>> layers;
    RMSNorm<B> norm;
    Linear<B> lm_head;
    ModelPart part;  ///< what this object holds (the whole model unless built from a part)

    /// What the head (final norm and lm_head) keeps for backward.
    struct HeadCache {
        KeptMatrix<B> h_last;    ///< input of the final norm
        KeptMatrix<B> h_normed;  ///< input of lm_head, unless recomputed (ActivationsConfig::recompute_norms)
        Tensor<float, 1, B> rstd;
        std::size_t bytes() const { return h_last.bytes() + h_normed.bytes() + rstd.bytes(); }
        template <class F>
        void for_each_kept(F&& f) {
            f(h_last), f(h_normed);
        }
    };

    /// What backward needs of one forward. backward consumes it (frees the activations and marks it consumed), so
    /// each forward allows one backward; a second backward on the same cache is refused, naming the fix.
    struct Cache {
        enum class State { empty, forwarded, consumed };
        State state = State::empty;
        Pass pass = Pass::inference;  ///< what the forward was for: only a training forward's backward runs
        std::vector<index_t> ids;
        TokenLayout layout;
        std::vector<typename DecoderLayer<B>::Cache> layers;
        HeadCache head;
        /// The bytes held for backward (the token ids and layout, on the host, aside).
        std::size_t bytes() const {
            std::size_t n = head.bytes();
            for (const auto& l : layers) n += l.bytes();
            return n;
        }
    };

    /// Inference state of one sequence: a latent (MLA) or K/V (MHA) cache per layer. Several states decode
    /// together through decode(ids, counts, states).
    struct DecodeState {
        std::vector<typename DecoderLayer<B>::DecodeCache> caches;
        index_t length() const { return caches.empty() ? 0 : caches[0].length(); }
    };

    Transformer() = default;
    explicit Transformer(const ModelConfig& c) : Transformer(c, ModelPart::whole(c)) {}
    /// The pieces `p` names (parameters named as in the whole model); the MoE layers move their pairs with
    /// `dispatcher` (null: local; an expert group's: parallel::expert_dispatcher).
    Transformer(const ModelConfig& c, ModelPart p, std::shared_ptr<Dispatcher<B>> dispatcher = {})
        : config(c), part(std::move(p)) {
        if (!c.is_static()) throw config_error("Transformer: every size must be known (resolve Dynamic sizes first)");
        validate(c);
        for (std::size_t i = 0; i < part.layers.size(); ++i)
            if (part.layers[i] < 0 || part.layers[i] >= c.dims.layers ||
                (i > 0 && part.layers[i] <= part.layers[i - 1]))
                throw std::invalid_argument("Transformer: the part's layers must be ascending indices in [0, " +
                                            std::to_string(c.dims.layers) + "); entry " + std::to_string(i) + " is " +
                                            std::to_string(part.layers[i]));
        if (part.embedding) embed_tokens = Embedding<B>(c.dims.vocab, c.dims.hidden);
        if (part.head) {
            norm = RMSNorm<B>(c.dims.hidden, c.dims.norm_eps);
            lm_head = Linear<B>(c.dims.hidden, c.dims.vocab, ParamKind::output_head, c.precision);
        }
        layers.reserve(part.layers.size());
        for (index_t l : part.layers) layers.emplace_back(c, l, part.first_expert, part.expert_count, dispatcher);
        norm.set_precision(c.precision);
        lm_head.set_precision(c.precision);
        set_offload(c.activations.offload);
    }

    /// Whether this object holds every parameter of the model (what a checkpoint of the whole model needs).
    bool is_whole() const { return part.is_whole(config); }
    /// Whether forward, backward and decoding can run here: every layer, the embedding and the head, and MoE layers
    /// that hold every expert or reach the others through an expert group's dispatcher (expert parallelism).
    bool runs_whole_model() const {
        if (!part.embedding || !part.head || index_t(part.layers.size()) != config.dims.layers) return false;
        for (const auto& layer : layers)
            if (!layer.dense && !layer.moe.covers_all_experts()) return false;
        return true;
    }

    NumberFormat compute() const { return config.precision.compute; }

    /// Changes what the next forwards keep for backward (config/activations.hpp): the policy of the model type, or
    /// another for this model. Refuses bf16 storage under f32 compute.
    void set_activations(const ActivationsConfig& a) {
        check_activations(a, config.precision);
        set_offload(a.offload);
        config.activations = a;
        for (auto& layer : layers) layer.set_activations(a);
    }

    /// Activations<Offload<true>>: the host copies of the layers' kept matrices (nn/offload.hpp); null otherwise.
    const KeptOffload<B>* offload() const
        requires backend::offloads<B>
    {
        return offloader_.get();
    }

    /// Re-rounds every bf16 working copy from its f32 master weight (bf16 policy; nothing under f32). The
    /// optimizer's step, QK-Clip and io's loading call it; so does any other code that writes master weights.
    void refresh_working_weights() {
        for (auto& layer : layers) layer.refresh_working();
        lm_head.refresh_working();
    }

    /// logits [tokens, vocab] of `ids` laid out as `layout`; keeps what backward needs. By default an inference
    /// forward, which leaves the training statistics alone (nn/pass.hpp): the routers' load counts and the
    /// attention's maximum logits move only for Pass::training (a forward whose backward trains; the only kind
    /// backward accepts) and the maxima for Pass::measurement (QK-Clip's re-measure).
    Mat forward(const index_t* ids, const TokenLayout& layout, Cache& c, Pass pass = Pass::inference) {
        require_whole("forward");
        const index_t T = layout.tokens(), H = config.dims.hidden;
        c.state = Cache::State::empty;  // until this forward completes
        c.pass = pass;
        c.ids.assign(ids, ids + T);
        c.layout = layout;
        Mat h({T, H});
        embed(ids, h.view());
        c.layers.resize(layers.size());
        forward_layers(0, layers.size(), h, layout, c.layers, pass, [&](std::size_t l) {
            if constexpr (backend::offloads<B>)
                if (offloader_) offloader_->offload(c.layers[l]);  // while the next layers compute
        });
        Mat logits = head_forward(std::move(h), c.head);
        c.state = Cache::State::forwarded;
        return logits;
    }

    /// Accumulates (+=) every parameter gradient from the gradient of the loss with respect to the logits
    /// [tokens, vocab] of the forward that filled `c`, then releases the cache: one backward per forward.
    void backward(View<const float, 2, B> dlogits, Cache& c) {
        if (c.state != Cache::State::forwarded)
            throw std::logic_error(
                c.state == Cache::State::consumed
                    ? "Transformer::backward: this cache's backward has already run; backward consumes (and frees) the "
                      "activations its forward stored, so each forward allows one backward. Run forward again to fill "
                      "the cache before another backward (gradients accumulate, so forward + backward per micro-batch "
                      "sums them)"
                    : "Transformer::backward: the cache holds no forward (or its forward threw); run forward(ids, "
                      "layout, cache, nn::Pass::training) before backward");
        if (c.pass != Pass::training)
            throw std::logic_error(std::string("Transformer::backward: the cache holds an ") + pass_name(c.pass) +
                                   " forward, which fed no router load and no QK-Clip maxima; a forward whose "
                                   "backward trains is marked: forward(ids, layout, cache, nn::Pass::training)");
        const index_t T = c.layout.tokens(), H = config.dims.hidden;
        if (dlogits.shape[0] != T || dlogits.shape[1] != config.dims.vocab)
            throw shape_error("Transformer::backward: dlogits is " + shape_string(dlogits.shape) +
                              ", the forward's logits are [" + std::to_string(T) + ", " +
                              std::to_string(config.dims.vocab) + "]");
        Mat dh({T, H});
        head_backward(dlogits, c.head, dh.view());
        backward_layers(0, layers.size(), dh, c.layers, [&](std::size_t l) {
            if constexpr (backend::offloads<B>) {
                if (offloader_) {
                    offloader_->restore(c.layers[l]);
                    if (l > 0) offloader_->prefetch(c.layers[l - 1]);  // copied while layer l's backward computes
                }
            }
        });
        embed_backward(c.ids.data(), dh.view());
        c = Cache{};
        c.state = Cache::State::consumed;
    }

private:
    /// Activations<Offload<true>> needs a backend whose memory is not the host's (backend/offload.hpp).
    void set_offload(bool on) {
        check_offload<B>(on);
        if constexpr (backend::offloads<B>) {
            if (on && !offloader_) offloader_ = std::make_unique<KeptOffload<B>>();
            if (!on) offloader_.reset();
        }
    }

    std::conditional_t<backend::offloads<B>, std::unique_ptr<KeptOffload<B>>, std::monostate> offloader_{};

public:
    /// Forward + cross-entropy on the causal targets + backward: HF's loss with labels = input_ids; returns the
    /// mean loss over the batch's targets. Gradients accumulate (+=) into the parameters' grad: the optimizer's
    /// step() consumes them and sets them to zero (optim/optimizer.hpp), so the usual loop is train_step, step,
    /// and several train_steps before one step() sum the micro-batches' gradients. A caller without an optimizer
    /// calls zero_grad() between batches. `gradient_scale` multiplies the gradient (not the returned loss): 1 / M
    /// for each of M micro-batches of one step makes their sum the gradient of the step's mean loss.
    float train_step(const index_t* ids, const TokenLayout& layout, float gradient_scale = 1.0f) {
        Cache c;
        Mat logits = forward(ids, layout, c, Pass::training);
        Mat dlogits(logits.shape());
        const float loss = causal_lm_loss<B>(logits.view(), ids, layout, dlogits.view(), gradient_scale);
        backward(dlogits.view(), c);
        return loss;
    }

    // ---- the model's pieces in order: what forward, backward and train_step run, and what the pipeline runtime
    //      (parallel/pipeline.hpp) runs of them on each stage (embedding on the first, head and loss on the last) --

    /// h = embed_tokens(ids), rounded to the compute format.
    void embed(const index_t* ids, View<float, 2, B> h) {
        embed_tokens.forward(ids, h);
        round_to(compute(), h);
    }
    /// Accumulates the embedding's gradient from dh, the gradient of the first layer's input.
    void embed_backward(const index_t* ids, View<const float, 2, B> dh) { embed_tokens.backward(ids, dh); }

    /// h <- the output of layers [first, last) of this object (positions in `layers`) applied to h; caches[k] is
    /// layer first + k's. after(l) runs once layer l's forward is done (the owner's activation offload).
    template <class After>
    void forward_layers(std::size_t first, std::size_t last, Mat& h, const TokenLayout& layout,
                        std::span<typename DecoderLayer<B>::Cache> caches, Pass pass, After&& after) {
        Mat next(h.shape());
        for (std::size_t l = first; l < last; ++l) {
            layers[l].forward(h.view(), layout, next.view(), caches[l - first], pass);
            after(l);
            std::swap(h, next);
        }
    }
    void forward_layers(std::size_t first, std::size_t last, Mat& h, const TokenLayout& layout,
                        std::span<typename DecoderLayer<B>::Cache> caches, Pass pass) {
        forward_layers(first, last, h, layout, caches, pass, [](std::size_t) {});
    }
    /// dh <- the gradient of the input of layers [first, last) from dh, the gradient of their output (mirrors
    /// forward_layers; each cache is consumed). before(l) runs before layer l's backward (the owner's restore).
    template <class Before>
    void backward_layers(std::size_t first, std::size_t last, Mat& dh,
                         std::span<typename DecoderLayer<B>::Cache> caches, Before&& before) {
        Mat prev(dh.shape());
        for (std::size_t l = last; l-- > first;) {
            before(l);
            layers[l].backward(dh.view(), caches[l - first], prev.view());
            std::swap(dh, prev);
        }
    }
    void backward_layers(std::size_t first, std::size_t last, Mat& dh,
                         std::span<typename DecoderLayer<B>::Cache> caches) {
        backward_layers(first, last, dh, caches, [](std::size_t) {});
    }

    /// logits = lm_head(norm(h)) [tokens, vocab]; keeps the final norm's input (taken from h) and its output
    /// unless recompute_norms.
    Mat head_forward(Mat&& h, HeadCache& c) {
        const index_t T = h.shape()[0];
        c.rstd = Tensor<float, 1, B>({T});
        Mat h_normed({T, config.dims.hidden});
        norm.forward(h.view(), h_normed.view(), c.rstd.view());
        Mat logits({T, config.dims.vocab});
        lm_head.forward(h_normed.view(), logits.view());
        const KeptFormat kept = config.activations.value_format();
        c.h_last = KeptMatrix<B>(std::move(h), kept);
        if (!config.activations.recompute_norms) c.h_normed = KeptMatrix<B>(std::move(h_normed), kept);
        return logits;
    }
    /// dh = the gradient of the final norm's input, from dlogits; accumulates lm_head's and the norm's gradients.
    void head_backward(View<const float, 2, B> dlogits, HeadCache& c, View<float, 2, B> dh) {
        const Mat h_last = c.h_last.take("the final norm's input");
        const Mat h_normed =
            config.activations.recompute_norms ? norm.recompute(h_last.view()) : c.h_normed.take("lm_head's input");
        Mat dn(dh.shape);
        lm_head.backward(h_normed.view(), dlogits, dn.view());
        norm.backward(h_last.view(), c.rstd.view(), dn.view(), dh);
        c = HeadCache{};
    }

    /// A decoding state whose caches hold `capacity` tokens; refused past the model's context
    /// (max_position_embeddings), where no position was trained and the cache would only grow for nothing.
    DecodeState start_decoding(index_t capacity) const {
        const index_t context = config.rope.max_positions;
        if (capacity < 1 || (context != Dynamic && capacity > context))
            throw std::invalid_argument("Transformer::start_decoding: a cache of " + std::to_string(capacity) +
                                        " tokens; the model's context is " + std::to_string(context) +
                                        " positions (max_position_embeddings), so a sequence holds 1 to " +
                                        std::to_string(context) + " tokens (prompt and new tokens together)");
        DecodeState s;
        for (const auto& layer : layers) s.caches.push_back(layer.make_decode_cache(capacity));
        return s;
    }

    /// Logits [n, vocab] of the next n tokens of the sequence in `state` (absorbed MLA with its latent cache).
    Mat decode(const index_t* ids, index_t n, DecodeState& state) {
        DecodeState* one[1] = {&state};
        const index_t counts[1] = {n};
        return decode(ids, counts, one);
    }

    /// Several sequences at once, each continuing its own state (their caches may hold different lengths):
    /// counts[s] next tokens of sequence s, the ids of all sequences one after another. Returns logits
    /// [sum of counts, vocab], rows in the same order. Attention runs per sequence against its own cache; the
    /// projections, experts and lm_head on all rows together. Each sequence gets the logits it would get decoded
    /// alone, up to the rounding of GEMMs over a different number of rows.
    Mat decode(const index_t* ids, std::span<const index_t> counts, std::span<DecodeState* const> states) {
        if (counts.size() != states.size())
            throw std::invalid_argument("Transformer.decode: " + std::to_string(counts.size()) + " token counts for " +
                                        std::to_string(states.size()) + " decode states");
        require_whole("decode");
        TokenLayout layout = TokenLayout::packed(counts);
        std::vector<std::vector<typename DecoderLayer<B>::DecodeCache*>> caches(layers.size());
        for (std::size_t s = 0; s < states.size(); ++s) {
            if (states[s]->caches.size() != layers.size())
                throw std::invalid_argument("Transformer.decode: decode state " + std::to_string(s) + " has " +
                                            std::to_string(states[s]->caches.size()) + " layer caches, the model " +
                                            std::to_string(layers.size()) + " layers (make it with start_decoding)");
            const index_t first = layout.begin(index_t(s)), cached = states[s]->length();
            for (index_t t = first; t < layout.end(index_t(s)); ++t)
                layout.positions[std::size_t(t)] = cached + t - first;
            for (std::size_t l = 0; l < layers.size(); ++l) caches[l].push_back(&states[s]->caches[l]);
        }
        const index_t T = layout.tokens(), H = config.dims.hidden;
        Mat h({T, H}), next({T, H});
        embed_tokens.forward(ids, h.view());
        round_to(compute(), h.view());
        for (std::size_t l = 0; l < layers.size(); ++l) {
            layers[l].forward_cached(h.view(), layout, caches[l], next.view());
            std::swap(h, next);
        }
        Tensor<float, 1, B> rstd({T});
        norm.forward(h.view(), next.view(), rstd.view());
        Mat logits({T, config.dims.vocab});
        lm_head.forward(next.view(), logits.view());
        return logits;
    }
    Mat decode(const index_t* ids, std::span<const index_t> counts, std::span<DecodeState> states) {
        std::vector<DecodeState*> pointers;
        for (DecodeState& s : states) pointers.push_back(&s);
        return decode(ids, counts, std::span<DecodeState* const>(pointers));
    }

    /// Sets every gradient to zero (one primitive call over all of them).
    void zero_grad() {
        std::vector<View<float, 1, B>> grads;
        visit_params([&](const ParamRef& p) {
            if (p.grad) grads.push_back(View<float, 1, B>(p.grad, {p.numel()}));
        });
        Ops::zero_all(grads);
    }

    /// Every parameter under its Hugging Face checkpoint name.
    void visit_params(const ParamVisitor& f) {
        if (part.embedding) embed_tokens.visit_params("model.embed_tokens", f);
        for (std::size_t l = 0; l < layers.size(); ++l)
            layers[l].visit_params("model.layers." + std::to_string(part.layers[l]), f);
        if (part.head) {
            norm.visit_params("model.norm", f);
            lm_head.visit_params("lm_head", f);
        }
    }

private:
    void require_whole(const char* op) const {
        if (!runs_whole_model())
            throw std::logic_error(std::string("Transformer::") + op +
                                   ": this model holds a part of the model (some layers of a pipeline stage, or "
                                   "experts without an expert group's dispatcher); the whole model's forward needs "
                                   "every layer: run a pipeline stage's part through parallel::Pipeline "
                                   "(parallel/pipeline.hpp), and build an expert-parallel part with "
                                   "parallel::expert_dispatcher");
    }
};

}  // namespace moonmoe::nn
