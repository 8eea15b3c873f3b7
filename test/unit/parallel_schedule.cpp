// The pipeline schedule as data (parallel/schedule.hpp), over many (PP, V, M): the oracles of Megatron-Core's
// tests/unit_tests/pipeline_parallel/test_schedules.py, and an event simulation of all ranks together that finds the
// bubble and would find a deadlock.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <moonmoe/parallel/schedule.hpp>

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_parallel_schedule {

using namespace moonmoe;
using namespace moonmoe::parallel;

namespace {

/// Every (PP, V, M, extra) the sweeps cover: Megatron's (P in 1, 2, 4, 8; V in 1, 2, 4, 8; M in PP .. 32 in steps
/// that keep M a multiple of PP when V > 1), with and without K2's extra warm-up forward.
std::vector<PipelineShape> sweep() {
    std::vector<PipelineShape> out;
    for (index_t pp : {1, 2, 3, 4, 8})
        for (index_t v : {1, 2, 4, 8})
            for (index_t m : {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 24, 32})
                for (index_t extra : {0, 1}) {
                    const PipelineShape s{pp, v, m, extra};
                    if (m < pp || (v > 1 && m % pp != 0)) continue;
                    out.push_back(s);
                }
    return out;
}

/// Runs every rank's list at once: a step starts when its rank has finished the step before it and the step it
/// depends on (the forward of the previous virtual stage, the backward of the next one, the own forward) has
/// finished, each step taking one time unit. Returns the finish time of the last step, or -1 when the ranks can
/// go no further (a deadlock: every rank waits for another).
index_t simulate(const PipelineShape& s, std::vector<std::vector<Step>> lists) {
    const index_t stages = s.virtual_stages();
    // done[(pass, mb, stage)] = finish time
    std::map<std::tuple<int, index_t, index_t>, index_t> done;
    std::vector<std::size_t> next(std::size_t(s.pp), 0);
    std::vector<index_t> free_at(std::size_t(s.pp), 0);
    std::size_t remaining = 0;
    for (const auto& l : lists) remaining += l.size();
    while (remaining > 0) {
        bool progressed = false;
        for (index_t r = 0; r < s.pp; ++r) {
            auto& i = next[std::size_t(r)];
            if (i == lists[std::size_t(r)].size()) continue;
            const Step& st = lists[std::size_t(r)][i];
            const index_t stage = s.virtual_stage(r, st.chunk);
            index_t ready = free_at[std::size_t(r)];
            const auto need = [&](int pass, index_t stg) {
                const auto it = done.find({pass, st.micro_batch, stg});
                if (it == done.end()) return false;
                ready = std::max(ready, it->second);
                return true;
            };
            bool ok = true;
            if (st.pass == Pass::forward) {
                if (stage > 0) ok = need(0, stage - 1);
            } else {
                ok = need(0, stage) && (stage == stages - 1 || need(1, stage + 1));
            }
            if (!ok) continue;
            done[{st.pass == Pass::forward ? 0 : 1, st.micro_batch, stage}] = ready + 1;
            free_at[std::size_t(r)] = ready + 1;
            ++i, --remaining, progressed = true;
        }
        if (!progressed) return -1;
    }
    return *std::max_element(free_at.begin(), free_at.end());
}

index_t simulate(const PipelineShape& s) {
    std::vector<std::vector<Step>> lists;
    for (index_t r = 0; r < s.pp; ++r) lists.push_back(interleaved_1f1b(s, r));
    return simulate(s, std::move(lists));
}

}  // namespace

TEST_CASE(
    "interleaved 1F1B, every rank: each (micro-batch, chunk) forward then backward once, equal counts per chunk, "
    "in-flight activations at most warm-up + 1") {
    int shapes = 0;
    for (const PipelineShape& s : sweep()) {
        ++shapes;
        for (index_t r = 0; r < s.pp; ++r) {
            INFO("PP ", s.pp, ", V ", s.v, ", M ", s.micro_batches, ", extra ", s.extra_warmup, ", rank ", r);
            const std::vector<Step> list = interleaved_1f1b(s, r);
            REQUIRE(index_t(list.size()) == 2 * s.micro_batches * s.v);
            std::set<std::pair<index_t, index_t>> forwarded, backwarded;
            std::vector<index_t> per_chunk(std::size_t(s.v), 0);
            index_t in_flight = 0, peak = 0;
            bool ordered = true;
            for (const Step& st : list) {
                REQUIRE(st.chunk >= 0);
                REQUIRE(st.chunk < s.v);
                REQUIRE(st.micro_batch >= 0);
                REQUIRE(st.micro_batch < s.micro_batches);
                const std::pair<index_t, index_t> key{st.micro_batch, st.chunk};
                if (st.pass == Pass::forward) {
                    ordered &= forwarded.insert(key).second;
                    ++per_chunk[std::size_t(st.chunk)], peak = std::max(peak, ++in_flight);
                } else {
                    ordered &= forwarded.count(key) == 1 && backwarded.insert(key).second;
                    --per_chunk[std::size_t(st.chunk)], --in_flight;
                }
                ordered &= in_flight >= 0;
            }
            CHECK(ordered);
            CHECK(forwarded.size() == std::size_t(s.micro_batches * s.v));
            CHECK(backwarded.size() == forwarded.size());
            CHECK(in_flight == 0);
            for (index_t c : per_chunk) CHECK(c == 0);
            const index_t w = warmup_forwards(s, r);
            CHECK(peak == std::min(w + 1, s.micro_batches * s.v));
            // the warm-up is all forwards, the cool-down all backwards
            for (index_t k = 0; k < w; ++k) CHECK(list[std::size_t(k)].pass == Pass::forward);
        }
    }
    CHECK(shapes > 100);
}

TEST_CASE("interleaved 1F1B: Megatron's warm-up counts and schedule table") {
    // Megatron test_schedules.py: PP 4, V 2, M 8 gives warm-ups 10, 8, 6, 4 for ranks 0..3
    const PipelineShape s{4, 2, 8};
    CHECK(warmup_forwards(s, 0) == 10);
    CHECK(warmup_forwards(s, 1) == 8);
    CHECK(warmup_forwards(s, 2) == 6);
    CHECK(warmup_forwards(s, 3) == 4);
    // with K2's extra warm-up micro-batch, one more each
    CHECK(warmup_forwards({4, 2, 8, 1}, 0) == 11);
    CHECK(warmup_forwards({4, 2, 8, 1}, 3) == 5);
    // K2's layout, PP 16 with V 2: rank 0 warms up with 30 + 16 forwards (47 with the extra one), the last with 16
    CHECK(warmup_forwards({16, 2, 64}, 0) == 46);
    CHECK(warmup_forwards({16, 2, 64, 1}, 0) == 47);
    CHECK(warmup_forwards({16, 2, 64}, 15) == 16);
    // plain 1F1B (V = 1): PP - rank - 1; capped at the number of forwards
    CHECK(warmup_forwards({4, 1, 8}, 0) == 3);
    CHECK(warmup_forwards({4, 1, 8}, 3) == 0);
    CHECK(warmup_forwards({8, 8, 8}, 0) == 64);
    // the order of virtual micro-batches: groups of PP micro-batches, cycling over the chunks
    const std::vector<Step> r3 = interleaved_1f1b(s, 3);
    const std::vector<std::pair<index_t, index_t>> first_forwards = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}};
    for (std::size_t k = 0; k < first_forwards.size(); ++k) {
        CHECK(r3[k].pass == Pass::forward);
        CHECK(std::pair{r3[k].micro_batch, r3[k].chunk} == first_forwards[k]);
    }
    // after the 4 warm-up forwards: forward (0, 1), then the first backward, of micro-batch 0 on the last chunk
    CHECK(r3[5] == Step{Pass::backward, 0, 1});
}

