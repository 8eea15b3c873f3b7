// bench/support/flops.hpp: the work formulas of the layer benchmarks (a multiply-add counts 2 FLOPs).
//
// Forward + backward is counted as 3 x forward, as config/accounting.hpp counts training: backward forms an input
// gradient and a weight gradient for every product (attention recomputes its probabilities on top of that, which
// is not counted).
#pragma once

#include <moonmoe/config/accounting.hpp>

namespace bench::flops {

using moonmoe::index_t;
using moonmoe::ModelConfig;

/// MLA forward on one causal sequence of S tokens: the projections, then per head q.k over nope + rope and p.v
/// over v for the i keys of query i (S(S+1)/2 pairs).
inline double mla_forward(const ModelConfig& c, index_t S) {
    const auto& a = c.attention;
    const double projections = 2.0 * S * double(moonmoe::count_attention(c).matrices());
    const double scores = double(a.heads) * (a.nope_dim + a.rope_dim + a.v_dim) * double(S) * double(S + 1);
    return projections + scores;
}

/// One new token against L cached latents in the absorbed form: the projections of one token, then per head
/// q_nope W_UK (nope x r), scores over r + rope for L keys, p against the latents (r per key), o_lat W_UV (r x v).
inline double mla_decode(const ModelConfig& c, index_t L) {
    const auto& a = c.attention;
    const double r = double(a.kv_rank), R = double(a.rope_dim);
    return 2.0 * double(moonmoe::count_attention(c).matrices()) +
           2.0 * a.heads * (a.nope_dim * r + (r + R) * L + r * L + r * a.v_dim);
}

/// Bytes a decode step must read at least once: every attention weight and the latent cache (float32).
inline double mla_decode_bytes(const ModelConfig& c, index_t L) {
    return 4.0 *
           (double(moonmoe::count_attention(c).matrices()) + double(L) * (c.attention.kv_rank + c.attention.rope_dim));
}

inline double router_forward(const ModelConfig& c, index_t T) { return 2.0 * T * c.moe.experts * c.dims.hidden; }

/// One SwiGLU expert (gate, up, down) on n rows.
inline double expert_forward(const ModelConfig& c, index_t n, index_t expert_hidden) {
    return 6.0 * double(n) * c.dims.hidden * expert_hidden;
}

/// MoE forward on T tokens of which `pairs` (token, expert) assignments are computed here.
inline double moe_forward(const ModelConfig& c, index_t T, index_t pairs) {
    return router_forward(c, T) + expert_forward(c, pairs, c.moe.expert_hidden) +
           expert_forward(c, T, c.moe.shared * c.moe.expert_hidden);
}

}  // namespace bench::flops
