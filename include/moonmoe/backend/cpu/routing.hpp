// moonmoe/backend/cpu/routing.hpp: RoutingOps<cpu> (backend/routing.hpp): the router's selection and backward row
// by row on the thread pool, the dispatch plan as one pass over the pairs, gathers and combines rows in parallel.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../config/moe.hpp"
#include "../../tensor/tensor.hpp"
#include "../functors.hpp"
#include "../routing.hpp"
#include "threads.hpp"

namespace moonmoe::backend {

template <>
struct RoutingOps<cpu> {
    /// Scores, selection and routing weights of every token (backend/routing.hpp).
    static void route_select(const MoEConfig& cfg, View<float, 2> scores, View<const float, 1> bias,
                             View<const index_t, 2> fixed, View<index_t, 2> idx, View<float, 2> weight) {
        const index_t T = scores.shape[0], E = scores.shape[1], K = idx.shape[1];
        contract::check_route_select(cfg, scores, bias, fixed, idx, weight);
        const index_t G = cfg.groups, per_group = G > 0 ? E / G : E;
        cpu_detail::parallel_for(T, [&](index_t t) {
            float* s = scores.data + t * E;
            to_scores(cfg.score, s, E);
            std::vector<float> choice(s, s + E);
            if (cfg.correction_bias)
                for (index_t e = 0; e < E; ++e) choice[e] += bias.data[e * bias.strides[0]];
            if (G > 1 && cfg.top_groups < G) limit_to_groups(cfg, choice, G, per_group);
            std::vector<index_t> chosen = fixed.data
                                              ? std::vector<index_t>(fixed.data + t * K, fixed.data + (t + 1) * K)
                                              : top_k(choice.data(), E, K);
            double sum = 0.0;
            for (index_t j = 0; j < K; ++j) sum += s[chosen[j]];
            for (index_t j = 0; j < K; ++j) {
                float w = s[chosen[j]];
                if (cfg.norm_top_k) w = w / (float(sum) + 1e-20f);
                idx.data[t * K + j] = chosen[j];
                weight.data[t * K + j] = w * float(cfg.routed_scale);
            }
        });
    }

    /// d loss / d logits of every token from the routing-weight gradient and the balance loss's (backend/routing.hpp).
    static void route_backward(const MoEConfig& cfg, View<const float, 2> scores, View<const index_t, 2> idx,
                               View<const float, 2> dweight, View<const float, 2> aux_grad, View<float, 2> dlogits) {
        const index_t T = scores.shape[0], E = scores.shape[1], K = idx.shape[1];
        contract::check_route_backward(scores, idx, dweight, aux_grad, dlogits);
        const float scale = float(cfg.routed_scale);
        cpu_detail::parallel_for(T, [&](index_t t) {
            const float* s = scores.data + t * E;
            float* d = dlogits.data + t * E;
            const index_t* id = idx.data + t * K;
            const float* dw = dweight.data + t * K;
            std::fill(d, d + E, 0.0f);
            if (cfg.norm_top_k) {  // w_k = scale s_k / Z, Z = sum s + 1e-20
                double z = 1e-20, dot = 0.0;
                for (index_t j = 0; j < K; ++j) z += s[id[j]], dot += double(dw[j]) * s[id[j]];
                for (index_t j = 0; j < K; ++j) d[id[j]] += float(scale * (dw[j] / z - dot / (z * z)));
            } else {
                for (index_t j = 0; j < K; ++j) d[id[j]] += scale * dw[j];
            }
            if (aux_grad.data)
                for (index_t e = 0; e < E; ++e) d[e] += aux_grad.data[t * E + e];
            if (cfg.score == ScoreFunc::sigmoid) {
                for (index_t e = 0; e < E; ++e) d[e] *= s[e] * (1.0f - s[e]);
            } else {
                double dot = 0.0;
                for (index_t e = 0; e < E; ++e) dot += double(d[e]) * s[e];
                for (index_t e = 0; e < E; ++e) d[e] = s[e] * (d[e] - float(dot));
            }
        });
    }

