// moonmoe/backend/cuda/routing.hpp: RoutingOps<cuda> (backend/routing.hpp): the router's selection and backward one
// thread per token, the dispatch plan as a stable sort of the pairs by expert, gathers and combines one thread per
// element.
//
// Results against RoutingOps<cpu>: each token's selection, backward, combine and dot run the CPU's float and double
// operations in the CPU's order, so the emulated mode (the host's libm, no FMA contraction) gives the CPU's bits.
// Under nvcc every product that the compiler would fuse with a sum into an FMA is written unfused (fn::add_product;
// test/nvcc/contraction_kernels.cu checks it); what may differ is the device's expf (sigmoid scores; CUDA documents
// 2 ulp at most) and exp (softmax; 1 ulp of double) against the host's libm: a score may move by a float ulp, and a
// token whose top-k is a tie to that ulp may choose another expert. histogram, update_bias, dispatch_plan and
// gather_pairs are integer work, one rounded step or copies: bitwise everywhere. NaN choices rank above every
// number (fn::ranks_above, torch.topk's order) on every backend and in the fast kernel.
//
// One thread per token is the simple form: route_select and route_backward loop over the E experts of their token
// (E = 384 for Kimi K2) and pair_dot over a whole row. Under nvcc route_select can take fast/router.hpp's warp per
// token (opt-in: fast/select.hpp, checked against RouteSelectToken by test/nvcc/fast_kernels.cu); route_backward
// and pair_dot would be the next such kernels.
#pragma once

#include "map.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#if MOONMOE_CUDA_EMULATED
#include <atomic>
#endif

#include <thrust/binary_search.h>
#include <thrust/execution_policy.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sort.h>

#include "../../config/moe.hpp"
#include "../../tensor/tensor.hpp"
#include "../functors.hpp"
#include "../routing.hpp"
#if !MOONMOE_CUDA_EMULATED
#include "fast/router.hpp"  // a warp per token, opt-in (fast/select.hpp)
#include "fast/select.hpp"
#endif

namespace moonmoe::backend {

namespace cuda_detail {

/// The largest K and number of groups one token's thread keeps in local arrays (Kimi K2: K = 8, one group;
/// DeepSeek-V3: K = 8, 8 groups).
inline constexpr index_t route_max_top_k = 32;
inline constexpr index_t route_max_groups = 64;  // the bits of the kept-groups mask

/// Thrust's temporary storage from the stream-ordered pool (Memory<cuda>) instead of its synchronous cudaMalloc.
#if !MOONMOE_CUDA_EMULATED
struct PoolAllocator {
    using value_type = char;
    char* allocate(std::ptrdiff_t n) { return static_cast<char*>(Memory<cuda>::allocate(std::size_t(n))); }
    void deallocate(char* p, std::size_t) { Memory<cuda>::release(p); }
};
#endif

/// The policy of the Thrust algorithms that need temporaries (sort, search): on the current stream, no host wait.
inline auto temporary_policy() {
#if MOONMOE_CUDA_EMULATED
    return thrust::device;
#else
    return thrust::cuda::par_nosync(PoolAllocator{}).on(current_stream());
#endif
}

/// One token of route_select: scores in place, the group limit, top-k (or the fixed experts) and the weights,
/// as RoutingOps<cpu>::route_select does it.
struct RouteSelectToken {
    float* scores;  // [T, E], contiguous
    const float* bias;
    index_t bias_step;
    const index_t* fixed;  // null: select
    index_t fixed_pitch, fixed_step;
    index_t* idx;   // [T, K], contiguous
    float* weight;  // [T, K], contiguous
    index_t E, K, groups, top_groups, per_group;
    bool softmax, group_max, correction_bias, norm_top_k, limit_groups;
    float routed_scale;

    MOONMOE_HD void operator()(index_t t) const {
        float* s = scores + t * E;
        to_scores(s);
        index_t chosen[route_max_top_k];
        select(t, s, chosen);
        write_weights(t, s, chosen);
    }

    /// The token's K experts: the fixed ones, or the top-k of the choices.
    MOONMOE_HD void select(index_t t, const float* s, index_t* chosen) const {
        if (fixed) {
            for (index_t j = 0; j < K; ++j) chosen[j] = fixed[t * fixed_pitch + j * fixed_step];
        } else {
            top_k(s, chosen);
        }
    }

