// The CUDA backend's fast kernels (backend/cuda/fast/) against its portable path, on a GPU: each primitive is
// called twice on the same random inputs, with the fast kernels off (the Thrust functors and the per-segment cuBLAS
// loop, themselves tested against double loops by test/unit/backend_*.cpp) and on, and every output is compared;
// the largest differences are printed. Shapes: Kimi K2's attention head dims (128 nope + 64 rope with one shared
// rope key, 128 value dims) and smaller ones, grouped-query heads, sequence lengths below, at and past the 32-row
// tile, packed sequences; RMSNorm rows narrow and wide (the warp and block kernels), with a row pitch; the routers
// of Kimi K2, DeepSeek-V3 (groups) and softmax ones; the experts' grouped GEMMs with empty segments. Outputs are
// pre-filled with NaN (or random values where the primitive accumulates), so an element a kernel forgets fails.
//
// A doctest program with its own main: CI compiles it (ctest nvcc.fast_kernels, -c); tools/gpu_check.sh builds,
// runs and sanitizes it on a GPU.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <moonmoe/backend/cuda.hpp>
#include <moonmoe/tensor/transfer.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

using namespace moonmoe;
using Cuda = moonmoe::cuda;  // `cuda` alone is ambiguous with libcu++'s namespace cuda (see cuda_backend.cu)

namespace {

constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();

std::vector<float> uniform(std::size_t n, std::uint64_t seed, float lo, float hi) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    return v;
}

template <class T, int R>
Tensor<T, R, Cuda> device(const std::vector<T>& values, Shape<R> shape) {
    return to_device<Cuda, R>(std::span<const T>(values), shape);
}

template <int R>
Tensor<float, R, Cuda> random_tensor(Shape<R> shape, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    return device<float, R>(uniform(std::size_t(numel<R>(shape)), seed, lo, hi), shape);
}

template <int R>
Tensor<float, R, Cuda> filled(Shape<R> shape, float value) {
    return device<float, R>(std::vector<float>(std::size_t(numel<R>(shape)), value), shape);
}

/// fast against reference: the largest absolute difference, against the largest |reference| (at least 1), and
/// a NaN exactly where the reference has one, the same infinity where it has one.
void expect_close(const std::string& what, const std::vector<float>& fast, const std::vector<float>& ref, double tol) {
    REQUIRE(fast.size() == ref.size());
    double err = 0.0, mag = 1.0;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
        const bool same_kind = std::isnan(ref[i])      ? std::isnan(fast[i])
                               : std::isfinite(ref[i]) ? std::isfinite(fast[i])
                                                       : ref[i] == fast[i];
        if (!same_kind) {
            ++bad;
            continue;
        }
        if (!std::isfinite(ref[i])) continue;
        err = std::max(err, std::abs(double(fast[i]) - double(ref[i])));
        mag = std::max(mag, std::abs(double(ref[i])));
    }
    MESSAGE(what << ": max |fast - portable| = " << err << " (max |portable| " << mag << ", " << ref.size()
                 << " values, " << bad << " non-finite mismatches)");
    CHECK_MESSAGE(bad == 0, what);
    CHECK_MESSAGE(err <= tol * mag, what);
}

void use_fast(bool attention, bool rmsnorm, bool router) {
    backend::set_cuda_fast_kernels(
        {.attention = attention, .rmsnorm = rmsnorm, .router = router, .grouped_gemm = false});
}

// ------------------------------------------------------------------------------------------------ attention

struct AttentionCase {
    std::string name;
    index_t heads, kv_heads;
    index_t dn, dr, dv;            // dr = 0: one part
    bool shared_rope;              // the rope key is one head read by all (head stride 0), as MLA's
    std::vector<index_t> lengths;  // packed sequences
    float amplitude;               // of queries and keys: larger makes the softmax peakier
};

