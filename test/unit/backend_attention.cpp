// AttentionOps (backend/attention.hpp) on every test backend against plain loops in double precision, and the
// CPU backend's exact softmax.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"
#include "support/thread_count.hpp"

#include <cmath>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_attention {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

/// Heads [rows, heads, dim] of a wide matrix whose head h starts at column col0 + h * head_stride.
template <class T, class B>
View<T, 3, B> heads(T* data, index_t pitch, index_t rows, index_t col0, index_t heads, index_t head_stride,
                    index_t dim) {
    return View<T, 3, B>(data + col0, {rows, heads, dim}, {pitch, head_stride, 1});
}

/// One attention problem: queries in `parts` parts, keys sharing (or not) heads, values; all as wide host matrices.
struct Problem {
    index_t T, H, KV, dv;
    int parts;
    index_t dim[2];
    bool shared_rope_key;  ///< part 1's key has one head for all (head stride 0), MLA's k_pe
    Mat q[2], k[2], v;
    Problem(index_t T_, index_t H_, index_t KV_, int parts_, index_t d0, index_t d1, index_t dv_, bool shared,
            std::uint64_t seed)
        : T(T_), H(H_), KV(KV_), dv(dv_), parts(parts_), dim{d0, d1}, shared_rope_key(shared) {
        for (int p = 0; p < parts; ++p) {
            q[p] = random_matrix(T, H * dim[p], seed + 10 * p);
            k[p] = random_matrix(T, (p == 1 && shared ? 1 : KV) * dim[p], seed + 10 * p + 1);
        }
        v = random_matrix(T, KV * dv, seed + 5);
    }
    index_t key_head_stride(int p) const { return p == 1 && shared_rope_key ? 0 : dim[p]; }
};

/// Device copies of a problem and its operand views.
template <class B>
struct OnDevice {
    Tensor<float, 2, B> q[2], k[2], v;
    backend::AttentionQueries<B> queries;
    backend::AttentionKeys<B> keys;
    explicit OnDevice(const Problem& pr) {
        queries.parts = pr.parts;
        for (int p = 0; p < pr.parts; ++p) {
            q[p] = on<B>(pr.q[p]), k[p] = on<B>(pr.k[p]);
            queries.q[p] = heads<const float, B>(q[p].data(), pr.H * pr.dim[p], pr.T, 0, pr.H, pr.dim[p], pr.dim[p]);
            keys.k[p] =
                heads<const float, B>(k[p].data(), k[p].size(1), pr.T, 0, pr.KV, pr.key_head_stride(p), pr.dim[p]);
        }
        v = on<B>(pr.v);
        keys.v = heads<const float, B>(v.data(), pr.KV * pr.dv, pr.T, 0, pr.KV, pr.dv, pr.dv);
    }
};

/// Head h of queries [q0, q0 + n) against keys [k0, k0 + L) in double: P [n, L] (causal, row i at key L - n + i).
std::vector<double> reference_p(const Problem& pr, index_t q0, index_t n, index_t k0, index_t L, index_t h, float scale,
                                std::vector<double>* lse, double* max_logit) {
    const index_t g = h / (pr.H / pr.KV);
    std::vector<double> P(static_cast<std::size_t>(n * L), 0.0);
    for (index_t i = 0; i < n; ++i) {
        const index_t last = L - n + i;
        std::vector<double> s(static_cast<std::size_t>(last + 1));
        double m = -INFINITY;
        for (index_t j = 0; j <= last; ++j) {
            double dot = 0;
            for (int p = 0; p < pr.parts; ++p) {
                const index_t kc = p == 1 && pr.shared_rope_key ? 0 : g * pr.dim[p];
                for (index_t c = 0; c < pr.dim[p]; ++c)
                    dot += double(pr.q[p](q0 + i, h * pr.dim[p] + c)) * pr.k[p](k0 + j, kc + c);
            }
            s[std::size_t(j)] = scale * dot;
            m = std::max(m, s[std::size_t(j)]);
        }
        double z = 0;
        for (index_t j = 0; j <= last; ++j) z += std::exp(s[std::size_t(j)] - m);
        for (index_t j = 0; j <= last; ++j) P[std::size_t(i * L + j)] = std::exp(s[std::size_t(j)] - m) / z;
        if (lse) lse->push_back(m + std::log(z));
        if (max_logit) *max_logit = std::max(*max_logit, m);
    }
    return P;
}

}  // namespace

