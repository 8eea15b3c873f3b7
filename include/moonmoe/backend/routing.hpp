// moonmoe/backend/routing.hpp: the routing (router selection and backward, dispatch plan, gather, combine, sorted scatter-add) primitives.
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
//                                ties to the lower index, largest first; or takes the experts of `fixed` [T, K]
//                                when it has data. weight [T, K] = s[idx], normalised by sum + 1e-20 (NormTopK),
//                                times cfg.routed_scale
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

#include "memory.hpp"

namespace moonmoe::backend {

template <class B>
struct RoutingOps {
    static_assert(missing_backend<B>, "moonmoe: no routing primitives for this backend; include "
                                      "<moonmoe/backend/cpu.hpp> (Backend<cpu>) or <moonmoe/backend/cuda.hpp>");
};

}  // namespace moonmoe::backend
