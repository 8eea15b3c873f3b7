// The routing primitives (backend/routing.hpp) against plain loops in double precision, on every test backend;
// and the MoE block's dispatch through them: identity-like routing round-trips, an expert-parallel split sums to
// the whole, and the stacked expert weights are handed out per expert with HF names. The templated tests call the
// family, RoutingOps<B>, not Ops<B>: Ops<cuda> instantiates only once every family has a cuda specialisation.
#include "support/backends.hpp"
#include "support/nn_testing.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_routing {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

using IdxMat = Tensor<index_t, 2>;

MoEConfig routing_config(index_t experts, index_t k, index_t groups = 1, index_t top_groups = 1,
                         ScoreFunc score = ScoreFunc::sigmoid, GroupScoreFunc group_score = GroupScoreFunc::top_two_sum,
                         bool correction_bias = true, bool norm_top_k = true, double routed_scale = 2.5) {
    return MoEConfig{.experts = experts,
                     .top_k = k,
                     .shared = 0,
                     .expert_hidden = 4,
                     .groups = groups,
                     .top_groups = top_groups,
                     .score = score,
                     .correction_bias = correction_bias,
                     .norm_top_k = norm_top_k,
                     .routed_scale = routed_scale,
                     .group_score = group_score};
}

IdxMat index_matrix(index_t rows, index_t cols, const std::vector<index_t>& values) {
    IdxMat m({rows, cols});
    std::copy(values.begin(), values.end(), m.data());
    return m;
}

/// The router's selection of one token in double precision: (experts, weights), largest first, ties to the lower
/// index.
std::pair<std::vector<index_t>, std::vector<double>> reference_route(const MoEConfig& cfg, const float* logits,
                                                                     const float* bias, std::vector<double>& s) {
    const index_t E = cfg.experts, K = cfg.top_k, G = cfg.groups, per = E / G;
    s.assign(std::size_t(E), 0.0);
    if (cfg.score == ScoreFunc::sigmoid) {
        for (index_t e = 0; e < E; ++e) s[e] = 1.0 / (1.0 + std::exp(-double(logits[e])));
    } else {
        double z = 0.0;
        for (index_t e = 0; e < E; ++e) z += std::exp(double(logits[e]));
        for (index_t e = 0; e < E; ++e) s[e] = std::exp(double(logits[e])) / z;
    }
    std::vector<double> choice(s);
    if (cfg.correction_bias)
        for (index_t e = 0; e < E; ++e) choice[e] += bias[e];
    auto ranked = [](const std::vector<double>& v) {  // indices by value, largest first, ties to the lower index
        std::vector<index_t> order(v.size());
        std::iota(order.begin(), order.end(), index_t{0});
        std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return v[a] > v[b]; });
        return order;
    };
    if (G > 1 && cfg.top_groups < G) {
        std::vector<double> group(static_cast<std::size_t>(G), 0.0);
        for (index_t g = 0; g < G; ++g) {
            std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
            std::sort(v.rbegin(), v.rend());
            group[g] = cfg.group_score == GroupScoreFunc::max ? v[0] : v[0] + v[1];
        }
        const std::vector<index_t> kept = ranked(group);
        for (index_t e = 0; e < E; ++e)
            if (std::find(kept.begin(), kept.begin() + cfg.top_groups, e / per) == kept.begin() + cfg.top_groups)
                choice[e] = cfg.group_score == GroupScoreFunc::max ? 0.0 : -INFINITY;
    }
    std::vector<index_t> idx = ranked(choice);
    idx.resize(std::size_t(K));
    double sum = 0.0;
    for (index_t e : idx) sum += s[e];
    std::vector<double> w;
    for (index_t e : idx) w.push_back((cfg.norm_top_k ? s[e] / (sum + 1e-20) : s[e]) * cfg.routed_scale);
    return {idx, w};
}

