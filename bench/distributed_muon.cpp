// Distributed Muon, two ways, over every rank of the world as one data-parallel group (mpirun -np 2 / 4 / 8), on
// the same matrices in the same run: the measurement behind parallel::DistributedOptimizer's choice
// (docs/parallel.md, "Distributed Muon"). Run under mpirun; rank 0 reports.
//
//   mpirun -np 2 build/bench/bench_distributed_muon [--benchmark_filter=...]
//
// Whole (parallel/zero.hpp, what the library does): each matrix is owned whole by one rank, shared out greedily
//   by Newton-Schulz cost max(m, n) min(m, n)^2 (parallel::assign_by_cost). A step: the gradients reduce-scattered
//   into the owners' blocks, Muon on the owned matrices, the parameters all-gathered from their owners.
// Flat (ZeRO-1's flat shards, the matrices gathered for Newton-Schulz): the concatenated floats are cut into
//   equal contiguous slices; a rank keeps the momentum of its slice. A step: the gradients reduce-scattered into
//   the slices, the momentum and Nesterov update on the slice, each matrix's pieces sent to the rank that runs its
//   Newton-Schulz (assigned by the same cost rule; one all-to-all-v), Newton-Schulz there, the orthogonalised
//   pieces sent back to the slices' holders (one all-to-all-v), the decayed step on the slice, the parameters
//   all-gathered from the slices.
// Both give the same parameters (checked on each set before it is timed: max_abs_diff). Each row reports the
// slowest rank's time per step, the bytes the busiest rank and the mean rank send per step (Communicator::traffic),
// and the Muon state (momentum floats) of the fullest rank over the mean: what Flat's equal slices buy.
//
// Sets: tiny_k2 (every Muon matrix of the TinyK2 preset), k2_mla (q_a_proj, q_b_proj, kv_a_proj_with_mqa,
// kv_b_proj of a Kimi K2 layer), k2_expert (one routed expert: gate_proj, up_proj, down_proj). Fixed iteration
// counts (every rank must run the same collectives).
//
// bench-mpi: 2
// bench-smoke-filter: /set:0/
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config.hpp>
#include <moonmoe/nn.hpp>
#include <moonmoe/optim/muon.hpp>
#include <moonmoe/parallel/zero.hpp>

#include "support/mpi_bench.hpp"

namespace {

using namespace moonmoe;
using namespace moonmoe::parallel;
using Ops = backend::Ops<cpu>;
using moonmoe::bench::slowest;
using Shape2 = std::pair<index_t, index_t>;

MpiCommunicator* world_ptr = nullptr;
const MuonConfig muon_config = KimiK2::config.optimizer.muon;
constexpr double learning_rate = 0.02;

std::vector<Shape2> matrix_set(int set) {
    if (set == 1) return {{1536, 7168}, {12288, 1536}, {576, 7168}, {16384, 512}};
    if (set == 2) return {{2048, 7168}, {2048, 7168}, {7168, 2048}};
    std::vector<Shape2> shapes;
    nn::Transformer<cpu> model(TinyK2::config);
    model.visit_params([&](const ParamRef& p) {
        if (optim::route_by_kind(p, true) == optim::Route::muon) shapes.emplace_back(p.shape[0], p.shape[1]);
    });
    return shapes;
}
const char* const set_names[] = {"tiny_k2", "k2_mla", "k2_expert"};

/// The matrices of one set, end to end in one buffer: every rank's copy of the parameters, its own gradients.
struct Matrices {
    std::vector<Shape2> shapes;
    std::vector<index_t> offset;  ///< where each matrix starts; offset.back() is the total
    std::vector<float> w, g;