    /// idx and weight of the token: its scores, normalised (the sum in double, in selection order) and scaled.
    MOONMOE_HD void write_weights(index_t t, const float* s, const index_t* chosen) const {
        double sum = 0.0;
        for (index_t j = 0; j < K; ++j) sum += s[chosen[j]];
        for (index_t j = 0; j < K; ++j) {
            float w = s[chosen[j]];
            if (norm_top_k) w = w / (float(sum) + 1e-20f);
            idx[t * K + j] = chosen[j];
            weight[t * K + j] = w * routed_scale;
        }
    }

    /// s = sigmoid(logits), or softmax with the exponentials' sum in double.
    MOONMOE_HD void to_scores(float* s) const {
        if (!softmax) {
            for (index_t e = 0; e < E; ++e) s[e] = fn::sigmoid(s[e]);
            return;
        }
        float m = s[0];
        for (index_t e = 1; e < E; ++e)
            if (m < s[e]) m = s[e];
        double sum = 0.0;
        for (index_t e = 0; e < E; ++e) sum += ::exp(double(s[e] - m));
        for (index_t e = 0; e < E; ++e) s[e] = float(::exp(double(s[e] - m)) / sum);
    }

    /// The selection score of expert e: s + bias when the correction bias is used.
    MOONMOE_HD float choice(const float* s, index_t e) const {
        return correction_bias ? s[e] + bias[e * bias_step] : s[e];
    }

    /// Bit g set when group g is among the top_groups groups by score (the sum of its two largest choices, or its
    /// largest), ties to the lower group. In fn::ranks_above's order: a NaN choice makes its group's score NaN, and
    /// a NaN score ranks first (torch.topk's order).
    MOONMOE_HD std::uint64_t kept_groups(const float* s) const {
        float score[route_max_groups];
        for (index_t g = 0; g < groups; ++g) {
            float first = -INFINITY, second = -INFINITY;
            for (index_t e = g * per_group; e < (g + 1) * per_group; ++e) {
                const float v = choice(s, e);
                if (fn::ranks_above(v, first)) second = first, first = v;
                else if (fn::ranks_above(v, second))
                    second = v;
            }
            score[g] = group_max ? first : first + second;
        }
        std::uint64_t keep = 0;
        for (index_t g = 0; g < groups; ++g) {
            index_t rank = 0;  // groups ahead of g
            for (index_t h = 0; h < groups; ++h) rank += fn::ranks_before(score[h], h, score[g], g);
            if (rank < top_groups) keep |= std::uint64_t{1} << g;
        }
        return keep;
    }

    /// The K experts with the largest choice, largest first, ties to the lower index, a NaN choice above every
    /// number (fn::ranks_above); experts of dropped groups choose with -inf (top-2 sum) or 0 (GroupMax), as
    /// limit_to_groups sets them on the CPU.
    MOONMOE_HD void top_k(const float* s, index_t* chosen) const {
        if (K == 0) return;
        const std::uint64_t keep = limit_groups ? kept_groups(s) : ~std::uint64_t{0};
        const float dropped = group_max ? 0.0f : -INFINITY;
        float best[route_max_top_k];
        index_t n = 0;
        for (index_t e = 0; e < E; ++e) {
            const float v = limit_groups && !((keep >> (e / per_group)) & 1u) ? dropped : choice(s, e);
            if (n == K && !fn::ranks_above(v, best[K - 1])) continue;  // a level value of a later expert loses the tie
            index_t p = n < K ? n++ : K - 1;
            for (; p > 0 && fn::ranks_above(v, best[p - 1]); --p) best[p] = best[p - 1], chosen[p] = chosen[p - 1];
            best[p] = v, chosen[p] = e;
        }
    }
};

/// One token of route_backward, as RoutingOps<cpu>::route_backward computes it.
struct RouteBackwardToken {
    const float* scores;   // [T, E], contiguous
    const index_t* idx;    // [T, K], contiguous
    const float* dweight;  // [T, K], contiguous
    const float* aux;      // [T, E], contiguous, or null
    float* dlogits;        // [T, E], contiguous
    index_t E, K;
    bool softmax, norm_top_k;
    float scale;

