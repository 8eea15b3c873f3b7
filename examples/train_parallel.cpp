// train_parallel: the Kimi K2-shaped tiny model of train_tiny trained over MPI with pipeline, expert and ZeRO-1
// data parallelism, Parallel<PP, EP, DP> (default (2, 2, 2): 8 processes), with MuonClip; then, on rank 0, the same
// run in one process (Parallel<1, 1, 1>) for comparison. Each run is a moonmoe::Trainer of a model type that names
// all of it (sizes, optimizer, layout, virtual stages, micro-batches: TinyRun below); --layout and --virtual choose
// one of the types compiled in (--help lists them).
//
//   mpirun -np 8 train_parallel [--layout PP,EP,DP] [--virtual V] [--steps N] [--text FILE] [--seed N] [--out DIR]
//                               [--save] [--no-reference] [--help]
//
// Each step takes a global batch of EP x DP x M micro-batches of 2 sequences of 64 bytes from the text (the
// same file as train_tiny); token stream (ep, dp) runs its M micro-batches through the pipeline. With --save the
// parallel run writes DIR/train_parallel_checkpoint (one Hugging Face checkpoint of the whole model, each rank
// writing the tensors it owns) and its optimizer state in DIR/train_parallel_optimizer (a file per rank; any layout
// resumes from both). Rank 0 shows
// progress, then prints per rank the time in compute, communication and pipeline bubble and the bytes sent, and
// the bubble against the interleaved 1F1B formula (PP - 1) / (V M), and the bytes per step against
// parallel/traffic.hpp's formula. Writes DIR/train_parallel.csv (step, the loss
// of the parallel run and of the one-process run), DIR/train_parallel.png (both curves; drawn with cairo,
// support/plot.hpp, the plotted points in DIR/train_parallel.plot.csv), and
// DIR/train_parallel_ranks.csv (the per-rank figures).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <moonmoe/moonmoe.hpp>
#include <moonmoe/nn/init.hpp>
#include <moonmoe/parallel/mpi.hpp>
#include <moonmoe/parallel/pipeline.hpp>
#include <moonmoe/parallel/traffic.hpp>
#include <moonmoe/parallel/zero.hpp>

#include "support/flags.hpp"
#include "support/plot.hpp"
#include "train_tiny.hpp"

