// train_tiny: QK-Clip at work. A small model of Kimi K2's shape learns the bytes of a text twice from the same
// initialisation: with Muon alone, whose maximum attention logit keeps growing past tau, and with MuonClip
// (Muon + QK-Clip), which holds it at tau; the losses stay together. In the spirit of the K2 report's Figures 2
// and 12.
//
//   train_tiny [--backend cpu|cuda] [--text FILE] [--steps N] [--lr X] [--tau X] [--seed N] [--threads N] [--out DIR]
//   [--help]
// --seed N (default 7) picks the initial weights and the batches (the same for both runs).
// --threads N (default: moonmoe::default_threads(), the CPUs this process may use after its affinity mask and cgroup
// CPU quota, or OMP_NUM_THREADS); a run is bitwise repeatable for a fixed thread count.
// Writes DIR/train_tiny.csv (step, loss, max logit per layer, heads clipped, for both runs) and DIR/train_tiny.png
// (drawn with cairo: support/plot.hpp), with the plotted points beside it in DIR/train_tiny.plot.csv.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "example_support.hpp"
#include "support/flags.hpp"
#include "support/plot.hpp"
#include "train_tiny.hpp"

namespace {

void progress_bar(const char* run, const train_tiny::StepLog& l, moonmoe::index_t steps, double seconds) {
    const int width = 30, done = int(width * l.step / steps);
    std::fprintf(stderr, "\r%-9s [%s%s] %4ld/%ld  loss %.3f  max logit %7.2f  clipped %ld  %5.1f s", run,
                 std::string(std::size_t(done), '#').c_str(), std::string(std::size_t(width - done), '.').c_str(),
                 long(l.step), long(steps), l.loss, l.max_logit, long(l.heads_clipped), seconds);
    if (l.step == steps) std::fprintf(stderr, "\n");
}

void usage(std::FILE* to, const train_tiny::Options& d) {
    std::fprintf(
        to,
        "usage: train_tiny [--backend cpu|cuda] [--text FILE] [--steps N] [--lr X] [--tau X] [--seed N] [--threads N]\n"
        "                  [--out DIR]\n"
        "Trains a Kimi K2-shaped tiny model on the bytes of a text twice from the same initialisation, with Muon\n"
        "and with MuonClip, and writes DIR/train_tiny.csv and DIR/train_tiny.png (loss and max logit per step).\n"
        "  --text FILE   training text, read as bytes (default %s)\n"
        "  --steps N     optimizer steps per run (default %ld)\n"
        "  --lr X        peak learning rate of Muon and AdamW (default %g)\n"
        "  --tau X       QK-Clip threshold (default %g)\n"
        "  --seed N      initial weights and batches, the same for both runs (default %llu)\n"
        "  --threads N   CPU threads (default: the CPUs this process may use, or OMP_NUM_THREADS); a run is\n"
        "                bitwise repeatable for a fixed thread count\n"
        "  --out DIR     output directory (default .)\n"
        "  --backend B   cpu or cuda (cuda: the train_tiny_cuda binary built by nvcc)\n"
        "  --help        this text\n",
        d.text.c_str(), long(d.steps), d.lr, d.tau, (unsigned long long)d.seed);
}

double mean_tail(const std::vector<train_tiny::StepLog>& h, std::size_t n) {
    double s = 0.0;
    for (std::size_t i = h.size() - std::min(n, h.size()); i < h.size(); ++i) s += h[i].loss;
    return s / double(std::min(n, h.size()));
}

}  // namespace

