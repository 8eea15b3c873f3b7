// Post-training (include/moonmoe/rl/): the sampler, rollouts, the K1.5 objective with budget control and the PTX
// loss, on every backend of the build.
//
// Oracles: the sampler's distributions are computed here in double from their definitions (the tempered softmax,
// top-k and top-p cuts) and its draws' frequencies held to them; the objective, its per-token log-probabilities and
// every parameter's gradient come from tools/make_rl_reference.py (PyTorch and transformers'
// DeepseekV3ForCausalLM on test/data/tiny_k2), held to 1e-6 on the loss and 2e-5 on gradients (relative to each
// tensor's largest value).
#include "support/backends.hpp"
#include "support/io_testing.hpp"
#include "support/nn_testing.hpp"
#include "support/reference.hpp"
#include "support/rl_oracle.hpp"
#include "support/self_world.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

#include <moonmoe/config.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/optim/optimizer.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/rl/objective.hpp>
#include <moonmoe/rl/pipeline.hpp>
#include <moonmoe/trainer.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_rl {

using namespace moonmoe;
using namespace moonmoe::testing;

namespace {

/// The training statistics a forward can move: each layer's per-head maximum logits and each MoE layer's load.
template <class B>
std::pair<std::vector<std::vector<float>>, std::vector<std::vector<index_t>>> statistics(nn::Transformer<B>& model) {
    std::vector<std::vector<float>> m;
    std::vector<std::vector<index_t>> l;
    for (auto& layer : model.layers) {
        m.push_back(to_host(layer.self_attn.max_logit_per_head));
        if (!layer.dense) l.push_back(to_host(layer.moe.gate.load));
    }
    return {m, l};
}

/// The distribution sample_row draws from, in double from its definition: softmax(z / T) over the candidates
/// (the top_k largest, ties to the lower id; then the shortest prefix reaching top_p of their mass), renormalised.
std::vector<double> expected_distribution(const std::vector<float>& z, const rl::SamplingParams& p) {
    const index_t V = index_t(z.size());
    std::vector<index_t> order(z.size());
    std::iota(order.begin(), order.end(), index_t(0));
    std::stable_sort(order.begin(), order.end(),
                     [&](index_t a, index_t b) { return z[std::size_t(a)] > z[std::size_t(b)]; });
    const index_t k = p.top_k > 0 ? std::min(p.top_k, V) : V;
    std::vector<double> w(z.size(), 0.0);
    double mass = 0.0;
    for (index_t i = 0; i < k; ++i) mass += std::exp(double(z[std::size_t(order[std::size_t(i)])]) / p.temperature);
    double kept = 0.0;
    for (index_t i = 0; i < k; ++i) {
        const index_t v = order[std::size_t(i)];
        w[std::size_t(v)] = std::exp(double(z[std::size_t(v)]) / p.temperature);
        kept += w[std::size_t(v)];
        if (kept >= p.top_p * mass) break;
    }
    for (double& x : w) x /= kept;
    return w;
}

std::vector<float> row(std::uint64_t seed, index_t V, float scale) {
    const Mat m = random_matrix(1, V, seed, scale);
    return std::vector<float>(m.data(), m.data() + V);
}

/// A tiny K2 with rollouts' settings, randomised weights.
template <class B>
nn::Transformer<B> tiny_model(std::uint64_t seed) {
    nn::Transformer<B> model(TinyK2::config);
    randomize(model, seed, 0.2f);
    return model;
}

bool same_rollouts(const std::vector<rl::Rollout>& a, const std::vector<rl::Rollout>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].response != b[i].response || a[i].finish != b[i].finish ||
            std::memcmp(a[i].logp.data(), b[i].logp.data(), a[i].logp.size() * sizeof(float)) != 0 ||
            std::memcmp(a[i].sampling_logp.data(), b[i].sampling_logp.data(), a[i].logp.size() * sizeof(float)) != 0)
            return false;
    return true;
}

}  // namespace

