// kimi_k2_1t: the full Kimi K2 model as a type, next to DeepSeek-V3: what it holds, what a token costs, and what
// one rank of K2's Parallel<16, 16, DP> training layout keeps in memory (all computed at compile time; nothing
// of the 1T parameters is allocated). Then a real computation at full width: one Kimi K2 MoE decoder layer,
// forward and backward, with the routed experts of one expert-parallel rank.
//
//   kimi_k2_1t [--tokens N]        the accounting, then the full-width layer on N tokens (default 256)
//   kimi_k2_1t --accounting-only   the accounting alone (milliseconds)
//   kimi_k2_1t --backend cpu|cuda  where the layer runs; the nvcc build (kimi_k2_1t_cuda) runs it on the GPU when
//                                  one is present unless told --backend cpu, the C++ compiler's build on the CPU
//   kimi_k2_1t --precision bf16    the layer under Precision<BF16> (bf16 products on the tensor cores on a GPU)
//   kimi_k2_1t --weights bf16      the layer under Precision<BF16, Weights<BF16>>: its matrices stored in bf16
//   kimi_k2_1t --activations P     what the layer keeps for backward (Activations<...>): f32 (default), bf16,
//                                  recompute (bf16 + K2's selective recomputation), k2 (+ FP8 MLP inputs),
//                                  k2-offload (+ offload: the CUDA backend only)
// example-test: --accounting-only
#include <sys/resource.h>

#include <array>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "example_support.hpp"

