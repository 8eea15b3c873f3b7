// moonmoe/backend/cuda/fast/router.hpp: the router's selection for RoutingOps<cuda>::route_select, a warp per token.
// header-check: nvcc-only
//
// The contract is route_select's (backend/routing.hpp), selected inside it when CudaFastKernels::router is on
// (fast/select.hpp). Lane l holds experts l + 32 k (k < 4, 8, 12 or 16 by E: up to 512 experts; Kimi K2 has 384)
// in registers:
//   scores      sigmoid (fn::sigmoid, the portable expression) or softmax (the maximum by shuffles, the sum of the
//               exponentials in double, per lane then a tree), written back to `scores` as the contract says
//   groups      each group's score (its largest choice, or the sum of its two largest: per-lane top-2 merged by
//               shuffles), every lane ranks its group (ties to the lower group) and a ballot gives the kept mask
//   top-k       K rounds of a warp arg-max (largest choice, ties to the lower expert: the portable order), the
//               winner's lane marks it taken; lane j keeps the j-th expert
//   weights     lane j reads s of its expert back, every lane sums the K of them in double in selection order
//               (as the portable path), then normalises and scales
// With sigmoid scores, selection and weights are the portable path's bits, NaNs included (a NaN choice ranks above
// every number, fn::ranks_above; a NaN logit under softmax makes every score NaN, on both paths); with softmax the
// scores' sum runs in another order (rounding differences, and a top-k tie at that level may then choose differently).
#pragma once

#include "warp.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else warp.hpp has stopped with an #error

#include <cmath>
#include <cstdint>

#include "../../../config/moe.hpp"
#include "../../../tensor/tensor.hpp"
#include "../../functors.hpp"
#include "../../routing.hpp"

namespace moonmoe::backend::cuda_fast {

inline constexpr int router_experts_per_lane = 16;  // experts up to 32 * 16 = 512 (the kernel takes 4, 8, 12 or 16)
inline constexpr index_t router_max_top_k = 32;     // a lane per chosen expert
inline constexpr index_t router_max_groups = 64;    // two per lane, and the bits of the kept mask

struct RouterArgs {
    float* scores;  // [T, E], contiguous
    const float* bias;
    index_t bias_step;
    const index_t* fixed;  // null: select
    index_t fixed_pitch, fixed_step;
    index_t* idx;   // [T, K], contiguous
    float* weight;  // [T, K], contiguous
    index_t T, E, K, groups, top_groups, per_group;
    bool softmax, group_max, correction_bias, norm_top_k, limit_groups;
    float routed_scale;
};

/// (v, e) beats (best, best_e) in the portable path's order (fn::ranks_before: a NaN above every number, ties to the
/// lower expert). A total order, so the warp's arg-max is the portable top-k's next expert whatever the shuffle
/// order; every untaken expert beats the start (-inf, E), so a round never picks an index past E.
__device__ __forceinline__ bool beats(float v, index_t e, float best, index_t best_e) {
    return fn::ranks_before(v, e, best, best_e);
}

/// The higher and the lower of a and b in fn::ranks_above's order (a NaN is the higher), for the groups' top two.
__device__ __forceinline__ float higher(float a, float b) { return fn::ranks_above(b, a) ? b : a; }
__device__ __forceinline__ float lower(float a, float b) { return fn::ranks_above(b, a) ? a : b; }

/// Bit g set when group g is among the top_groups groups by score, ties to the lower group (as the portable path).
template <int PerLane>
__device__ std::uint64_t kept_groups(const RouterArgs& a, const float (&c)[PerLane], int lane) {
    float mine0 = -INFINITY, mine1 = -INFINITY;  // the scores of groups lane and lane + 32
    for (index_t g = 0; g < a.groups; ++g) {
        float first = -INFINITY, second = -INFINITY;
#pragma unroll
        for (int k = 0; k < PerLane; ++k) {
            const index_t e = lane + 32 * k;
            if (e < a.E && e / a.per_group == g) {
                if (fn::ranks_above(c[k], first)) second = first, first = c[k];
                else if (fn::ranks_above(c[k], second))
                    second = c[k];
            }
        }
        // Merge two lanes' top-2 (equal values count twice) in the portable order: fmaxf would drop a NaN.
        for (int off = 16; off > 0; off /= 2) {
            const float f = __shfl_xor_sync(full_warp, first, off), s = __shfl_xor_sync(full_warp, second, off);
            second = higher(lower(first, f), higher(second, s));
            first = higher(first, f);
        }
        if (lane == g % 32) (g < 32 ? mine0 : mine1) = a.group_max ? first : first + second;
    }
    std::uint64_t keep = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const index_t g = lane + 32 * half;
        const float score = half ? mine1 : mine0;
        index_t rank = 0;  // groups ahead of g
        for (index_t other = 0; other < a.groups; ++other) {
            const float so = __shfl_sync(full_warp, other < 32 ? mine0 : mine1, int(other % 32));
            rank += fn::ranks_before(so, other, score, g);
        }
        keep |= std::uint64_t(__ballot_sync(full_warp, g < a.groups && rank < a.top_groups)) << (32 * half);
    }
    return keep;
}