    /// counts[e] += the pairs routed to expert first + e.
    static void histogram(View<const index_t, 2> idx, index_t first, View<index_t, 1> counts) {
        contract::require_contiguous("histogram", idx);
        const index_t n = idx.numel(), L = counts.shape[0];
        for (index_t i = 0; i < n; ++i) {
            const index_t e = idx.data[i] - first;
            if (e >= 0 && e < L) ++counts.data[e * counts.strides[0]];
        }
    }

    /// bias[e] += gamma * sign(mean load - load[e]).
    static void update_bias(float gamma, View<const index_t, 1> load, View<float, 1> bias) {
        contract::check_update_bias(load, bias);
        const index_t E = load.shape[0];
        if (E == 0) return;
        index_t total = 0;
        for (index_t e = 0; e < E; ++e) total += load.data[e * load.strides[0]];
        const fn::LoadBalanceStep step{gamma, double(total) / double(E)};
        for (index_t e = 0; e < E; ++e) step(bias.data[e * bias.strides[0]], load.data[e * load.strides[0]]);
    }

    /// The dispatch plan: pairs of experts [first, first + L) sorted stably by expert (backend/routing.hpp).
    static void dispatch_plan(View<const index_t, 2> idx, index_t first, View<index_t, 1> offsets,
                              View<index_t, 1> row_slot, View<index_t, 2> slot_row) {
        const index_t n = idx.numel(), L = offsets.shape[0] - 1;
        contract::check_dispatch_plan(idx, offsets, row_slot, slot_row);
        std::vector<index_t> next(static_cast<std::size_t>(L) + 1, 0);
        for (index_t i = 0; i < n; ++i) {  // histogram
            const index_t e = idx.data[i] - first;
            if (e >= 0 && e < L) ++next[std::size_t(e) + 1];
        }
        std::partial_sum(next.begin(), next.end(), next.begin());  // exclusive scan: where each expert starts
        std::copy(next.begin(), next.end(), offsets.data);
        std::fill(row_slot.data, row_slot.data + n, index_t{-1});
        for (index_t i = 0; i < n; ++i) {  // stable placement, in slot order
            const index_t e = idx.data[i] - first;
            if (e < 0 || e >= L) {
                slot_row.data[i] = -1;
                continue;
            }
            const index_t r = next[std::size_t(e)]++;
            slot_row.data[i] = r;
            row_slot.data[r] = i;
        }
    }

    /// out[r, :] = x[row_slot[r] / k, :]: each pair's token row, rows in parallel.
    static void gather_pairs(View<const float, 2> x, View<const index_t, 1> row_slot, index_t k, View<float, 2> out) {
        contract::check_gather_pairs(x, row_slot, k, out);
        const index_t cols = x.shape[1];
        cpu_detail::parallel_for(out.shape[0], [&](index_t r) {
            const float* src = x.data + row_slot.data[r] / k * x.strides[0];
            std::copy(src, src + cols, out.data + r * out.strides[0]);
        });
    }

    /// y[t, :] += sum_j weight[t, j] rows[slot_row[t, j], :], each token's terms in ascending row (= expert) order;
    /// tokens in parallel. weight without data: every weight 1.
    static void combine(View<const float, 2> rows, View<const index_t, 2> slot_row, View<const float, 2> weight,
                        View<float, 2> y) {
        const index_t T = y.shape[0], K = slot_row.shape[1], cols = y.shape[1];
        contract::check_combine(rows, slot_row, weight, y);
        cpu_detail::parallel_for(T, [&](index_t t) {
            std::vector<std::pair<index_t, float>> terms;  // (row, weight), sorted by row: ascending expert
            terms.reserve(static_cast<std::size_t>(K));
            for (index_t j = 0; j < K; ++j) {
                const index_t r = slot_row.data[t * K + j];
                if (r >= 0) terms.emplace_back(r, weight.data ? weight.data[t * K + j] : 1.0f);
            }
            std::sort(terms.begin(), terms.end());
            float* dst = y.data + t * y.strides[0];
            for (const auto& [r, w] : terms) {
                const float* src = rows.data + r * rows.strides[0];
                if (weight.data)
                    for (index_t j = 0; j < cols; ++j) dst[j] += w * src[j];
                else
                    for (index_t j = 0; j < cols; ++j) dst[j] += src[j];
            }
        });
    }