TEST_CASE_TEMPLATE("rope: HF's rotation (interleaved or not) and its transpose, against double loops", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::AttentionOps<B>;
    const index_t rows = 5, H = 3, D = 8, pitch = H * D + 3;
    const Mat x = random_matrix(rows, pitch, 20);
    const std::vector<index_t> pos = {0, 1, 7, 100, 4000};
    const std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f, 0.001f};
    const float af = 1.25f;
    const auto positions = to_device<B>(pos);
    const auto freq = to_device<B>(inv_freq);
    for (bool interleave : {true, false})
        for (bool transpose : {false, true}) {
            CAPTURE(interleave);
            CAPTURE(transpose);
            auto xd = on<B>(x);
            Ops::rope(heads<float, B>(xd.data(), pitch, rows, 1, H, D, D), positions.view(), freq.view(), af,
                      interleave, transpose);
            const Mat y = host(xd);
            for (index_t r = 0; r < rows; ++r)
                for (index_t h = 0; h < H; ++h)
                    for (index_t i = 0; i < D / 2; ++i) {
                        const double angle = double(float(pos[std::size_t(r)]) * inv_freq[std::size_t(i)]);
                        const double c = std::cos(angle) * af, s = std::sin(angle) * af;
                        const index_t lo = interleave ? 2 * i : i, hi = interleave ? 2 * i + 1 : i + D / 2;
                        const index_t col = 1 + h * D;
                        double expect_lo, expect_hi;  // stored positions of the pair after the call
                        if (!transpose) {             // output in half-split order
                            const double a = x(r, col + lo), b = x(r, col + hi);
                            CHECK(y(r, col + i) == doctest::Approx(a * c - b * s).epsilon(1e-4));
                            CHECK(y(r, col + i + D / 2) == doctest::Approx(b * c + a * s).epsilon(1e-4));
                            continue;
                        }
                        const double a = x(r, col + i), b = x(r, col + i + D / 2);  // input in half-split order
                        expect_lo = a * c + b * s, expect_hi = b * c - a * s;
                        CHECK(y(r, col + lo) == doctest::Approx(expect_lo).epsilon(1e-4));
                        CHECK(y(r, col + hi) == doctest::Approx(expect_hi).epsilon(1e-4));
                    }
            for (index_t r = 0; r < rows; ++r) {  // columns outside the heads are untouched
                CHECK(y(r, 0) == x(r, 0));
                CHECK(y(r, pitch - 2) == x(r, pitch - 2));
            }
        }
}

TEST_CASE_TEMPLATE("attention_forward over packed sequences: o, log-sum-exps and max-accumulated per-head maxima", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::AttentionOps<B>;
    const std::vector<index_t> offsets = {0, 3, 8, 9};
    const float scale = 0.37f;
    // MHA with grouped key/value heads (one part), and MLA's two parts with one rope key shared by every head
    for (const Problem& pr : {Problem(9, 4, 2, 1, 6, 0, 5, false, 30), Problem(9, 3, 3, 2, 6, 4, 5, true, 40)}) {
        CAPTURE(pr.parts);
        const index_t T = pr.T, H = pr.H;
        OnDevice<B> d(pr);
        Tensor<float, 2, B> o({T, H * pr.dv});
        Tensor<float, 1, B> lse({T * H});
        Tensor<float, 1> before({H});
        for (index_t h = 0; h < H; ++h) before(h) = h == 1 ? 100.0f : -INFINITY;  // a larger maximum from before stays
        auto max_logit = on<B>(before);
        Ops::attention_forward(d.queries, d.keys, offsets, scale,
                               heads<float, B>(o.data(), H * pr.dv, T, 0, H, pr.dv, pr.dv), lse.view(),
                               max_logit.view());
        const Mat oh = host(o);
        const std::vector<float> lh = to_host(lse), mh = to_host(max_logit);
        std::vector<double> expect_max(std::size_t(H), -INFINITY);
        expect_max[1] = 100.0;
        for (std::size_t s = 0; s + 1 < offsets.size(); ++s) {
            const index_t t0 = offsets[s], S = offsets[s + 1] - t0;
            for (index_t h = 0; h < H; ++h) {
                std::vector<double> lse_ref;
                const std::vector<double> P =
                    reference_p(pr, t0, S, t0, S, h, scale, &lse_ref, &expect_max[std::size_t(h)]);
                const index_t g = h / (H / pr.KV);
                for (index_t i = 0; i < S; ++i) {
                    CHECK(lh[std::size_t(t0 * H + h * S + i)] ==
                          doctest::Approx(lse_ref[std::size_t(i)]).epsilon(1e-5));
                    for (index_t c = 0; c < pr.dv; ++c) {
                        double e = 0;
                        for (index_t j = 0; j < S; ++j) e += P[std::size_t(i * S + j)] * pr.v(t0 + j, g * pr.dv + c);
                        CHECK(oh(t0 + i, h * pr.dv + c) == doctest::Approx(e).epsilon(1e-4));
                    }
                }
            }
        }
        for (index_t h = 0; h < H; ++h)
            CHECK(mh[std::size_t(h)] == doctest::Approx(expect_max[std::size_t(h)]).epsilon(1e-5));
        const std::vector<index_t> short_offsets = {0, 3, 8};  // one row left out
        CHECK_THROWS_AS(Ops::attention_forward(d.queries, d.keys, short_offsets, scale,
                                               heads<float, B>(o.data(), H * pr.dv, T, 0, H, pr.dv, pr.dv), lse.view(),
                                               max_logit.view()),
                        shape_error);
    }
}