/// Queries, keys and values of one case, in the layouts the model uses: queries as head columns of one wide
/// matrix [T, H, dn + dr], keys per part, the shared rope key as [T, 1, dr] read with a head stride of 0.
struct AttentionProblem {
    AttentionCase c;
    index_t T = 0;
    std::vector<index_t> offsets{0};
    Tensor<float, 3, Cuda> q, k0, k1, v, d_o;
    backend::AttentionQueries<Cuda> queries;
    backend::AttentionKeys<Cuda> keys;

    /// nan_queries / nan_keys: rows whose first element (head 0) is NaN, so every score of it is.
    explicit AttentionProblem(AttentionCase cs, std::uint64_t seed, const std::vector<index_t>& nan_queries = {},
                              const std::vector<index_t>& nan_keys = {})
        : c(std::move(cs)) {
        for (index_t n : c.lengths) offsets.push_back(T += n);
        const index_t H = c.heads, KV = c.kv_heads, D = c.dn + c.dr;
        std::vector<float> qh = uniform(std::size_t(T * H * D), seed, -c.amplitude, c.amplitude);
        std::vector<float> kh = uniform(std::size_t(T * KV * c.dn), seed + 1, -c.amplitude, c.amplitude);
        for (index_t r : nan_queries) qh[std::size_t(r * H * D)] = nan_value;
        for (index_t r : nan_keys) kh[std::size_t(r * KV * c.dn)] = nan_value;
        q = device<float, 3>(qh, {T, H, D});
        k0 = device<float, 3>(kh, {T, KV, c.dn});
        v = random_tensor<3>({T, KV, c.dv}, seed + 3, -2.0f, 2.0f);
        d_o = random_tensor<3>({T, H, c.dv}, seed + 4);
        queries.parts = c.dr > 0 ? 2 : 1;
        queries.q[0] = View<const float, 3, Cuda>(q.data(), {T, H, c.dn}, {H * D, D, 1});
        keys.k[0] = k0.view();
        keys.v = v.view();
        if (c.dr > 0) {
            queries.q[1] = View<const float, 3, Cuda>(q.data() + c.dn, {T, H, c.dr}, {H * D, D, 1});
            k1 = random_tensor<3>({T, c.shared_rope ? 1 : KV, c.dr}, seed + 2, -c.amplitude, c.amplitude);
            keys.k[1] = View<const float, 3, Cuda>(k1.data(), {T, KV, c.dr},
                                                   {k1.shape()[1] * c.dr, c.shared_rope ? 0 : c.dr, 1});
        }
    }
    float scale() const { return 1.0f / std::sqrt(float(c.dn + c.dr)); }
};

struct ForwardOut {
    Tensor<float, 3, Cuda> o;
    Tensor<float, 1, Cuda> lse, max_logit;
};

ForwardOut forward(const AttentionProblem& p, bool fast, std::vector<float> start = {}) {
    use_fast(fast, false, false);
    const index_t H = p.c.heads;
    ForwardOut out{filled<3>({p.T, H, p.c.dv}, nan_value), filled<1>({p.T * H}, nan_value), {}};
    if (start.empty()) {
        start.assign(std::size_t(H), -INFINITY);
        if (H > 1) start[1] = 100.0f;  // larger than any score here: max_logit accumulates, head 1 keeps it
    }
    out.max_logit = device<float, 1>(start, {H});
    backend::AttentionOps<Cuda>::attention_forward(p.queries, p.keys, p.offsets, p.scale(), out.o.view(),
                                                   out.lse.view(), out.max_logit.view());
    use_fast(false, false, false);
    return out;
}

struct Grads {
    Tensor<float, 3, Cuda> dq0, dq1, dk0, dk1, dv;
};