namespace {

using moonmoe::index_t;
using namespace moonmoe::parallel;

/// train_tiny's optimizer as a type: MuonClip at tau 30, Muon and AdamW at 2e-2 after 20 warm-up steps (then
/// constant), the correction bias moving at 1e-3 per step.
using TinyMuonClip = moonmoe::Optimizer<
    moonmoe::Muon<moonmoe::LearningRate<2e-2>>, moonmoe::AdamW<moonmoe::LearningRate<2e-2>>, moonmoe::QKClip<30>,
    moonmoe::WSD<moonmoe::Warmup<20>, moonmoe::Stable<1'000'000>, moonmoe::Decay<0>>, moonmoe::BiasUpdateRate<1e-3>>;

/// The whole run as one type: train_tiny's model (with a layer more where the pipeline has more chunks than its
/// three layers), TinyMuonClip, and the layout with V virtual stages and M micro-batches per token stream and step
/// (0: 4, or PP when that is more, so that the pipeline fills).
template <index_t PP, index_t EP, index_t DP, index_t V = 1, index_t M = 0>
using TinyRun =
    train_tiny::TinyModel::with<moonmoe::Dims<moonmoe::Hidden<128>, moonmoe::Layers<(PP * V > 3 ? PP * V : 3)>,
                                              moonmoe::DenseLayers<1>, moonmoe::Vocab<256>, moonmoe::DenseHidden<256>>,
                                TinyMuonClip,
                                moonmoe::Parallel<PP, EP, DP, moonmoe::VirtualStages<V>,
                                                  moonmoe::MicroBatches<(M        ? M
                                                                         : PP > 4 ? PP
                                                                                  : 4)>>>;

/// The runs compiled in, the first the default: --layout PP,EP,DP and --virtual V pick one.
using Runs = std::tuple<TinyRun<2, 2, 2>, TinyRun<2, 2, 2, 2>, TinyRun<2, 1, 1>, TinyRun<1, 2, 1>, TinyRun<1, 1, 2>,
                        TinyRun<2, 2, 1>, TinyRun<2, 1, 2>, TinyRun<1, 2, 2>, TinyRun<4, 1, 1>, TinyRun<4, 1, 1, 2>,
                        TinyRun<4, 2, 1>, TinyRun<4, 1, 2>, TinyRun<1, 4, 2>, TinyRun<1, 8, 1>, TinyRun<8, 1, 1>>;

/// The same run in one process: every token stream's micro-batches through the one model.
template <class Model>
using OneProcess = typename Model::template with<
    moonmoe::Parallel<1, 1, 1,
                      moonmoe::MicroBatches<Model::config.parallel.ep * Model::config.parallel.dp *
                                            Model::config.parallel.micro_batches>>>;

struct Options {
    index_t pp = 2, ep = 2, dp = 2, v = 1, steps = 60, sequences = 2, seq = 64;
    std::string text = train_tiny::Options{}.text, out = ".";
    std::uint64_t seed = 7;
    bool reference = true, save = false;
};

std::string layouts() {
    std::string list;
    std::apply(
        [&](auto... run) {
            ((list += "    " + std::to_string(decltype(run)::config.parallel.pp) + "," +
                      std::to_string(decltype(run)::config.parallel.ep) + "," +
                      std::to_string(decltype(run)::config.parallel.dp) + "  --virtual " +
                      std::to_string(decltype(run)::config.parallel.virtual_stages) + "  (" +
                      std::to_string(decltype(run)::config.parallel.micro_batches) + " micro-batches)\n"),
             ...);
        },
        Runs{});
    return list;
}

void usage(std::FILE* to, const Options& d) {
    std::fprintf(
        to,
        "usage: train_parallel [--layout PP,EP,DP] [--virtual V] [--steps N] [--text FILE] [--seed N]\n"
        "                      [--out DIR] [--save] [--no-reference] [--help]\n"
        "Run under mpirun with PP x EP x DP processes (default 2,2,2: mpirun -np 8). Trains train_tiny's Kimi\n"
        "K2-shaped model with pipeline (interleaved 1F1B), expert and ZeRO-1 data parallelism and MuonClip, then\n"
        "the same run in one process on rank 0; writes DIR/train_parallel.csv and .png (both loss curves) and\n"
        "DIR/train_parallel_ranks.csv (per rank: compute, communication and bubble seconds, bytes sent).\n"
        "  --layout PP,EP,DP   the process layout (default %ld,%ld,%ld), one of the model types compiled in:\n%s"
        "  --virtual V         model chunks per pipeline rank (default %ld)\n"
        "  --steps N           optimizer steps (default %ld)\n"
        "  --text FILE         training text, read as bytes (default %s)\n"
        "  --seed N            initial weights and batches (default %llu)\n"
        "  --out DIR           output directory (default .)\n"
        "  --save              save the parallel run: DIR/train_parallel_checkpoint (Hugging Face) and its\n"
        "                      optimizer state in DIR/train_parallel_optimizer\n"
        "  --no-reference      skip the one-process run\n"
        "  --help              this text\n",
        long(d.pp), long(d.ep), long(d.dp), layouts().c_str(), long(d.v), long(d.steps), d.text.c_str(),
        (unsigned long long)d.seed);
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const auto value = [&](const char* flag) { return example::flag_text(argc, argv, i, flag); };
        const auto number = [&]<class T>(const char* flag, T& to) {
            to = example::flag_number<T>(argc, argv, i, flag);
        };
        if (!std::strcmp(argv[i], "--layout")) {
            const std::string s = value("--layout");
            long a = 0, b = 0, c = 0;
            char tail = 0;
            if (std::sscanf(s.c_str(), "%ld,%ld,%ld%c", &a, &b, &c, &tail) != 3 || a < 1 || b < 1 || c < 1)
                throw std::invalid_argument("--layout takes PP,EP,DP (three positive integers), got '" + s + "'");
            o.pp = a, o.ep = b, o.dp = c;
        } else if (!std::strcmp(argv[i], "--virtual"))
            number("--virtual", o.v);
        else if (!std::strcmp(argv[i], "--steps"))
            number("--steps", o.steps);
        else if (!std::strcmp(argv[i], "--text"))
            o.text = value("--text");
        else if (!std::strcmp(argv[i], "--seed"))
            number("--seed", o.seed);
        else if (!std::strcmp(argv[i], "--out"))
            o.out = value("--out");
        else if (!std::strcmp(argv[i], "--save"))
            o.save = true;
        else if (!std::strcmp(argv[i], "--no-reference"))
            o.reference = false;
        else if (!std::strcmp(argv[i], "--backend"))
            value("--backend");  // cpu (anything else is refused in main)
        else
            throw std::invalid_argument(std::string("unknown argument '") + argv[i] + "' (--help lists them)");
    }
    if (o.steps < 1 || o.v < 1) throw std::invalid_argument("--steps and --virtual must be positive");
    return o;
}