template <class B>
void check_selection(const MoEConfig& cfg, const Mat& logits, const Mat& bias) {
    using Ops = backend::RoutingOps<B>;
    const index_t T = logits.size(0), E = cfg.experts, K = cfg.top_k;
    auto scores = on<B>(logits);
    auto b = on<B>(bias);
    Tensor<index_t, 2, B> idx({T, K});
    Tensor<float, 2, B> weight({T, K});
    Ops::route_select(cfg, scores.view(), b.view().template reshape<1>(Shape<1>{E}), View<const index_t, 2, B>{},
                      idx.view(), weight.view());
    const IdxMat got_idx = host(idx);
    const Mat got_w = host(weight), got_s = host(scores);
    for (index_t t = 0; t < T; ++t) {
        CAPTURE(t);
        std::vector<double> s;
        const auto [want_idx, want_w] = reference_route(cfg, logits.data() + t * E, bias.data(), s);
        for (index_t e = 0; e < E; ++e) CHECK(got_s(t, e) == doctest::Approx(s[e]).epsilon(1e-6));
        for (index_t j = 0; j < K; ++j) {
            CHECK(got_idx(t, j) == want_idx[j]);
            CHECK(got_w(t, j) == doctest::Approx(want_w[j]).epsilon(1e-6));
        }
    }
}

}  // namespace

TEST_CASE_TEMPLATE("route_select: sigmoid and softmax, correction bias, top-k, NormTopK, routed scale", B,
                   MOONMOE_TEST_BACKENDS) {
    const Mat logits = random_matrix(9, 16, 1), bias = random_matrix(1, 16, 2, 0.1f);
    check_selection<B>(routing_config(16, 4), logits, bias);
    check_selection<B>(routing_config(16, 3, 1, 1, ScoreFunc::softmax, GroupScoreFunc::max, false, false, 1.0), logits,
                       bias);
    check_selection<B>(routing_config(16, 5, 1, 1, ScoreFunc::sigmoid, GroupScoreFunc::top_two_sum, true, false, 1.5),
                       logits, bias);
}

TEST_CASE_TEMPLATE("route_select: group-limited (sum of the top two, and GroupMax)", B, MOONMOE_TEST_BACKENDS) {
    const Mat logits = random_matrix(11, 24, 3), bias = random_matrix(1, 24, 4, 0.2f);
    check_selection<B>(routing_config(24, 4, 6, 2), logits, bias);  // V3's noaux_tc rule on 6 groups of 4
    check_selection<B>(routing_config(24, 3, 4, 1, ScoreFunc::softmax, GroupScoreFunc::max, false, false, 1.0), logits,
                       bias);  // V2's group_limited_greedy
}

TEST_CASE_TEMPLATE("route_select: ties go to the lower index, for experts and for groups", B, MOONMOE_TEST_BACKENDS) {
    // every logit equal: the first K experts; with groups of equal score, the first groups
    const Mat flat({3, 8}), zero({1, 8});
    check_selection<B>(routing_config(8, 3), flat, zero);
    check_selection<B>(routing_config(8, 2, 4, 2), flat, zero);
    using Ops = backend::RoutingOps<B>;
    auto scores = on<B>(flat);
    auto b = on<B>(zero);
    Tensor<index_t, 2, B> idx({3, 3});
    Tensor<float, 2, B> weight({3, 3});
    Ops::route_select(routing_config(8, 3), scores.view(), b.view().template reshape<1>(Shape<1>{8}),
                      View<const index_t, 2, B>{}, idx.view(), weight.view());
    const IdxMat got = host(idx);
    for (index_t t = 0; t < 3; ++t)
        for (index_t j = 0; j < 3; ++j) CHECK(got(t, j) == j);
}