    Matrices(std::vector<Shape2> s, int rank) : shapes(std::move(s)), offset{0} {
        for (auto [r, c] : shapes) offset.push_back(offset.back() + r * c);
        w.resize(std::size_t(total())), g.resize(std::size_t(total()));
        Ops::fill_normal(View<float, 2>(w.data(), {1, total()}), 0.0f, 0.02f, 7);  // the same on every rank
        Ops::fill_normal(View<float, 2>(g.data(), {1, total()}), 0.0f, 1.0f, 100 + std::uint64_t(rank));
    }
    index_t total() const { return offset.back(); }
    index_t numel(std::size_t m) const { return offset[m + 1] - offset[m]; }
    Assignment newton_schulz_ranks(int ranks) const {
        std::vector<double> cost;
        for (auto [r, c] : shapes) cost.push_back(newton_schulz_cost(r, c));
        return assign_by_cost(cost, ranks);
    }
};

void copy_floats(const float* from, float* to, index_t n) { std::copy(from, from + n, to); }
void scale_floats(float* x, index_t n, float by) { Ops::map(fn::ScaleBy<float>{by}, View<float, 2>(x, {1, n})); }

/// The library's way: whole matrices owned by ranks.
class WholeMuon {
public:
    WholeMuon(Communicator& group, Matrices& m) : group_(group), m_(m), a_(m.newton_schulz_ranks(group.size())) {
        counts_.assign(std::size_t(group.size()), 0);
        for (std::size_t k = 0; k < m.shapes.size(); ++k) {
            at_.push_back(counts_[std::size_t(a_.owner[k])]);
            counts_[std::size_t(a_.owner[k])] += m.numel(k);
            if (mine(k)) momentum_.emplace_back(m.numel(k), 0.0f);
            else
                momentum_.emplace_back();
        }
        for (int r = 0; r < group.size(); ++r)
            start_.push_back(r == 0 ? 0 : start_.back() + counts_[std::size_t(r - 1)]);
        send_.resize(std::size_t(m.total())), all_.resize(std::size_t(m.total()));
        block_.resize(std::size_t(counts_[std::size_t(group.rank())]));
    }

    index_t state_floats() const { return counts_[std::size_t(group_.rank())]; }

    void step() {
        const std::size_t n = m_.shapes.size();
        for (std::size_t k = 0; k < n; ++k)
            copy_floats(m_.g.data() + m_.offset[k], send_.data() + start_[std::size_t(a_.owner[k])] + at_[k],
                        m_.numel(k));
        group_.reduce_scatter_v(std::span<const float>(send_), std::span<float>(block_), counts_);
        scale_floats(block_.data(), index_t(block_.size()), 1.0f / float(group_.size()));
        for (std::size_t k = 0; k < n; ++k) {
            if (!mine(k)) continue;
            const auto [rows, cols] = m_.shapes[k];
            float* w = m_.w.data() + m_.offset[k];
            optim::muon_step<KellerQuintic, cpu>(muon_config, learning_rate, View<float, 2>(w, {rows, cols}),
                                                 View<const float, 2>(block_.data() + at_[k], {rows, cols}),
                                                 View<float, 2>(momentum_[k].data(), {rows, cols}), ws_, u_, o_);
            copy_floats(w, block_.data() + at_[k], m_.numel(k));
        }
        group_.all_gather_v(std::span<const float>(block_), std::span<float>(all_), counts_);
        for (std::size_t k = 0; k < n; ++k)
            if (!mine(k))
                copy_floats(all_.data() + start_[std::size_t(a_.owner[k])] + at_[k], m_.w.data() + m_.offset[k],
                            m_.numel(k));
    }

private:
    bool mine(std::size_t k) const { return a_.owner[k] == group_.rank(); }

    Communicator& group_;
    Matrices& m_;
    Assignment a_;
    std::vector<index_t> counts_, start_,
        at_;  ///< floats per owner; owner blocks' starts; a matrix's place in its block
    std::vector<std::vector<float>> momentum_;
    std::vector<float> send_, all_, block_;
    optim::NSWorkspace<float, cpu> ws_;
    Tensor<float, 2> u_, o_;
};

/// ZeRO-1's flat slices, each matrix gathered to one rank for its Newton-Schulz and scattered back.
class FlatMuon {
public:
    FlatMuon(Communicator& group, Matrices& m) : group_(group), m_(m), a_(m.newton_schulz_ranks(group.size())) {
        const int n = group.size();
        for (int r = 0; r <= n; ++r) cut_.push_back(m.total() * r / n);  // rank r holds [cut_[r], cut_[r + 1])
        for (int r = 0; r < n; ++r) counts_.push_back(cut_[std::size_t(r) + 1] - cut_[std::size_t(r)]);
        lo_ = cut_[std::size_t(group.rank())], hi_ = cut_[std::size_t(group.rank()) + 1];
        momentum_.assign(std::size_t(hi_ - lo_), 0.0f);
        slice_.resize(momentum_.size()), u_.resize(momentum_.size()), o_.resize(momentum_.size());
        all_.resize(std::size_t(m.total()));
        // The pieces: matrix k's overlap with rank r's slice travels between r and k's Newton-Schulz rank.
        to_ns_.assign(std::size_t(n), 0), from_holders_.assign(std::size_t(n), 0);
        for (std::size_t k = 0; k < m.shapes.size(); ++k) {
            const int ns = a_.owner[k];
            to_ns_[std::size_t(ns)] += overlap(k, group.rank());
            if (ns == group.rank())
                for (int r = 0; r < n; ++r) from_holders_[std::size_t(r)] += overlap(k, r);
        }
        pieces_out_.resize(std::size_t(hi_ - lo_)), pieces_in_.resize(std::size_t(sum(from_holders_)));
        for (std::size_t k = 0; k < m.shapes.size(); ++k)
            if (a_.owner[k] == group.rank())
                whole_[k] = {std::vector<float>(std::size_t(m.numel(k))), std::vector<float>(std::size_t(m.numel(k)))};
    }