/// The text's sequences of one step: [stream][micro-batch] -> ids (sequences x seq), the same on every rank.
class Batches {
public:
    Batches(const Options& o, index_t streams, index_t micro_batches)
        : o_(o), streams_(streams), micro_batches_(micro_batches), text_(train_tiny::read_bytes(o.text)) {
        if (index_t(text_.size()) < o.seq + 1) throw std::runtime_error(o.text + ": too short for one sequence");
    }
    std::vector<std::vector<std::vector<index_t>>> next() {
        std::vector<std::vector<std::vector<index_t>>> b(static_cast<std::size_t>(streams_));
        for (auto& stream : b)
            for (index_t m = 0; m < micro_batches_; ++m) {
                std::vector<index_t> ids;
                for (index_t s = 0; s < o_.sequences; ++s) {
                    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
                    const auto start = std::ptrdiff_t((state_ >> 17) % std::uint64_t(text_.size() - o_.seq));
                    ids.insert(ids.end(), text_.begin() + start, text_.begin() + start + o_.seq);
                }
                stream.push_back(std::move(ids));
            }
        return b;
    }

private:
    Options o_;
    index_t streams_, micro_batches_;
    std::vector<index_t> text_;
    std::uint64_t state_ = 0x9E3779B97F4A7C15ull;
};

struct Totals {
    double compute = 0, communication = 0, bubble = 0, optimizer = 0, total = 0;
    double bytes = 0, optimizer_bytes = 0;
    StepTraffic predicted;  ///< per step (parallel/traffic.hpp)
    double parameters = 0;  ///< of this rank's part
};

