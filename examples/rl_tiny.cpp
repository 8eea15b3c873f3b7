// rl_tiny: Kimi K2's post-training in miniature (Kimi K2 technical report, section 3.2.3). A small model of K2's shape
// first learns, briefly, the bytes of a text of sums ("17+25=42\n" lines) with MuonClip, as train_tiny learns its
// text; then reinforcement learning alone improves it on the task: for each prompt "a+b=" it samples K answers
// (rl::rollout, temperature from the type's TemperatureDecay, a token budget per answer, '\n' ends one), the
// example checks each (reward 1 for the right sum, else 0), and the K1.5 objective with MuonClip updates the model.
//
//   rl_tiny [--backend cpu|cuda] [--pretrain-steps N] [--iterations N] [--prompts P] [--k K] [--budget N]
//           [--budget-penalty X] [--ptx-weight X] [--rl-lr X] [--seed N] [--threads N] [--out DIR] [--help]
//
// Prints a progress line per iteration and the greedy accuracy on 200 held-out prompts before and after RL.
// Writes DIR/rl_tiny.csv (per iteration: temperature, mean reward, response length, truncated share, loss, PTX
// loss, max attention logit) and DIR/rl_tiny.png (reward, response length, loss and max-logit curves), with the
// plotted points in DIR/rl_tiny.plot.csv. --budget-penalty and --ptx-weight show budget control and the PTX loss
// (the text loss of the pre-training text is reported either way).
//
// example-test: --pretrain-steps 20 --iterations 3 --prompts 4 --k 4 --ptx-weight 0.5 --out @BINARY_DIR@/rl_tiny
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "example_support.hpp"
#include "support/flags.hpp"
#include "support/plot.hpp"
#include "train_tiny.hpp"

#if defined(__SANITIZE_ADDRESS__)
// LeakSanitizer (the sanitize preset runs this example) reports fontconfig's own leaks, made when cairo's text first
// loads the font configuration: not this code's (test/unit/plot.cpp, which suppresses them the same way, says more).
extern "C" const char* __lsan_default_suppressions() { return "leak:libfontconfig.so\n"; }
#endif

namespace {

using moonmoe::index_t;
namespace rl = moonmoe::rl;

/// The policy: train_tiny's model with the post-training settings of the type (config/rl.hpp).
using Policy = train_tiny::TinyModel::with<
    moonmoe::RL<moonmoe::Regularization<0.05>,
                moonmoe::TemperatureDecay<moonmoe::StartTemperature<1.2>, moonmoe::FinalTemperature<0.8>,
                                          moonmoe::DecayIterations<60>>>>;

struct Options {
    index_t pretrain_steps = 300, iterations = 80, prompts = 8, k = 8, budget = 4;
    double budget_penalty = 0.0, ptx_weight = 0.0, rl_lr = 3e-3;
    std::uint64_t seed = 1;
};

constexpr int max_operand = 20;  // a, b in [0, 20): sums of one or two digits

std::string equation(int a, int b) { return std::to_string(a) + "+" + std::to_string(b) + "="; }

std::vector<index_t> bytes(const std::string& s) {
    std::vector<index_t> ids;
    for (unsigned char c : s) ids.push_back(index_t(c));
    return ids;
}

/// The pre-training text: random sums, one per line.
std::vector<index_t> sums_text(std::uint64_t seed, int lines) {
    std::mt19937_64 rng(seed);
    std::string text;
    for (int i = 0; i < lines; ++i) {
        const int a = int(rng() % max_operand), b = int(rng() % max_operand);
        text += equation(a, b) + std::to_string(a + b) + "\n";
    }
    return bytes(text);
}

struct IterationLog {
    index_t iteration;
    double temperature, reward, length, truncated, loss, ptx_loss, max_logit;
};

template <class B>
struct Run {
    moonmoe::nn::Transformer<B> model{Policy::config};
    moonmoe::optim::Optimizer<Policy::optimizer, B> opt{model};
    std::vector<index_t> text;
    std::mt19937_64 rng;
    moonmoe::nn::TokenLayout layout = moonmoe::nn::TokenLayout::sequences(8, 64);