TEST_CASE_TEMPLATE("route_select: a fixed selection keeps its experts and gets their weights", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    const MoEConfig cfg = routing_config(8, 2);
    const Mat logits = random_matrix(3, 8, 5), bias = random_matrix(1, 8, 6);
    const IdxMat fixed = index_matrix(3, 2, {7, 0, 3, 4, 1, 6});
    auto scores = on<B>(logits);
    auto b = on<B>(bias);
    auto f = on<B>(fixed);
    Tensor<index_t, 2, B> idx({3, 2});
    Tensor<float, 2, B> weight({3, 2});
    Ops::route_select(cfg, scores.view(), b.view().template reshape<1>(Shape<1>{8}), f.view(), idx.view(),
                      weight.view());
    const IdxMat got = host(idx);
    const Mat w = host(weight);
    for (index_t t = 0; t < 3; ++t) {
        std::vector<double> s;
        reference_route(cfg, logits.data() + t * 8, bias.data(), s);
        const double sum = s[fixed(t, 0)] + s[fixed(t, 1)];
        for (index_t j = 0; j < 2; ++j) {
            CHECK(got(t, j) == fixed(t, j));
            CHECK(w(t, j) == doctest::Approx(2.5 * s[fixed(t, j)] / sum).epsilon(1e-6));
        }
    }
}

TEST_CASE_TEMPLATE(
    "route_select with NaNs: a NaN choice ranks above every number (torch.topk's order), ties to the "
    "lower index, and its weight is NaN",
    B, MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const auto sig = [](double z) { return 1.0 / (1.0 + std::exp(-z)); };
    struct Case {
        const char* name;
        MoEConfig cfg;
        std::vector<float> logits, bias;
        std::vector<index_t> idx;
        std::vector<double> weight;  // NaN: a NaN weight
    };
    const double N = std::numeric_limits<double>::quiet_NaN();
    const double s6 = sig(6), s7 = sig(7), z_bias = s7 + s6 + sig(3);  // case "a NaN bias"
    const std::vector<Case> cases = {
        {"two NaN logits (one with the sign bit), normalised: both chosen first, every weight NaN",
         routing_config(8, 3),
         {1, nan, 3, 4, 5, 6, 7, -nan},
         std::vector<float>(8, 0.0f),
         {1, 7, 6},
         {N, N, N}},
        {"not normalised: only the NaN experts' weights are NaN",
         routing_config(8, 3, 1, 1, ScoreFunc::sigmoid, GroupScoreFunc::top_two_sum, true, false, 2.0),
         {1, nan, 3, 4, 5, 6, 7, -nan},
         std::vector<float>(8, 0.0f),
         {1, 7, 6},
         {N, N, 2.0 * s7}},
        {"a NaN bias: its expert is chosen first, the weights (from the scores) stay numbers",
         routing_config(8, 3),
         {1, 2, 3, 4, 5, 6, 7, 0},
         {0, 0, nan, 0, 0, 0, 0, 0},
         {2, 6, 5},
         {2.5 * sig(3) / z_bias, 2.5 * s7 / z_bias, 2.5 * s6 / z_bias}},
        {"groups by their top two: a NaN makes its group's score NaN, kept first",
         routing_config(8, 2, 4, 2),
         {0, 1, 2, nan, 4, 5, -1, -2},
         std::vector<float>(8, 0.0f),
         {3, 5},
         {N, N}},
        {"groups by their maximum (others' choices 0): the NaN group kept",
         routing_config(8, 2, 4, 1, ScoreFunc::sigmoid, GroupScoreFunc::max, false, false, 1.0),
         {0, 1, 2, nan, 4, 5, -1, -2},
         std::vector<float>(8, 0.0f),
         {3, 2},
         {N, sig(2)}},
        {"softmax: one NaN logit makes every score NaN, the first experts win the tie",
         routing_config(8, 3, 1, 1, ScoreFunc::softmax, GroupScoreFunc::max, false, false, 1.0),
         {1, 2, 3, nan, 5, 6, 7, 8},
         std::vector<float>(8, 0.0f),
         {0, 1, 2},
         {N, N, N}},
    };
    for (const Case& c : cases) {
        const std::string name = c.name;
        CAPTURE(name);
        const index_t E = c.cfg.experts, K = c.cfg.top_k;
        Mat logits({1, E}), bias({1, E});
        std::copy(c.logits.begin(), c.logits.end(), logits.data());
        std::copy(c.bias.begin(), c.bias.end(), bias.data());
        auto scores = on<B>(logits);
        auto b = on<B>(bias);
        Tensor<index_t, 2, B> idx({1, K});
        Tensor<float, 2, B> weight({1, K});
        Ops::route_select(c.cfg, scores.view(), b.view().template reshape<1>(Shape<1>{E}), View<const index_t, 2, B>{},
                          idx.view(), weight.view());
        const std::vector<index_t> got_idx = to_host(idx);
        const std::vector<float> got_w = to_host(weight);
        CHECK(got_idx == c.idx);
        for (index_t j = 0; j < K; ++j) {
            CAPTURE(j);
            if (std::isnan(c.weight[std::size_t(j)])) CHECK(std::isnan(got_w[std::size_t(j)]));
            else
                CHECK(got_w[std::size_t(j)] == doctest::Approx(c.weight[std::size_t(j)]).epsilon(1e-6));
        }
    }
}