/// Trains `steps` steps of the run `Model` (the layout of its type; on `world`, or in this process alone when
/// `world` is null); returns the mean loss per step (on every rank). `streams` token streams of M micro-batches each
/// make a step's global batch, whatever the layout. `save`: the run's checkpoint and optimizer state, at the end.
template <class Model>
std::vector<float> train(const Options& o, Communicator* world, index_t streams, Totals& totals, bool show_progress,
                         const char* label, const std::string& save = {}) {
    constexpr moonmoe::ParallelConfig p = Model::config.parallel;
    std::unique_ptr<moonmoe::Trainer<Model>> made;
    if constexpr (moonmoe::Trainer<Model>::one_process) {
        if (!world) made = std::make_unique<moonmoe::Trainer<Model>>(moonmoe::TrainerOptions{.seed = o.seed});
    }
    if (!made) made = std::make_unique<moonmoe::Trainer<Model>>(*world, moonmoe::TrainerOptions{.seed = o.seed});
    moonmoe::Trainer<Model>& run = *made;
    if (show_progress) std::fprintf(stderr, "%s: %s\n", label, run.kernels().c_str());
    run.model().visit_params([&](const moonmoe::ParamRef& param) { totals.parameters += double(param.numel()); });
    const auto layout = moonmoe::nn::TokenLayout::sequences(o.sequences, o.seq);
    ProcessGroups* g = run.groups();
    if (g) totals.predicted = step_traffic(run.config(), g->at, layout.tokens());
    Batches batches(o, streams, p.micro_batches * p.ep * p.dp / streams);  // each stream's micro-batches
    std::vector<float> losses;
    const auto start = std::chrono::steady_clock::now();
    for (index_t step = 1; step <= o.steps; ++step) {
        auto all = batches.next();
        std::vector<std::vector<index_t>> mine;
        if (run.replicas() == 1)
            for (auto& stream : all)
                for (auto& mb : stream) mine.push_back(std::move(mb));
        else
            mine = std::move(all[std::size_t(run.replica())]);
        const Traffic before = g ? g->traffic() : Traffic{};
        const auto step_start = std::chrono::steady_clock::now();
        losses.push_back(run.step(mine, layout));
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
        const auto& t = run.timing();  // the pipeline's share of the step; the rest is the optimizer
        totals.compute += t.compute, totals.communication += t.communication, totals.bubble += t.bubble;
        totals.total += seconds, totals.optimizer += seconds - t.total;
        totals.bytes += double(t.bytes_sent);
        if (g) totals.optimizer_bytes += double(g->traffic().bytes - before.bytes) - double(t.bytes_sent);
        if (show_progress) {
            const int width = 30, done = int(width * step / o.steps);
            const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            std::fprintf(stderr, "\r%-10s [%s%s] %4ld/%ld  loss %.3f  %6.1f s", label,
                         std::string(std::size_t(done), '#').c_str(),
                         std::string(std::size_t(width - done), '.').c_str(), long(step), long(o.steps), losses.back(),
                         elapsed);
            if (step == o.steps) std::fprintf(stderr, "\n");
        }
    }
    if (!save.empty()) {
        run.save(save + "_checkpoint");
        run.save_optimizer_state(save + "_optimizer");
    }
    return losses;
}

