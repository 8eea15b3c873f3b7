// A downstream project using the installed package: a model type of its own, built, run forward and backward, its
// parameters counted at compile time and at run time; and the instruction set the package gives it. Built twice:
// through moonmoe::moonmoe (portable: no -march from the package, the AVX-512 few-row GEMM taken only if the running
// CPU has it) and through moonmoe::native (MOONMOE_CONSUMER_NATIVE: -march=native).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <moonmoe/moonmoe.hpp>

#if !defined(MOONMOE_CONSUMER_NATIVE) && (defined(__AVX__) || defined(__AVX2__) || defined(__AVX512F__))
// clang-format off: an #error line cannot break
#error "moonmoe::moonmoe gave a consumer without flags an instruction set (__AVX__ is defined): the package must not add -march or -m flags"
// clang-format on
#endif

namespace mm = moonmoe;
namespace cd = moonmoe::backend::cpu_detail;

using Small = mm::Model<
    mm::Dims<mm::Hidden<32>, mm::Layers<2>, mm::DenseLayers<1>, mm::Vocab<64>, mm::DenseHidden<48>>,
    mm::Attention<mm::MLA<mm::Heads<2>, mm::QRank<16>, mm::KVRank<8>, mm::NopeDim<8>, mm::RopeDim<4>, mm::VDim<8>>>,
    mm::MoE<mm::Experts<4>, mm::TopK<2>, mm::Shared<1>, mm::ExpertHidden<8>>,
    mm::RoPE<mm::MaxPositions<256>, mm::YaRN<mm::OriginalMaxPositions<64>>>>;

namespace {

// Whether /proc/cpuinfo lists `flag` (Linux; -1 when it cannot be read).
int cpuinfo_has(const std::string& flag) {
    std::ifstream in("/proc/cpuinfo");
    if (!in) return -1;
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("flags", 0) == 0) return (line + " ").find(" " + flag + " ") != std::string::npos ? 1 : 0;
    return -1;
}

// C = X W^T with X [8, 700] (few rows, a k tail that is not a multiple of 16), against a double-precision sum; and
// bitwise equal when repeated.
bool few_row_gemm_ok() {
    const mm::index_t m = 8, n = 96, k = 700;
    mm::Tensor<float, 2> x({m, k}), w({n, k}), c({m, n}), c2({m, n});
    mm::backend::Ops<mm::cpu>::fill_normal(x.view(), 0.0f, 1.0f, 11);
    mm::backend::Ops<mm::cpu>::fill_normal(w.view(), 0.0f, 1.0f, 12);
    mm::backend::Ops<mm::cpu>::linear(x.view(), w.view(), c.view());
    mm::backend::Ops<mm::cpu>::linear(x.view(), w.view(), c2.view());
    double worst = 0;
    for (mm::index_t i = 0; i < m; ++i)
        for (mm::index_t j = 0; j < n; ++j) {
            double ref = 0;
            for (mm::index_t p = 0; p < k; ++p) ref += double(x.data()[i * k + p]) * double(w.data()[j * k + p]);
            worst = std::max(worst, std::abs(ref - double(c.data()[i * n + j])) / std::sqrt(double(k)));
            if (c.data()[i * n + j] != c2.data()[i * n + j]) {
                std::printf("few-row GEMM: element (%lld, %lld) differs between two identical calls\n",
                            static_cast<long long>(i), static_cast<long long>(j));
                return false;
            }
        }
    std::printf("few-row GEMM [8 x 700] x [96 x 700]^T: worst error %.2e x sqrt(k) against a double sum\n", worst);
    return worst < 1e-5;
}

}  // namespace

int main() {
    // The CPU features: detected at run time, and the few-row kernel taken exactly when the CPU has AVX-512.
    const cd::CpuFeatures& f = cd::cpu_features();
    const int listed = cpuinfo_has("avx512f");
    const bool small = static_cast<bool>(cd::have_small_gemm);
    std::printf("consumer%s: CPU avx2 %d, fma %d, avx512f %d (/proc/cpuinfo: %d); few-row AVX-512 GEMM %s\n",
#if defined(MOONMOE_CONSUMER_NATIVE)
                " (moonmoe::native)",
#else
                " (moonmoe::moonmoe)",
#endif
                f.avx2, f.fma, f.avx512f, listed, small ? "on" : "off");
    bool ok = true;
    if (listed >= 0 && f.avx512f != (listed == 1)) {
        std::printf("cpu_features().avx512f disagrees with /proc/cpuinfo\n");
        ok = false;
    }
#if defined(__x86_64__)
    if (small != f.avx512f) {
        std::printf("the few-row GEMM kernel is %s on a CPU %s AVX-512\n", small ? "on" : "off",
                    f.avx512f ? "with" : "without");
        ok = false;
    }
#endif
#if defined(MOONMOE_CONSUMER_NATIVE) && defined(__x86_64__)
    // -march=native reached the compiler: it enables what the CPU has.
#if defined(__AVX512F__)
    const bool native_avx512 = true;
#else
    const bool native_avx512 = false;
#endif
    if (native_avx512 != f.avx512f) {
        std::printf("moonmoe::native: __AVX512F__ is %s but the CPU %s AVX-512\n", native_avx512 ? "on" : "off",
                    f.avx512f ? "has" : "lacks");
        ok = false;
    }
#endif
    ok = few_row_gemm_ok() && ok;

    mm::nn::Transformer<> model(Small::config);
    mm::index_t count = 0;
    std::uint64_t seed = 1;
    model.visit_params([&](const mm::ParamRef& p) {
        count += p.numel();
        if (p.kind != mm::ParamKind::vector)
            mm::backend::Ops<mm::cpu>::fill_normal(mm::View<float, 2>(p.value, {1, p.numel()}), 0.0f, 0.1f, seed++);
    });
    const mm::index_t ids[] = {1, 2, 3, 4, 5, 6, 7, 8};
    const float loss = model.train_step(ids, mm::nn::TokenLayout::sequences(2, 4));
    std::printf("consumer: %lld parameters, loss %.4f (ln 64 = 4.1589)\n", static_cast<long long>(count), loss);
    ok = ok && count == Small::parameter_count() && loss > 3.5f && loss < 5.0f;
    return ok ? 0 : 1;
}
