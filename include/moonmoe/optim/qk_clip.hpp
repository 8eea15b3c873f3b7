// moonmoe/optim/qk_clip.hpp: QK-Clip (Kimi K2 technical report, §2.1 and Algorithm 1), applied after the
// optimizer step to the query / key weights of every head whose maximum scaled logit S since the last step
// exceeds tau:
//   gamma = tau / S
//   MLA: the head's q_nope rows (q_b_proj, or q_proj) and k_nope rows (kv_b_proj) *= sqrt(gamma), its q_rope rows
//        *= gamma; the shared k_rope (kv_a_proj_with_mqa) and the v rows are untouched.
//   MHA: q rows of head h *= gamma_h^alpha; k rows of key/value head g *= (min gamma of its query heads)^(1 - alpha),
//        which still bounds every head of the group by tau.
// Heads at or below tau (and any maximum <= 0) are untouched, bit for bit. A head over tau always shrinks: a factor
// that rounds to 1 in f32 (S above tau by less than 3e-8 relative) is taken as the largest float below 1, so that
// re-measuring and clipping again (Optimizer::step with remeasure) cannot repeat a round that changes nothing.
// Scope PerLayer uses the layer's largest maximum for all its heads (the report's naive form). The maxima are then
// reset for the next step.
//
// The rows are scaled in the weights' f32 values: the parameters, or under Precision<BF16, Weights<BF16>> the f32
// masters an optimizer keeps (MasterOf), whose bf16 roundings then become the weights. A weight with neither (a
// bf16 weight another ZeRO-1 rank steps) is left to the rank that owns it, whose clipped values reach it.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "../config/optimizer.hpp"
#include "../nn/transformer.hpp"
#include "../tensor/transfer.hpp"