/// The run of the layout type `Model` on `world`, with the one-process run beside it on rank 0, and the report.
template <class Model>
void run_layout(const Options& o, Communicator& world) {
    constexpr moonmoe::ModelConfig c = Model::config;
    const int me = world.rank();
    const index_t streams = c.parallel.ep * c.parallel.dp;
    if (me == 0)
        std::printf(
            "train_parallel: %lld parameters, Parallel<%ld, %ld, %ld> V=%ld on %d processes; %ld steps of "
            "%ld x %ld micro-batches of %ld x %ld bytes from %s\n",
            (long long)Model::parameter_count(), long(c.parallel.pp), long(c.parallel.ep), long(c.parallel.dp),
            long(c.parallel.virtual_stages), world.size(), long(o.steps), long(streams), long(c.parallel.micro_batches),
            long(o.sequences), long(o.seq), o.text.c_str());
    Totals t;
    const std::vector<float> parallel =
        train<Model>(o, &world, streams, t, me == 0, "parallel", o.save ? o.out + "/train_parallel" : "");

    // per rank: where the time went, the bytes sent
    std::vector<double> mine = {
        t.compute,        t.communication, t.bubble,          t.optimizer,
        t.total,          t.bytes,         t.optimizer_bytes, t.predicted.pipeline + t.predicted.expert,
        t.predicted.zero, t.parameters};
    std::vector<double> all(mine.size() * std::size_t(world.size()));
    world.all_gather(std::span<const double>(mine), std::span<double>(all));
    const double predicted = bubble_fraction(c.parallel, c.parallel.micro_batches);
    std::vector<std::string> rows;
    if (me == 0) {
        std::printf("per rank over %ld steps (seconds; bytes sent to other ranks):\n", long(o.steps));
        std::printf(
            "rank (pp,ep,dp)  params  compute  all-to-all+p2p  bubble  optimizer  total   bubble/busy   MB sent "
            "per step: pipeline+EP (formula)   ZeRO-1 (flat ZeRO-1)\n");
        const RankLayout layout(c.parallel);
        double bubble_sum = 0, pipeline_sum = 0, longest = 0;
        for (int r = 0; r < world.size(); ++r) {
            const double* v = all.data() + std::size_t(r) * mine.size();
            longest = std::max(longest, v[4] - v[3]);
        }
        for (int r = 0; r < world.size(); ++r) {
            const double* v = all.data() + std::size_t(r) * mine.size();
            const Coordinates at = layout.coordinates(r);
            const double busy = v[0];                            // the pipeline's compute
            bubble_sum += longest - busy, pipeline_sum += busy;  // idle: waits, and the flush of the slowest
            const double per_step = 1e6 * double(o.steps);
            std::printf(
                "%4d (%ld,%ld,%ld)  %6.0f  %7.2f  %14.2f  %6.2f  %9.2f  %6.2f  %10.1f%%   %13.3f (%7.3f)   %6.3f "
                "(%6.3f)\n",
                r, long(at.pp), long(at.ep), long(at.dp), v[9], v[0], v[1], v[2], v[3], v[4], 100.0 * v[2] / busy,
                v[5] / per_step, v[7] / 1e6, v[6] / per_step, v[8] / 1e6);
            rows.push_back(std::to_string(r) + "," + std::to_string(at.pp) + "," + std::to_string(at.ep) + "," +
                           std::to_string(at.dp) + "," + std::to_string(v[9]) + "," + std::to_string(v[0]) + "," +
                           std::to_string(v[1]) + "," + std::to_string(v[2]) + "," + std::to_string(v[3]) + "," +
                           std::to_string(v[4]) + "," + std::to_string(v[5]) + "," + std::to_string(v[6]) + "," +
                           std::to_string(v[7]) + "," + std::to_string(v[8]));
        }
        std::printf(
            "pipeline bubble: measured %.1f%% (over all ranks, the time a rank idled while the slowest "
            "rank's pipeline ran, over the time it worked), interleaved 1F1B predicts (PP - 1) / (V M) = "
            "%.1f%% (equal chunks, free transfers, a core per process)\n",
            100.0 * bubble_sum / pipeline_sum, 100.0 * predicted);
    }

    std::vector<float> single;
    if (o.reference && me == 0) {  // rank 0 alone, without a communicator
        Totals ignored;
        single = train<OneProcess<Model>>(o, nullptr, streams, ignored, true, "1 process");
    }
    if (me == 0) {
        std::filesystem::create_directories(o.out);
        const std::string csv = o.out + "/train_parallel.csv", png = o.out + "/train_parallel.png",
                          ranks = o.out + "/train_parallel_ranks.csv";
        std::ostringstream f;  // both CSVs written atomically (plot::write_file)
        f.precision(9);
        f << "step,loss_parallel" << (single.empty() ? "" : ",loss_one_process") << "\n";
        double worst = 0;
        for (std::size_t s = 0; s < parallel.size(); ++s) {
            f << s + 1 << ',' << parallel[s];
            if (!single.empty()) {
                f << ',' << single[s];
                worst = std::max(worst, std::abs(double(parallel[s]) - single[s]) / std::abs(double(single[s])));
            }
            f << '\n';
        }
        moonmoe::plot::write_file(csv, f.str());
        std::ostringstream rf;
        rf << "rank,pp,ep,dp,parameters,compute_s,communication_s,bubble_s,optimizer_s,total_s,pipeline_ep_bytes,zero_"
              "bytes,"
              "formula_pipeline_ep_bytes_per_step,formula_flat_zero_bytes_per_step\n";
        for (const std::string& r : rows) rf << r << '\n';
        moonmoe::plot::write_file(ranks, rf.str());
        using namespace moonmoe::plot;
        Figure fig;
        fig.title = "train_parallel: Parallel<" + std::to_string(o.pp) + ", " + std::to_string(o.ep) + ", " +
                    std::to_string(o.dp) + "> V=" + std::to_string(o.v) + " vs one process (MuonClip)";
        Panel loss{"training loss", "step", "loss (nats / byte)"};
        Series a{"Parallel<" + std::to_string(o.pp) + ", " + std::to_string(o.ep) + ", " + std::to_string(o.dp) + ">"};
        for (std::size_t s = 0; s < parallel.size(); ++s) a.x.push_back(double(s + 1)), a.y.push_back(parallel[s]);
        loss.series.push_back(a);
        if (!single.empty()) {
            Series b{"one process"};
            for (std::size_t s = 0; s < single.size(); ++s) b.x.push_back(double(s + 1)), b.y.push_back(single[s]);
            loss.series.push_back(b);
        }
        fig.panels = {loss};
        if (!single.empty()) {  // the curves overlap: their distance, step by step
            Panel diff{"the two losses' relative difference", "step", "|a - b| / b"};
            Series d{"Parallel<" + std::to_string(o.pp) + ", " + std::to_string(o.ep) + ", " + std::to_string(o.dp) +
                     "> vs one process"};
            for (std::size_t s = 0; s < single.size(); ++s)
                d.x.push_back(double(s + 1)),
                    d.y.push_back(std::abs(double(parallel[s]) - single[s]) / std::abs(double(single[s])));
            diff.series.push_back(d);
            fig.panels.push_back(diff);
        }
        write_png(png, fig);
        std::printf("final loss %.4f%s\n", parallel.back(),
                    single.empty() ? ""
                                   : (" (one process: " + std::to_string(single.back()) +
                                      "; largest relative difference over the steps " + std::to_string(worst) + ")")
                                         .c_str());
        std::printf("wrote %s, %s and %s\n", csv.c_str(), png.c_str(), ranks.c_str());
    }
}