TEST_CASE_TEMPLATE("route_backward: d logits from dweight and the balance-loss gradient, against double loops", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    for (const bool norm : {true, false})
        for (const ScoreFunc score : {ScoreFunc::sigmoid, ScoreFunc::softmax}) {
            CAPTURE(norm);
            const MoEConfig cfg = routing_config(10, 3, 1, 1, score, GroupScoreFunc::top_two_sum, true, norm, 1.7);
            const index_t T = 5, E = 10, K = 3;
            const Mat logits = random_matrix(T, E, 7), bias({1, E}), dweight = random_matrix(T, K, 8),
                      aux = random_matrix(T, E, 9, 0.1f);
            auto scores = on<B>(logits);
            auto b = on<B>(bias);
            Tensor<index_t, 2, B> idx({T, K});
            Tensor<float, 2, B> weight({T, K}), dlogits({T, E});
            Ops::route_select(cfg, scores.view(), b.view().template reshape<1>(Shape<1>{E}),
                              View<const index_t, 2, B>{}, idx.view(), weight.view());
            auto dw = on<B>(dweight);
            auto ag = on<B>(aux);
            Ops::route_backward(cfg, scores.view(), idx.view(), dw.view(), ag.view(), dlogits.view());
            const Mat got = host(dlogits), s = host(scores);
            const IdxMat id = host(idx);
            for (index_t t = 0; t < T; ++t) {
                std::vector<double> ds(std::size_t(E), 0.0);
                double z = 1e-20, dot = 0.0;
                for (index_t j = 0; j < K; ++j) z += s(t, id(t, j)), dot += double(dweight(t, j)) * s(t, id(t, j));
                for (index_t j = 0; j < K; ++j)
                    ds[id(t, j)] += cfg.routed_scale * (norm ? dweight(t, j) / z - dot / (z * z) : dweight(t, j));
                for (index_t e = 0; e < E; ++e) ds[e] += aux(t, e);
                double sd = 0.0;
                for (index_t e = 0; e < E; ++e) sd += ds[e] * s(t, e);
                for (index_t e = 0; e < E; ++e) {
                    const double want =
                        score == ScoreFunc::sigmoid ? ds[e] * s(t, e) * (1.0 - s(t, e)) : s(t, e) * (ds[e] - sd);
                    CHECK(got(t, e) == doctest::Approx(want).epsilon(1e-5).scale(1.0));
                }
            }
        }
}

TEST_CASE_TEMPLATE("histogram counts a range of experts, update_bias is the sign rule over the load", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    const IdxMat idx = index_matrix(4, 2, {0, 5, 5, 2, 7, 3, 2, 5});
    auto d_idx = on<B>(idx);
    Tensor<index_t, 1, B> all({8}), upper({4});
    Ops::histogram(d_idx.view(), 0, all.view());
    Ops::histogram(d_idx.view(), 0, all.view());  // accumulates
    Ops::histogram(d_idx.view(), 4, upper.view());
    CHECK(to_host(all) == std::vector<index_t>{2, 0, 4, 2, 0, 6, 0, 2});
    CHECK(to_host(upper) == std::vector<index_t>{0, 3, 0, 1});
    // load {10, 2, 4, 4, 0, 8, 3, 1}: mean 4
    auto load = to_device<B>(std::vector<index_t>{10, 2, 4, 4, 0, 8, 3, 1});
    Tensor<float, 1, B> bias({8});
    Ops::update_bias(0.001f, load.view(), bias.view());
    CHECK(to_host(bias) == std::vector<float>{-0.001f, 0.001f, 0.0f, 0.0f, 0.001f, -0.001f, 0.001f, 0.001f});
}