TEST_CASE(
    "sample_row: the draws follow the tempered, top-k and top-p distribution, and report both log-probabilities") {
    const index_t V = 12;
    const std::vector<float> z = row(3, V, 2.0f);
    double lse = 0.0;
    for (float v : z) lse += std::exp(double(v));
    lse = std::log(lse);
    const rl::SamplingParams settings[] = {{1.0, 0, 1.0}, {0.7, 0, 1.0}, {1.3, 5, 1.0}, {1.0, 0, 0.6}, {0.8, 6, 0.9}};
    for (const rl::SamplingParams& p : settings) {
        CAPTURE(p.temperature);
        CAPTURE(p.top_k);
        CAPTURE(p.top_p);
        const std::vector<double> expect = expected_distribution(z, p);
        const int draws = 40000;
        std::vector<int> seen(std::size_t(V), 0);
        for (int i = 0; i < draws; ++i) {
            const rl::Draw d = rl::sample_row(z.data(), V, p, 17, std::uint64_t(i));
            REQUIRE(expect[std::size_t(d.token)] > 0.0);  // never outside the candidates
            ++seen[std::size_t(d.token)];
            CHECK(d.logp == doctest::Approx(double(z[std::size_t(d.token)]) - lse).epsilon(1e-6));
            CHECK(d.sampling_logp == doctest::Approx(std::log(expect[std::size_t(d.token)])).epsilon(1e-6));
        }
        for (index_t v = 0; v < V; ++v) {  // within 5 standard deviations of the binomial count
            const double e = expect[std::size_t(v)] * draws, sd = std::sqrt(e * (1.0 - expect[std::size_t(v)]));
            CHECK(std::abs(seen[std::size_t(v)] - e) <= 5.0 * sd + 1.0);
        }
    }
    const rl::Draw greedy = rl::sample_row(z.data(), V, {0.0, 0, 1.0}, 17, 0);
    CHECK(greedy.token == index_t(std::max_element(z.begin(), z.end()) - z.begin()));
    CHECK(greedy.sampling_logp == 0.0f);
    const std::vector<float> tie = {1.0f, 3.0f, 3.0f, -2.0f};  // greedy and top-1 take the lower id of a tie
    CHECK(rl::sample_row(tie.data(), 4, {0.0, 0, 1.0}, 1, 0).token == 1);
    CHECK(rl::sample_row(tie.data(), 4, {1.0, 1, 1.0}, 1, 0).token == 1);
}

TEST_CASE(
    "sample_rows: a row's draw depends on its logits, settings, seed and index alone, not on the batch or the "
    "threads") {
    const index_t V = 50, rows = 9;
    Mat logits = random_matrix(rows, V, 5, 3.0f);
    std::vector<rl::SamplingParams> params;
    std::vector<std::uint64_t> seeds, indices;
    for (index_t r = 0; r < rows; ++r) {
        params.push_back({0.5 + 0.1 * double(r), r % 3 == 0 ? 0 : 4 + r, r % 2 ? 0.9 : 1.0});
        seeds.push_back(1000 + std::uint64_t(r));
        indices.push_back(std::uint64_t(r * 7));
    }
    const int threads = moonmoe::threads();
    moonmoe::set_threads(1);
    const std::vector<rl::Draw> one = rl::sample_rows(logits.data(), rows, V, V, params, seeds, indices);
    moonmoe::set_threads(2);
    const std::vector<rl::Draw> two = rl::sample_rows(logits.data(), rows, V, V, params, seeds, indices);
    // the rows reversed, after three other rows
    Mat other = random_matrix(rows + 3, V, 6, 3.0f);
    std::vector<rl::SamplingParams> p2(3, rl::SamplingParams{1.0, 0, 1.0});
    std::vector<std::uint64_t> s2 = {1, 2, 3}, i2 = {0, 0, 0};
    for (index_t r = rows; r-- > 0;) {
        std::copy(logits.data() + r * V, logits.data() + (r + 1) * V, other.data() + (3 + rows - 1 - r) * V);
        p2.push_back(params[std::size_t(r)]), s2.push_back(seeds[std::size_t(r)]),
            i2.push_back(indices[std::size_t(r)]);
    }
    const std::vector<rl::Draw> mixed = rl::sample_rows(other.data(), rows + 3, V, V, p2, s2, i2);
    moonmoe::set_threads(threads);
    for (index_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        const rl::Draw& a = one[std::size_t(r)];
        for (const rl::Draw* b : {&two[std::size_t(r)], &mixed[std::size_t(3 + rows - 1 - r)]}) {
            CHECK(a.token == b->token);
            CHECK(std::memcmp(&a.logp, &b->logp, sizeof(float)) == 0);
            CHECK(std::memcmp(&a.sampling_logp, &b->sampling_logp, sizeof(float)) == 0);
        }
    }
    params[4].top_p = 0.0;
    CHECK_THROWS_WITH_AS(rl::sample_rows(logits.data(), rows, V, V, params, seeds, indices),
                         doctest::Contains("row 4): top_p must be in (0, 1]"), std::invalid_argument);
}