/// Runs the type of Runs whose layout the options name.
void run(const Options& o, Communicator& world) {
    bool found = false;
    std::apply(
        [&](auto... run) {
            const auto try_one = [&]<class Model>(Model) {
                constexpr moonmoe::ParallelConfig p = Model::config.parallel;
                if (found || p.pp != o.pp || p.ep != o.ep || p.dp != o.dp || p.virtual_stages != o.v) return;
                found = true;
                run_layout<Model>(o, world);
            };
            (try_one(run), ...);
        },
        Runs{});
    if (!found)
        throw std::invalid_argument("--layout " + std::to_string(o.pp) + "," + std::to_string(o.ep) + "," +
                                    std::to_string(o.dp) + " --virtual " + std::to_string(o.v) +
                                    ": not one of the model types compiled in; these are:\n" + layouts());
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(stdout, Options{}), 0;
        if (!std::strcmp(argv[i], "--backend") && i + 1 < argc && std::strcmp(argv[i + 1], "cpu") != 0) {
            std::fprintf(stderr,
                         "train_parallel: --backend %s: this binary was built without CUDA; it runs the CPU "
                         "backend over MPI (the CUDA backend's communicator is NCCL's, parallel/nccl.hpp; "
                         "configure with -DMOONMOE_BUILD_CUDA=ON for the CUDA examples)\n",
                         argv[i + 1]);
            return 1;
        }
    }
    MpiSession mpi(&argc, &argv);
    std::unique_ptr<Communicator> world = mpi.world();
    try {
        const Options o = parse(argc, argv);
        moonmoe::set_threads(1);  // one thread per process: the ranks share this machine's cores
        run(o, *world);
        return 0;
    } catch (const std::exception& e) {
        MpiSession::abort(1, std::string("train_parallel: ") + e.what());
    }
}