Grads backward(const AttentionProblem& p, const ForwardOut& f, bool fast) {
    use_fast(fast, false, false);
    const index_t T = p.T, H = p.c.heads, KV = p.c.kv_heads, dr = std::max<index_t>(p.c.dr, 1);
    Grads g{filled<3>({T, H, p.c.dn}, nan_value), filled<3>({T, H, dr}, nan_value),
            filled<3>({T, KV, p.c.dn}, nan_value), filled<3>({T, KV, dr}, nan_value),
            filled<3>({T, KV, p.c.dv}, nan_value)};
    backend::AttentionGrads<Cuda> grads;
    grads.dq[0] = g.dq0.view(), grads.dk[0] = g.dk0.view(), grads.dv = g.dv.view();
    if (p.c.dr > 0) grads.dq[1] = g.dq1.view(), grads.dk[1] = g.dk1.view();
    backend::AttentionOps<Cuda>::attention_backward(p.queries, p.keys, p.offsets, p.scale(), f.o.view(), f.lse.view(),
                                                    p.d_o.view(), grads);
    use_fast(false, false, false);
    return g;
}

std::vector<AttentionCase> attention_cases() {
    return {
        {"K2 heads (128 + 64 shared rope, v 128), one row", 2, 2, 128, 64, 128, true, {1}, 1.0f},
        {"K2 heads, 31 rows", 2, 2, 128, 64, 128, true, {31}, 1.0f},
        {"K2 heads, 32 rows", 2, 2, 128, 64, 128, true, {32}, 1.0f},
        {"K2 heads, 33 rows", 2, 2, 128, 64, 128, true, {33}, 1.0f},
        {"K2 heads, 150 rows, peaky", 3, 3, 128, 64, 128, true, {150}, 3.0f},
        {"K2 heads, packed 5 + 64 + 37 + 1", 2, 2, 128, 64, 128, true, {5, 64, 37, 1}, 1.5f},
        {"MLA small dims 16 + 8, packed 40 + 70", 4, 4, 16, 8, 24, true, {40, 70}, 2.0f},
        {"GQA one part, 4 heads over 2, d 64, packed 17 + 50", 4, 2, 64, 0, 64, false, {17, 50}, 1.0f},
        {"two parts, own rope keys, 8 heads over 1, dims 32 + 32 / 96", 8, 1, 32, 32, 96, false, {45}, 1.0f},
        {"largest dims 192 + 64, v 128", 1, 1, 192, 64, 128, false, {70}, 1.0f},
    };
}

}  // namespace

TEST_CASE("fast attention: forward and backward against the portable path") {
    std::uint64_t seed = 100;
    for (const AttentionCase& c : attention_cases()) {
        CAPTURE(c.name);
        const AttentionProblem p(c, seed += 10);
        REQUIRE(backend::cuda_fast::attention_supported(p.queries, p.keys));
        const ForwardOut ref = forward(p, false), fast = forward(p, true);
        expect_close(c.name + ": o", to_host(fast.o), to_host(ref.o), 1e-5);
        expect_close(c.name + ": lse", to_host(fast.lse), to_host(ref.lse), 1e-5);
        expect_close(c.name + ": max_logit", to_host(fast.max_logit), to_host(ref.max_logit), 1e-5);
        // Both backward paths from the same forward outputs.
        const Grads gr = backward(p, ref, false), gf = backward(p, ref, true);
        expect_close(c.name + ": dq nope", to_host(gf.dq0), to_host(gr.dq0), 1e-5);
        expect_close(c.name + ": dk nope", to_host(gf.dk0), to_host(gr.dk0), 1e-5);
        expect_close(c.name + ": dv", to_host(gf.dv), to_host(gr.dv), 1e-5);
        if (c.dr > 0) {
            expect_close(c.name + ": dq rope", to_host(gf.dq1), to_host(gr.dq1), 1e-5);
            expect_close(c.name + ": dk rope", to_host(gf.dk1), to_host(gr.dk1), 1e-5);
        }
    }
}