TEST_CASE_TEMPLATE(
    "attention_forward with NaN scores: max_logit is the largest number among the scores, a NaN already "
    "there stays, the rows that see a NaN get NaN o and lse",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::AttentionOps<B>;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    // 4 rows, 4 heads of one dim, scale 1: every score is a product of small integers, exact on every backend.
    // Head 0: key row 2 is NaN, so rows 2 and 3 see a NaN score; head 1: query row 1 is NaN, so all its scores are;
    // head 2: no NaN, but max_logit starts as a NaN with the sign bit set; head 3: key row 0 is NaN, the first
    // score of every row.
    Problem pr(4, 4, 4, 1, 1, 0, 1, false, 60);
    const float q[4][4] = {{1, 2, 1, 1}, {2, nan, -1, 2}, {-1, 1, 2, 1}, {3, 1, 1, -1}};
    const float k[4][4] = {{2, 1, -1, nan}, {1, 3, 2, 2}, {nan, -2, 1, 3}, {1, 1, 3, -2}};
    for (index_t t = 0; t < 4; ++t)
        for (index_t h = 0; h < 4; ++h) pr.q[0](t, h) = q[t][h], pr.k[0](t, h) = k[t][h];
    const bool nan_row[4][4] = {{false, false, false, true},
                                {false, true, false, true},
                                {true, false, false, true},
                                {true, false, false, true}};
    OnDevice<B> d(pr);
    Tensor<float, 2, B> o({4, 4});
    Tensor<float, 1, B> lse({16});
    Tensor<float, 1> before({4});
    before(0) = before(1) = before(3) = -INFINITY, before(2) = -nan;
    auto max_logit = on<B>(before);
    const std::vector<index_t> offsets = {0, 4};
    Ops::attention_forward(d.queries, d.keys, offsets, 1.0f, heads<float, B>(o.data(), 4, 4, 0, 4, 1, 1), lse.view(),
                           max_logit.view());
    const std::vector<float> mh = to_host(max_logit), lh = to_host(lse);
    const Mat oh = host(o);
    CHECK(mh[0] == 6.0f);  // row 3 against key 0; its NaN against key 2 is passed over
    CHECK(mh[1] == 3.0f);  // row 2 or 3 against key 1; row 1's scores are all NaN
    CHECK(std::isnan(mh[2]));
    CHECK(mh[3] == 4.0f);  // row 1 against key 1, after a NaN
    for (index_t h = 0; h < 4; ++h) {
        std::vector<double> lse_ref;
        const std::vector<double> P = reference_p(pr, 0, 4, 0, 4, h, 1.0f, &lse_ref, nullptr);
        for (index_t i = 0; i < 4; ++i) {
            CAPTURE(h);
            CAPTURE(i);
            if (nan_row[i][h]) {
                CHECK(std::isnan(oh(i, h)));
                CHECK(std::isnan(lh[std::size_t(h * 4 + i)]));
                continue;
            }
            double e = 0;
            for (index_t j = 0; j <= i; ++j) e += P[std::size_t(i * 4 + j)] * pr.v(j, h);
            CHECK(oh(i, h) == doctest::Approx(e).epsilon(1e-5));
            CHECK(lh[std::size_t(h * 4 + i)] == doctest::Approx(lse_ref[std::size_t(i)]).epsilon(1e-6));
        }
    }
}

TEST_CASE_TEMPLATE("attention_backward: dq, dk, dv against double loops (grouped heads add into their dK, dV)", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::AttentionOps<B>;
    const std::vector<index_t> offsets = {0, 4, 9};
    const float scale = 0.41f;
    for (const Problem& pr : {Problem(9, 4, 2, 1, 6, 0, 5, false, 50), Problem(9, 3, 3, 2, 6, 4, 5, false, 60)}) {
        CAPTURE(pr.parts);
        const index_t T = pr.T, H = pr.H, KV = pr.KV, dv = pr.dv;
        OnDevice<B> d(pr);
        Tensor<float, 2, B> o({T, H * dv});
        Tensor<float, 1, B> lse({T * H}), max_logit({H});
        const auto o_view = heads<float, B>(o.data(), H * dv, T, 0, H, dv, dv);
        Ops::attention_forward(d.queries, d.keys, offsets, scale, o_view, lse.view(), max_logit.view());
        const Mat dO = random_matrix(T, H * dv, 70), oh = host(o);
        const auto dOd = on<B>(dO);
        Tensor<float, 2, B> dq[2], dk[2], dvt({T, KV * dv});
        backend::AttentionGrads<B> grads;
        for (int p = 0; p < pr.parts; ++p) {
            dq[p] = Tensor<float, 2, B>({T, H * pr.dim[p]}), dk[p] = Tensor<float, 2, B>({T, KV * pr.dim[p]});
            grads.dq[p] = heads<float, B>(dq[p].data(), H * pr.dim[p], T, 0, H, pr.dim[p], pr.dim[p]);
            grads.dk[p] = heads<float, B>(dk[p].data(), KV * pr.dim[p], T, 0, KV, pr.dim[p], pr.dim[p]);
        }
        grads.dv = heads<float, B>(dvt.data(), KV * dv, T, 0, KV, dv, dv);
        Ops::attention_backward(d.queries, d.keys, offsets, scale,
                                heads<const float, B>(o.data(), H * dv, T, 0, H, dv, dv), lse.view(),
                                heads<const float, B>(dOd.data(), H * dv, T, 0, H, dv, dv), grads);
        // the double reference
        std::vector<Mat> eq, ek;
        for (int p = 0; p < pr.parts; ++p)
            eq.push_back(Mat({T, H * pr.dim[p]})), ek.push_back(Mat({T, KV * pr.dim[p]}));
        std::vector<double> edv(std::size_t(T * KV * dv), 0.0), edq, edk;
        std::vector<std::vector<double>> gq(2), gk(2);
        for (int p = 0; p < pr.parts; ++p)
            gq[p].assign(std::size_t(T * H * pr.dim[p]), 0.0), gk[p].assign(std::size_t(T * KV * pr.dim[p]), 0.0);
        for (std::size_t s = 0; s + 1 < offsets.size(); ++s) {
            const index_t t0 = offsets[s], S = offsets[s + 1] - t0;
            for (index_t h = 0; h < H; ++h) {
                const index_t g = h / (H / KV);
                const std::vector<double> P = reference_p(pr, t0, S, t0, S, h, scale, nullptr, nullptr);
                for (index_t j = 0; j < S; ++j)
                    for (index_t c = 0; c < dv; ++c)
                        for (index_t i = 0; i < S; ++i)
                            edv[std::size_t((t0 + j) * KV * dv + g * dv + c)] +=
                                P[std::size_t(i * S + j)] * dO(t0 + i, h * dv + c);
                for (index_t i = 0; i < S; ++i) {
                    double rowdot = 0;
                    for (index_t c = 0; c < dv; ++c) rowdot += double(dO(t0 + i, h * dv + c)) * oh(t0 + i, h * dv + c);
                    for (index_t j = 0; j < S; ++j) {
                        double dp = 0;
                        for (index_t c = 0; c < dv; ++c)
                            dp += double(dO(t0 + i, h * dv + c)) * pr.v(t0 + j, g * dv + c);
                        const double ds = P[std::size_t(i * S + j)] * (dp - rowdot) * scale;
                        for (int p = 0; p < pr.parts; ++p)
                            for (index_t c = 0; c < pr.dim[p]; ++c) {
                                gq[p][std::size_t((t0 + i) * H * pr.dim[p] + h * pr.dim[p] + c)] +=
                                    ds * pr.k[p](t0 + j, g * pr.dim[p] + c);
                                gk[p][std::size_t((t0 + j) * KV * pr.dim[p] + g * pr.dim[p] + c)] +=
                                    ds * pr.q[p](t0 + i, h * pr.dim[p] + c);
                            }
                    }
                }
            }
        }
        const Mat dvh = host(dvt);
        for (index_t i = 0; i < T * KV * dv; ++i)
            CHECK(dvh.data()[i] == doctest::Approx(edv[std::size_t(i)]).epsilon(1e-4));
        for (int p = 0; p < pr.parts; ++p) {
            const Mat dqh = host(dq[p]), dkh = host(dk[p]);
            for (index_t i = 0; i < dqh.numel(); ++i)
                CHECK(dqh.data()[i] == doctest::Approx(gq[p][std::size_t(i)]).epsilon(1e-4));
            for (index_t i = 0; i < dkh.numel(); ++i)
                CHECK(dkh.data()[i] == doctest::Approx(gk[p][std::size_t(i)]).epsilon(1e-4));
        }
    }
}