namespace {

using moonmoe::index_t;

// K2 pre-trained at a 4096-token context (report §2.5).
constexpr index_t kSeqLen = 4096;

// Everything the example prints is a constant expression: the counts below are evaluated by the compiler.
constexpr auto k2 = moonmoe::KimiK2::parameters();
constexpr auto v3 = moonmoe::DeepSeekV3::parameters();
constexpr auto k2_flops = moonmoe::KimiK2::flops_per_token(kSeqLen);
constexpr auto v3_flops = moonmoe::DeepSeekV3::flops_per_token(kSeqLen);
static_assert(k2.total == 1'026'408'232'448 && v3.total == 671'026'419'200);

std::string grouped(index_t v) {
    std::string digits = std::to_string(v < 0 ? -v : v), out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return v < 0 ? "-" + out : out;
}

void row(const char* what, index_t a, index_t b) {
    std::printf("  %-44s %22s %22s\n", what, grouped(a).c_str(), grouped(b).c_str());
}
void rowf(const char* what, const char* unit, double a, double b) {
    std::printf("  %-44s %18.2f %-3s %18.2f %-3s\n", what, a, unit, b, unit);
}
void heading(const char* title) { std::printf("\n%s\n  %-44s %22s %22s\n", title, "", "Kimi K2", "DeepSeek-V3"); }

template <class Model>
void print_pipeline(const char* name) {
    constexpr auto& par = Model::config.parallel;
    constexpr index_t layers = Model::config.dims.layers;
    std::printf("\n%s on Parallel<PP=%ld, EP=%ld, DP>, %ld virtual stages per pipeline rank (%ld chunks):\n", name,
                long(par.pp), long(par.ep), long(par.virtual_stages), long(par.chunks()));
    std::printf("  layers per chunk, in pipeline order:");
    for (index_t c = 0; c < par.chunks(); ++c) std::printf(" %ld", long(moonmoe::layers_in_chunk(par, layers, c)));
    std::printf("\n  layers per pipeline rank (its %ld chunks):", long(par.virtual_stages));
    for (index_t r = 0; r < par.pp; ++r) {
        index_t n = 0;
        for (index_t c = r; c < par.chunks(); c += par.pp) n += moonmoe::layers_in_chunk(par, layers, c);
        std::printf(" %ld", long(n));
    }
    std::printf("\n  interleaved 1F1B bubble (PP-1)/(V*m):");
    for (index_t m : {16, 32, 64, 128})
        std::printf("  m=%ld: %.1f%%", long(m), 100.0 * moonmoe::bubble_fraction(par, m));
    std::printf("\n");
}

template <class Model>
void print_memory(const char* name) {
    std::printf("\n%s, bytes held by the most loaded rank (BF16 weights, FP32 gradient buffer, ZeRO-1 %s state):\n",
                name, Model::config.optimizer.muon.enabled ? "Muon + AdamW" : "AdamW");
    std::printf("  %6s %6s %8s %12s %10s %10s %10s %10s %10s\n", "DP", "GPUs", "rank", "layers", "params", "weights",
                "grads", "optimizer", "total");
    for (index_t dp : {1, 2, 8, 32}) {
        const moonmoe::RankMemory m = Model::memory_per_rank(dp);
        std::printf("  %6ld %6ld %8ld %5ld (%ld MoE) %8.2f B %7.2f GB %7.2f GB %7.2f GB %7.2f GB\n", long(dp),
                    long(dp * Model::config.parallel.model_parallel_ranks()), long(m.pipeline_rank), long(m.layers),
                    long(m.moe_layers), m.params() / 1e9, m.weight_bytes / 1e9, m.gradient_bytes / 1e9,
                    m.optimizer_bytes / 1e9, m.total_bytes() / 1e9);
    }
}

// Activations at K2's training setting (report §2.4.2-2.4.3): 4096-token sequences, one per micro-batch,
// interleaved 1F1B with one extra warm-up forward, at a DP where ZeRO-1's optimizer shard is small.
constexpr index_t kActivationDp = 32;
constexpr moonmoe::ActivationSetup activation_setup(const moonmoe::ActivationsConfig& a) {
    return {.seq_len = kSeqLen, .micro_batch = 1, .activations = a, .extra_warmup = 1};
}

/// Per step of the report's activation reduction (activation_steps::all): the rank holding the most bytes,
/// activations included.
template <class Model>
constexpr std::array<moonmoe::RankMemory, 5> busiest_per_policy() {
    std::array<moonmoe::RankMemory, 5> out{};
    for (std::size_t i = 0; i < out.size(); ++i)
        out[i] = moonmoe::most_loaded_rank(Model::config, kActivationDp,
                                           activation_setup(moonmoe::activation_steps::all[i]));
    return out;
}
constexpr auto k2_busiest = busiest_per_policy<moonmoe::KimiK2>();
constexpr auto v3_busiest = busiest_per_policy<moonmoe::DeepSeekV3>();
// K2 with recomputation and FP8 storage: rank 2 (chunks 2 and 18, two MoE layers each) holds 44 units of 2 layers;
// its states are the ~30 GB of the report's §2.4.2, its activations about 54 GB more (an H800 has 80).
static_assert(k2_busiest[3].pipeline_rank == 2 && k2_busiest[3].in_flight == 44);
static_assert(k2_busiest[3].state_bytes() == moonmoe::KimiK2::memory_per_rank(kActivationDp).total_bytes());
static_assert(k2_busiest[3].activation_bytes == 88 * moonmoe::layer_activations(moonmoe::KimiK2::config, false, kSeqLen)
                                                         .bytes(moonmoe::activation_steps::fp8));
static_assert(k2_busiest[0].activation_bytes > 8 * k2_busiest[0].state_bytes());  // f32 caches: far beyond a GPU
static_assert(k2_busiest[4].total_bytes() < 40'000'000'000);                      // offload: states + 3 units

template <class Model>
constexpr index_t moe_layer_bytes(const moonmoe::ActivationsConfig& s) {
    return moonmoe::layer_activations(Model::config, false, kSeqLen).bytes(s);
}

void print_activations() {
    std::printf(
        "\nActivations kept for backward, micro-batches of 1 x %ld tokens, on the most loaded rank of\n"
        "Parallel<16, 16, %ld> (interleaved 1F1B, V = 2, one extra warm-up forward); GB = 1e9 bytes.\n"
        "units: (micro-batch, chunk) pairs in flight at the rank's peak; states: weights, gradients, optimizer.\n",
        long(kSeqLen), long(kActivationDp));
    std::printf("  %-22s | %-47s | %-47s\n", "", "Kimi K2", "DeepSeek-V3");
    std::printf("  %-22s |", "policy");
    for (int m = 0; m < 2; ++m)
        std::printf(" %9s %4s %5s %8s %7s %8s |", "MoE layer", "rank", "units", "activ.", "states", "total");
    std::printf("\n");
    for (std::size_t i = 0; i < k2_busiest.size(); ++i) {
        const auto& s = moonmoe::activation_steps::all[i];
        std::printf("  %-22s |", moonmoe::activation_steps::names[i]);
        const moonmoe::RankMemory* r[2] = {&k2_busiest[i], &v3_busiest[i]};
        const index_t layer[2] = {moe_layer_bytes<moonmoe::KimiK2>(s), moe_layer_bytes<moonmoe::DeepSeekV3>(s)};
        for (int m = 0; m < 2; ++m)
            std::printf(" %6.3f GB %4ld %5ld %5.1f GB %4.1f GB %5.1f GB |", layer[m] / 1e9, long(r[m]->pipeline_rank),
                        long(r[m]->in_flight), r[m]->activation_bytes / 1e9, r[m]->state_bytes() / 1e9,
                        r[m]->total_bytes() / 1e9);
        std::printf("\n");
    }
    std::printf(
        "  A unit is one chunk's layers for one micro-batch (2 MoE layers on the middle ranks). Under offload\n"
        "  the GPU keeps 3 units (being computed, offloaded, prefetched) of the rank's largest chunk: the last\n"
        "  rank, whose last chunk holds the head's f32 loss gradient (%ld x vocab x 4 B), becomes the busiest.\n",
        long(kSeqLen));
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
double peak_rss_gib() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

/// Waits for the GPU's queued work before a clock is read (the CPU's work is done when its call returns).
template <class B>
void wait_for_device() {
#if MOONMOE_EXAMPLE_HAS_CUDA && !MOONMOE_CUDA_EMULATED
    if constexpr (std::is_same_v<B, moonmoe::cuda>)
        MOONMOE_CUDA_CHECK(cudaStreamSynchronize(moonmoe::backend::current_stream()));
#endif
}

/// Whether this binary can run the layer on a GPU, and one is present.
bool gpu_present() {
#if MOONMOE_EXAMPLE_HAS_CUDA && !MOONMOE_CUDA_EMULATED
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
}

/// The layer's norms and memory: |output|, |d input|, the peak resident memory, what its parameters hold as stored
/// and their f32 gradients.
void print_norms_and_memory(auto& layer, double out_norm_squared, double grad_norm_squared) {
    double stored = 0, grads = 0;
    layer.visit_params("layer", [&](const moonmoe::ParamRef& p) {
        stored += double(p.numel()) * ((p.value ? 4 : 0) + (p.value16 ? 2 : 0));
        grads += p.grad ? 4.0 * double(p.numel()) : 0.0;
    });
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    std::printf(
        "  |output| = %.1f, |d input| = %.1f; peak resident memory %.2f GiB (weights %.2f GiB as stored,\n"
        "  f32 gradients %.2f GiB)\n",
        std::sqrt(out_norm_squared), std::sqrt(grad_norm_squared), peak_rss_gib(), stored / GiB, grads / GiB);
}

/// The gradient error FP8 storage of the MLP inputs causes at full width: the same forward and backward again with
/// the MLP inputs kept unquantized, ||g_fp8 - g|| / ||g|| for the input gradient and per parameter (the routed
/// experts: the first four, to bound the host copies).
template <class B, class Layer, class Mat>
void report_fp8_error(Layer& layer, const moonmoe::ModelConfig& cfg, const Mat& h, const Mat& dout, const Mat& dh_fp8,
                      index_t tokens) {
    std::map<std::string, std::vector<float>> fp8;
    const auto compared = [](const moonmoe::ParamRef& p) {
        const auto e = p.name.find(".experts.");
        return p.grad && (e == std::string::npos || std::stol(p.name.substr(e + 9)) < 4);
    };
    layer.visit_params("layer", [&](const moonmoe::ParamRef& p) {
        if (compared(p)) fp8[p.name] = moonmoe::to_host(moonmoe::View<const float, 1, B>(p.grad, {p.numel()}));
        if (p.grad) moonmoe::backend::Ops<B>::fill(moonmoe::View<float, 2, B>(p.grad, {1, p.numel()}), 0.0f);
    });
    moonmoe::ActivationsConfig exact = cfg.activations;
    exact.fp8_mlp_inputs = false;
    layer.set_activations(exact);
    typename Layer::Cache cache;
    Mat out({tokens, cfg.dims.hidden}), dh({tokens, cfg.dims.hidden});
    layer.forward(h.view(), moonmoe::nn::TokenLayout::sequences(1, tokens), out.view(), cache);
    layer.backward(dout.view(), cache, dh.view());
    const auto distance = [](const std::vector<float>& a, const std::vector<float>& b) {
        double d = 0, n = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
            d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(b[i]) * b[i];
        return n > 0 ? std::sqrt(d / n) : std::sqrt(d);
    };
    std::vector<std::pair<double, std::string>> errors;
    layer.visit_params("layer", [&](const moonmoe::ParamRef& p) {
        if (compared(p))
            errors.emplace_back(
                distance(fp8.at(p.name), moonmoe::to_host(moonmoe::View<const float, 1, B>(p.grad, {p.numel()}))),
                p.name);
    });
    std::sort(errors.begin(), errors.end());
    std::printf(
        "  FP8 MLP inputs against unquantized ones, ||g_fp8 - g|| / ||g||: the input gradient %.4f; %zu\n"
        "  parameter gradients: median %.4f, worst %.4f (%s)\n",
        distance(moonmoe::to_host(dh_fp8), moonmoe::to_host(dh)), errors.size(), errors[errors.size() / 2].first,
        errors.back().first, errors.back().second.c_str());
}

/// The layer's own forward and backward under an activation policy: the bytes its cache keeps, beside the
/// accounting's count of the same layer.
template <class B, class Layer, class Mat>
int run_whole_layer(Layer& layer, const moonmoe::ModelConfig& cfg, const Mat& h, const Mat& dout, index_t tokens) {
    const index_t H = cfg.dims.hidden;
    const auto layout = moonmoe::nn::TokenLayout::sequences(1, tokens);
    typename Layer::Cache cache;
    Mat out({tokens, H}), dh({tokens, H});
    std::printf("  [3/5] %-44s", "forward");
    std::fflush(stdout);
    auto t = Clock::now();
    layer.forward(h.view(), layout, out.view(), cache);
    wait_for_device<B>();
    const double forward_seconds = since(t);
    std::printf("%6.2f s\n", forward_seconds);
    const double kept = double(cache.bytes());
    std::printf("  [4/5] %-44s", "backward");
    std::fflush(stdout);
    t = Clock::now();
    layer.backward(dout.view(), cache, dh.view());
    wait_for_device<B>();
    const double backward_seconds = since(t);
    std::printf("%6.2f s\n", backward_seconds);
    double out_norm = 0, grad_norm = 0;
    for (float v : moonmoe::to_host(out)) out_norm += double(v) * v;
    for (float v : moonmoe::to_host(dh)) grad_norm += double(v) * v;
    constexpr double MiB = 1024.0 * 1024.0;
    // The accounting's count of this layer (config/accounting.hpp): one process (its experts' pairs are the ones
    // routed here, counted after the forward), and of the layer of Parallel<16, 16, DP>'s EP rank 0 when the 16
    // ranks each bring as many tokens (balanced routing: it receives tokens x TopK rows from its group)
    moonmoe::ModelConfig one = cfg;
    one.parallel.ep = 1;
    moonmoe::KeptTensors here = moonmoe::layer_activations(one, false, tokens);
    const index_t pairs = layer.moe.expert_rows;
    for (int i = 0; i < here.count; ++i)
        if (std::string_view(here.tensors[i].name).starts_with("experts.")) here.tensors[i].rows = pairs;
    const moonmoe::ActivationsConfig& storage = cfg.activations;
    const double predicted = double(here.bytes(storage));
    const double ep_rank = double(moonmoe::layer_activations(cfg, false, tokens).bytes(storage));
    std::printf("\n  layer                   %7.2f s forward %8.2f s backward\n", forward_seconds, backward_seconds);
    std::printf(
        "  kept for backward: %.2f MiB; the accounting: %.2f MiB for this layer (%ld pairs on its experts),\n"
        "  %.2f MiB for EP rank 0 of Parallel<16, 16, DP> with %ld tokens on each rank\n",
        kept / MiB, predicted / MiB, long(pairs), ep_rank / MiB, long(tokens));
    print_norms_and_memory(layer, out_norm, grad_norm);
    if (cfg.activations.fp8_mlp_inputs) report_fp8_error<B>(layer, cfg, h, dout, dh, tokens);
    return 0;
}

/// One Kimi K2 MoE layer at full width, holding the 24 routed experts of expert-parallel rank 0 of 16, on backend B.
template <class B>
int run_full_width_layer(index_t tokens, moonmoe::PrecisionConfig precision, moonmoe::ActivationsConfig activations,
                         bool whole_layer) {
    using DecoderLayer = moonmoe::nn::DecoderLayer<B>;
    using Mat = moonmoe::Tensor<float, 2, B>;
    using Ops = moonmoe::backend::Ops<B>;
    constexpr bool gpu = !std::is_same_v<B, moonmoe::cpu>;
    // KimiK2::with<Precision<BF16>> for --precision bf16 (and Weights<BF16> for --weights bf16): the same sizes,
    // the precision chosen at run time
    moonmoe::ModelConfig cfg = moonmoe::KimiK2::config;
    cfg.precision = precision;
    cfg.activations = activations;  // --activations: the layer's own forward and backward, its kept bytes
    constexpr index_t ep = moonmoe::KimiK2::config.parallel.ep, local = moonmoe::KimiK2::config.moe.experts / ep,
                      H = moonmoe::KimiK2::config.dims.hidden;
    std::printf(
        "\nOne Kimi K2 decoder layer at full width, forward and backward, %ld tokens (one sequence), on the %s,"
        " %s compute, %s weights, activations %s:\n",
        long(tokens), gpu ? "GPU" : "CPU", moonmoe::format_name(precision.compute),
        moonmoe::format_name(precision.weights), moonmoe::activation_step_name(activations));
    std::printf(
        "  computed:     MLA with 64 heads (q latent 1536, kv latent 512 + rope 64), RMSNorms, residuals, the\n"
        "                sigmoid router over all 384 experts, the shared expert, and the routed experts of one\n"
        "                expert-parallel rank (%ld of 384: experts 0..%ld of Parallel<16, 16, DP>'s rank 0)\n",
        long(local), long(local - 1));
    std::printf(
        "  not computed: the other %ld experts (they live on the 15 other EP ranks; their tokens would\n"
        "                leave and return by all-to-all), the other 60 layers, embeddings and head\n",
        long(cfg.moe.experts - local));

    auto step = [](int i, const char* what) {
        std::printf("  [%d/5] %-44s", i, what);
        std::fflush(stdout);
        return Clock::now();
    };
    auto t = step(1, "allocating weights, zeroing gradients");
    DecoderLayer layer(cfg, /*index=*/1, /*first_expert=*/0, /*expert_count=*/local);
    layer.visit_params("layer", [](const moonmoe::ParamRef& p) {  // as every training step does, in parallel
        if (p.grad) Ops::fill(moonmoe::View<float, 2, B>(p.grad, {p.shape[0], p.numel() / p.shape[0]}), 0.0f);
    });
    wait_for_device<B>();
    std::printf("%6.2f s\n", since(t));

    t = step(2, "initialising weights (uniform, fan-in scaled)");
    std::uint64_t seed = 1;
    layer.visit_params("layer", [&](const moonmoe::ParamRef& p) {
        if (p.kind == moonmoe::ParamKind::vector) return;             // norm gains stay 1
        if (p.kind == moonmoe::ParamKind::router_bias) return;        // the correction bias starts at 0
        const float bound = std::sqrt(3.0f / float(p.shape.back()));  // unit-variance outputs
        // drawn in f32 (for bf16-stored weights one matrix at a time, then rounded)
        moonmoe::nn::write_values<B>(p,
                                     [&](moonmoe::View<float, 2, B> v) { Ops::fill_uniform(v, -bound, bound, seed); });
        ++seed;
    });
    layer.refresh_working();  // Precision<BF16>: the products read bf16 copies of the masters just written
    Mat h({tokens, H}), out({tokens, H}), dout({tokens, H}), dh({tokens, H});
    Ops::fill_normal(h.view(), 0.0f, 1.0f, 1000);
    Ops::fill_normal(dout.view(), 0.0f, 1.0f, 1001);
    wait_for_device<B>();
    std::printf("%6.2f s\n", since(t));

    const auto layout = moonmoe::nn::TokenLayout::sequences(1, tokens);
    typename DecoderLayer::Cache cache;
    Mat a_in({tokens, H}), attn({tokens, H}), h1({tokens, H}), m_in({tokens, H}), m({tokens, H});
    moonmoe::Tensor<float, 1, B> rstd1({tokens}), rstd2({tokens});
    double fwd_norm = 0, fwd_attn = 0, bwd_norm = 0, bwd_attn = 0;
    // On the GPU each part is timed to its end (wait_for_device); MoE's own part timers read the host clock
    // without waiting, so there only the MoE block as a whole is timed.
    double fwd_moe = 0, bwd_moe = 0;

    if (whole_layer) return run_whole_layer<B>(layer, cfg, h, dout, tokens);

    t = step(3, "forward");
    auto p = Clock::now();
    layer.input_layernorm.forward(h.view(), a_in.view(), rstd1.view());
    wait_for_device<B>();
    fwd_norm += since(p), p = Clock::now();
    layer.self_attn.forward(a_in.view(), layout, attn.view(), cache.attn);
    wait_for_device<B>();
    fwd_attn += since(p), p = Clock::now();
    layer.add(h.view(), attn.view(), h1.view());
    layer.post_attention_layernorm.forward(h1.view(), m_in.view(), rstd2.view());
    wait_for_device<B>();
    fwd_norm += since(p), p = Clock::now();
    layer.moe.forward(m_in.view(), m.view(), cache.moe);
    wait_for_device<B>();
    fwd_moe += since(p);
    layer.add(h1.view(), m.view(), out.view());
    wait_for_device<B>();
    const double forward_seconds = since(t);
    const auto forward_times = layer.moe.times;
    std::printf("%6.2f s\n", forward_seconds);

    t = step(4, "backward");
    Mat dm({tokens, H}), dh1({tokens, H}), da({tokens, H});
    p = Clock::now();
    layer.moe.backward(dout.view(), cache.moe, dm.view());
    wait_for_device<B>();
    bwd_moe += since(p), p = Clock::now();
    Ops::copy(dout.view(), dh1.view());
    layer.post_attention_layernorm.backward(h1.view(), rstd2.view(), dm.view(), dh1.view(),
                                            moonmoe::nn::Accumulate::yes);
    wait_for_device<B>();
    bwd_norm += since(p), p = Clock::now();
    layer.self_attn.backward(dh1.view(), cache.attn, da.view());
    wait_for_device<B>();
    bwd_attn += since(p), p = Clock::now();
    Ops::copy(dh1.view(), dh.view());
    layer.input_layernorm.backward(h.view(), rstd1.view(), da.view(), dh.view(), moonmoe::nn::Accumulate::yes);
    wait_for_device<B>();
    bwd_norm += since(p);
    const double backward_seconds = since(t);
    std::printf("%6.2f s\n", backward_seconds);

    t = step(5, "checking the results are finite");
    double out_norm = 0, grad_norm = 0;
    for (float v : moonmoe::to_host(out)) out_norm += double(v) * v;  // on the GPU: copied back once, to check
    for (float v : moonmoe::to_host(dh)) grad_norm += double(v) * v;
    std::printf("%6.2f s\n", since(t));

    const auto& mt = layer.moe.times;
    const index_t routed_here = layer.moe.expert_rows;
    std::printf("\n  time per part            forward   backward\n");
    std::printf("  MLA (64 heads)          %7.2f s %8.2f s\n", fwd_attn, bwd_attn);
    if (gpu) {
        std::printf(
            "  MoE (router, %2ld routed  %7.2f s %8.2f s   %ld of %ld (token, expert) pairs are on this rank\n"
            "       and shared expert)\n",
            long(local), fwd_moe, bwd_moe, long(routed_here), long(tokens * cfg.moe.top_k));
    } else {
        std::printf("  router (384 experts)    %7.2f s %8.2f s\n", forward_times.router,
                    mt.router - forward_times.router);
        std::printf("  routed experts (%2ld)     %7.2f s %8.2f s   %ld of %ld (token, expert) pairs are on this rank\n",
                    long(local), forward_times.experts, mt.experts - forward_times.experts, long(routed_here),
                    long(tokens * cfg.moe.top_k));
        std::printf("  shared expert           %7.2f s %8.2f s\n", forward_times.shared,
                    mt.shared - forward_times.shared);
    }
    std::printf("  norms and residuals     %7.2f s %8.2f s\n", fwd_norm, bwd_norm);
    std::printf("  layer                   %7.2f s %8.2f s\n", forward_seconds, backward_seconds);
    print_norms_and_memory(layer, out_norm, grad_norm);
    if (gpu)
        std::printf("  peak GPU tensor memory %.2f GiB\n",
                    double(moonmoe::backend::Memory<B>::stats().peak.load()) / (1024.0 * 1024.0 * 1024.0));
    return 0;
}

}  // namespace

int main(int argc, char** argv) try {
    bool layer = true;
    index_t tokens = 256;
    moonmoe::PrecisionConfig precision;
    moonmoe::ActivationsConfig activations;
    bool activations_given = false;
    for (int i = 1; i < argc; ++i)
        if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
            std::printf(
                "usage: %s [--backend cpu|cuda] [--precision f32|bf16] [--weights f32|bf16]\n"
                "       [--activations f32|bf16|recompute|k2|k2-offload] [--tokens N | --accounting-only]\n"
                "  the Kimi K2 type's accounting beside DeepSeek-V3's, then one full-width K2 decoder layer\n"
                "  forward and backward on N tokens (default 256); --accounting-only skips the layer\n"
                "  --backend: where the layer runs (default: the GPU in the nvcc build when one is present,\n"
                "  else the CPU)\n"
                "  --precision: the layer's compute policy, Precision<F32> (default) or Precision<BF16>\n"
                "  (docs/precision.md)\n"
                "  --weights bf16: the layer's matrices stored in bf16, Precision<BF16, Weights<BF16>>\n"
                "  (implies --precision bf16)\n"
                "  --activations: what the layer keeps for backward (docs/activation_memory.md): f32\n"
                "  (Activations<>), bf16 (Storage<BF16>), recompute (+ Recompute<KimiK2Selection>), k2\n"
                "  (KimiK2Activations: + MlpInputs<FP8>), k2-offload (+ Offload<true>, CUDA only); all but\n"
                "  f32 imply --precision bf16\n",
                argv[0]);
            return 0;
        }
    const bool backend_given = [&] {
        for (int i = 1; i < argc; ++i)
            if (std::string(argv[i]).rfind("--backend", 0) == 0) return true;
        return false;
    }();
    example::Backend backend = example::take_backend(argc, argv, "kimi_k2_1t");
    if (!backend_given && gpu_present()) backend = example::Backend::cuda;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--accounting-only")) {
            layer = false;
        } else if (!std::strcmp(argv[i], "--precision") && i + 1 < argc) {
            const std::string p = argv[++i];
            if (p != "f32" && p != "bf16") {
                std::fprintf(stderr, "kimi_k2_1t: --precision is f32 or bf16, got '%s'\n", p.c_str());
                return 2;
            }
            precision.compute = p == "bf16" ? moonmoe::NumberFormat::bf16 : moonmoe::NumberFormat::f32;
        } else if (!std::strcmp(argv[i], "--weights") && i + 1 < argc) {
            const std::string w = argv[++i];
            if (w != "f32" && w != "bf16") {
                std::fprintf(stderr, "kimi_k2_1t: --weights is f32 or bf16, got '%s'\n", w.c_str());
                return 2;
            }
            precision.weights = w == "bf16" ? moonmoe::NumberFormat::bf16 : moonmoe::NumberFormat::f32;
        } else if (!std::strcmp(argv[i], "--activations") && i + 1 < argc) {
            const std::string a = argv[++i];
            activations_given = true;
            if (a == "f32") activations = moonmoe::Activations<>::value;
            else if (a == "bf16")
                activations = moonmoe::Activations<moonmoe::Storage<moonmoe::BF16>>::value;
            else if (a == "recompute")
                activations = moonmoe::Activations<moonmoe::Recompute<moonmoe::KimiK2Selection>,
                                                   moonmoe::Storage<moonmoe::BF16>>::value;
            else if (a == "k2")
                activations = moonmoe::KimiK2Activations::value;
            else if (a == "k2-offload")
                activations = moonmoe::KimiK2ActivationsOffloaded::value;
            else {
                std::fprintf(stderr, "kimi_k2_1t: --activations is f32, bf16, recompute, k2 or k2-offload, got '%s'\n",
                             a.c_str());
                return 2;
            }
        } else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
            tokens = std::atol(argv[++i]);
            if (tokens < 1) {
                std::fprintf(stderr, "kimi_k2_1t: --tokens needs a positive count, got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            std::fprintf(stderr,
                         "usage: %s [--backend cpu|cuda] [--precision f32|bf16] [--weights f32|bf16] "
                         "[--activations f32|bf16|recompute|k2|k2-offload] "
                         "[--tokens N | --accounting-only]\n",
                         argv[0]);
            return 2;
        }
    }
    if (precision.weights == moonmoe::NumberFormat::bf16 || activations.storage == moonmoe::NumberFormat::bf16)
        precision.compute = moonmoe::NumberFormat::bf16;
    std::printf("moonmoe %d.%d.%d: Kimi K2 as a C++ type (no weights allocated; all figures are constexpr)\n",
                MOONMOE_VERSION_MAJOR, MOONMOE_VERSION_MINOR, MOONMOE_VERSION_PATCH);