    /// out.flat[row_slot[r]] = a[r, :] . b[r, :] in double, rows in parallel.
    static void pair_dot(View<const float, 2> a, View<const float, 2> b, View<const index_t, 1> row_slot,
                         View<float, 2> out) {
        contract::check_pair_dot(a, b, row_slot, out);
        const index_t cols = a.shape[1];
        cpu_detail::parallel_for(a.shape[0], [&](index_t r) {
            const float* x = a.data + r * a.strides[0];
            const float* y = b.data + r * b.strides[0];
            double dot = 0.0;
            for (index_t j = 0; j < cols; ++j) dot += double(x[j]) * y[j];
            out.data[row_slot.data[r]] = float(dot);
        });
    }

private:
    /// s = sigmoid(logits), or softmax with the exponentials' sum in double.
    static void to_scores(ScoreFunc score, float* s, index_t E) {
        if (score == ScoreFunc::sigmoid) {
            for (index_t e = 0; e < E; ++e) s[e] = fn::sigmoid(s[e]);
            return;
        }
        const float m = *std::max_element(s, s + E);
        double sum = 0.0;
        for (index_t e = 0; e < E; ++e) sum += std::exp(double(s[e] - m));
        for (index_t e = 0; e < E; ++e) s[e] = float(std::exp(double(s[e] - m)) / sum);
    }

    /// Keeps the top_groups groups with the largest score (the sum of their two largest choices, or their largest);
    /// the other groups' choices become -inf (top-2 sum, transformers 5.23 modeling_deepseek_v3.py) or 0 (GroupMax,
    /// modeling_deepseek_v2.py DeepseekV2TopkRouter).
    static void limit_to_groups(const MoEConfig& cfg, std::vector<float>& choice, index_t G, index_t per_group) {
        std::vector<float> group_score(static_cast<std::size_t>(G));
        const bool group_max = cfg.group_score == GroupScoreFunc::max;
        for (index_t g = 0; g < G; ++g) {
            std::vector<float> v(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
            const auto above = [](float a, float b) { return fn::ranks_above(a, b); };  // a NaN first
            if (group_max) {
                group_score[g] = *std::min_element(v.begin(), v.end(), above);
            } else {
                std::partial_sort(v.begin(), v.begin() + 2, v.end(), above);
                group_score[g] = v[0] + v[1];
            }
        }
        std::vector<bool> keep(static_cast<std::size_t>(G), false);
        for (index_t g : top_k(group_score.data(), G, cfg.top_groups)) keep[g] = true;
        const float dropped = group_max ? 0.0f : -INFINITY;
        for (index_t e = 0; e < index_t(choice.size()); ++e)
            if (!keep[e / per_group]) choice[e] = dropped;
    }

    /// Indices of the k largest of v[0..n), largest first; ties go to the lower index.
    static std::vector<index_t> top_k(const float* v, index_t n, index_t k) {
        if (k < 0 || k > n) throw std::invalid_argument("top_k: k = " + std::to_string(k) + " of " + std::to_string(n));
        std::vector<index_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), index_t{0});
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [v](index_t a, index_t b) { return fn::ranks_before(v[a], a, v[b], b); });
        order.resize(static_cast<std::size_t>(k));
        return order;
    }
};

}  // namespace moonmoe::backend