TEST_CASE_TEMPLATE(
    "rollout: budgets truncate, stop tokens end, and isolated decoding gives a sequence the same bits "
    "whatever else is requested",
    B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = tiny_model<B>(41);
    const std::vector<rl::RolloutRequest> requests = {
        {{5, 9, 2}, 11, 6, {1.0, 0, 1.0}},
        {{7}, 12, 4, {0.8, 8, 0.95}},
        {{1, 2, 3, 4, 5, 6}, 13, 9, {1.2, 0, 0.9}},
    };
    const rl::RolloutOptions isolated{.stop_tokens = {}, .isolated = true};
    const std::vector<rl::Rollout> all = rl::rollout(model, std::span(requests), isolated);
    for (std::size_t i = 0; i < requests.size(); ++i) {
        CAPTURE(i);
        CHECK(all[i].finish == rl::Finish::budget);  // no stop token: every response runs to its budget
        CHECK(all[i].truncated());
        CHECK(index_t(all[i].response.size()) == requests[i].budget);
        CHECK(all[i].prompt == requests[i].prompt);
    }
    // the last request alone, and among the others in another order: the same bits
    const std::vector<rl::RolloutRequest> alone = {requests[2]};
    const std::vector<rl::RolloutRequest> reordered = {requests[2], requests[0]};
    CHECK(same_rollouts({all[2]}, rl::rollout(model, std::span(alone), isolated)));
    const std::vector<rl::Rollout> r2 = rl::rollout(model, std::span(reordered), isolated);
    CHECK(same_rollouts({all[2], all[0]}, r2));

    // batched: each response's logp is the model's log-softmax of the token, as decoding that sequence alone gives
    const std::vector<rl::Rollout> batched = rl::rollout(model, std::span(requests));
    for (std::size_t i = 0; i < requests.size(); ++i) {
        CAPTURE(i);
        std::vector<index_t> ids = batched[i].prompt;
        auto state = model.start_decoding(index_t(ids.size() + batched[i].response.size()));
        Tensor<float, 2, B> logits = model.decode(ids.data(), index_t(ids.size()), state);
        for (std::size_t t = 0; t < batched[i].response.size(); ++t) {
            const index_t V = model.config.dims.vocab, last = logits.size(0) - 1;
            const std::vector<float> z = to_host(View<const float, 1, B>(logits.data() + last * V, {V}));
            double lse = 0.0;
            for (float v : z) lse += std::exp(double(v));
            const index_t y = batched[i].response[t];
            CHECK(batched[i].logp[t] == doctest::Approx(double(z[std::size_t(y)]) - std::log(lse)).epsilon(1e-5));
            logits = model.decode(&y, 1, state);
        }
    }

    // a stop token ends a response, kept as its last token
    const index_t stop = all[0].response[2];
    const rl::RolloutOptions stopping{.stop_tokens = {stop}, .isolated = true};
    const std::vector<rl::RolloutRequest> first = {requests[0]};
    const std::vector<rl::Rollout> stopped = rl::rollout(model, std::span(first), stopping);
    const auto at = std::find(all[0].response.begin(), all[0].response.end(), stop);
    CHECK(stopped[0].finish == rl::Finish::stop);
    CHECK_FALSE(stopped[0].truncated());
    CHECK(stopped[0].response == std::vector<index_t>(all[0].response.begin(), at + 1));

    const std::vector<rl::RolloutRequest> no_budget = {{{5}, 1, 0, {}}};
    CHECK_THROWS_WITH_AS(rl::rollout(model, std::span(no_budget)),
                         doctest::Contains("request 0 has a token budget of 0"), std::invalid_argument);
    const std::vector<rl::RolloutRequest> bad_token = {{{5, 256}, 1, 3, {}}};
    CHECK_THROWS_WITH_AS(rl::rollout(model, std::span(bad_token)),
                         doctest::Contains("prompt token 1 is 256, outside the vocabulary [0, 256)"),
                         std::out_of_range);
}