TEST_CASE_TEMPLATE("dispatch_plan: pairs sorted stably by expert, experts outside the range skipped", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    const index_t T = 6, K = 3;
    Tensor<index_t, 2> idx({T, K});
    for (index_t i = 0; i < T * K; ++i) idx.data()[i] = (i * 7 + i / K) % 9;  // 9 experts
    auto d_idx = on<B>(idx);
    for (const auto& [first, local] : {std::pair<index_t, index_t>{0, 9}, {3, 4}, {8, 1}}) {
        CAPTURE(first);
        Tensor<index_t, 1, B> offsets({local + 1}), row_slot({T * K});
        Tensor<index_t, 2, B> slot_row({T, K});
        Ops::dispatch_plan(d_idx.view(), first, offsets.view(), row_slot.view(), slot_row.view());
        // plain loops: for each expert in order, its pairs in slot order
        std::vector<index_t> want_offsets{0}, want_rows;
        for (index_t e = first; e < first + local; ++e) {
            for (index_t i = 0; i < T * K; ++i)
                if (idx.data()[i] == e) want_rows.push_back(i);
            want_offsets.push_back(index_t(want_rows.size()));
        }
        CHECK(to_host(offsets) == want_offsets);
        const std::vector<index_t> rows = to_host(row_slot), slots = to_host(slot_row);
        const index_t P = want_offsets.back();
        CHECK(std::vector<index_t>(rows.begin(), rows.begin() + P) == want_rows);
        for (index_t i = 0; i < T * K; ++i) {
            const auto at = std::find(want_rows.begin(), want_rows.end(), i);
            CHECK(slots[i] == (at == want_rows.end() ? -1 : index_t(at - want_rows.begin())));
        }
    }
}