TEST_CASE("interleaved 1F1B: all ranks together never deadlock, and the bubble is (PP - 1) / (V M)") {
    for (const PipelineShape& s : sweep()) {
        if (s.extra_warmup) continue;  // checked below: the extra forward only moves work earlier
        INFO("PP ", s.pp, ", V ", s.v, ", M ", s.micro_batches);
        const index_t makespan = simulate(s);
        REQUIRE(makespan > 0);
        // each rank computes 2 M V unit steps; the rest of the makespan is bubble
        const index_t ideal = 2 * s.micro_batches * s.v;
        const double bubble = double(makespan - ideal) / double(ideal);
        CHECK(bubble == doctest::Approx(predicted_bubble(s)).epsilon(1e-12));
    }
    for (const PipelineShape& s : sweep())
        if (s.extra_warmup) {
            INFO("PP ", s.pp, ", V ", s.v, ", M ", s.micro_batches);
            CHECK(simulate(s) > 0);
        }
    // the simulation does find a deadlock: rank 1 of PP 2 running its list backwards waits for a backward that
    // waits for its own forwards
    const PipelineShape s{2, 2, 4};
    std::vector<std::vector<Step>> lists{interleaved_1f1b(s, 0), interleaved_1f1b(s, 1)};
    std::reverse(lists[1].begin(), lists[1].end());
    CHECK(simulate(s, lists) == -1);
}

TEST_CASE("pipeline schedule: shapes without a schedule are refused, naming the numbers") {
    CHECK_THROWS_WITH_AS(interleaved_1f1b({4, 2, 7}, 0), doctest::Contains("multiple of PP 4; got 7"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(interleaved_1f1b({4, 1, 3}, 0), doctest::Contains("3 micro-batches for 4 pipeline ranks"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(interleaved_1f1b({4, 2, 8}, 4), doctest::Contains("rank 4 outside [0, 4)"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(interleaved_1f1b({0, 1, 1}, 0), doctest::Contains("must be at least 1"),
                         std::invalid_argument);
    CHECK_NOTHROW(interleaved_1f1b({4, 2, 8}, 0));
    CHECK_NOTHROW(interleaved_1f1b({3, 1, 5}, 2));  // V = 1 takes any M >= PP
}

}  // namespace unit_parallel_schedule
