// Bitwise repeatability: for a fixed thread count the same seed gives the same bits, run after run,
// whatever the timing (another thread competing for the cores) and wherever the buffers lie in memory (which
// differs between runs and processes): primitive by primitive, and over a multi-step MuonClip training run.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <moonmoe/backend/cpu.hpp>
#include "support/thread_count.hpp"
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/optim.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_repeatability {

using namespace moonmoe;
using moonmoe::testing::ThreadCount;
using Ops = backend::Ops<cpu>;
using backend::Trans;

namespace {

bool same_bits(const float* a, const float* b, std::size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

/// A thread that keeps one core busy while it lives: the scheduler then deschedules the pool's threads at
/// arbitrary points, as another process on a shared machine does.
class BusyThread {
public:
    BusyThread()
        : thread_([this] {
              std::uint64_t x = 1;
              while (!stop_.load(std::memory_order_relaxed)) x = x * 6364136223846793005ull + 1;
              sink_.store(x, std::memory_order_relaxed);
          }) {}
    ~BusyThread() {
        stop_.store(true);
        thread_.join();
    }
    BusyThread(const BusyThread&) = delete;
    BusyThread& operator=(const BusyThread&) = delete;

private:
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> sink_{0};
    std::thread thread_;
};

struct Run {
    std::vector<float> losses, max_logits, weights;
};

/// `steps` MuonClip steps of a tiny K2-shaped model (MLA, a dense layer, MoE with a shared expert and the
/// balancing bias) on fixed pseudo-random tokens, at `thread_count` threads. `heap_shift` bytes stay allocated
/// during the run, so its buffers come from other addresses than in a run with another shift.
Run train(int thread_count, std::size_t heap_shift, int steps) {
    set_threads(thread_count);
    const std::unique_ptr<char[]> ballast(new char[heap_shift + 1]);
    nn::Transformer<> model(TinyK2::config);
    std::uint64_t seed = 11;
    model.visit_params([&](const ParamRef& p) {
        if (p.kind == ParamKind::vector || p.kind == ParamKind::router_bias) return;
        const float stddev = p.kind == ParamKind::embedding ? 1.0f : 1.5f / std::sqrt(float(p.shape.back()));
        Ops::fill_normal(View<float, 2>(p.value, {1, p.numel()}), 0.0f, stddev, seed++);
    });
    optim::Optimizer<TinyK2::optimizer> opt(model);
    opt.config.muon.learning_rate = opt.config.adamw.learning_rate = 0.05;
    opt.config.schedule = {2, steps, 0, 1.0};
    opt.config.qk_clip.tau = 2.0;  // low enough that heads are clipped: QK-Clip's path runs too
    opt.bias_update_rate = 1e-3f;
    const auto layout = nn::TokenLayout::sequences(4, 32);
    std::vector<index_t> ids(std::size_t(layout.tokens()));
    std::uint64_t state = 5;
    Run r;
    for (int step = 0; step < steps; ++step) {
        for (auto& id : ids)
            id = index_t(((state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 256);
        model.zero_grad();
        r.losses.push_back(model.train_step(ids.data(), layout));
        for (auto& layer : model.layers)
            for (const float m : to_host(layer.self_attn.max_logit_per_head)) r.max_logits.push_back(m);
        opt.step();
    }
    model.visit_params([&](const ParamRef& p) { r.weights.insert(r.weights.end(), p.value, p.value + p.numel()); });
    return r;
}

void check_same(const Run& a, const Run& b) {
    REQUIRE(a.losses.size() == b.losses.size());
    REQUIRE(a.max_logits.size() == b.max_logits.size());
    REQUIRE(a.weights.size() == b.weights.size());
    for (std::size_t s = 0; s < a.losses.size(); ++s) {
        CAPTURE(s);
        CHECK(same_bits(&a.losses[s], &b.losses[s], 1));
    }
    CHECK(same_bits(a.max_logits.data(), b.max_logits.data(), a.max_logits.size()));
    CHECK(same_bits(a.weights.data(), b.weights.data(), a.weights.size()));
}

}  // namespace

TEST_CASE("exp_shifted and softmax_rows give the same bits wherever the row lies in memory") {
    // Eigen's exp on a Map used std::exp for the elements before the first 64-byte boundary and its vectorised exp
    // for the rest; they differ in the last bit, so a row's result depended on its address.
    const index_t n = 45;
    std::vector<float> values(n);
    for (index_t j = 0; j < n; ++j) values[j] = 0.37f * float(j % 11) - 1.9f + 0.01f * float(j);
    alignas(64) float buffer[n + 16];
    std::vector<float> first_exp, first_softmax;
    float first_lse = 0;
    for (int offset = 0; offset < 16; ++offset) {
        CAPTURE(offset);
        std::memcpy(buffer + offset, values.data(), n * sizeof(float));
        backend::cpu_detail::exp_shifted(buffer + offset, n, 0.5f);
        std::vector<float> e(buffer + offset, buffer + offset + n);
        std::memcpy(buffer + offset, values.data(), n * sizeof(float));
        float lse = 0;
        backend::cpu_detail::softmax_rows(View<float, 2>(buffer + offset, {1, n}), -1, &lse);
        std::vector<float> s(buffer + offset, buffer + offset + n);
        if (offset == 0) {
            first_exp = e, first_softmax = s, first_lse = lse;
            continue;
        }
        CHECK(same_bits(e.data(), first_exp.data(), std::size_t(n)));
        CHECK(same_bits(s.data(), first_softmax.data(), std::size_t(n)));
        CHECK(same_bits(&lse, &first_lse, 1));
    }
    for (index_t j = 0; j < n; ++j)
        CHECK(first_exp[j] == doctest::Approx(std::exp(double(values[j]) - 0.5)).epsilon(1e-6));
}

TEST_CASE("gemm and syrk: the same bits run after run for a fixed thread count, wherever the operands lie") {
    const ThreadCount restore;
    struct Case {
        Trans ta, tb;
        index_t m, n, k;
    };
    // split along n, along m, nothing to split, and the few-rows path
    const Case cases[] = {{Trans::no, Trans::yes, 300, 1100, 96},
                          {Trans::yes, Trans::no, 1000, 300, 64},
                          {Trans::no, Trans::no, 40, 30, 20},
                          {Trans::no, Trans::yes, 12, 700, 300}};
    for (int threads : {1, 2, 3}) {
        CAPTURE(threads);
        set_threads(threads);
        for (const Case& c : cases) {
            CAPTURE(c.m);
            const index_t a_rows = c.ta == Trans::no ? c.m : c.k, a_cols = c.ta == Trans::no ? c.k : c.m;
            const index_t b_rows = c.tb == Trans::no ? c.k : c.n, b_cols = c.tb == Trans::no ? c.n : c.k;
            std::vector<float> a(std::size_t(a_rows * a_cols)), b(std::size_t(b_rows * b_cols));
            Ops::fill_normal(View<float, 2>(a.data(), {1, index_t(a.size())}), 0.0f, 1.0f, 1);
            Ops::fill_normal(View<float, 2>(b.data(), {1, index_t(b.size())}), 0.0f, 1.0f, 2);
            std::vector<float> first;
            for (int offset : {0, 1, 3, 0}) {  // operands moved by some floats: other alignments, other heap blocks
                CAPTURE(offset);
                std::vector<float> a2(a.size() + 3), b2(b.size() + 3), out(std::size_t(c.m * c.n + 3), 0.5f);
                std::copy(a.begin(), a.end(), a2.begin() + offset);
                std::copy(b.begin(), b.end(), b2.begin() + offset);
                Ops::gemm(c.ta, c.tb, 0.75f, View<const float, 2>(a2.data() + offset, {a_rows, a_cols}),
                          View<const float, 2>(b2.data() + offset, {b_rows, b_cols}), 1.5f,
                          View<float, 2>(out.data() + offset, {c.m, c.n}));
                std::vector<float> result(out.begin() + offset, out.begin() + offset + c.m * c.n);
                if (first.empty()) first = result;
                else
                    CHECK(same_bits(result.data(), first.data(), first.size()));
            }
        }
        Tensor<float, 2> x({600, 130});
        Ops::fill_normal(x.view(), 0.0f, 1.0f, 3);
        std::vector<float> first;
        for (int rep = 0; rep < 3; ++rep) {
            Tensor<float, 2> c({600, 600});
            Ops::syrk(1.0f, View<const float, 2>(x.view()), 0.0f, c.view());
            if (first.empty()) first.assign(c.data(), c.data() + c.numel());
            else
                CHECK(same_bits(c.data(), first.data(), first.size()));
        }
    }
}

TEST_CASE(
    "a multi-step MuonClip training run at 2 threads is bitwise repeatable, with a thread competing for the cores") {
    const ThreadCount restore;
    const int steps = 6;
    const Run first = train(2, 0, steps);
    {
        const BusyThread busy;
        for (std::size_t shift : {24u, 72u, 200u, 1000u}) {
            CAPTURE(shift);
            check_same(train(2, shift, steps), first);
        }
    }
    for (float loss : first.losses) CHECK(std::isfinite(loss));
}

}  // namespace unit_repeatability