TEST_CASE("fast attention: NaN scores give the portable path's o, lse and max_logit") {
    // A NaN query row (head 0) makes all its scores NaN; a NaN key row (key head 0) the scores of every row that sees
    // it, in its own tile and later ones. max_logit passes NaN scores over and keeps a NaN it starts with (head 2:
    // one with the sign bit set, which the integer atomicMax trick used to replace).
    const AttentionCase c{"K2 heads with NaN rows", 3, 3, 128, 64, 128, true, {70}, 1.0f};
    const AttentionProblem p(c, 41, {5, 33}, {9, 40});
    REQUIRE(backend::cuda_fast::attention_supported(p.queries, p.keys));
    const std::vector<float> start = {-INFINITY, 2.0f, -nan_value};
    const ForwardOut ref = forward(p, false, start), fast = forward(p, true, start);
    expect_close("NaN rows: o", to_host(fast.o), to_host(ref.o), 1e-5);
    expect_close("NaN rows: lse", to_host(fast.lse), to_host(ref.lse), 1e-5);
    const std::vector<float> mf = to_host(fast.max_logit), mr = to_host(ref.max_logit);
    for (std::size_t h = 0; h < mr.size(); ++h) {
        CAPTURE(h);
        CHECK(std::isnan(mf[h]) == std::isnan(mr[h]));
        if (!std::isnan(mr[h])) CHECK(mf[h] == doctest::Approx(mr[h]).epsilon(1e-5));
    }
    CHECK(std::isnan(mr[2]));
    CHECK(std::isfinite(mr[0]));  // the NaN scores were passed over
}

TEST_CASE("fast attention: dims past the kernel's limits keep the portable path") {
    const AttentionProblem wide({"v 256", 1, 1, 64, 0, 256, false, {10}, 1.0f}, 7);
    CHECK_FALSE(backend::cuda_fast::attention_supported(wide.queries, wide.keys));
    const AttentionProblem deep({"qk 320", 1, 1, 256, 64, 64, false, {10}, 1.0f}, 8);
    CHECK_FALSE(backend::cuda_fast::attention_supported(deep.queries, deep.keys));
    // Switched on, the primitive still answers (by the portable functors): the same values as switched off.
    const ForwardOut ref = forward(wide, false), fast = forward(wide, true);
    CHECK(to_host(fast.o) == to_host(ref.o));
}

// ------------------------------------------------------------------------------------------------ RMSNorm

TEST_CASE("fast rmsnorm: forward and backward against the portable path") {
    struct Case {
        index_t rows, n, pitch;
    };
    using Rows = backend::RowOps<Cuda>;
    std::uint64_t seed = 500;
    for (const Case c :
         {Case{1, 64, 64}, Case{7, 512, 520}, Case{130, 1536, 1536}, Case{33, 2049, 2052}, Case{20, 7168, 7168}}) {
        const std::string name =
            std::to_string(c.rows) + " rows of " + std::to_string(c.n) + " (pitch " + std::to_string(c.pitch) + ")";
        CAPTURE(name);
        seed += 10;
        const Tensor<float, 2, Cuda> x = random_tensor<2>({c.rows, c.pitch}, seed, -3.0f, 3.0f);
        const Tensor<float, 1, Cuda> w = random_tensor<1>({c.n}, seed + 1, 0.5f, 1.5f);
        const Tensor<float, 2, Cuda> dy = random_tensor<2>({c.rows, c.pitch}, seed + 2);
        const std::vector<float> dx_start = uniform(std::size_t(c.rows * c.pitch), seed + 3, -1.0f, 1.0f);
        const auto rows_view = [&](auto* data) {
            return View<std::remove_pointer_t<decltype(data)>, 2, Cuda>(data, {c.rows, c.n}, {c.pitch, 1});
        };

        std::vector<float> y[2], rstd[2], dx[2], dx_add[2], dw[2];
        Tensor<float, 1, Cuda> rstd_ref;
        for (int fast = 0; fast < 2; ++fast) {
            use_fast(false, fast == 1, false);
            Tensor<float, 2, Cuda> yt = filled<2>({c.rows, c.pitch}, 0.0f);
            Tensor<float, 1, Cuda> rt = filled<1>({c.rows}, nan_value);
            Rows::rmsnorm_forward(rows_view(static_cast<const float*>(x.data())), w.view(), 1e-6f, rows_view(yt.data()),
                                  rt.view());
            y[fast] = to_host(yt), rstd[fast] = to_host(rt);
            if (fast == 0) rstd_ref = std::move(rt);
            // Both backward paths from the portable rstd; dx written, then added to a random start.
            Tensor<float, 2, Cuda> dxt = filled<2>({c.rows, c.pitch}, 0.0f);
            Tensor<float, 1, Cuda> dwt = filled<1>({c.n}, 0.0f);
            Rows::rmsnorm_backward(rows_view(static_cast<const float*>(x.data())), w.view(), rstd_ref.view(),
                                   rows_view(static_cast<const float*>(dy.data())), rows_view(dxt.data()), dwt.view(),
                                   false);
            dx[fast] = to_host(dxt), dw[fast] = to_host(dwt);
            Tensor<float, 2, Cuda> dxa = device<float, 2>(dx_start, {c.rows, c.pitch});
            Rows::rmsnorm_backward(rows_view(static_cast<const float*>(x.data())), w.view(), rstd_ref.view(),
                                   rows_view(static_cast<const float*>(dy.data())), rows_view(dxa.data()), dwt.view(),
                                   true);
            dx_add[fast] = to_host(dxa);
        }
        use_fast(false, false, false);
        expect_close(name + ": y", y[1], y[0], 1e-6);
        expect_close(name + ": rstd", rstd[1], rstd[0], 1e-6);
        expect_close(name + ": dx", dx[1], dx[0], 1e-5);
        expect_close(name + ": dx accumulated", dx_add[1], dx_add[0], 1e-5);
        CHECK(dw[1] == dw[0]);  // dweight is the portable column sums on both paths: the same bits
    }
}