TEST_CASE_TEMPLATE("attention_decode: new rows against caches of different lengths, causal at the end", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::AttentionOps<B>;
    const float scale = 0.5f;
    // queries: 2 rows of sequence 0, 1 row of sequence 1; caches of 5 and 3 keys (the rows are their last keys)
    const std::vector<index_t> offsets = {0, 2, 3}, lengths = {5, 3};
    for (const bool latent : {false, true}) {  // MHA-like grouped heads, and MLA-like keys shared by every head
        CAPTURE(latent);
        const index_t H = 4, KV = latent ? 1 : 2, dv = 3;
        const int parts = latent ? 2 : 1;
        const index_t dim[2] = {5, 2};
        Mat q[2];
        for (int p = 0; p < parts; ++p) q[p] = random_matrix(3, H * dim[p], 80 + p);
        std::vector<Problem> caches;  // host keys / values of each sequence (its queries unused)
        for (index_t s = 0; s < 2; ++s)
            caches.emplace_back(lengths[std::size_t(s)], H, KV, parts, dim[0], dim[1], dv, false, 90 + 10 * s);
        std::vector<OnDevice<B>> dev;
        for (const Problem& c : caches) dev.emplace_back(c);
        std::vector<backend::AttentionKeys<B>> keys;
        for (const auto& c : dev) keys.push_back(c.keys);
        Tensor<float, 2, B> qd[2];
        backend::AttentionQueries<B> queries;
        queries.parts = parts;
        for (int p = 0; p < parts; ++p) {
            qd[p] = on<B>(q[p]);
            queries.q[p] = heads<const float, B>(qd[p].data(), H * dim[p], 3, 0, H, dim[p], dim[p]);
        }
        Tensor<float, 2, B> o({3, H * dv});
        Ops::attention_decode(queries, keys, offsets, scale, heads<float, B>(o.data(), H * dv, 3, 0, H, dv, dv));
        const Mat oh = host(o);
        for (index_t s = 0; s < 2; ++s) {
            Problem pr = Problem(lengths[std::size_t(s)], H, KV, parts, dim[0], dim[1], dv, false, 90 + 10 * s);
            const index_t t0 = offsets[std::size_t(s)], n = offsets[std::size_t(s) + 1] - t0, L = pr.T;
            for (int p = 0; p < parts; ++p) pr.q[p] = q[p].clone();  // the decoding queries, rows [t0, t0 + n)
            for (index_t h = 0; h < H; ++h) {
                const std::vector<double> P = reference_p(pr, t0, n, 0, L, h, scale, nullptr, nullptr);
                const index_t g = h / (H / KV);
                for (index_t i = 0; i < n; ++i)
                    for (index_t c = 0; c < dv; ++c) {
                        double e = 0;
                        for (index_t j = 0; j < L; ++j) e += P[std::size_t(i * L + j)] * pr.v(j, g * dv + c);
                        CHECK(oh(t0 + i, h * dv + c) == doctest::Approx(e).epsilon(1e-4));
                    }
            }
        }
    }
}