TEST_CASE_TEMPLATE("gather_pairs, combine (weighted, ascending expert order), scatter-add and pair_dot", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    const index_t T = 7, K = 3, H = 5, E = 6;
    Tensor<index_t, 2> idx({T, K});
    for (index_t t = 0; t < T; ++t)
        for (index_t j = 0; j < K; ++j) idx(t, j) = (t * 5 + (K - j) * 2 + j) % E;  // distinct per token, unsorted
    const Mat x = random_matrix(T, H, 10), weight = random_matrix(T, K, 11), y0 = random_matrix(T, H, 12);
    auto d_idx = on<B>(idx);
    const index_t first = 1, local = 4;  // experts 1..4 here
    Tensor<index_t, 1, B> offsets({local + 1}), row_slot({T * K});
    Tensor<index_t, 2, B> slot_row({T, K});
    Ops::dispatch_plan(d_idx.view(), first, offsets.view(), row_slot.view(), slot_row.view());
    const index_t P = to_host(offsets).back();
    const std::vector<index_t> rows = to_host(row_slot), slots = to_host(slot_row);

    Tensor<float, 2, B> gathered({P, H});
    auto d_x = on<B>(x);
    Ops::gather_pairs(d_x.view(), row_slot.view(), K, gathered.view());
    const Mat g = host(gathered);
    for (index_t r = 0; r < P; ++r)
        for (index_t c = 0; c < H; ++c) CHECK(g(r, c) == x(rows[r] / K, c));

    // expert outputs: any rows; combine adds each token's in ascending expert order, as this plain loop does
    const Mat out = random_matrix(P, H, 13);
    auto d_out = on<B>(out);
    auto d_w = on<B>(weight);
    auto y = on<B>(y0), dx = on<B>(y0);
    Ops::combine(d_out.view(), slot_row.view(), d_w.view(), y.view());
    Ops::combine(d_out.view(), slot_row.view(), View<const float, 2, B>{}, dx.view());
    const Mat got_y = host(y), got_dx = host(dx);
    for (index_t t = 0; t < T; ++t)
        for (index_t c = 0; c < H; ++c) {
            float want_y = y0(t, c), want_dx = y0(t, c);
            for (index_t e = first; e < first + local; ++e)
                for (index_t j = 0; j < K; ++j)
                    if (idx(t, j) == e) {
                        want_y += weight(t, j) * out(slots[t * K + j], c);
                        want_dx += out(slots[t * K + j], c);
                    }
            CHECK(got_y(t, c) == want_y);  // bitwise: the same order of the same float operations
            CHECK(got_dx(t, c) == want_dx);
        }

    // pair_dot: each row's dot into its pair's slot; skipped pairs untouched
    const Mat a = random_matrix(P, H, 14), b = random_matrix(P, H, 15);
    auto d_a = on<B>(a);
    auto d_b = on<B>(b);
    Mat init({T, K});
    std::fill(init.data(), init.data() + T * K, -3.0f);
    auto dots = on<B>(init);
    Ops::pair_dot(d_a.view(), d_b.view(), row_slot.view(), dots.view());
    const Mat got = host(dots);
    for (index_t i = 0; i < T * K; ++i) {
        const index_t r = slots[i];
        if (r < 0) {
            CHECK(got.data()[i] == -3.0f);
            continue;
        }
        double want = 0.0;
        for (index_t c = 0; c < H; ++c) want += double(a(r, c)) * b(r, c);
        CHECK(got.data()[i] == doctest::Approx(want).epsilon(1e-6));
    }
}

TEST_CASE_TEMPLATE("identity-like routing round-trips: dispatch, then combine with weights 1/k, returns the input", B,
                   MOONMOE_TEST_BACKENDS) {
    using Ops = backend::RoutingOps<B>;
    const index_t T = 9, K = 4, H = 6, E = 8;
    Tensor<index_t, 2> idx({T, K});
    for (index_t t = 0; t < T; ++t)
        for (index_t j = 0; j < K; ++j) idx(t, j) = (3 * t + 5 * j) % E;
    Mat weight({T, K});
    std::fill(weight.data(), weight.data() + T * K, 1.0f / float(K));
    const Mat x = random_matrix(T, H, 16);
    auto d_idx = on<B>(idx);
    Tensor<index_t, 1, B> offsets({E + 1}), row_slot({T * K});
    Tensor<index_t, 2, B> slot_row({T, K});
    Ops::dispatch_plan(d_idx.view(), 0, offsets.view(), row_slot.view(), slot_row.view());
    CHECK(to_host(offsets).back() == T * K);
    Tensor<float, 2, B> rows({T * K, H}), y({T, H});
    auto d_x = on<B>(x);
    auto d_w = on<B>(weight);
    Ops::gather_pairs(d_x.view(), row_slot.view(), K, rows.view());
    Ops::combine(rows.view(), slot_row.view(), d_w.view(), y.view());
    const Mat got = host(y);
    for (index_t t = 0; t < T; ++t)
        for (index_t c = 0; c < H; ++c) CHECK(got(t, c) == doctest::Approx(x(t, c)).epsilon(1e-6));
}