TEST_CASE_TEMPLATE("rollouts feed no router load and record no QK-Clip maxima", B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = tiny_model<B>(42);
    const auto before = statistics(model);
    const std::vector<rl::RolloutRequest> requests = {{{3, 4}, 1, 5, {}}, {{8, 8, 8}, 2, 3, {}}};
    rl::rollout(model, std::span(requests));
    CHECK(statistics(model) == before);
}

TEST_CASE("k15_objective: the loss and its gradient with respect to each log pi_theta, against their definitions") {
    std::vector<rl::Group> groups(2);
    groups[0].samples = {{{1}, {2}, 1.0, -3.0, false}, {{1}, {3}, 0.0, -2.5, true}, {{1}, {4}, 0.5, -4.0, false}};
    groups[1].samples = {{{5}, {6}, -1.0, -1.0, false}, {{5}, {7}, 2.0, -6.0, false}};
    const rl::Objective o{.tau = 0.3, .budget_penalty = 0.25, .ptx_weight = 0.0};
    const std::vector<double> logp = {-2.8, -2.7, -4.4, -1.3, -5.5};
    const rl::ObjectiveValue v = rl::k15_objective(groups, logp, o);
    const auto loss_at = [&](const std::vector<double>& lp) {
        double total = 0.0;
        std::size_t i = 0;
        for (const rl::Group& g : groups) {
            double mean = 0.0;
            for (const rl::Sample& s : g.samples) mean += s.reward - (s.truncated ? o.budget_penalty : 0.0);
            mean /= double(g.samples.size());
            double lx = 0.0;
            for (const rl::Sample& s : g.samples) {
                const double a =
                    s.reward - (s.truncated ? o.budget_penalty : 0.0) - mean - o.tau * (lp[i++] - s.old_logp);
                lx += a * a;
            }
            total += lx / double(g.samples.size());
        }
        return total / double(groups.size());
    };
    CHECK(v.rl_loss == doctest::Approx(loss_at(logp)).epsilon(1e-14));
    CHECK(v.loss == v.rl_loss);
    CHECK(v.mean_reward == doctest::Approx((1.0 + 0.0 - 0.25 + 0.5 - 1.0 + 2.0) / 5.0).epsilon(1e-14));
    for (std::size_t i = 0; i < logp.size(); ++i) {  // central differences
        std::vector<double> up = logp, down = logp;
        up[i] += 1e-5, down[i] -= 1e-5;
        CHECK(v.dlogp[i] == doctest::Approx((loss_at(up) - loss_at(down)) / 2e-5).epsilon(1e-7));
    }
    // on-policy (pi_theta = pi_old) the loss is the mean over prompts of each group's reward variance
    std::vector<double> old;
    for (const rl::Group& g : groups)
        for (const rl::Sample& s : g.samples) old.push_back(s.old_logp);
    const rl::ObjectiveValue on = rl::k15_objective(groups, old, o);
    const double mean0 = (1.0 - 0.25 + 0.5) / 3.0;  // the truncated sample's reward 0 - 0.25
    const double var0 = (std::pow(1.0 - mean0, 2) + std::pow(-0.25 - mean0, 2) + std::pow(0.5 - mean0, 2)) / 3.0,
                 var1 = (std::pow(-1.0 - 0.5, 2) + std::pow(2.0 - 0.5, 2)) / 2.0;
    CHECK(on.rl_loss == doctest::Approx((var0 + var1) / 2.0).epsilon(1e-14));
    CHECK_THROWS_WITH_AS(rl::k15_objective(groups, std::vector<double>(4, 0.0), o),
                         doctest::Contains("4 log-probabilities for 5 samples"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(rl::k15_objective(groups, logp, rl::Objective{.tau = 0.0}),
                         doctest::Contains("tau must be finite and > 0"), std::invalid_argument);
}

TEST_CASE_TEMPLATE(
    "the K1.5 objective with budget control and the PTX loss against PyTorch: response log-probs, "
    "loss and every gradient",
    B, MOONMOE_TEST_BACKENDS) {
    nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
    const RlOracle oracle;
    const std::vector<rl::Group>& groups = oracle.groups;
    const rl::PtxBatch& ptx = oracle.ptx;
    const rl::Objective& o = oracle.objective;
    const auto f64 = [&](const std::string& name) { return oracle.f64(name); };
    const Reference& ref = oracle.ref;

    // the response tokens' log-probabilities (prompt tokens masked)
    const rl::PackedResponses packed = rl::pack_responses(groups, model.config.dims.vocab);
    typename nn::Transformer<B>::Cache cache;
    const Tensor<float, 2, B> logits = model.forward(packed.ids.data(), packed.layout, cache);
    const std::vector<float> token_logp = nn::token_log_probs<B>(logits.view(), packed.targets.data());
    std::vector<float> response_logp;
    for (std::size_t t = 0; t < packed.targets.size(); ++t)
        if (packed.targets[t] != nn::ignore_index) response_logp.push_back(token_logp[t]);
    const std::vector<float> expected_logp = ref.f32("token_logp");
    REQUIRE(response_logp.size() == expected_logp.size());
    CHECK(scaled_error(response_logp.data(), expected_logp) < 1e-6);
    const std::vector<double> seq = rl::sequence_logps(packed, token_logp), expected_seq = f64("seq_logp");
    for (std::size_t i = 0; i < seq.size(); ++i) CHECK(seq[i] == doctest::Approx(expected_seq[i]).epsilon(1e-6));

    model.zero_grad();
    const rl::ObjectiveValue v = rl::k15_train_step(model, std::span<const rl::Group>(groups), o, &ptx);
    const double rl_ref = f64("loss.rl")[0], ptx_ref = f64("loss.ptx")[0], total_ref = f64("loss.total")[0];
    MESSAGE(std::string(B::name) << ": K1.5 loss " << v.rl_loss << " (PyTorch " << rl_ref << "), PTX " << v.ptx_loss
                                 << " (" << ptx_ref << "), total " << v.loss << " (" << total_ref << ")");
    CHECK(std::abs(v.loss - total_ref) <= 1e-6 * std::abs(total_ref));
    CHECK(std::abs(v.ptx_loss - ptx_ref) <= 1e-6 * std::abs(ptx_ref));
    // The K1.5 part alone is a small difference of large log-probabilities (sums of -5 to -52 here against a loss of
    // 0.25): f32 logits, ours and transformers', agree to about 1e-6 of each sequence's log-probability, which moves
    // the loss by up to sum_i |dL/dlogp_i| |logp_i| 1e-6 (1.3e-6 of 0.25 measured on the CPU): held to that bound.
    double sensitivity = 0.0;
    for (std::size_t i = 0; i < v.dlogp.size(); ++i) sensitivity += std::abs(v.dlogp[i] * expected_seq[i]);
    MESSAGE(std::string(B::name) << ": K1.5 loss error " << std::abs(v.rl_loss - rl_ref) << ", bound "
                                 << 1e-6 * sensitivity);
    CHECK(std::abs(v.rl_loss - rl_ref) <= 1e-6 * sensitivity);
    double worst = 0.0;
    int compared = 0;
    model.visit_params([&](const ParamRef& p) {
        if (!p.grad) return;
        const double e = scaled_error(floats_to_host<B>(p.grad, p.numel()).data(), ref.f32("grad." + p.name));
        CAPTURE(p.name);
        CHECK(e < 2e-5);
        worst = std::max(worst, e), ++compared;
    });
    MESSAGE(std::string(B::name) << ": " << compared << " gradients, worst error " << worst);
    CHECK(compared > 20);

    CHECK_THROWS_WITH_AS(rl::k15_train_step(model, std::span<const rl::Group>(groups), o),
                         doctest::Contains("no PTX batch"), std::invalid_argument);
}

TEST_CASE_TEMPLATE(
    "the K1.5 objective through a pipeline (rl/pipeline.hpp) of 2 and 3 micro-batches against PyTorch: loss, "
    "gradients, and the forward-only pass feeds no router load and records no QK-Clip maxima",
    B, MOONMOE_TEST_BACKENDS) {
    const RlOracle oracle;
    const Reference& ref = oracle.ref;
    SelfWorld world = self_world<B>();
    for (const index_t micro_batches : {index_t(2), index_t(3)}) {
        CAPTURE(micro_batches);
        // a one-stage pipeline over the whole model: the two passes, the samples and the PTX batch's sequences cut
        // into micro-batches, the loss hook at the last stage
        nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
        parallel::ProcessGroups g(world, model.config.parallel);
        parallel::Pipeline<B> pipeline(model, g, micro_batches);
        typename parallel::Pipeline<B>::Timing timing;
        const rl::ObjectiveValue v = rl::k15_train_step(pipeline, g, std::span<const rl::Group>(oracle.groups),
                                                        oracle.objective, &oracle.ptx, &timing);
        const double total_ref = oracle.f64("loss.total")[0], ptx_ref = oracle.f64("loss.ptx")[0];
        CHECK(std::abs(v.loss - total_ref) <= 1e-6 * std::abs(total_ref));
        CHECK(std::abs(v.ptx_loss - ptx_ref) <= 1e-6 * std::abs(ptx_ref));
        const std::vector<double> expected_seq = oracle.f64("seq_logp");
        REQUIRE(v.logp.size() == expected_seq.size());
        for (std::size_t i = 0; i < v.logp.size(); ++i)
            CHECK(v.logp[i] == doctest::Approx(expected_seq[i]).epsilon(1e-6));
        double worst = 0.0;
        model.visit_params([&](const ParamRef& p) {
            if (!p.grad) return;
            const double e = scaled_error(floats_to_host<B>(p.grad, p.numel()).data(), ref.f32("grad." + p.name));
            CAPTURE(p.name);
            CHECK(e < 2e-5);
            worst = std::max(worst, e);
        });
        MESSAGE(std::string(B::name) << ", " << micro_batches << " micro-batches: loss " << v.loss << " (PyTorch "
                                     << total_ref << "), worst gradient error " << worst << ", " << timing.total
                                     << " s");
        CHECK(timing.total > 0.0);

        // the statistics: those of the one training pass, as the whole model's k15_train_step leaves them
        nn::Transformer<B> whole = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
        rl::k15_train_step(whole, std::span<const rl::Group>(oracle.groups), oracle.objective, &oracle.ptx);
        const auto got = statistics(model);
        for (std::size_t l = 0, moe = 0; l < whole.layers.size(); ++l) {
            CAPTURE(l);
            const std::vector<float> m = to_host(whole.layers[l].self_attn.max_logit_per_head);
            for (std::size_t h = 0; h < m.size(); ++h) CHECK(got.first[l][h] == doctest::Approx(m[h]).epsilon(1e-5));
            if (!whole.layers[l].dense) CHECK(got.second[moe++] == to_host(whole.layers[l].moe.gate.load));
        }
    }
    // too few samples for the micro-batches, named
    nn::Transformer<B> model = load_transformer<TinyK2, B>(data_dir("tiny_k2"));
    parallel::ProcessGroups g(world, model.config.parallel);
    parallel::Pipeline<B> pipeline(model, g, 64);
    CHECK_THROWS_WITH_AS(
        rl::k15_train_step(pipeline, g, std::span<const rl::Group>(oracle.groups), oracle.objective, &oracle.ptx),
        doctest::Contains("samples for 64 pipeline micro-batches"), std::invalid_argument);
}

TEST_CASE_TEMPLATE("train, rollout, train equals train, train bit for bit", B, MOONMOE_TEST_BACKENDS) {
    using Tiny = TinyK2::with<Optimizer<Muon<LearningRate<0.02>>, QKClip<30.0>>>;
    const auto run = [](bool with_rollout) {
        nn::Transformer<B> model = load_transformer<Tiny, B>(data_dir("tiny_k2"));
        optim::Optimizer<typename Tiny::optimizer, B> opt(model);
        std::vector<rl::Group> groups(1);
        groups[0].samples = {{{3, 1, 4}, {1, 5, 9}, 1.0, -20.0, false}, {{3, 1, 4}, {2, 6}, 0.0, -14.0, true}};
        const rl::Objective o{.tau = 0.5, .budget_penalty = 0.1, .ptx_weight = 0.0};
        std::vector<float> losses;
        for (int step = 0; step < 2; ++step) {
            losses.push_back(float(rl::k15_train_step(model, std::span<const rl::Group>(groups), o).loss));
            opt.step();
            if (with_rollout && step == 0) {
                const std::vector<rl::RolloutRequest> requests = {{{3, 1, 4}, 5, 4, {1.0, 0, 1.0}},
                                                                  {{2, 7}, 6, 3, {0.7, 5, 0.9}}};
                rl::rollout(model, std::span(requests));
            }
        }
        std::map<std::string, std::vector<float>> weights;
        model.visit_params([&](const ParamRef& p) { weights[p.name] = floats_to_host<B>(p.value, p.numel()); });
        for (auto& layer : model.layers)
            weights["max." + std::to_string(weights.size())] = to_host(layer.self_attn.max_logit_per_head);
        return std::make_pair(losses, weights);
    };
    const auto plain = run(false), with = run(true);
    CHECK(plain.first == with.first);
    CHECK(plain.second == with.second);  // every weight, bit for bit (float ==, no NaN)
}

TEST_CASE_TEMPLATE(
    "after an optimizer step, rollouts decode the updated weights, bf16 working copies included, as a "
    "model loaded from them does",
    B, MOONMOE_TEST_BACKENDS) {
    using Tiny = TinyK2::with<Precision<BF16>, Optimizer<Muon<LearningRate<0.05>>, QKClip<30.0>>>;
    nn::Transformer<B> model = load_transformer<Tiny, B>(data_dir("tiny_k2"));
    optim::Optimizer<typename Tiny::optimizer, B> opt(model);
    const std::vector<rl::RolloutRequest> requests = {{{3, 1, 4}, 5, 6, {1.0, 0, 1.0}}, {{2, 7}, 6, 5, {0.0, 0, 1.0}}};
    const rl::RolloutOptions isolated{.stop_tokens = {}, .isolated = true};
    const std::vector<rl::Rollout> before = rl::rollout(model, std::span(requests), isolated);
    std::vector<rl::Group> groups(1);
    for (const rl::Rollout& r : before) groups[0].samples.push_back(rl::Sample::of(r, r.response[0] % 2 ? 1.0 : 0.0));
    rl::k15_train_step(model, std::span<const rl::Group>(groups), rl::Objective{.tau = 0.5});
    opt.step();
    const std::vector<rl::Rollout> after = rl::rollout(model, std::span(requests), isolated);
    const std::filesystem::path dir = io_testing::scratch_dir(std::string("rl_refresh_") + B::name);
    save_transformer(dir.string(), model);
    nn::Transformer<B> loaded = load_transformer<Tiny, B>(dir.string());
    CHECK(same_rollouts(after, rl::rollout(loaded, std::span(requests), isolated)));
    CHECK_FALSE(same_rollouts(before, after));  // the step moved what decoding reads
}

TEST_CASE(
    "Trainer::rl_step: the K1.5 objective with the type's RL<...> settings, then the optimizer step, and the "
    "temperature follows the type's TemperatureDecay") {
    using Tiny = TinyK2::with<Optimizer<Muon<LearningRate<0.02>>, QKClip<30.0>>,
                              RL<Regularization<0.5>, BudgetPenalty<0.2>, PTXWeight<0.3>,
                                 TemperatureDecay<StartTemperature<1.5>, FinalTemperature<0.5>, DecayIterations<2>>>>;
    Trainer<Tiny> run({.seed = 3});
    nn::Transformer<cpu> model(Tiny::config);
    nn::init_weights(model, {.seed = 3});
    optim::Optimizer<Tiny::optimizer, cpu> opt(model);
    std::vector<rl::Group> groups(2);
    groups[0].samples = {{{3, 1, 4}, {1, 5, 9}, 1.0, -20.0, false}, {{3, 1, 4}, {2, 6}, 0.0, -14.0, true}};
    groups[1].samples = {{{2, 7}, {1}, 0.5, -5.0, false}, {{2, 7}, {8, 2, 8}, 0.0, -16.0, false}};
    const rl::PtxBatch ptx{{10, 20, 30, 40, 50, 60}, nn::TokenLayout::sequences(2, 3)};
    CHECK(run.sampling_temperature() == 1.5);
    for (int it = 0; it < 2; ++it) {
        const rl::ObjectiveValue a = run.rl_step(groups, &ptx);
        const rl::ObjectiveValue b =
            rl::k15_train_step(model, std::span<const rl::Group>(groups),
                               rl::Objective{.tau = 0.5, .budget_penalty = 0.2, .ptx_weight = 0.3}, &ptx);
        opt.step();
        CHECK(a.loss == b.loss);
        CHECK(a.ptx_loss == b.ptx_loss);
    }
    CHECK(run.rl_iterations() == 2);
    CHECK(run.sampling_temperature() == 0.5);
    std::map<std::string, std::vector<float>> want;
    model.visit_params([&](const ParamRef& p) { want[p.name].assign(p.value, p.value + p.numel()); });
    run.model().visit_params([&](const ParamRef& p) {
        CAPTURE(p.name);
        CHECK(std::equal(p.value, p.value + p.numel(), want.at(p.name).begin()));
    });
}

TEST_CASE("RL<...>: the model type's post-training settings and the temperature schedule") {
    using Tiny = TinyK2::with<RL<Regularization<0.1>, BudgetPenalty<0.5>, PTXWeight<0.2>,
                                 TemperatureDecay<StartTemperature<1.2>, FinalTemperature<0.6>, DecayIterations<10>>>>;
    constexpr RLConfig c = Tiny::rl::value;
    static_assert(c.tau == 0.1 && c.budget_penalty == 0.5 && c.ptx_weight == 0.2);
    static_assert(c.temperature.at(0) == 1.2 && c.temperature.at(10) == 0.6 && c.temperature.at(1000) == 0.6);
    CHECK(c.temperature.at(5) == doctest::Approx(0.9).epsilon(1e-12));  // the cosine's midpoint
    for (long long i = 0; i < 10; ++i) CHECK(c.temperature.at(i + 1) < c.temperature.at(i));
    const rl::Objective o = rl::Objective::of(c);
    CHECK(o.tau == 0.1);
    CHECK(o.ptx_weight == 0.2);
    static_assert(TinyK2::rl::value.temperature.at(7) == 1.0);  // RL<> by default: temperature 1 throughout
}

}  // namespace unit_rl