    explicit Run(std::uint64_t seed) : text(sums_text(seed + 1000, 20000)), rng(seed) {
        std::uint64_t s = seed;
        model.visit_params([&](const moonmoe::ParamRef& p) {  // as train_tiny: N(0, 1/fan_in), gains 1, bias 0
            if (p.kind == moonmoe::ParamKind::vector || p.kind == moonmoe::ParamKind::router_bias) return;
            const float std_dev =
                p.kind == moonmoe::ParamKind::embedding ? 1.0f : 1.0f / std::sqrt(float(p.shape.back()));
            moonmoe::backend::Ops<B>::fill_normal(moonmoe::View<float, 2, B>(p.value, {1, p.numel()}), 0.0f, std_dev,
                                                  s++);
        });
        model.refresh_working_weights();
        opt.config.muon.learning_rate = opt.config.adamw.learning_rate = 2e-2;
        opt.config.qk_clip.tau = 30.0;
        opt.config.schedule = {20, 1 << 30, 0, 1.0};  // a 20-step warm-up, then constant
    }

    /// A batch of the pre-training text: 8 windows of 64 bytes.
    std::vector<index_t> text_batch() {
        std::vector<index_t> ids;
        for (int b = 0; b < 8; ++b) {
            const std::size_t start = rng() % (text.size() - 64);
            ids.insert(ids.end(), text.begin() + std::ptrdiff_t(start), text.begin() + std::ptrdiff_t(start + 64));
        }
        return ids;
    }

    float pretrain_step() {
        const std::vector<index_t> ids = text_batch();
        model.zero_grad();
        const float loss = model.train_step(ids.data(), layout);
        opt.step();
        return loss;
    }

    /// The mean text loss over 8 fixed batches (no training): how much of the pre-training text the model keeps.
    double text_loss() {
        std::mt19937_64 fixed(99);
        double sum = 0.0;
        for (int i = 0; i < 8; ++i) {
            std::vector<index_t> ids;
            for (int b = 0; b < 8; ++b) {
                const std::size_t start = fixed() % (text.size() - 64);
                ids.insert(ids.end(), text.begin() + std::ptrdiff_t(start), text.begin() + std::ptrdiff_t(start + 64));
            }
            typename moonmoe::nn::Transformer<B>::Cache cache;
            const auto logits = model.forward(ids.data(), layout, cache);
            sum += moonmoe::nn::cross_entropy<B>(logits.view(), moonmoe::nn::causal_targets(ids.data(), layout).data());
        }
        return sum / 8.0;
    }

    /// Greedy accuracy on 200 held-out prompts (their own seed), answers of at most `budget` tokens.
    double accuracy(index_t budget) {
        std::mt19937_64 held_out(4242);
        std::vector<rl::RolloutRequest> requests;
        std::vector<int> answers;
        for (int i = 0; i < 200; ++i) {
            const int a = int(held_out() % max_operand), b = int(held_out() % max_operand);
            requests.push_back({bytes(equation(a, b)), 0, budget, {.temperature = 0.0}});
            answers.push_back(a + b);
        }
        const auto out = rl::rollout(model, std::span<const rl::RolloutRequest>(requests), {.stop_tokens = {'\n'}});
        int right = 0;
        for (std::size_t i = 0; i < out.size(); ++i) right += reward(out[i], answers[i]) > 0.5;
        return double(right) / double(out.size());
    }

    static double reward(const rl::Rollout& r, int answer) {
        if (r.finish != rl::Finish::stop) return 0.0;
        std::string s;
        for (index_t t : r.response) s += char(t);
        return s == std::to_string(answer) + "\n" ? 1.0 : 0.0;
    }