    MOONMOE_HD void operator()(index_t t) const {
        const float* s = scores + t * E;
        float* d = dlogits + t * E;
        const index_t* id = idx + t * K;
        const float* dw = dweight + t * K;
        for (index_t e = 0; e < E; ++e) d[e] = 0.0f;
        if (norm_top_k) {  // w_k = scale s_k / Z, Z = sum s + 1e-20
            double z = 1e-20, dot = 0.0;
            for (index_t j = 0; j < K; ++j) z += s[id[j]], dot = fn::add_product(dot, double(dw[j]), double(s[id[j]]));
            for (index_t j = 0; j < K; ++j) d[id[j]] += float(scale * (dw[j] / z - dot / (z * z)));
        } else {
            for (index_t j = 0; j < K; ++j) d[id[j]] = fn::add_product(d[id[j]], scale, dw[j]);
        }
        if (aux)
            for (index_t e = 0; e < E; ++e) d[e] += aux[t * E + e];
        if (!softmax) {
            for (index_t e = 0; e < E; ++e) d[e] *= s[e] * (1.0f - s[e]);
        } else {
            double dot = 0.0;
            for (index_t e = 0; e < E; ++e) dot = fn::add_product(dot, double(d[e]), double(s[e]));
            for (index_t e = 0; e < E; ++e) d[e] = s[e] * (d[e] - float(dot));
        }
    }
};

/// counts[e] += 1 for the pair's expert first + e, when e < L: an atomic add (integer counts are exact).
struct CountPair {
    const index_t* idx;
    index_t first, L;
    index_t* counts;
    index_t step;
    MOONMOE_HD void operator()(index_t i) const {
        const index_t e = idx[i] - first;
        if (e < 0 || e >= L) return;
#if defined(__CUDA_ARCH__)
        atomicAdd(reinterpret_cast<unsigned long long*>(counts + e * step), 1ull);
#else
        std::atomic_ref<index_t>(counts[e * step]).fetch_add(1, std::memory_order_relaxed);
#endif
    }
};

/// bias[e] += gamma * sign(mean load - load[e]); every thread sums the E loads itself (exact integers, E in the
/// hundreds), so the mean never crosses to the host.
struct BiasStep {
    float gamma;
    const index_t* load;
    index_t load_step;
    float* bias;
    index_t bias_step, E;
    MOONMOE_HD void operator()(index_t e) const {
        index_t total = 0;
        for (index_t k = 0; k < E; ++k) total += load[k * load_step];
        const fn::LoadBalanceStep step{gamma, double(total) / double(E)};
        step(bias[e * bias_step], load[e * load_step]);
    }
};

/// Sort key of pair i: its local expert, or L (after every local expert) when the pair is skipped; value: i.
struct PlanKeys {
    const index_t* idx;
    index_t first, L;
    index_t* keys;
    index_t* pair;
    MOONMOE_HD void operator()(index_t i) const {
        const index_t e = idx[i] - first;
        keys[i] = e >= 0 && e < L ? e : L;
        pair[i] = i;
    }
};

/// After the sort, row r holds pair row_slot[r]: slot_row is its inverse; the skipped pairs' rows become -1.
struct PlanRows {
    const index_t* keys;  // sorted
    index_t L;
    index_t* row_slot;
    index_t* slot_row;
    MOONMOE_HD void operator()(index_t r) const {
        const index_t i = row_slot[r];
        if (keys[r] < L) {
            slot_row[i] = r;
        } else {
            slot_row[i] = -1;
            row_slot[r] = -1;
        }
    }
};

/// out[r, c] = x[row_slot[r] / k, c]
struct GatherPair {
    Strided<const float> x;
    const index_t* row_slot;
    index_t k, cols;
    Strided<float> out;
    MOONMOE_HD void operator()(index_t q) const {
        const index_t r = q / cols, c = q % cols;
        out.data[r * out.pitch + c * out.step] = x.data[row_slot[r] / k * x.pitch + c * x.step];
    }
};

/// y[t, c] += each of token t's terms weight * rows[r, c] in ascending row order, one thread per element (the
/// same adds in the same order as the CPU's row loop).
struct CombineElement {
    Strided<const float> rows;
    const index_t* slot_row;  // [T, K], contiguous
    const float* weight;      // [T, K], contiguous, or null: weights 1
    index_t K, cols;
    Strided<float> y;
    MOONMOE_HD void operator()(index_t q) const {
        const index_t t = q / cols, c = q % cols;
        index_t row[route_max_top_k];
        float w[route_max_top_k];
        index_t n = 0;
        for (index_t j = 0; j < K; ++j) {  // insertion sort by row: ascending expert
            const index_t r = slot_row[t * K + j];
            if (r < 0) continue;
            const float wj = weight ? weight[t * K + j] : 1.0f;
            index_t p = n++;
            for (; p > 0 && row[p - 1] > r; --p) row[p] = row[p - 1], w[p] = w[p - 1];
            row[p] = r, w[p] = wj;
        }
        float acc = y.data[t * y.pitch + c * y.step];
        for (index_t p = 0; p < n; ++p) {
            const float v = rows.data[row[p] * rows.pitch + c * rows.step];
            acc = weight ? fn::add_product(acc, w[p], v) : acc + v;
        }
        y.data[t * y.pitch + c * y.step] = acc;
    }
};

/// out[row_slot[r]] = a[r, :] . b[r, :] in double, as on the CPU (products of floats are exact in double; written
/// unfused all the same, so that contraction_kernels.cu holds every routing functor to the same rule).
struct PairDot {
    Strided<const float> a, b;
    const index_t* row_slot;
    index_t cols;
    float* out;
    MOONMOE_HD void operator()(index_t r) const {
        double dot = 0.0;
        for (index_t j = 0; j < cols; ++j) {
            const double x = a.data[r * a.pitch + j * a.step], y = b.data[r * b.pitch + j * b.step];
            dot = fn::add_product(dot, x, y);
        }
        out[row_slot[r]] = float(dot);
    }
};

}  // namespace cuda_detail

template <>
struct RoutingOps<cuda> {
    /// Scores, selection and routing weights of every token (backend/routing.hpp), one thread per token.
    static void route_select(const MoEConfig& cfg, View<float, 2, cuda> scores, View<const float, 1, cuda> bias,
                             View<const index_t, 2, cuda> fixed, View<index_t, 2, cuda> idx,
                             View<float, 2, cuda> weight) {
        const index_t T = scores.shape[0], E = scores.shape[1], K = idx.shape[1];
        contract::check_route_select(cfg, scores, bias, fixed, idx, weight);
        const index_t G = cfg.groups, per_group = G > 0 ? E / G : E;
        const bool limit_groups = G > 1 && cfg.top_groups < G;
        if (K > cuda_detail::route_max_top_k || (limit_groups && (G > cuda_detail::route_max_groups || E % G != 0)))
            throw std::invalid_argument("route_select on cuda: top_k = " + std::to_string(K) + " (at most " +
                                        std::to_string(cuda_detail::route_max_top_k) + "), " + std::to_string(G) +
                                        " groups of " + std::to_string(E) + " experts (at most " +
                                        std::to_string(cuda_detail::route_max_groups) + ", dividing the experts)");
        if (E == 0) return;
#if !MOONMOE_CUDA_EMULATED
        if (cuda_fast_kernels().router && cuda_fast::router_supported(cfg, E, K))
            return cuda_fast::route_select(cfg, scores, bias, fixed, idx, weight);
#endif
        cuda_detail::launch(T, cuda_detail::RouteSelectToken{
                                   scores.data, bias.data, bias.strides[0], fixed.data, fixed.strides[0],
                                   fixed.strides[1], idx.data, weight.data, E, K, G, cfg.top_groups, per_group,
                                   cfg.score == ScoreFunc::softmax, cfg.group_score == GroupScoreFunc::max,
                                   cfg.correction_bias, cfg.norm_top_k, limit_groups, float(cfg.routed_scale)});
    }

