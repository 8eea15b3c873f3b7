// moonmoe/backend/routing.hpp: the routing (router selection and backward, dispatch plan, gather, combine, sorted
// scatter-add) primitives.
//
// T tokens, E experts, K experts per token; a pair (t, j) is slot t * K + j of the [T, K] routing tensors. Index
// tensors hold index_t. A dispatch plan sorts the pairs whose expert lies in [first, first + L) (one expert-parallel
// rank's experts; the others are skipped) stably by expert into P rows: row r holds pair row_slot[r], the rows of
// local expert e are [offsets[e], offsets[e + 1]), and within an expert the pairs keep their slot order (so the
// tokens ascend). The grouped GEMMs (BlasOps::gemm_grouped) then run over those segments.
//
// RoutingOps<B>:
//   route_select(cfg, scores, bias, fixed, idx, weight)
//                                scores [T, E] holds the router logits and becomes s = sigmoid or softmax of them;
//                                selects with s + bias (bias [E], used when cfg.correction_bias), limited to the
//                                cfg.top_groups best of cfg.groups groups (GroupSum-of-top-2 or GroupMax), top-k with
//                                ties to the lower index, largest first, in torch.topk's order (fn::ranks_before: a
//                                NaN above every number, a group holding one first); or takes the experts of
//                                `fixed` [T, K] when it has data. weight [T, K] = s[idx], normalised by sum + 1e-20
//                                (NormTopK), times cfg.routed_scale
//   route_backward(cfg, scores, idx, dweight, aux_grad, dlogits)
//                                dlogits [T, E] = d loss / d logits from dweight [T, K] (through NormTopK and the
//                                routed scale) plus aux_grad [T, E] (d balance loss / ds; no data = none), through
//                                the sigmoid or softmax
//   histogram(idx, first, counts)
//                                counts[e] += #{pairs with idx == first + e} for e < counts.size (others ignored)
//   update_bias(gamma, load, bias)
//                                bias[e] += gamma * sign(mean(load) - load[e]) (fn::LoadBalanceStep)
//   dispatch_plan(idx, first, offsets, row_slot, slot_row)
//                                the plan above: offsets [L + 1] (histogram, exclusive scan), row_slot [T * K]
//                                (rows P.. unused, -1), slot_row [T, K] (the row of each pair, -1 when skipped)
//   gather_pairs(x, row_slot, k, out)
//                                out[r, :] = x[row_slot[r] / k, :] for r < out.rows: each pair's token row
//   combine(rows, slot_row, weight, y)
//                                y[t, :] += sum_j weight[t, j] rows[slot_row[t, j], :], skipped pairs left out, each
//                                token's terms added in ascending row order (= ascending expert): repeatable, no
//                                atomics; weight without data = 1 (the backward's scatter of dx back to the tokens)
//   pair_dot(a, b, row_slot, out)
//                                out.flat[row_slot[r]] = sum_j a[r, j] b[r, j] (in double) for r < a.rows: the
//                                routing-weight gradient dy . y_e of every pair; other entries untouched
#pragma once

#include <string>

