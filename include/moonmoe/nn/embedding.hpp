// moonmoe/nn/embedding.hpp: token embedding, y[t] = W[ids[t]], W [vocab, hidden] (HF model.embed_tokens).
#pragma once

#include <span>
#include <stdexcept>
#include <string>

#include "../backend/backend.hpp"
#include "../tensor/transfer.hpp"
#include "param.hpp"

namespace moonmoe::nn {

template <class B = cpu>
struct Embedding {
    using Ops = backend::Ops<B>;
    Param<2, B> weight;

    Embedding() = default;
    Embedding(index_t vocab, index_t hidden) : weight({vocab, hidden}, ParamKind::embedding) {}

    void check_ids(const index_t* ids, index_t n) const {
        for (index_t t = 0; t < n; ++t)
            if (ids[t] < 0 || ids[t] >= weight.value.size(0))
                throw std::out_of_range("Embedding: token id " + std::to_string(ids[t]) + " at position " +
                                        std::to_string(t) + " is outside the vocabulary [0, " +
                                        std::to_string(weight.value.size(0)) + ")");
    }

    /// ids: host token ids, checked against the vocabulary, then uploaded for the gather.
    void forward(const index_t* ids, View<float, 2, B> y) const {
        check_ids(ids, y.shape[0]);
        Ops::embedding_gather(weight.value.view(), upload(ids, y.shape[0]).view(), y);
    }

    /// dW[ids[t]] += dy[t], tokens in order (repeatable when ids repeat).
    void backward(const index_t* ids, View<const float, 2, B> dy) {
        Ops::embedding_scatter_add(dy, upload(ids, dy.shape[0]).view(), weight.grad.view());
    }

    static Tensor<index_t, 1, B> upload(const index_t* ids, index_t n) {
        return to_device<B>(std::span<const index_t>(ids, std::size_t(n)));
    }

    void visit_params(const std::string& name, const ParamVisitor& f) { visit(name + ".weight", weight, f); }
};

}  // namespace moonmoe::nn
