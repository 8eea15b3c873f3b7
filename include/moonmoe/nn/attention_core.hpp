// moonmoe/nn/attention_core.hpp: causal softmax attention over a token layout, shared by MLA and MHA: views of
// the heads of wide activations, and the calls into the attention primitives (backend/attention.hpp), one call
// for every sequence and head of the layout, so attention never crosses a sequence boundary of a packed batch.
//
// scores = scale * sum over parts p of Q_p K_p^T (MLA has two parts, nope and rope, so its keys are never
// concatenated; MHA has one), P = softmax(scores) over keys j <= i, O = P V. Forward keeps only the per-row
// log-sum-exp; backward recomputes P from it:
//   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)) * scale,  dQ_p = dS K_p,  dK_p = dS^T Q_p.
#pragma once

#include "../backend/backend.hpp"
#include "../tensor/tensor.hpp"
#include "layout.hpp"

namespace moonmoe::nn {

/// Where the log-sum-exps of head h of sequence s start in a [tokens * heads] buffer: blocks of length(s) values,
/// sequence by sequence, head by head within a sequence.
inline index_t lse_offset(const TokenLayout& layout, index_t heads, index_t s, index_t h) {
    return layout.begin(s) * heads + h * layout.length(s);
}

/// The heads of a wide activation m [rows, width] as [rows, heads, dim]: head h's columns start at
/// col0 + h * head_stride (head_stride 0: one head shared by all, as MLA's rope key).
template <class T, class B>
View<T, 3, B> heads_view(View<T, 2, B> m, index_t col0, index_t heads, index_t head_stride, index_t dim) {
    return View<T, 3, B>(m.data + col0, {m.shape[0], heads, dim}, {m.strides[0], head_stride, 1});
}
template <class B>
View<const float, 3, B> heads_view(const Tensor<float, 2, B>& m, index_t col0, index_t heads, index_t head_stride,
                                   index_t dim) {
    return heads_view<const float, B>(m.view(), col0, heads, head_stride, dim);
}
template <class B>
View<float, 3, B> heads_view(Tensor<float, 2, B>& m, index_t col0, index_t heads, index_t head_stride, index_t dim) {
    return heads_view<float, B>(m.view(), col0, heads, head_stride, dim);
}

}  // namespace moonmoe::nn