// ------------------------------------------------------------------------------------------------ router

TEST_CASE("fast router: route_select against the portable path, NaN logits and a NaN bias included") {
    struct Case {
        std::string name;
        MoEConfig cfg;
        index_t tokens;
        bool fixed;
        bool nan_logits = false;  // NaNs in a third of the tokens (some with the sign bit), two in some
        bool nan_bias = false;    // expert E / 2's correction bias: its choice is NaN, its score a number
    };
    const auto config = [](index_t E, index_t K, index_t G, index_t TG, ScoreFunc score, bool bias, bool norm,
                           double scale, GroupScoreFunc gs) {
        return MoEConfig{.experts = E,
                         .top_k = K,
                         .shared = 0,
                         .expert_hidden = 16,
                         .groups = G,
                         .top_groups = TG,
                         .score = score,
                         .correction_bias = bias,
                         .norm_top_k = norm,
                         .routed_scale = scale,
                         .group_score = gs};
    };
    const std::vector<Case> cases = {
        {"Kimi K2: 384 experts, top 8, sigmoid, bias",
         config(384, 8, 1, 1, ScoreFunc::sigmoid, true, true, 2.827, GroupScoreFunc::top_two_sum), 1000, false},
        {"DeepSeek-V3: 256 experts in 8 groups, top 4 groups",
         config(256, 8, 8, 4, ScoreFunc::sigmoid, true, true, 2.5, GroupScoreFunc::top_two_sum), 300, false},
        {"softmax, 160 experts in 8 groups by their maximum, top 6",
         config(160, 6, 8, 3, ScoreFunc::softmax, false, false, 16.0, GroupScoreFunc::max), 300, false},
        {"softmax, 20 experts, top 4, normalised",
         config(20, 4, 1, 1, ScoreFunc::softmax, false, true, 1.0, GroupScoreFunc::top_two_sum), 37, false},
        {"128 experts in 64 groups (two per lane), top 8 groups",
         config(128, 4, 64, 8, ScoreFunc::sigmoid, true, true, 1.0, GroupScoreFunc::top_two_sum), 50, false},
        {"Kimi K2 with fixed experts",
         config(384, 8, 1, 1, ScoreFunc::sigmoid, true, true, 2.827, GroupScoreFunc::top_two_sum), 64, true},
        {"one token, 512 experts, top 32",
         config(512, 32, 1, 1, ScoreFunc::sigmoid, true, true, 1.0, GroupScoreFunc::top_two_sum), 1, false},
        // NaN: a NaN choice ranks above every number, ties to the lower expert (fn::ranks_above); a group holding
        // one has a NaN score and ranks first; under softmax a NaN logit makes every score of its token NaN.
        {"Kimi K2, NaN logits",
         config(384, 8, 1, 1, ScoreFunc::sigmoid, true, true, 2.827, GroupScoreFunc::top_two_sum), 300, false, true,
         false},
        {"Kimi K2, a NaN bias",
         config(384, 8, 1, 1, ScoreFunc::sigmoid, true, true, 2.827, GroupScoreFunc::top_two_sum), 100, false, false,
         true},
        {"DeepSeek-V3 groups, NaN logits and a NaN bias",
         config(256, 8, 8, 4, ScoreFunc::sigmoid, true, true, 2.5, GroupScoreFunc::top_two_sum), 300, false, true,
         true},
        {"64 groups (two per lane), NaN logits",
         config(128, 4, 64, 8, ScoreFunc::sigmoid, true, false, 1.0, GroupScoreFunc::top_two_sum), 50, false, true,
         false},
        {"softmax in groups by their maximum, NaN logits",
         config(160, 6, 8, 3, ScoreFunc::softmax, false, false, 16.0, GroupScoreFunc::max), 60, false, true, false},
        {"sigmoid in groups by their maximum, not normalised, NaN logits",
         config(160, 6, 8, 3, ScoreFunc::sigmoid, true, false, 16.0, GroupScoreFunc::max), 60, false, true, true},
    };
    std::uint64_t seed = 900;
    for (const Case& c : cases) {
        CAPTURE(c.name);
        seed += 10;
        const index_t T = c.tokens, E = c.cfg.experts, K = c.cfg.top_k;
        REQUIRE(backend::cuda_fast::router_supported(c.cfg, E, K));
        std::vector<float> logits = uniform(std::size_t(T * E), seed, -4.0f, 4.0f);
        std::vector<float> bias_host = uniform(std::size_t(E), seed + 1, -0.1f, 0.1f);
        if (c.nan_logits)
            for (index_t t = 0; t < T; t += 3) {
                logits[std::size_t(t * E + t * 7 % E)] = nan_value;
                if (t % 5 == 0) logits[std::size_t(t * E + (t * 13 + 1) % E)] = -nan_value;
            }
        if (c.nan_bias) bias_host[std::size_t(E / 2)] = nan_value;
        const Tensor<float, 1, Cuda> bias = device<float, 1>(bias_host, {E});
        std::vector<index_t> fixed_host(std::size_t(T * K));
        std::mt19937_64 gen(seed + 2);
        for (index_t& e : fixed_host) e = index_t(gen() % std::uint64_t(E));
        const Tensor<index_t, 2, Cuda> fixed = device<index_t, 2>(fixed_host, {T, K});

        std::vector<float> scores[2], weight[2];
        std::vector<index_t> idx[2];
        for (int fast = 0; fast < 2; ++fast) {
            use_fast(false, false, fast == 1);
            Tensor<float, 2, Cuda> s = device<float, 2>(logits, {T, E});
            Tensor<index_t, 2, Cuda> it = device<index_t, 2>(std::vector<index_t>(std::size_t(T * K), -7), {T, K});
            Tensor<float, 2, Cuda> wt = filled<2>({T, K}, nan_value);
            backend::RoutingOps<Cuda>::route_select(
                c.cfg, s.view(), bias.view(),
                c.fixed ? View<const index_t, 2, Cuda>(fixed.view()) : View<const index_t, 2, Cuda>(), it.view(),
                wt.view());
            scores[fast] = to_host(s), idx[fast] = to_host(it), weight[fast] = to_host(wt);
        }
        use_fast(false, false, false);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < idx[0].size(); ++i) differ += idx[0][i] != idx[1][i];
        MESSAGE(c.name << ": " << differ << " of " << idx[0].size() << " chosen experts differ");
        CHECK(differ == 0);
        expect_close(c.name + ": scores", scores[1], scores[0], 1e-6);
        expect_close(c.name + ": weights", weight[1], weight[0], 1e-6);
    }
}