    index_t state_floats() const { return hi_ - lo_; }

    void step() {
        const std::size_t n = m_.shapes.size();
        const int ranks = group_.size();
        // 1. the gradients' mean over the group, into this rank's slice
        group_.reduce_scatter_v(std::span<const float>(m_.g), std::span<float>(slice_), counts_);
        scale_floats(slice_.data(), index_t(slice_.size()), 1.0f / float(ranks));
        // 2. momentum and the Nesterov update on the slice (elementwise: the same floats as on whole matrices)
        const index_t len = hi_ - lo_;
        Ops::map(fn::MuonMomentum{float(muon_config.momentum), muon_config.nesterov},
                 View<float, 2>(momentum_.data(), {1, len}), View<float, 2>(u_.data(), {1, len}),
                 View<const float, 2>(slice_.data(), {1, len}));
        // 3. the update's pieces to the Newton-Schulz ranks, grouped by destination, matrices in order
        index_t at = 0;
        for (int dest = 0; dest < ranks; ++dest)
            for (std::size_t k = 0; k < n; ++k)
                if (a_.owner[k] == dest) at += piece(k, group_.rank(), u_.data(), pieces_out_.data() + at, true);
        group_.all_to_all_v(std::span<const float>(pieces_out_.data(), std::size_t(at)), to_ns_,
                            std::span<float>(pieces_in_), from_holders_);
        // 4. Newton-Schulz on each matrix this rank runs, whole (pieces arrive by source rank, matrices in order)
        at = 0;
        for (int src = 0; src < ranks; ++src)
            for (auto& [k, buffers] : whole_) {
                const index_t len_k = overlap(k, src), first = std::max(m_.offset[k], cut_[std::size_t(src)]);
                copy_floats(pieces_in_.data() + at, buffers.first.data() + (first - m_.offset[k]), len_k);
                at += len_k;
            }
        for (auto& [k, buffers] : whole_) {
            const auto [rows, cols] = m_.shapes[k];
            optim::orthogonalise<KellerQuintic, cpu>(View<const float, 2>(buffers.first.data(), {rows, cols}),
                                                     View<float, 2>(buffers.second.data(), {rows, cols}),
                                                     muon_config.ns_steps, ws_, optim::Products::symmetric);
        }
        // 5. the orthogonalised pieces back to the slices' holders (the reverse exchange)
        at = 0;
        for (int src = 0; src < ranks; ++src)
            for (auto& [k, buffers] : whole_) {
                const index_t len_k = overlap(k, src), first = std::max(m_.offset[k], cut_[std::size_t(src)]);
                copy_floats(buffers.second.data() + (first - m_.offset[k]), pieces_in_.data() + at, len_k);
                at += len_k;
            }
        group_.all_to_all_v(std::span<const float>(pieces_in_), from_holders_,
                            std::span<float>(pieces_out_.data(), std::size_t(hi_ - lo_)), to_ns_);
        at = 0;
        for (int src = 0; src < ranks; ++src)
            for (std::size_t k = 0; k < n; ++k)
                if (a_.owner[k] == src) at += piece(k, group_.rank(), o_.data(), pieces_out_.data() + at, false);
        // 6. the decayed step on the slice, each matrix's piece with its own scale; then every rank's copy
        for (std::size_t k = 0; k < n; ++k) {
            const index_t first = std::max(m_.offset[k], lo_), last = std::min(m_.offset[k + 1], hi_);
            if (first >= last) continue;
            const auto [rows, cols] = m_.shapes[k];
            const float decay = float(1.0 - learning_rate * muon_config.weight_decay);
            const float step = float(learning_rate * optim::muon_update_scale(muon_config, rows, cols));
            Ops::map(fn::DecayAndStep{decay, step}, View<float, 2>(m_.w.data() + first, {1, last - first}),
                     View<const float, 2>(o_.data() + (first - lo_), {1, last - first}));
        }
        copy_floats(m_.w.data() + lo_, slice_.data(), hi_ - lo_);
        group_.all_gather_v(std::span<const float>(slice_), std::span<float>(all_), counts_);
        m_.w.swap(all_);
    }

private:
    /// The floats of matrix k inside rank r's slice.
    index_t overlap(std::size_t k, int r) const {
        return std::max<index_t>(
            0, std::min(m_.offset[k + 1], cut_[std::size_t(r) + 1]) - std::max(m_.offset[k], cut_[std::size_t(r)]));
    }
    /// Copies matrix k's part of this rank's slice between `slice` (indexed from lo_) and `packed`; its length.
    index_t piece(std::size_t k, int r, float* slice, float* packed, bool pack) const {
        const index_t len = overlap(k, r);
        if (len == 0) return 0;
        float* s = slice + (std::max(m_.offset[k], lo_) - lo_);
        if (pack) copy_floats(s, packed, len);
        else
            copy_floats(packed, s, len);
        return len;
    }
    static index_t sum(const std::vector<index_t>& v) { return std::accumulate(v.begin(), v.end(), index_t{0}); }

