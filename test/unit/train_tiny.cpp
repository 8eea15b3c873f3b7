// A short run of examples/train_tiny: with Muon alone the maximum attention logit exceeds tau; with MuonClip it is
// at or below tau after every step; the losses stay within a few percent.
#include <doctest/doctest.h>

#include <cmath>

#include "../../examples/train_tiny.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_train_tiny {

TEST_CASE("train_tiny: MuonClip holds the max logit at tau where Muon alone exceeds it, at the same loss") {
    const int n = moonmoe::threads();
    moonmoe::set_threads(1);  // small matrices: one thread is fastest, and repeatable
    train_tiny::Options o;
    o.steps = 50;  // short enough for the sanitizer build (a few minutes there, seconds in release)
    o.batch = 4;
    o.tau = 10.0;
    const auto muon = train_tiny::run(o, false), clip = train_tiny::run(o, true);
    moonmoe::set_threads(n);
    float muon_peak = 0, clip_peak = 0;
    moonmoe::index_t clips = 0;
    for (const auto& l : muon) muon_peak = std::max(muon_peak, l.max_logit_after);
    for (const auto& l : clip) {
        CAPTURE(l.step);
        CHECK(l.max_logit_after <= o.tau * (1 + 1e-4));  // after every step, on that step's batch
        clip_peak = std::max(clip_peak, l.max_logit_after);
        clips += l.heads_clipped;
    }
    CHECK(muon_peak > 1.3 * o.tau);
    CHECK(clips > 0);
    double a = 0, b = 0;
    for (std::size_t i = muon.size() - 20; i < muon.size(); ++i) a += muon[i].loss, b += clip[i].loss;
    MESSAGE("Muon alone peaks at " << muon_peak << ", MuonClip at " << clip_peak << " (tau " << o.tau
                                   << "); final losses " << a / 20 << " and " << b / 20);
    CHECK(std::abs(b / a - 1.0) < 0.05);
}

}  // namespace unit_train_tiny
