// moonmoe/rl/sampling.hpp: drawing the next token of a sequence from its logits, reproducibly.
//
// A draw depends on the row of logits, the sampling settings, the sequence's seed and the index of the token in
// its response, and on nothing else: not on the other rows of the batch, their order, or the number of threads.
// Its uniform number is rng::uniform01(seed, index) (backend/random.hpp, counter-based); the candidates are ordered
// by (scaled logit descending, token id ascending), so ties break the same way everywhere; every sum is in double in
// that order. Rows are drawn in parallel on the host's thread pool (moonmoe::set_threads), each by one thread.
//
// What a draw returns besides the token:
//   logp           log softmax(z)[token]: the MODEL's log-probability of the token (temperature 1, no top-k or
//                  top-p), from the same logits the sampler drew from. This is pi_old of the K1.5 objective
//                  (rl/objective.hpp): the training side computes log pi_theta from the logits the same way, so
//                  with unchanged weights the ratio pi_theta / pi_old is exactly 1 and the regulariser
//                  tau log(pi_theta / pi_old) measures how far training has moved the model, not the sampler's
//                  reshaping of it. Using the tempered, truncated distribution there would put a nonzero,
//                  weight-independent term into every sample's residual (log p_T(y) - log p_1(y)) and make the
//                  on-policy ratio differ from 1.
//   sampling_logp  the log-probability under the distribution the token was actually drawn from (temperature,
//                  top-k, top-p applied; 0 for a greedy draw): for diagnostics and for importance weights a caller
//                  may want.
//
// Settings: temperature T > 0 divides the logits (T = 0: greedy, the lowest id among the maxima); top_k > 0
// keeps the k largest; top_p < 1 keeps the smallest prefix of the candidates (in the order above) whose
// probability, renormalised over the candidates, reaches top_p (at least one). On a CUDA model the rows come to the
// host (one [rows, vocab] copy per decoding step; a device-side sampler is not written).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../backend/cpu/threads.hpp"  // the host thread pool (moonmoe::set_threads)
#include "../backend/random.hpp"
#include "../tensor/tensor.hpp"

namespace moonmoe::rl {

struct SamplingParams {
    double temperature = 1.0;  ///< 0: greedy
    index_t top_k = 0;         ///< 0: every token
    double top_p = 1.0;        ///< 1: no nucleus cut

    void validate(const std::string& where) const {
        if (!(temperature >= 0.0) || !std::isfinite(temperature))
            throw std::invalid_argument(where + ": temperature must be finite and >= 0 (0 is greedy), not " +
                                        std::to_string(temperature));
        if (top_k < 0)
            throw std::invalid_argument(where + ": top_k must be >= 0 (0: no cut), not " + std::to_string(top_k));
        if (!(top_p > 0.0 && top_p <= 1.0))
            throw std::invalid_argument(where + ": top_p must be in (0, 1] (1: no cut), not " + std::to_string(top_p));
    }
};

struct Draw {
    index_t token = 0;
    float logp = 0.0f;           ///< log softmax(z)[token]: the model's distribution (pi_old)
    float sampling_logp = 0.0f;  ///< under the tempered, truncated distribution the token was drawn from
};

/// One token from the row z[0, V): see the file's comment for what decides it.
inline Draw sample_row(const float* z, index_t V, const SamplingParams& p, std::uint64_t seed, std::uint64_t index) {
    if (V <= 0) throw std::invalid_argument("rl::sample_row: an empty row of logits");
    // the model's log-softmax normaliser, and the argmax (lowest id among equal maxima)
    index_t best = 0;
    for (index_t v = 1; v < V; ++v)
        if (z[v] > z[best]) best = v;
    double sum = 0.0;
    for (index_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - double(z[best]));
    const double lse = double(z[best]) + std::log(sum);
    if (!std::isfinite(lse))
        throw std::domain_error("rl::sample_row: the row of logits is not finite (its log-sum-exp is " +
                                std::to_string(lse) + ")");
    Draw d;
    if (p.temperature == 0.0) {
        d.token = best;
        d.logp = float(double(z[best]) - lse);
        return d;
    }
    const double inv_t = 1.0 / p.temperature, top = double(z[best]) * inv_t;
    const bool cut = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0;
    std::vector<index_t> order;
    index_t n = V;  // candidates: order[0, n), or every id in id order when there is no cut
    if (cut) {
        order.resize(std::size_t(V));
        std::iota(order.begin(), order.end(), index_t(0));
        const auto before = [z](index_t a, index_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); };
        n = p.top_k > 0 && p.top_k < V ? p.top_k : V;
        if (n < V) std::partial_sort(order.begin(), order.begin() + n, order.end(), before);
        else
            std::sort(order.begin(), order.end(), before);
    }
    const auto id = [&](index_t i) { return cut ? order[std::size_t(i)] : i; };
    double mass = 0.0;  // of the candidates, relative to exp(top)
    for (index_t i = 0; i < n; ++i) mass += std::exp(double(z[id(i)]) * inv_t - top);
    if (p.top_p < 1.0) {
        double kept = 0.0;
        index_t i = 0;
        while (i < n) {
            kept += std::exp(double(z[id(i)]) * inv_t - top);
            ++i;
            if (kept >= p.top_p * mass) break;
        }
        n = i, mass = kept;
    }
    const double u = backend::rng::uniform01(seed, index) * mass;
    double run = 0.0;
    index_t pick = n - 1;  // should rounding leave u past the last sum
    for (index_t i = 0; i < n; ++i) {
        run += std::exp(double(z[id(i)]) * inv_t - top);
        if (u < run) {
            pick = i;
            break;
        }
    }
    d.token = id(pick);
    d.logp = float(double(z[d.token]) - lse);
    d.sampling_logp = float(double(z[d.token]) * inv_t - top - std::log(mass));
    return d;
}

/// One draw per row of the host matrix `logits` [rows, V] (row pitch `pitch`): row r with params[r], seeds[r] and
/// index indices[r] (the token's index in its sequence's response). Rows in parallel; each row's draw is the same
/// whatever the thread count and whatever the other rows are.
inline std::vector<Draw> sample_rows(const float* logits, index_t rows, index_t V, index_t pitch,
                                     std::span<const SamplingParams> params, std::span<const std::uint64_t> seeds,
                                     std::span<const std::uint64_t> indices) {
    const auto n = std::size_t(rows);
    if (params.size() != n || seeds.size() != n || indices.size() != n)
        throw std::invalid_argument("rl::sample_rows: " + std::to_string(rows) + " rows but " +
                                    std::to_string(params.size()) + " settings, " + std::to_string(seeds.size()) +
                                    " seeds and " + std::to_string(indices.size()) + " indices");
    for (std::size_t r = 0; r < n; ++r) params[r].validate("rl::sample_rows (row " + std::to_string(r) + ")");
    std::vector<Draw> draws(n);
    backend::cpu_detail::parallel_for(rows, [&](index_t r) {
        draws[std::size_t(r)] =
            sample_row(logits + r * pitch, V, params[std::size_t(r)], seeds[std::size_t(r)], indices[std::size_t(r)]);
    });
    return draws;
}

}  // namespace moonmoe::rl