TEST_CASE_TEMPLATE("latent_decode: bf16 latent caches of different lengths, appended at device lengths, padded extents",
                   B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::AttentionOps<B>;
    // 3 sequences: 2 new rows after 5 cached, 1 after 0, 3 after 9; width 12 (value_dim 8, rope 4), 4 heads. The
    // extents reach past the new rows (as a captured step's buckets do): the rows there hold huge values that
    // must not be seen, and the caches' rows past the new ones must stay as they were.
    const index_t H = 4, W = 12, dv = 8, capacity = 16;
    const float scale = 0.3f;
    const std::vector<index_t> offsets = {0, 2, 3, 6}, held = {5, 0, 9}, extents = {9, 1, 16};
    const index_t T = offsets.back(), N = 3;
    auto bf16_matrix = [](index_t rows, index_t cols, std::uint64_t seed) {
        Mat m = random_matrix(rows, cols, seed);
        std::vector<bf16> out;
        for (index_t i = 0; i < m.numel(); ++i) out.push_back(bf16::from_float(2.0f * m.data()[i]));
        return out;
    };
    const std::vector<bf16> q = bf16_matrix(T * H, W, 300), fresh = bf16_matrix(T, W, 301);
    std::vector<std::vector<bf16>> before;
    std::vector<Tensor<bf16, 2, B>> caches;
    std::vector<backend::LatentRows<B>> rows;
    for (index_t s = 0; s < N; ++s) {
        std::vector<bf16> c = bf16_matrix(capacity, W, 310 + std::uint64_t(s));
        for (index_t j = held[std::size_t(s)]; j < capacity; ++j)  // not cached yet: must never be seen
            for (index_t d = 0; d < W; ++d) c[std::size_t(j * W + d)] = bf16::from_float(1e4f);
        before.push_back(c);
        caches.push_back(to_device<B, 2>(std::span<const bf16>(c), Shape<2>{capacity, W}));
        rows.push_back(caches.back().view());
    }
    const Tensor<bf16, 1, B> qd = to_device<B>(q), fd = to_device<B>(fresh);
    const Tensor<index_t, 1, B> lengths = to_device<B>(held);
    Tensor<float, 1, B> o({T * H * dv});
    Ops::latent_decode(View<const bf16, 3, B>(qd.data(), {T, H, W}, {H * W, W, 1}),
                       View<const bf16, 2, B>(fd.data(), {T, W}, {W, 1}), rows, lengths.view(), offsets, extents, dv,
                       scale, View<float, 3, B>(o.data(), {T, H, dv}, {H * dv, dv, 1}));
    const std::vector<float> got = to_host(o);
    bool tensor_cores = false;  // the nvcc build's library path (backend/cuda/latent.hpp); the others are exact f32
#if defined(MOONMOE_CUDA_EMULATED) && !MOONMOE_CUDA_EMULATED
    tensor_cores = std::is_same_v<B, moonmoe::cuda> && backend::cuda_detail::latent_on_tensor_cores();
#endif
    for (index_t s = 0; s < N; ++s) {
        std::vector<bf16> want_cache = before[std::size_t(s)];
        const index_t t0 = offsets[std::size_t(s)], n = offsets[std::size_t(s) + 1] - t0, L0 = held[std::size_t(s)];
        for (index_t i = 0; i < n; ++i)
            for (index_t d = 0; d < W; ++d)
                want_cache[std::size_t((L0 + i) * W + d)] = fresh[std::size_t((t0 + i) * W + d)];
        const std::vector<bf16> got_cache = to_host(caches[std::size_t(s)]);
        for (std::size_t k = 0; k < got_cache.size(); ++k) CHECK(got_cache[k].bits == want_cache[k].bits);
        for (index_t i = 0; i < n; ++i)
            for (index_t h = 0; h < H; ++h) {
                const index_t r = (t0 + i) * H + h, visible = L0 + i + 1;
                std::vector<double> sc;
                double m = -INFINITY, z = 0;
                for (index_t j = 0; j < visible; ++j) {
                    double dot = 0;
                    for (index_t d = 0; d < W; ++d)
                        dot += double(q[std::size_t(r * W + d)].to_float()) *
                               want_cache[std::size_t(j * W + d)].to_float();
                    sc.push_back(scale * dot), m = std::max(m, sc.back());
                }
                for (double v : sc) z += std::exp(v - m);
                for (index_t c = 0; c < dv; ++c) {
                    double e = 0;
                    for (index_t j = 0; j < visible; ++j)
                        e += std::exp(sc[std::size_t(j)] - m) / z * want_cache[std::size_t(j * W + c)].to_float();
                    if (tensor_cores)  // probabilities rounded to bf16 (2^-9 relative) before the values' product
                        CHECK(std::abs(got[std::size_t(r * dv + c)] - e) <= 2e-2);
                    else
                        CHECK(got[std::size_t(r * dv + c)] == doctest::Approx(e).epsilon(1e-4));
                }
            }
    }
    // extents that cannot hold the new rows, or exceed the capacity
    const std::vector<index_t> short_extents = {9, 0, 16}, long_extents = {9, 1, 17};
    for (const auto* e : {&short_extents, &long_extents})
        CHECK_THROWS_WITH_AS(
            Ops::latent_decode(View<const bf16, 3, B>(qd.data(), {T, H, W}, {H * W, W, 1}),
                               View<const bf16, 2, B>(fd.data(), {T, W}, {W, 1}), rows, lengths.view(), offsets, *e, dv,
                               scale, View<float, 3, B>(o.data(), {T, H, dv}, {H * dv, dv, 1})),
            doctest::Contains("rows <= extent <= capacity"), shape_error);
}