    IterationLog rl_iteration(const Options& o, index_t iteration) {
        // Muon's update has the learning rate's size whatever the gradient's (it is orthogonalised): RL, whose
        // gradients are small and noisy, takes a smaller rate than pre-training
        opt.config.muon.learning_rate = opt.config.adamw.learning_rate = o.rl_lr;
        const double temperature = Policy::rl::value.temperature.at(iteration);
        std::vector<rl::RolloutRequest> requests;
        std::vector<int> answers;
        for (index_t p = 0; p < o.prompts; ++p) {
            const int a = int(rng() % max_operand), b = int(rng() % max_operand);
            for (index_t k = 0; k < o.k; ++k) {
                requests.push_back({bytes(equation(a, b)), rng(), o.budget, {.temperature = temperature}});
                answers.push_back(a + b);
            }
        }
        const auto out = rl::rollout(model, std::span<const rl::RolloutRequest>(requests), {.stop_tokens = {'\n'}});
        std::vector<rl::Group> groups(std::size_t(o.prompts));
        IterationLog log{iteration, temperature, 0, 0, 0, 0, 0, 0};
        for (std::size_t i = 0; i < out.size(); ++i) {
            groups[i / std::size_t(o.k)].samples.push_back(rl::Sample::of(out[i], reward(out[i], answers[i])));
            log.length += double(out[i].response.size()) / double(out.size());
            log.truncated += out[i].truncated() ? 1.0 / double(out.size()) : 0.0;
        }
        rl::Objective objective = rl::Objective::of(Policy::rl::value);
        objective.budget_penalty = o.budget_penalty, objective.ptx_weight = o.ptx_weight;
        rl::PtxBatch ptx{text_batch(), layout};
        model.zero_grad();
        const rl::ObjectiveValue v =
            rl::k15_train_step(model, std::span<const rl::Group>(groups), objective, o.ptx_weight > 0 ? &ptx : nullptr);
        log.max_logit = -INFINITY;
        for (auto& layer : model.layers) {
            const std::vector<float> m = moonmoe::to_host(layer.self_attn.max_logit_per_head);
            log.max_logit = std::max(log.max_logit, double(*std::max_element(m.begin(), m.end())));
        }
        opt.step();
        log.reward = v.mean_reward, log.loss = v.loss, log.ptx_loss = v.ptx_loss;
        return log;
    }
};

void usage(std::FILE* to, const Options& d) {
    std::fprintf(
        to,
        "usage: rl_tiny [--backend cpu|cuda] [--pretrain-steps N] [--iterations N] [--prompts P] [--k K]\n"
        "               [--budget N] [--budget-penalty X] [--ptx-weight X] [--rl-lr X] [--seed N] [--threads N]\n"
        "               [--out DIR]\n"
        "Pre-trains a Kimi K2-shaped tiny model briefly on lines of sums, then improves it by RL alone (the\n"
        "K1.5 objective with MuonClip) on answering \"a+b=\"; writes DIR/rl_tiny.csv and DIR/rl_tiny.png.\n"
        "  --pretrain-steps N  MuonClip steps on the text of sums first (default %ld)\n"
        "  --iterations N      RL iterations: rollout, rewards, one optimizer step (default %ld)\n"
        "  --prompts P         prompts per iteration (default %ld)\n"
        "  --k K               sampled answers per prompt (default %ld)\n"
        "  --budget N          the most answer tokens (default %ld); a longer answer is truncated\n"
        "  --budget-penalty X  subtracted from a truncated answer's reward (default %g)\n"
        "  --ptx-weight X      weight of the PTX loss on the pre-training text (default %g)\n"
        "  --rl-lr X           Muon's and AdamW's learning rate during RL (default %g; pre-training 2e-2)\n"
        "  --seed N            initial weights, text, prompts and samples (default %llu)\n"
        "  --threads N         CPU threads (default: the CPUs this process may use)\n"
        "  --out DIR           output directory (default .)\n"
        "  --backend B         cpu or cuda (cuda: the rl_tiny_cuda binary built by nvcc)\n"
        "  --help              this text\n",
        long(d.pretrain_steps), long(d.iterations), long(d.prompts), long(d.k), long(d.budget), d.budget_penalty,
        d.ptx_weight, d.rl_lr, (unsigned long long)d.seed);
}

}  // namespace