namespace moonmoe::optim {

/// How many heads were rescaled, per layer, and the largest maximum logit seen (before clipping).
struct ClipReport {
    std::vector<index_t> heads_clipped;
    std::vector<float> max_logit;
    index_t total() const {
        index_t n = 0;
        for (index_t h : heads_clipped) n += h;
        return n;
    }
};

namespace detail {
/// Sets factors[first, first + rows) to `factor`: a head's block of rows in the per-row factors of one weight.
inline void set_rows(std::vector<float>& factors, index_t first, index_t rows, float factor) {
    std::fill(factors.begin() + first, factors.begin() + first + rows, factor);
}
/// Scales the rows of w [rows, cols] (in backend B's memory) by the host-computed per-row factors, in one
/// primitive call; rows whose factor is 1 are not touched.
template <class B>
void scale_rows(float* w, index_t cols, const std::vector<float>& factors) {
    if (!w) return;  // no f32 values here (see the header comment)
    if (std::all_of(factors.begin(), factors.end(), [](float f) { return f == 1.0f; })) return;
    const Tensor<float, 1, B> f = to_device<B>(factors);
    backend::Ops<B>::scale_rows(View<float, 2, B>(w, {index_t(factors.size()), cols}), f.view());
}
/// The f32 factor a row of a head over tau is scaled by: f rounded, but never 1 (see the header comment).
inline float shrink_factor(double f) { return std::min(float(f), std::nextafter(1.0f, 0.0f)); }
/// gamma per head: tau / S where S > tau, else 1 (exactly: those heads are not touched).
inline std::vector<double> clip_factors(const std::vector<float>& max_logit, const QKClipConfig& c) {
    std::vector<double> gamma(max_logit.size(), 1.0);
    float layer_max = -INFINITY;
    for (float s : max_logit) layer_max = std::max(layer_max, s);
    for (std::size_t h = 0; h < max_logit.size(); ++h) {
        const double s = c.scope == ClipScope::per_layer ? layer_max : max_logit[h];
        if (s > c.tau) gamma[h] = c.tau / s;
    }
    return gamma;
}
}  // namespace detail

/// MLA: rescales the heads of q (q_b_proj or q_proj, [heads * (nope + rope), q_cols]) and kv_b_proj
/// ([heads * (nope + v), kv_cols]) whose maximum exceeds tau; returns how many heads were rescaled. The factors
/// come from the maxima on the host; q and kv_b point into backend B's memory and are scaled there (a null one is
/// skipped).
template <class B = cpu>
index_t clip_mla_heads(float* q, index_t q_cols, float* kv_b, index_t kv_cols, const nn::MLAHeadLayout& L,
                       const std::vector<float>& maxima, const QKClipConfig& c) {
    const std::vector<double> gamma = detail::clip_factors(maxima, c);
    std::vector<float> q_factor(std::size_t(L.heads * (L.nope + L.rope)), 1.0f);
    std::vector<float> kv_factor(std::size_t(L.heads * (L.nope + L.v)), 1.0f);
    for (index_t h = 0; h < L.heads; ++h) {
        if (gamma[h] == 1.0) continue;
        const float root = detail::shrink_factor(std::sqrt(gamma[h]));
        detail::set_rows(q_factor, L.q_row(h), L.nope, root);
        detail::set_rows(q_factor, L.q_rope_row(h), L.rope, detail::shrink_factor(gamma[h]));
        detail::set_rows(kv_factor, L.k_nope_row(h), L.nope, root);
    }
    detail::scale_rows<B>(q, q_cols, q_factor);
    detail::scale_rows<B>(kv_b, kv_cols, kv_factor);
    return index_t(std::count_if(gamma.begin(), gamma.end(), [](double g) { return g != 1.0; }));
}

/// MHA: rescales q_proj rows of each head over tau by gamma^alpha and k_proj rows of its key/value head by the
/// group's smallest gamma^(1 - alpha); both weights have `cols` columns and point into backend B's memory (a null
/// one is skipped).
template <class B = cpu>
index_t clip_mha_heads(float* q, float* k, index_t cols, const nn::MHAHeadLayout& L, const std::vector<float>& maxima,
                       const QKClipConfig& c) {
    const std::vector<double> gamma = detail::clip_factors(maxima, c);
    const index_t group = L.heads / L.kv_heads;
    std::vector<float> q_factor(std::size_t(L.heads * L.head_dim), 1.0f);
    std::vector<float> k_factor(std::size_t(L.kv_heads * L.head_dim), 1.0f);
    index_t clipped = 0;
    for (index_t g = 0; g < L.kv_heads; ++g) {
        double smallest = 1.0;
        for (index_t h = g * group; h < (g + 1) * group; ++h) {
            if (gamma[h] == 1.0) continue;
            ++clipped;
            smallest = std::min(smallest, gamma[h]);
            if (c.alpha > 0.0)
                detail::set_rows(q_factor, L.q_row(h), L.head_dim, detail::shrink_factor(std::pow(gamma[h], c.alpha)));
        }
        if (smallest < 1.0 && c.alpha < 1.0)
            detail::set_rows(k_factor, L.kv_row(g), L.head_dim,
                             detail::shrink_factor(std::pow(smallest, 1.0 - c.alpha)));
    }
    detail::scale_rows<B>(q, cols, q_factor);
    detail::scale_rows<B>(k, cols, k_factor);
    return clipped;
}

/// The clip of one attention module, on the projections it names for QK-Clip (query_projection, key_projection).
template <class B>
index_t clip_heads(nn::MLA<B>& a, float* q, float* k, const std::vector<float>& maxima, const QKClipConfig& c) {
    return clip_mla_heads<B>(q, a.query_projection().in_features(), k, a.key_projection().in_features(),
                             a.head_layout(), maxima, c);
}
template <class B>
index_t clip_heads(nn::MHA<B>& a, float* q, float* k, const std::vector<float>& maxima, const QKClipConfig& c) {
    return clip_mha_heads<B>(q, k, a.query_projection().in_features(), a.head_layout(), maxima, c);
}

/// Where a weight's f32 values are: its own, or the master an optimizer keeps of a bf16 weight; null if neither.
template <class B>
using MasterOf = std::function<float*(const Param<2, B>&)>;

/// The weight's own f32 values (null for a weight stored in bf16).
template <class B>
float* own_values(const Param<2, B>& w) {
    return w.value.empty() ? nullptr : const_cast<float*>(w.value.data());
}

/// QK-Clip over every layer of `model`, from the maxima its forwards recorded since the last call; resets them.
/// It scales the f32 values `master_of` finds and rounds a bf16 weight's clipped master into it.
template <class B>
ClipReport apply_qk_clip(nn::Transformer<B>& model, const QKClipConfig& c,
                         const MasterOf<B>& master_of = own_values<B>) {
    ClipReport report;
    const auto clipped = [&](nn::Linear<B>& l) {  // a bf16 weight takes its master's new values
        float* m = master_of(l.weight);
        if (!m || !l.weight.value.empty()) return;
        backend::cast_flat<bf16, float, B>(m, l.weight.value16.data(), l.weight.value16.numel());
    };
    for (auto& layer : model.layers) {
        // Named host sync: QK-Clip's per-head maxima decide on the host which heads' weights to rescale.
        const std::vector<float> maxima = to_host(layer.max_logits().view());
        report.max_logit.push_back(*std::max_element(maxima.begin(), maxima.end()));
        report.heads_clipped.push_back(layer.visit_attention([&](auto& a) {
            nn::Linear<B>& q = a.query_projection();
            nn::Linear<B>& k = a.key_projection();
            const index_t n = clip_heads<B>(a, master_of(q.weight), master_of(k.weight), maxima, c);
            if (n > 0) clipped(q), clipped(k);
            return n;
        }));
        layer.reset_max_logits();
        if (report.heads_clipped.back() > 0) layer.refresh_working();  // bf16 compute: the products read bf16 values
    }
    return report;
}

}  // namespace moonmoe::optim