TEST_CASE(
    "latent_decode on the CPU: K2's 64 heads against 1000 cached rows of 576, the same bits at 1, 2 and 3 "
    "threads") {
    // With AVX512_BF16 the scores run on oneDNN in panels of keys fixed by their count (cpu/attention.hpp); cut by
    // the thread count instead, this shape's scores differed in their last bits between one thread and two.
    using Ops = backend::AttentionOps<cpu>;
    const testing::ThreadCount restore;
    const index_t H = 64, W = 576, dv = 512, held = 999;
    const Mat qm = random_matrix(H, W, 320), cm = random_matrix(held + 1, W, 321);
    std::vector<bf16> q, cache;
    for (index_t i = 0; i < qm.numel(); ++i) q.push_back(bf16::from_float(qm.data()[i]));
    for (index_t i = 0; i < cm.numel(); ++i) cache.push_back(bf16::from_float(cm.data()[i]));
    const std::vector<index_t> offsets = {0, 1}, extents = {held + 1}, lengths_host = {held};
    const Tensor<index_t, 1> lengths = to_device<cpu>(lengths_host);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
        set_threads(threads);
        std::vector<bf16> c = cache;  // the new row is the cache's last, already there: appending rewrites it
        const std::vector<backend::LatentRows<cpu>> rows = {View<bf16, 2>(c.data(), {held + 1, W}, {W, 1})};
        std::vector<float> o(std::size_t(H * dv));
        Ops::latent_decode(View<const bf16, 3>(q.data(), {1, H, W}, {H * W, W, 1}),
                           View<const bf16, 2>(cache.data() + held * W, {1, W}, {W, 1}), rows, lengths.view(), offsets,
                           extents, dv, 0.05f, View<float, 3>(o.data(), {1, H, dv}, {H * dv, dv, 1}));
        outs.push_back(o);
    }
    for (std::size_t t = 1; t < outs.size(); ++t) {
        CAPTURE(t + 1);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < outs[0].size(); ++i) differ += outs[t][i] != outs[0][i];
        CHECK(differ == 0);
    }
}

#if MOONMOE_WITH_ONEDNN
TEST_CASE(
    "latent_decode on the CPU with oneDNN's bf16 scores: a growing cache makes a primitive per width of the last "
    "panel of keys, not per token") {
    if (backend::cpu_detail::amx_gemm_available() || !backend::cpu_detail::native_bf16()) {
        MESSAGE("the scores do not run on oneDNN here: " << backend::bf16_gemm_path());
        return;
    }
    using Ops = backend::AttentionOps<cpu>;
    const index_t H = 64, W = 576, dv = 512, capacity = 1100;
    const Mat qm = random_matrix(H, W, 330), cm = random_matrix(capacity, W, 331);
    std::vector<bf16> q, cache;
    for (index_t i = 0; i < qm.numel(); ++i) q.push_back(bf16::from_float(qm.data()[i]));
    for (index_t i = 0; i < cm.numel(); ++i) cache.push_back(bf16::from_float(cm.data()[i]));
    const std::vector<backend::LatentRows<cpu>> rows = {View<bf16, 2>(cache.data(), {capacity, W}, {W, 1})};
    std::vector<float> o(std::size_t(H * dv));
    const std::vector<index_t> offsets = {0, 1}, extents = {capacity};
    const auto decode_tokens = [&](index_t first, index_t count) {  // one token at each cache length in turn
        const std::size_t before = backend::cpu_detail::onednn::primitives_made();
        for (index_t held = first; held < first + count; ++held) {
            const Tensor<index_t, 1> lengths = to_device<cpu>(std::vector<index_t>{held});
            Ops::latent_decode(View<const bf16, 3>(q.data(), {1, H, W}, {H * W, W, 1}),
                               View<const bf16, 2>(cache.data() + held * W, {1, W}, {W, 1}), rows, lengths.view(),
                               offsets, extents, dv, 0.05f, View<float, 3>(o.data(), {1, H, dv}, {H * dv, dv, 1}));
        }
        return backend::cpu_detail::onednn::primitives_made() - before;
    };
    // 40 tokens, 1001 to 1040 keys: panels of 512, 512 and 1 to 40 keys; the row stride of the scores changes with
    // every token, and must not be part of what the primitives are made for
    CHECK(decode_tokens(1000, 40) <= 41);
    CHECK(decode_tokens(1000, 40) == 0);  // the same lengths again: nothing new
}