TEST_CASE("MoE: stacked expert weights are handed out per expert with HF names, pointing into the stacks") {
    const MoEConfig cfg = routing_config(8, 2);
    nn::MoE<> moe(cfg, 6, 2, 3);  // experts 2, 3, 4 of 8
    std::vector<std::string> names;
    moe.visit_params("mlp", [&](const ParamRef& p) {
        names.push_back(p.name);
        if (p.kind != ParamKind::expert_matrix) return;
        const bool down = p.name.find("down_proj") != std::string::npos;
        CHECK(p.shape == std::vector<index_t>{down ? 6 : 4, down ? 4 : 6});
        const index_t e = std::stoi(p.name.substr(p.name.find("experts.") + 8)) - 2;
        const auto& stack = down                                            ? moe.experts.down_proj
                            : p.name.find("gate_proj") != std::string::npos ? moe.experts.gate_proj
                                                                            : moe.experts.up_proj;
        CHECK(p.value == stack.value.data() + e * 24);
        CHECK(p.grad == stack.grad.data() + e * 24);
    });
    CHECK(names == std::vector<std::string>{"mlp.gate.weight", "mlp.gate.e_score_correction_bias",
                                            "mlp.experts.2.gate_proj.weight", "mlp.experts.2.up_proj.weight",
                                            "mlp.experts.2.down_proj.weight", "mlp.experts.3.gate_proj.weight",
                                            "mlp.experts.3.up_proj.weight", "mlp.experts.3.down_proj.weight",
                                            "mlp.experts.4.gate_proj.weight", "mlp.experts.4.up_proj.weight",
                                            "mlp.experts.4.down_proj.weight"});
}

TEST_CASE("MoE: an expert-parallel split sums to the whole block, forward and backward") {
    const MoEConfig cfg = routing_config(8, 3, 4, 2);
    const index_t H = 12, T = 10;
    nn::MoE<> whole(cfg, H), low(cfg, H, 0, 5), high(cfg, H, 5, 3);
    randomize(whole, 50);
    auto copy_params = [&](nn::MoE<>& part) {  // the same router, and its own experts' weights
        std::map<std::string, const float*> src;
        whole.visit_params("m", [&](const ParamRef& p) { src[p.name] = p.value; });
        part.visit_params("m", [&](const ParamRef& p) { std::copy(src[p.name], src[p.name] + p.numel(), p.value); });
    };
    copy_params(low);
    copy_params(high);
    const Mat x = random_matrix(T, H, 51), dy = random_matrix(T, H, 52);
    Mat y({T, H}), y_low({T, H}), y_high({T, H}), dx({T, H}), dx_parts({T, H});
    nn::MoE<>::Cache c, c_low, c_high;
    whole.forward(x.view(), y.view(), c);
    low.forward(x.view(), y_low.view(), c_low);
    high.forward(x.view(), y_high.view(), c_high);
    CHECK(whole.expert_rows == T * 3);
    CHECK(low.expert_rows + high.expert_rows == T * 3);
    for (index_t i = 0; i < T * H; ++i)
        CHECK(y.data()[i] == doctest::Approx(y_low.data()[i] + y_high.data()[i]).epsilon(1e-5).scale(1.0));
    whole.backward(dy.view(), c, dx.view());
    low.backward(dy.view(), c_low, dx_parts.view());
    high.backward(dy.view(), c_high, dx_parts.view(), nn::Accumulate::yes);
    // each rank's dweight holds its own pairs, and the router's backward is linear in it: the parts sum to the whole
    for (index_t i = 0; i < T * H; ++i)
        CHECK(dx.data()[i] == doctest::Approx(dx_parts.data()[i]).epsilon(1e-5).scale(1.0));
    for (index_t i = 0; i < whole.gate.weight.grad.numel(); ++i)
        CHECK(
            whole.gate.weight.grad.data()[i] ==
            doctest::Approx(low.gate.weight.grad.data()[i] + high.gate.weight.grad.data()[i]).epsilon(1e-5).scale(1.0));
    std::map<std::string, std::pair<const float*, index_t>> grads;
    whole.visit_params("m", [&](const ParamRef& p) { grads[p.name] = {p.grad, p.numel()}; });
    for (nn::MoE<>* part : {&low, &high})
        part->visit_params("m", [&](const ParamRef& p) {
            if (p.kind != ParamKind::expert_matrix) return;
            CAPTURE(p.name);
            const auto [want, n] = grads[p.name];
            for (index_t i = 0; i < n; ++i) CHECK(p.grad[i] == want[i]);  // each expert's rows, the same GEMMs
        });
}

}  // namespace unit_backend_routing