#include "../config/moe.hpp"
#include "../tensor/tensor.hpp"
#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RoutingOps {
    static_assert(missing_backend<B>,
                  "moonmoe: no routing primitives for this backend; include "
                  "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

/// The argument checks every backend's RoutingOps runs before touching data (shapes and strides only), so both
/// backends reject the same calls with the same messages.
namespace contract {

template <class... V>
void require_contiguous(const char* op, const V&... v) {
    ((v.contiguous()
          ? void()
          : throw shape_error(std::string(op) + ": a view of shape " + shape_string(v.shape) + " must be contiguous")),
     ...);
}

template <class B>
void check_route_select(const MoEConfig& cfg, const View<float, 2, B>& scores, const View<const float, 1, B>& bias,
                        const View<const index_t, 2, B>& fixed, const View<index_t, 2, B>& idx,
                        const View<float, 2, B>& weight) {
    const index_t T = scores.shape[0], E = scores.shape[1], K = idx.shape[1];
    if (E != cfg.experts || bias.shape[0] != E || idx.shape[0] != T || weight.shape != idx.shape ||
        (fixed.data && fixed.shape != idx.shape) || K > E)
        throw shape_error("route_select: scores " + shape_string(scores.shape) + " (" + std::to_string(cfg.experts) +
                          " experts), bias " + shape_string(bias.shape) + ", idx " + shape_string(idx.shape) +
                          ", weight " + shape_string(weight.shape) +
                          (fixed.data ? ", fixed " + shape_string(fixed.shape) : std::string()));
    require_contiguous("route_select", scores, idx, weight);
}

template <class B>
void check_route_backward(const View<const float, 2, B>& scores, const View<const index_t, 2, B>& idx,
                          const View<const float, 2, B>& dweight, const View<const float, 2, B>& aux_grad,
                          const View<float, 2, B>& dlogits) {
    const index_t T = scores.shape[0];
    if (idx.shape[0] != T || dweight.shape != idx.shape || dlogits.shape != scores.shape ||
        (aux_grad.data && aux_grad.shape != scores.shape))
        throw shape_error("route_backward: scores " + shape_string(scores.shape) + ", idx " + shape_string(idx.shape) +
                          ", dweight " + shape_string(dweight.shape) + ", dlogits " + shape_string(dlogits.shape) +
                          (aux_grad.data ? ", aux_grad " + shape_string(aux_grad.shape) : std::string()));
    require_contiguous("route_backward", scores, idx, dweight, dlogits);
    if (aux_grad.data) require_contiguous("route_backward", aux_grad);
}

template <class B>
void check_update_bias(const View<const index_t, 1, B>& load, const View<float, 1, B>& bias) {
    if (load.shape != bias.shape) throw_shape_mismatch("update_bias: load against bias", load.shape, bias.shape);
}

template <class B>
void check_dispatch_plan(const View<const index_t, 2, B>& idx, const View<index_t, 1, B>& offsets,
                         const View<index_t, 1, B>& row_slot, const View<index_t, 2, B>& slot_row) {
    const index_t n = idx.numel(), L = offsets.shape[0] - 1;
    if (L < 0 || row_slot.shape[0] != n || slot_row.shape != idx.shape)
        throw shape_error("dispatch_plan: idx " + shape_string(idx.shape) + ", offsets " + shape_string(offsets.shape) +
                          ", row_slot " + shape_string(row_slot.shape) + ", slot_row " + shape_string(slot_row.shape) +
                          " (expected offsets [local experts + 1], row_slot [pairs], slot_row like idx)");
    require_contiguous("dispatch_plan", idx, offsets, row_slot, slot_row);
}

template <class B>
void check_gather_pairs(const View<const float, 2, B>& x, const View<const index_t, 1, B>& row_slot, index_t k,
                        const View<float, 2, B>& out) {
    if (x.shape[1] != out.shape[1] || out.shape[0] > row_slot.shape[0] || k < 1)
        throw shape_error("gather_pairs: x " + shape_string(x.shape) + ", row_slot " + shape_string(row_slot.shape) +
                          ", k = " + std::to_string(k) + ", out " + shape_string(out.shape));
    require_contiguous("gather_pairs", row_slot);
}

template <class B>
void check_combine(const View<const float, 2, B>& rows, const View<const index_t, 2, B>& slot_row,
                   const View<const float, 2, B>& weight, const View<float, 2, B>& y) {
    const index_t T = y.shape[0], cols = y.shape[1];
    if (slot_row.shape[0] != T || rows.shape[1] != cols || (weight.data && weight.shape != slot_row.shape))
        throw shape_error("combine: rows " + shape_string(rows.shape) + ", slot_row " + shape_string(slot_row.shape) +
                          (weight.data ? ", weight " + shape_string(weight.shape) : std::string()) + ", y " +
                          shape_string(y.shape));
    require_contiguous("combine", slot_row);
    if (weight.data) require_contiguous("combine", weight);
}

template <class B>
void check_pair_dot(const View<const float, 2, B>& a, const View<const float, 2, B>& b,
                    const View<const index_t, 1, B>& row_slot, const View<float, 2, B>& out) {
    if (a.shape != b.shape || a.shape[0] > row_slot.shape[0] || row_slot.shape[0] != out.numel())
        throw shape_error("pair_dot: a " + shape_string(a.shape) + ", b " + shape_string(b.shape) + ", row_slot " +
                          shape_string(row_slot.shape) + ", out " + shape_string(out.shape));
    require_contiguous("pair_dot", row_slot, out);
}

}  // namespace contract

}  // namespace moonmoe::backend