int main(int argc, char** argv) try {
    train_tiny::Options o;
    std::string out = ".";
    int threads = 0;  // 0: the library's default
    for (int i = 1; i < argc; ++i)
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(stdout, o), 0;
    const example::Backend backend = example::take_backend(argc, argv, "train_tiny");
    for (int i = 1; i < argc; ++i) {
        const auto value = [&](const char* flag) { return example::flag_text(argc, argv, i, flag); };
        const auto number = [&]<class T>(const char* flag, T& to) {
            to = example::flag_number<T>(argc, argv, i, flag);
        };
        if (!std::strcmp(argv[i], "--text")) o.text = value("--text");
        else if (!std::strcmp(argv[i], "--steps"))
            number("--steps", o.steps);
        else if (!std::strcmp(argv[i], "--lr"))
            number("--lr", o.lr);
        else if (!std::strcmp(argv[i], "--tau"))
            number("--tau", o.tau);
        else if (!std::strcmp(argv[i], "--seed"))
            number("--seed", o.seed);
        else if (!std::strcmp(argv[i], "--out"))
            out = value("--out");
        else if (!std::strcmp(argv[i], "--threads")) {
            number("--threads", threads);
            if (threads < 1) throw std::invalid_argument("--threads must be positive");
        } else
            throw std::invalid_argument(
                std::string("unknown argument '") + argv[i] +
                "'; usage: train_tiny [--backend cpu|cuda] [--text FILE] [--steps N] [--lr X] [--tau X] [--seed N] "
                "[--threads N] [--out DIR] (--help explains each)");
    }
    if (o.steps < 1) throw std::invalid_argument("--steps must be positive");
    // the optimizer refuses such settings too, by field; the command line names its own flags
    if (!std::isfinite(o.lr) || !(o.lr > 0.0) || o.lr > moonmoe::optim::max_learning_rate)
        throw std::invalid_argument("--lr is " + std::to_string(o.lr) +
                                    "; the learning rate must be finite and in (0, " +
                                    std::to_string(int(moonmoe::optim::max_learning_rate)) + "]");
    if (!std::isfinite(o.tau) || !(o.tau > 0.0))
        throw std::invalid_argument("--tau is " + std::to_string(o.tau) +
                                    "; QK-Clip's threshold must be finite and > 0");
    if (threads > 0) moonmoe::set_threads(threads);
    std::printf("threads: %s\n", threads > 0 ? (std::to_string(threads) + " (--threads)").c_str()
                                             : moonmoe::default_threads().describe().c_str());
    std::printf("train_tiny: %s, %lld parameters, %ld steps of %ld x %ld bytes from %s; lr %g, tau %g\n",
                "a Kimi K2-shaped model (MLA, dense first layer, 8 experts top-2 + 1 shared)",
                (long long)train_tiny::TinyModel::parameter_count(), long(o.steps), long(o.batch), long(o.seq),
                o.text.c_str(), o.lr, o.tau);

    std::vector<train_tiny::StepLog> runs[2];
    const char* names[2] = {"Muon", "MuonClip"};
    for (int r = 0; r < 2; ++r) {
        const auto start = std::chrono::steady_clock::now();
        const auto progress = [&](const train_tiny::StepLog& l) {
            progress_bar(names[r], l, o.steps,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        };
        example::with_backend(backend, [&]<class B>() {
            runs[r] = train_tiny::run<B>(o, r == 1, progress);
            return 0;
        });
    }

    std::filesystem::create_directories(out);
    const std::string csv = out + "/train_tiny.csv", png = out + "/train_tiny.png";
    std::ostringstream f;  // written atomically below (plot::write_file)
    f.precision(9);        // every float round-trips: a max logit a hair above tau stays visible
    const std::size_t layers = runs[0].front().layer_max.size();
    // max_logit_layer<l>: in the step's training forward; max_logit_after_step: the step's batch again, with the
    // weights the step left (after the update and, for MuonClip, the clip)
    f << "run,step,loss";
    for (std::size_t l = 0; l < layers; ++l) f << ",max_logit_layer" << l;
    f << ",max_logit_forward,max_logit_after_step,heads_clipped\n";
    for (int r = 0; r < 2; ++r)
        for (const auto& l : runs[r]) {
            f << names[r] << ',' << l.step << ',' << l.loss;
            for (float m : l.layer_max) f << ',' << m;
            f << ',' << l.max_logit << ',' << l.max_logit_after << ',' << l.heads_clipped << '\n';
        }
    moonmoe::plot::write_file(csv, f.str());

    using namespace moonmoe::plot;
    Figure fig;
    fig.title = "Kimi K2-shaped tiny model on bytes: Muon vs MuonClip (tau = " + std::to_string(int(o.tau)) + ")";
    Panel loss{"training loss", "step", "loss (nats / byte)"},
        logits{"max attention logit after each step", "step", "max scaled q.k"};
    for (int r = 0; r < 2; ++r) {
        Series s{names[r]}, m{names[r]};
        for (const auto& l : runs[r]) {
            s.x.push_back(double(l.step)), s.y.push_back(l.loss);
            m.x.push_back(double(l.step)), m.y.push_back(l.max_logit_after);
        }
        loss.series.push_back(s), logits.series.push_back(m);
    }
    logits.hlines.push_back({o.tau, "tau"});
    fig.panels = {loss, logits};
    write_png(png, fig);

    float peak[2] = {0, 0}, forward_peak[2] = {0, 0};
    moonmoe::index_t clipped = 0, exhausted = 0, above = 0;
    for (int r = 0; r < 2; ++r)
        for (const auto& l : runs[r]) {
            peak[r] = std::max(peak[r], l.max_logit_after), forward_peak[r] = std::max(forward_peak[r], l.max_logit);
            if (r == 1) clipped += l.heads_clipped, exhausted += l.clip_exhausted, above += l.max_logit_after > o.tau;
        }
    std::printf(
        "Muon alone: max logit after a step peaks at %.2f (%.2f x tau); final loss %.4f (mean of the last 20 "
        "steps)\n",
        peak[0], peak[0] / o.tau, mean_tail(runs[0], 20));
    std::printf(
        "MuonClip:   max logit after a step peaks at %.2f (%.6f x tau; %ld steps ended above tau), %ld head "
        "clips; the next batch's forward saw at most %.2f; final loss %.4f (%+.1f%%)\n",
        peak[1], peak[1] / o.tau, long(above), long(clipped), forward_peak[1], mean_tail(runs[1], 20),
        100.0 * (mean_tail(runs[1], 20) / mean_tail(runs[0], 20) - 1.0));
    if (exhausted > 0)  // the clip loop's promise did not hold on these steps: say so, never silently
        std::printf("MuonClip:   on %ld steps QK-Clip ran out of re-measure rounds with a head above tau\n",
                    long(exhausted));
    std::printf("wrote %s and %s\n", csv.c_str(), png.c_str());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "train_tiny: %s\n", e.what());
    return 1;
}