int main(int argc, char** argv) try {
    Options o;
    std::string out = ".";
    int threads = 0;
    for (int i = 1; i < argc; ++i)
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) return usage(stdout, o), 0;
    const example::Backend backend = example::take_backend(argc, argv, "rl_tiny");
    for (int i = 1; i < argc; ++i) {
        const auto number = [&]<class T>(const char* flag, T& to) {
            to = example::flag_number<T>(argc, argv, i, flag);
        };
        const auto count = [&](const char* flag) {
            const long n = example::flag_number<long>(argc, argv, i, flag);
            if (n < 1) throw std::invalid_argument(std::string(flag) + " must be positive, not " + std::to_string(n));
            return index_t(n);
        };
        if (!std::strcmp(argv[i], "--pretrain-steps")) number("--pretrain-steps", o.pretrain_steps);
        else if (!std::strcmp(argv[i], "--iterations"))
            o.iterations = count("--iterations");
        else if (!std::strcmp(argv[i], "--prompts"))
            o.prompts = count("--prompts");
        else if (!std::strcmp(argv[i], "--k"))
            o.k = count("--k");
        else if (!std::strcmp(argv[i], "--budget"))
            o.budget = count("--budget");
        else if (!std::strcmp(argv[i], "--budget-penalty"))
            number("--budget-penalty", o.budget_penalty);
        else if (!std::strcmp(argv[i], "--ptx-weight"))
            number("--ptx-weight", o.ptx_weight);
        else if (!std::strcmp(argv[i], "--rl-lr"))
            number("--rl-lr", o.rl_lr);
        else if (!std::strcmp(argv[i], "--seed"))
            number("--seed", o.seed);
        else if (!std::strcmp(argv[i], "--out"))
            out = example::flag_text(argc, argv, i, "--out");
        else if (!std::strcmp(argv[i], "--threads")) {
            number("--threads", threads);
            if (threads < 1) throw std::invalid_argument("--threads must be positive");
        } else
            throw std::invalid_argument(std::string("unknown argument '") + argv[i] +
                                        "'; usage: rl_tiny [--backend cpu|cuda] [--pretrain-steps N] [--iterations N] "
                                        "[--prompts P] [--k K] [--budget N] [--budget-penalty X] [--ptx-weight X] "
                                        "[--rl-lr X] [--seed N] [--threads N] [--out DIR] (--help explains each)");
    }
    if (o.pretrain_steps < 0) throw std::invalid_argument("--pretrain-steps must be >= 0");
    if (threads > 0) moonmoe::set_threads(threads);

    std::vector<IterationLog> logs;
    double before = 0, after = 0, text_before = 0, text_after = 0;
    example::with_backend(backend, [&]<class B>() {
        Run<B> run(o.seed);
        const auto start = std::chrono::steady_clock::now();
        const auto seconds = [&] {
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        };
        for (index_t s = 1; s <= o.pretrain_steps; ++s) {
            const float loss = run.pretrain_step();
            std::fprintf(stderr, "\rpre-training %4ld/%ld  text loss %.3f  %5.1f s", long(s), long(o.pretrain_steps),
                         loss, seconds());
        }
        if (o.pretrain_steps > 0) std::fprintf(stderr, "\n");
        before = run.accuracy(o.budget), text_before = run.text_loss();
        std::printf("after pre-training: greedy accuracy %.1f%% on 200 held-out sums, text loss %.4f\n", 100 * before,
                    text_before);
        for (index_t it = 0; it < o.iterations; ++it) {
            logs.push_back(run.rl_iteration(o, it));
            const IterationLog& l = logs.back();
            std::fprintf(stderr,
                         "\rRL %4ld/%ld  T %.2f  reward %.3f  length %.2f  truncated %.2f  loss %.4f  max logit %.1f  "
                         "%5.1f s",
                         long(it + 1), long(o.iterations), l.temperature, l.reward, l.length, l.truncated, l.loss,
                         l.max_logit, seconds());
        }
        std::fprintf(stderr, "\n");
        after = run.accuracy(o.budget), text_after = run.text_loss();
        return 0;
    });
    std::printf("after %ld RL iterations: greedy accuracy %.1f%% (%+.1f points), text loss %.4f (%+.4f)\n",
                long(o.iterations), 100 * after, 100 * (after - before), text_after, text_after - text_before);
    const auto mean_reward = [&](std::size_t from, std::size_t to) {
        double s = 0;
        for (std::size_t i = from; i < to; ++i) s += logs[i].reward;
        return s / double(to - from);
    };
    const std::size_t window = std::max<std::size_t>(1, std::min<std::size_t>(10, logs.size() / 2));
    std::printf("mean sampled reward: first %zu iterations %.3f, last %zu %.3f\n", window, mean_reward(0, window),
                window, mean_reward(logs.size() - window, logs.size()));

    std::filesystem::create_directories(out);
    const std::string csv = out + "/rl_tiny.csv", png = out + "/rl_tiny.png";
    {
        std::ostringstream f;
        f.precision(9);
        f << "iteration,temperature,mean_reward,mean_response_tokens,truncated_share,loss,ptx_loss,max_logit\n";
        for (const auto& l : logs)
            f << l.iteration << ',' << l.temperature << ',' << l.reward << ',' << l.length << ',' << l.truncated << ','
              << l.loss << ',' << l.ptx_loss << ',' << l.max_logit << '\n';
        moonmoe::plot::write_file(csv, f.str());  // atomically: never a truncated file
    }
    using namespace moonmoe::plot;
    Figure fig;
    fig.title = "rl_tiny: the K1.5 objective with MuonClip on sums (" + std::to_string(o.k) + " answers per prompt)";
    Panel reward{"mean reward of the sampled answers", "RL iteration", "reward"},
        length{"answer length", "RL iteration", "tokens"}, loss{"objective", "RL iteration", "loss"},
        logits{"max attention logit", "RL iteration", "max scaled q.k"};
    Series r{"per iteration"}, n{"tokens"}, t{"truncated share"}, ls{"loss"}, m{"max logit"};
    for (const auto& l : logs) {
        const double x = double(l.iteration);
        r.x.push_back(x), r.y.push_back(l.reward), n.x.push_back(x), n.y.push_back(l.length);
        t.x.push_back(x), t.y.push_back(l.truncated), ls.x.push_back(x), ls.y.push_back(l.loss);
        m.x.push_back(x), m.y.push_back(l.max_logit);
    }
    Series smooth{"mean of the last 10"};  // the trend under the sampling noise
    for (std::size_t i = 0; i < logs.size(); ++i) {
        double sum = 0;
        const std::size_t from = i >= 9 ? i - 9 : 0;
        for (std::size_t j = from; j <= i; ++j) sum += logs[j].reward;
        smooth.x.push_back(double(logs[i].iteration)), smooth.y.push_back(sum / double(i - from + 1));
    }
    reward.series = {r, smooth}, length.series = {n, t}, loss.series = {ls}, logits.series = {m};
    logits.hlines.push_back({30.0, "tau"});
    fig.panels = {reward, length, loss, logits};
    write_png(png, fig);
    std::printf("wrote %s and %s\n", csv.c_str(), png.c_str());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "rl_tiny: %s\n", e.what());
    return 1;
}