    /// d loss / d logits of every token (backend/routing.hpp), one thread per token.
    static void route_backward(const MoEConfig& cfg, View<const float, 2, cuda> scores,
                               View<const index_t, 2, cuda> idx, View<const float, 2, cuda> dweight,
                               View<const float, 2, cuda> aux_grad, View<float, 2, cuda> dlogits) {
        const index_t T = scores.shape[0], E = scores.shape[1], K = idx.shape[1];
        contract::check_route_backward(scores, idx, dweight, aux_grad, dlogits);
        cuda_detail::launch(T, cuda_detail::RouteBackwardToken{scores.data, idx.data, dweight.data, aux_grad.data,
                                                               dlogits.data, E, K, cfg.score == ScoreFunc::softmax,
                                                               cfg.norm_top_k, float(cfg.routed_scale)});
    }

    /// counts[e] += the pairs routed to expert first + e, one thread per pair.
    static void histogram(View<const index_t, 2, cuda> idx, index_t first, View<index_t, 1, cuda> counts) {
        contract::require_contiguous("histogram", idx);
        cuda_detail::launch(idx.numel(),
                            cuda_detail::CountPair{idx.data, first, counts.shape[0], counts.data, counts.strides[0]});
    }

    /// bias[e] += gamma * sign(mean load - load[e]), one thread per expert.
    static void update_bias(float gamma, View<const index_t, 1, cuda> load, View<float, 1, cuda> bias) {
        contract::check_update_bias(load, bias);
        const index_t E = load.shape[0];
        cuda_detail::launch(E, cuda_detail::BiasStep{gamma, load.data, load.strides[0], bias.data, bias.strides[0], E});
    }