    Communicator& group_;
    Matrices& m_;
    Assignment a_;
    std::vector<index_t> cut_, counts_, to_ns_, from_holders_;
    index_t lo_ = 0, hi_ = 0;
    std::vector<float> momentum_, slice_, u_, o_, all_, pieces_out_, pieces_in_;
    std::map<std::size_t, std::pair<std::vector<float>, std::vector<float>>> whole_;  ///< u and O of each NS matrix
    optim::NSWorkspace<float, cpu> ws_;
};

/// The largest |difference| between the two ways' parameters after `steps` steps from the same start.
double disagreement(Communicator& w, int set, int steps) {
    Matrices a(matrix_set(set), w.rank()), b(matrix_set(set), w.rank());
    WholeMuon whole(w, a);
    FlatMuon flat(w, b);
    for (int s = 0; s < steps; ++s) whole.step(), flat.step();
    std::vector<double> worst = {0.0};
    for (std::size_t i = 0; i < a.w.size(); ++i) worst[0] = std::max(worst[0], double(std::abs(a.w[i] - b.w[i])));
    w.all_reduce(std::span<double>(worst), ReduceOp::max);
    return worst[0];
}

template <class Way>
void distributed_muon(benchmark::State& state) {
    MpiCommunicator& w = *world_ptr;
    const int set = int(state.range(0));
    static std::map<int, double> checked;  // each set once, before its first timed row
    if (!checked.count(set)) checked[set] = disagreement(w, set, 2);
    if (!(checked[set] <= 1e-6))
        throw std::runtime_error(std::string("Whole and Flat disagree on ") + set_names[set] + ": " +
                                 std::to_string(checked[set]));
    Matrices m(matrix_set(set), w.rank());
    Way way(w, m);
    way.step();  // untimed: the first touch of every buffer
    w.reset_traffic();
    for (auto _ : state) {
        state.SetIterationTime(slowest(w, [&] { way.step(); }));
        benchmark::DoNotOptimize(m.w.data());
    }
    std::vector<double> stats = {double(w.traffic().bytes) / double(state.iterations()), double(way.state_floats())};
    std::vector<double> sums = stats;
    w.all_reduce(std::span<double>(stats), ReduceOp::max);
    w.all_reduce(std::span<double>(sums), ReduceOp::sum);
    state.SetLabel(set_names[set]);
    state.counters["ranks"] = double(w.size());
    state.counters["matrices"] = double(m.shapes.size());
    state.counters["MB_sent_max_rank"] = stats[0] / 1e6;
    state.counters["MB_sent_mean"] = sums[0] / double(w.size()) / 1e6;
    state.counters["MB_params"] = double(m.total()) * sizeof(float) / 1e6;
    state.counters["state_max_over_mean"] = stats[1] / (sums[1] / double(w.size()));
    state.counters["max_abs_diff"] = checked[set];
}

void sets(benchmark::internal::Benchmark* b) {
    b->ArgName("set")->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(3);
    for (int s : {0, 1, 2}) b->Arg(s);
}
BENCHMARK_TEMPLATE(distributed_muon, WholeMuon)->Apply(sets);
BENCHMARK_TEMPLATE(distributed_muon, FlatMuon)->Apply(sets);

}  // namespace

int main(int argc, char** argv) {
    return moonmoe::bench::mpi_benchmark_main(argc, argv, [](MpiCommunicator& world) {
        world_ptr = &world;
        return "data-parallel group: " + std::to_string(world.size()) + " ranks; Muon (Keller quintic, " +
               std::to_string(muon_config.ns_steps) + " steps, f32); max_abs_diff: the two ways' largest parameter " +
               "difference after 2 steps from the same start (checked before timing, at most 1e-6)";
    });
}