// ------------------------------------------------------------------------------------------------ grouped GEMM

TEST_CASE("fast grouped GEMM: gemm_grouped and its weight gradient against the per-segment loop") {
    using Blas = backend::BlasOps<Cuda>;
    using backend::Trans;
    struct Case {
        std::vector<index_t> sizes;  // rows per segment (expert); 0 = an expert without tokens
        index_t in, out;
        Trans tw;
        float beta;
    };
    const std::vector<Case> cases = {
        {{5, 0, 17, 1, 40}, 64, 48, Trans::yes, 0.0f},
        {{3, 9, 0}, 32, 16, Trans::no, 1.0f},
        {{30, 1, 0, 0, 12, 7, 25, 2}, 128, 64, Trans::yes, 0.5f},
    };
    std::uint64_t seed = 1300;
    for (const Case& c : cases) {
        std::vector<index_t> offsets{0};
        for (index_t n : c.sizes) offsets.push_back(offsets.back() + n);
        const index_t rows = offsets.back(), G = index_t(c.sizes.size());
        const std::string name = std::to_string(G) + " segments, " + std::to_string(rows) + " rows, " +
                                 std::to_string(c.in) + " -> " + std::to_string(c.out);
        CAPTURE(name);
        seed += 10;
        const Tensor<float, 2, Cuda> X = random_tensor<2>({rows, c.in}, seed);
        const Tensor<float, 3, Cuda> W =
            random_tensor<3>(c.tw == Trans::yes ? Shape<3>{G, c.out, c.in} : Shape<3>{G, c.in, c.out}, seed + 1);
        const Tensor<float, 2, Cuda> dY = random_tensor<2>({rows, c.out}, seed + 2);
        const std::vector<float> y_start = uniform(std::size_t(rows * c.out), seed + 3, -1.0f, 1.0f);
        const std::vector<float> dw_start = uniform(std::size_t(G * c.out * c.in), seed + 4, -1.0f, 1.0f);
        std::vector<float> y[2], dw[2];
        for (int fast = 0; fast < 2; ++fast) {
            backend::set_cuda_fast_kernels({.grouped_gemm = fast == 1});
            Tensor<float, 2, Cuda> yt = device<float, 2>(y_start, {rows, c.out});
            Blas::gemm_grouped(c.tw, 0.5f, X.view(), W.view(), c.beta, yt.view(), offsets);
            Tensor<float, 3, Cuda> dwt = device<float, 3>(dw_start, {G, c.out, c.in});
            Blas::gemm_grouped_weight_grad(1.5f, dY.view(), X.view(), c.beta, dwt.view(), offsets);
            y[fast] = to_host(yt), dw[fast] = to_host(dwt);
        }
        use_fast(false, false, false);
        expect_close(name + ": Y", y[1], y[0], 1e-5);
        expect_close(name + ": dW", dw[1], dw[0], 1e-5);
    }
}

// ------------------------------------------------------------------------------------------------ the switch

TEST_CASE("MOONMOE_CUDA_FAST_KERNELS is parsed strictly") {
    using backend::cuda_fast::parse_fast_kernels;
    const backend::CudaFastKernels some = parse_fast_kernels(" attention , router");
    CHECK(some.attention);
    CHECK_FALSE(some.rmsnorm);
    CHECK(some.router);
    const backend::CudaFastKernels all = parse_fast_kernels("all");
    CHECK((all.attention && all.rmsnorm && all.router));
    const backend::CudaFastKernels none = parse_fast_kernels("none");
    CHECK_FALSE((none.attention || none.rmsnorm || none.router));
    CHECK(parse_fast_kernels("grouped_gemm").grouped_gemm);
    CHECK(parse_fast_kernels("all").grouped_gemm);
    CHECK_THROWS_WITH_AS(parse_fast_kernels("attention,flash"), doctest::Contains("unknown kernel 'flash'"),
                         std::invalid_argument);
}