    /// The dispatch plan (backend/routing.hpp): the pairs sorted stably by local expert (skipped pairs last), the
    /// experts' starts found by binary search in the sorted keys, slot_row the inverse permutation.
    static void dispatch_plan(View<const index_t, 2, cuda> idx, index_t first, View<index_t, 1, cuda> offsets,
                              View<index_t, 1, cuda> row_slot, View<index_t, 2, cuda> slot_row) {
        const index_t n = idx.numel(), L = offsets.shape[0] - 1;
        contract::check_dispatch_plan(idx, offsets, row_slot, slot_row);
        Tensor<index_t, 1, cuda> keys({n});  // scratch, released in stream order
        cuda_detail::launch(n, cuda_detail::PlanKeys{idx.data, first, L, keys.data(), row_slot.data});
        // A stable sort keeps each expert's pairs in slot order (Thrust sorts integer keys by a stable radix sort).
        if (n > 1)
            thrust::stable_sort_by_key(cuda_detail::temporary_policy(), keys.data(), keys.data() + n, row_slot.data);
        // offsets[e] = the pairs of local experts before e: where e's keys start
        thrust::lower_bound(cuda_detail::temporary_policy(), keys.data(), keys.data() + n,
                            thrust::counting_iterator<index_t>(0), thrust::counting_iterator<index_t>(L + 1),
                            offsets.data);
        cuda_detail::launch(n, cuda_detail::PlanRows{keys.data(), L, row_slot.data, slot_row.data});
    }

    /// out[r, :] = x[row_slot[r] / k, :], one thread per element.
    static void gather_pairs(View<const float, 2, cuda> x, View<const index_t, 1, cuda> row_slot, index_t k,
                             View<float, 2, cuda> out) {
        contract::check_gather_pairs(x, row_slot, k, out);
        const index_t cols = x.shape[1];
        if (cols == 0) return;
        cuda_detail::launch(out.shape[0] * cols, cuda_detail::GatherPair{cuda_detail::strided(x), row_slot.data, k,
                                                                         cols, cuda_detail::strided(out)});
    }

    /// y[t, :] += sum_j weight[t, j] rows[slot_row[t, j], :] in ascending row (= expert) order, one thread per
    /// element of y, no atomics. weight without data: every weight 1.
    static void combine(View<const float, 2, cuda> rows, View<const index_t, 2, cuda> slot_row,
                        View<const float, 2, cuda> weight, View<float, 2, cuda> y) {
        const index_t T = y.shape[0], K = slot_row.shape[1], cols = y.shape[1];
        contract::check_combine(rows, slot_row, weight, y);
        if (K > cuda_detail::route_max_top_k)
            throw std::invalid_argument("combine on cuda: slot_row " + shape_string(slot_row.shape) +
                                        " has more than " + std::to_string(cuda_detail::route_max_top_k) +
                                        " pairs per token");
        if (cols == 0) return;
        cuda_detail::launch(T * cols, cuda_detail::CombineElement{cuda_detail::strided(rows), slot_row.data,
                                                                  weight.data, K, cols, cuda_detail::strided(y)});
    }

    /// out.flat[row_slot[r]] = a[r, :] . b[r, :] in double, one thread per row (a warp per row would be faster).
    static void pair_dot(View<const float, 2, cuda> a, View<const float, 2, cuda> b,
                         View<const index_t, 1, cuda> row_slot, View<float, 2, cuda> out) {
        contract::check_pair_dot(a, b, row_slot, out);
        cuda_detail::launch(a.shape[0], cuda_detail::PairDot{cuda_detail::strided(a), cuda_detail::strided(b),
                                                             row_slot.data, a.shape[1], out.data});
    }
};

}  // namespace moonmoe::backend

#endif  // defined(MOONMOE_CUDA_EMULATED)