    heading("Parameters per component");
    row("embed_tokens", k2.embedding, v3.embedding);
    row("attention (MLA) per layer, incl. latent norms", k2.attention_layer.total(), v3.attention_layer.total());
    row("  q_a_proj", k2.attention_layer.q_a_proj, v3.attention_layer.q_a_proj);
    row("  q_b_proj", k2.attention_layer.q_b_proj, v3.attention_layer.q_b_proj);
    row("  kv_a_proj_with_mqa", k2.attention_layer.kv_a_proj_with_mqa, v3.attention_layer.kv_a_proj_with_mqa);
    row("  kv_b_proj", k2.attention_layer.kv_b_proj, v3.attention_layer.kv_b_proj);
    row("  o_proj", k2.attention_layer.o_proj, v3.attention_layer.o_proj);
    row("attention, all layers", k2.attention, v3.attention);
    row("dense MLPs (first layers)", k2.dense_mlps, v3.dense_mlps);
    row("routed experts per MoE layer", k2.routed_experts_layer, v3.routed_experts_layer);
    row("routed experts, all MoE layers", k2.routed_experts, v3.routed_experts);
    row("shared experts, all MoE layers", k2.shared_experts, v3.shared_experts);
    row("routers (gate + correction bias), all", k2.routers, v3.routers);
    row("RMSNorm gains (2 per layer + final)", k2.layer_norms, v3.layer_norms);
    row("lm_head", k2.lm_head, v3.lm_head);
    row("TOTAL", k2.total, v3.total);
    row("total without embed_tokens and lm_head", k2.total_without_embeddings, v3.total_without_embeddings);
    row("ACTIVATED per token (without embed_tokens)", k2.active, v3.active);
    row("activated with embed_tokens too", k2.active_with_embeddings, v3.active_with_embeddings);
    row("activated without embed_tokens and lm_head", k2.active_without_embeddings, v3.active_without_embeddings);
    std::printf(
        "  ACTIVATED follows the published convention (embed_tokens is a lookup, not multiplied by): it is the\n"
        "  count behind DeepSeek-V3's 37B and the K2 report's 32B (section 1), as for DeepSeek-V2's 21B and\n"
        "  V2-Lite's 2.4B. The report's Table 2 (1.04T / 32.6B) follows no convention that the released\n"
        "  config.json reproduces (it gives 1.026T); the exact counts above are what the weights hold.\n");