TEST_CASE(
    "attention_decode on the CPU with f32 products on oneDNN: one key/value head per query head makes a primitive "
    "per width of the last panel of keys, not per token, and decodes as the library's kernels do") {
    using Ops = backend::AttentionOps<cpu>;
    const backend::F32Gemm was = backend::cpu_detail::f32_gemm_choice();
    const index_t H = 2, d = 64, dv = 32, capacity = 1100;
    const Problem cache(capacity, H, H, 1, d, 0, dv, false, 340);  // G = 1: each token's scores have one row
    const OnDevice<cpu> dev(cache);
    const Mat q = random_matrix(1, H * d, 341);
    backend::AttentionQueries<cpu> queries;
    queries.q[0] = heads<const float, cpu>(q.data(), H * d, 1, 0, H, d, d);
    Mat o({1, H * dv});
    const std::vector<index_t> offsets = {0, 1};
    const auto decode = [&](index_t held) {  // one token against the first `held` + 1 rows of the cache
        backend::AttentionKeys<cpu> keys = dev.keys;
        for (auto* view : {&keys.k[0], &keys.v}) view->shape[0] = held + 1;
        Ops::attention_decode(queries, std::span(&keys, 1), offsets, 0.125f,
                              heads<float, cpu>(o.data(), H * dv, 1, 0, H, dv, dv));
        return o.clone();
    };
    std::vector<Mat> library;
    backend::set_f32_gemm(backend::F32Gemm::library);
    for (index_t held = 1000; held < 1040; ++held) library.push_back(decode(held));
    backend::set_f32_gemm(backend::F32Gemm::onednn);
    const auto primitives_made = [&](index_t first) {  // one token at each of 40 cache lengths in turn
        const std::size_t before = backend::cpu_detail::onednn::primitives_made();
        for (index_t held = first; held < first + 40; ++held) {
            CAPTURE(held);
            const Mat got = decode(held);
            if (first == 1000)
                for (index_t c = 0; c < H * dv; ++c)
                    CHECK(got(0, c) == doctest::Approx(library[std::size_t(held - 1000)](0, c)).epsilon(1e-5));
        }
        return backend::cpu_detail::onednn::primitives_made() - before;
    };
    // 1001 to 1040 keys: the scores and P V each in panels of 512, 512 and 1 to 40 keys; 512 more keys add a whole
    // panel and nothing new (over all of a token's keys: new primitives for both products at every token)
    CHECK(primitives_made(1000) <= 2 * 41);
    CHECK(primitives_made(1512) == 0);
    backend::set_f32_gemm(was);
}
#endif

namespace {

/// Every value of m rounded to bf16 (the operands of the bf16 policy).
void round_bf16(Mat& m) {
    for (index_t i = 0; i < m.numel(); ++i) m.data()[i] = bf16::from_float(m.data()[i]).to_float();
}

/// max |a - b| / max |b|.
double scaled_difference(const Mat& a, const Mat& b) {
    double num = 0, den = 0;
    for (index_t i = 0; i < a.numel(); ++i)
        num = std::max(num, std::abs(double(a.data()[i]) - b.data()[i])),
        den = std::max(den, std::abs(double(b.data()[i])));
    return num / den;
}

}  // namespace