/// route_select for token 4 blockIdx.x + warp; lanes hold PerLane experts each (E <= 32 PerLane).
template <int PerLane>
__global__ void __launch_bounds__(128) route_select_kernel(RouterArgs a) {
    const int lane = threadIdx.x % 32;
    const index_t t = index_t(blockIdx.x) * 4 + threadIdx.x / 32;
    if (t >= a.T) return;  // the whole warp leaves together
    float* row = a.scores + t * a.E;
    float s[PerLane];
#pragma unroll
    for (int k = 0; k < PerLane; ++k) {
        const index_t e = lane + 32 * k;
        s[k] = e < a.E ? row[e] : -INFINITY;
    }
    if (!a.softmax) {
#pragma unroll
        for (int k = 0; k < PerLane; ++k) s[k] = fn::sigmoid(s[k]);
    } else {
        float m = -INFINITY;
#pragma unroll
        for (int k = 0; k < PerLane; ++k) m = fmaxf(m, s[k]);
        m = group_max(m);
        double sum = 0.0;
#pragma unroll
        for (int k = 0; k < PerLane; ++k)
            if (lane + 32 * k < a.E) sum += exp(double(s[k] - m));
        sum = group_sum(sum);
#pragma unroll
        for (int k = 0; k < PerLane; ++k) s[k] = float(exp(double(s[k] - m)) / sum);
    }
#pragma unroll
    for (int k = 0; k < PerLane; ++k)
        if (lane + 32 * k < a.E) row[lane + 32 * k] = s[k];

    index_t mine = 0;  // lane j < K: the j-th chosen expert
    if (a.fixed) {
        if (lane < a.K) mine = a.fixed[t * a.fixed_pitch + lane * a.fixed_step];
    } else if (a.K > 0) {
        float c[PerLane];  // the selection values
#pragma unroll
        for (int k = 0; k < PerLane; ++k) {
            const index_t e = lane + 32 * k;
            c[k] = e < a.E && a.correction_bias ? s[k] + a.bias[e * a.bias_step] : s[k];
        }
        if (a.limit_groups) {
            const std::uint64_t keep = kept_groups(a, c, lane);
            const float dropped = a.group_max ? 0.0f : -INFINITY;
#pragma unroll
            for (int k = 0; k < PerLane; ++k) {
                const index_t e = lane + 32 * k;
                if (e < a.E && !((keep >> (e / a.per_group)) & 1u)) c[k] = dropped;
            }
        }
        unsigned taken = 0;  // bit k: expert lane + 32 k is taken (or past E)
#pragma unroll
        for (int k = 0; k < PerLane; ++k)
            if (lane + 32 * k >= a.E) taken |= 1u << k;
        for (index_t j = 0; j < a.K; ++j) {
            float best = -INFINITY;
            index_t best_e = a.E;  // none yet
#pragma unroll
            for (int k = 0; k < PerLane; ++k)
                if (!((taken >> k) & 1u) && beats(c[k], lane + 32 * k, best, best_e))
                    best = c[k], best_e = lane + 32 * k;
            for (int off = 16; off > 0; off /= 2) {
                const float v = __shfl_xor_sync(full_warp, best, off);
                const index_t e = __shfl_xor_sync(full_warp, best_e, off);
                if (beats(v, e, best, best_e)) best = v, best_e = e;
            }
            if (best_e % 32 == lane) taken |= 1u << (best_e / 32);
            if (lane == j) mine = best_e;
        }
    }
    __syncwarp();  // the scores written above are visible to every lane of the warp
    const float chosen = lane < a.K ? row[mine] : 0.0f;
    double sum = 0.0;
    for (index_t j = 0; j < a.K; ++j) sum += __shfl_sync(full_warp, chosen, int(j));
    if (lane < a.K) {
        float w = chosen;
        if (a.norm_top_k) w = w / (float(sum) + 1e-20f);
        a.idx[t * a.K + lane] = mine;
        a.weight[t * a.K + lane] = w * a.routed_scale;
    }
}

/// Whether the warp kernel takes this problem: up to 512 experts, top_k up to 32, up to 64 groups that divide the
/// experts (when groups limit the choice).
inline bool router_supported(const MoEConfig& cfg, index_t E, index_t K) {
    const bool limit_groups = cfg.groups > 1 && cfg.top_groups < cfg.groups;
    return E >= 1 && E <= 32 * router_experts_per_lane && K <= router_max_top_k &&
           (!limit_groups || (cfg.groups <= router_max_groups && E % cfg.groups == 0));
}

/// route_select (backend/routing.hpp); arguments already checked by the primitive.
inline void route_select(const MoEConfig& cfg, View<float, 2, cuda> scores, View<const float, 1, cuda> bias,
                         View<const index_t, 2, cuda> fixed, View<index_t, 2, cuda> idx, View<float, 2, cuda> weight) {
    const index_t T = scores.shape[0], E = scores.shape[1], K = idx.shape[1], G = cfg.groups;
    if (T == 0) return;
    const RouterArgs a{scores.data,
                       bias.data,
                       bias.strides[0],
                       fixed.data,
                       fixed.strides[0],
                       fixed.strides[1],
                       idx.data,
                       weight.data,
                       T,
                       E,
                       K,
                       G,
                       cfg.top_groups,
                       G > 0 ? E / G : E,
                       cfg.score == ScoreFunc::softmax,
                       cfg.group_score == GroupScoreFunc::max,
                       cfg.correction_bias,
                       cfg.norm_top_k,
                       G > 1 && cfg.top_groups < G,
                       float(cfg.routed_scale)};
    const unsigned blocks = unsigned((T + 3) / 4);
    // The fewest experts per lane that hold E: fewer registers, and no loop over lanes' empty slots.
    if (E <= 128) route_select_kernel<4><<<blocks, 128, 0, current_stream()>>>(a);
    else if (E <= 256)
        route_select_kernel<8><<<blocks, 128, 0, current_stream()>>>(a);
    else if (E <= 384)
        route_select_kernel<12><<<blocks, 128, 0, current_stream()>>>(a);
    else
        route_select_kernel<16><<<blocks, 128, 0, current_stream()>>>(a);
    check_launch("route_select_kernel<<<...>>>");
}

}  // namespace moonmoe::backend::cuda_fast

#endif  // defined(MOONMOE_CUDA_EMULATED)