    heading("Forward FLOPs per token at sequence length 4096");
    row("attention projections", k2_flops.attention_projections, v3_flops.attention_projections);
    row("attention scores (q.k, p.v; causal)", k2_flops.attention_scores, v3_flops.attention_scores);
    row("dense MLPs", k2_flops.dense_mlps, v3_flops.dense_mlps);
    row("routed experts (TopK per layer)", k2_flops.routed_experts, v3_flops.routed_experts);
    row("shared experts", k2_flops.shared_experts, v3_flops.shared_experts);
    row("routers", k2_flops.routers, v3_flops.routers);
    row("lm_head", k2_flops.lm_head, v3_flops.lm_head);
    row("forward", k2_flops.forward, v3_flops.forward);
    row("forward + backward (3x forward)", k2_flops.forward_backward, v3_flops.forward_backward);
    rowf("forward + backward per 67M-token K2 batch", "EF", k2_flops.forward_backward * 67.0e6 / 1e18,
         v3_flops.forward_backward * 67.0e6 / 1e18);

    print_pipeline<moonmoe::KimiK2>("Kimi K2");
    print_pipeline<moonmoe::DeepSeekV3>("DeepSeek-V3");

    constexpr auto& par = moonmoe::KimiK2::config.parallel;
    const double six_bytes = 6.0 * double(k2.total);
    std::printf("\nWhere the report's \"about 6 TB over 256 GPUs, about 30 GB per GPU\" comes from:\n");
    std::printf("  BF16 weights (2 B) + FP32 gradient buffer (4 B) = 6 B per parameter x %s = %.2f TB,\n",
                grouped(k2.total).c_str(), six_bytes / 1e12);
    std::printf("  over the PP x EP = %ld x %ld = %ld ranks of one model replica: %.1f GB per rank on average.\n",
                long(par.pp), long(par.ep), long(par.model_parallel_ranks()),
                six_bytes / double(par.model_parallel_ranks()) / 1e9);
    const auto busiest = moonmoe::KimiK2::memory_per_rank(1024);
    std::printf(
        "  The most loaded rank holds %ld MoE layers (%.2f B parameters): %.1f GB of weights and gradients;\n"
        "  with ZeRO-1 over many replicas the optimizer state shrinks to %.2f GB at DP = 1024 (%.1f GB in all).\n",
        long(busiest.moe_layers), busiest.params() / 1e9, (busiest.weight_bytes + busiest.gradient_bytes) / 1e9,
        busiest.optimizer_bytes / 1e9, busiest.total_bytes() / 1e9);

    print_memory<moonmoe::KimiK2>("Kimi K2");
    print_memory<moonmoe::DeepSeekV3>("DeepSeek-V3");
    print_activations();
    if (layer)
        return example::with_backend(backend, [&]<class B>() {
            return run_full_width_layer<B>(tokens, precision, activations, activations_given);
        });
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "kimi_k2_1t: %s\n", e.what());
    return 1;
}