TEST_CASE_TEMPLATE(
    "values = bf16 (the bf16 policy): attention in bf16 is the f32 attention of the bf16 operands, its outputs and "
    "gradients rounded to bf16, and the maxima exact",
    B, MOONMOE_TEST_BACKENDS) {
    // MLA's shape: two parts, the rope key one head for all, as many key heads as query heads. On CUDA this takes
    // the fused-engine path (cuda/sdpa.hpp: cuDNN on a GPU, the host engine emulated); the CPU attends in f32.
    using Ops = backend::AttentionOps<B>;
    const std::vector<index_t> offsets = {0, 5, 6, 17};
    const float scale = 0.37f;
    Problem pr(17, 3, 3, 2, 8, 4, 6, true, 90);
    for (int p = 0; p < 2; ++p) round_bf16(pr.q[p]), round_bf16(pr.k[p]);
    round_bf16(pr.v);
    const index_t T = pr.T, H = pr.H, dv = pr.dv;
    OnDevice<B> d(pr);
    Mat dO = random_matrix(T, H * dv, 91);
    round_bf16(dO);
    const auto dOd = on<B>(dO);
    struct Run {
        Mat o, lse, max_logit, dq[2], dk[2], dv;
    };
    const auto run = [&](NumberFormat values, bool maxima) {
        backend::AttentionQueries<B> queries = d.queries;
        queries.values = values;
        Tensor<float, 2, B> o({T, H * dv}), dq[2], dk[2], dvt({T, H * dv});
        Tensor<float, 1, B> lse({T * H}), max_logit({H});
        backend::Ops<B>::template fill<float>(max_logit.view().template reshape<2>({1, H}), -INFINITY);
        Ops::attention_forward(queries, d.keys, offsets, scale, heads<float, B>(o.data(), H * dv, T, 0, H, dv, dv),
                               lse.view(), maxima ? max_logit.view() : View<float, 1, B>{});
        backend::AttentionGrads<B> grads;
        for (int p = 0; p < 2; ++p) {
            dq[p] = Tensor<float, 2, B>({T, H * pr.dim[p]}), dk[p] = Tensor<float, 2, B>({T, H * pr.dim[p]});
            grads.dq[p] = heads<float, B>(dq[p].data(), H * pr.dim[p], T, 0, H, pr.dim[p], pr.dim[p]);
            grads.dk[p] = heads<float, B>(dk[p].data(), H * pr.dim[p], T, 0, H, pr.dim[p], pr.dim[p]);
        }
        grads.dv = heads<float, B>(dvt.data(), H * dv, T, 0, H, dv, dv);
        Ops::attention_backward(queries, d.keys, offsets, scale,
                                heads<const float, B>(o.data(), H * dv, T, 0, H, dv, dv), lse.view(),
                                heads<const float, B>(dOd.data(), H * dv, T, 0, H, dv, dv), grads);
        Run r{host(o), Mat({1, T * H}), Mat({1, H}), {host(dq[0]), host(dq[1])}, {host(dk[0]), host(dk[1])}, host(dvt)};
        const std::vector<float> l = to_host(lse), m = to_host(max_logit);
        std::copy(l.begin(), l.end(), r.lse.data());
        std::copy(m.begin(), m.end(), r.max_logit.data());
        return r;
    };
    const Run f32 = run(NumberFormat::f32, true), b16 = run(NumberFormat::bf16, true);
    for (index_t i = 0; i < f32.o.numel(); ++i) {  // o rounded once: half a bf16 ulp (2^-8 of the value at most)
        CAPTURE(i);
        CHECK(std::abs(b16.o.data()[i] - f32.o.data()[i]) <= std::ldexp(std::abs(f32.o.data()[i]), -8) + 1e-6);
        if (!std::is_same_v<B, moonmoe::cpu>)  // the CPU may attend in f32 (it does); CUDA's engine rounds o
            CHECK(bf16::from_float(b16.o.data()[i]).to_float() == b16.o.data()[i]);
    }
    CHECK(scaled_difference(b16.lse, f32.lse) < 1e-5);
    CHECK(scaled_difference(b16.max_logit, f32.max_logit) < 1e-5);
    for (index_t h = 0; h < H; ++h) CHECK(std::isfinite(b16.max_logit.data()[h]));
    for (int p = 0; p < 2; ++p) {
        CAPTURE(p);
        CHECK(scaled_difference(b16.dq[p], f32.dq[p]) < std::ldexp(1.0, -7));
        CHECK(scaled_difference(b16.dk[p], f32.dk[p]) < std::ldexp(1.0, -7));
    }
    CHECK(scaled_difference(b16.dv, f32.dv) < std::ldexp(1.0, -7));
    // a forward that asks for no maxima leaves them alone, and attends the same
    const Run none = run(NumberFormat::bf16, false);
    for (index_t h = 0; h < H; ++h) CHECK(none.max_logit.data()[h] == -INFINITY);
    CHECK(scaled_difference(none.o, b16.o) == 0.0);
#if defined(MOONMOE_TEST_CUDA)
    if constexpr (std::is_same_v<B, moonmoe::cuda>) {
        // An engine that declines the shape (cuDNN declines head sizes that are not multiples of 8, these among
        // them): the portable engine runs the call and the contract holds, o rounded to bf16. On an H100 the declined
        // calls had run the f32 path and returned o unrounded (2026-11-27).
        struct Declining final : backend::cuda_detail::SdpaEngine {
            const char* name() const override { return "declining"; }
            bool forward(const backend::cuda_detail::SdpaProblem&, const bf16*, const bf16*, const bf16*, bf16*,
                         float*) override {
                return false;
            }
            bool backward(const backend::cuda_detail::SdpaProblem&, const bf16*, const bf16*, const bf16*, const bf16*,
                          const bf16*, const float*, bf16*, bf16*, bf16*) override {
                return false;
            }
        };
        static Declining declining;
        backend::cuda_detail::SdpaEngine* registered = backend::cuda_detail::registered_sdpa().exchange(&declining);
        const Run declined = run(NumberFormat::bf16, true);
        backend::cuda_detail::registered_sdpa().store(registered);
        for (index_t i = 0; i < declined.o.numel(); ++i) {
            CAPTURE(i);
            CHECK(bf16::from_float(declined.o.data()[i]).to_float() == declined.o.data()[i]);
        }
        CHECK(scaled_difference(declined.o, b16.o) <= std::ldexp(1.0, -8));
        CHECK(scaled_difference(declined.dv, b16.dv) <= std::ldexp(1.0, -7));
        CHECK(scaled_difference(declined.max_logit, b16.max_logit) == 0.0);
    }
#endif
}

TEST_CASE("CPU attention's softmax: causal rows, log-sum-exp and the visible maximum") {
    Mat s = random_matrix(4, 6, 8, 3.0f), orig = s.clone();
    std::vector<float> lse(4);
    const float top = backend::cpu_detail::softmax_rows(s.view(), 2, lse.data());  // row i sees columns 0..2+i
    float expect_top = -INFINITY;
    for (index_t i = 0; i < 4; ++i) {
        const index_t last = std::min<index_t>(2 + i, 5);
        double z = 0.0;
        for (index_t t = 0; t <= last; ++t)
            z += std::exp(double(orig(i, t))), expect_top = std::max(expect_top, orig(i, t));
        CHECK(lse[i] == doctest::Approx(std::log(z)).epsilon(1e-6));
        for (index_t t = 0; t < 6; ++t)
            CHECK(s(i, t) == doctest::Approx(t <= last ? std::exp(double(orig(i, t))) / z : 0.0).epsilon(1e-6));
    }
    CHECK(top == expect_top);
}

}  // namespace unit_backend_attention
