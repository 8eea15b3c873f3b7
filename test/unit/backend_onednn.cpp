// BlasOps<cpu>::gemm_bf16's two paths (backend/cpu/onednn.hpp): oneDNN's matmul where the build has it and the CPU
// multiplies bf16 natively, and the operands widened to f32. Both against products summed in double over the same
// bf16 operands, on shapes that cross the panel cuts of the pool, every transpose, alpha and beta, f32 and bf16 C,
// pitched views; both against each other; and the oneDNN path repeatable bit for bit. The cases that need oneDNN
// say so and check nothing more where this build or CPU lacks it (the message names which).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <moonmoe/backend/cpu.hpp>

#include "support/thread_count.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_onednn {

using namespace moonmoe;
using backend::Bf16Gemm;
using backend::Trans;
using Ops = backend::Ops<cpu>;

namespace {

/// Restores the process's bf16 GEMM choice when a case ends.
struct Bf16GemmChoice {
    Bf16Gemm saved = backend::cpu_detail::bf16_gemm_choice();
    ~Bf16GemmChoice() { backend::cpu_detail::bf16_gemm_choice() = saved; }
};

struct Case {
    index_t m, n, k;
    Trans ta, tb;
    float alpha, beta;
    index_t pad;  ///< extra elements at the end of every row of A, B and C (pitched views)
};

std::vector<bf16> random_bf16(std::size_t n, std::mt19937& gen) {
    std::normal_distribution<float> d;
    std::vector<bf16> v(n);
    for (bf16& x : v) x = bf16::from_float(d(gen));
    return v;
}

/// The product of one case through the current path, C [m, n] of type TC, and the double reference with the bound
/// of an f32 sum's error (k ulps of the sum of |terms|, plus C's own rounding for bf16).
template <class TC>
struct Run {
    std::vector<double> got, want, bound;
};

template <class TC>
Run<TC> run(const Case& c, std::uint32_t seed) {
    std::mt19937 gen(seed);
    const index_t ar = c.ta == Trans::no ? c.m : c.k, ac = c.ta == Trans::no ? c.k : c.m;
    const index_t br = c.tb == Trans::no ? c.k : c.n, bc = c.tb == Trans::no ? c.n : c.k;
    const std::vector<bf16> a = random_bf16(std::size_t(ar * (ac + c.pad)), gen),
                            b = random_bf16(std::size_t(br * (bc + c.pad)), gen);
    std::vector<TC> cmat(std::size_t(c.m * (c.n + c.pad)));
    std::normal_distribution<float> d;
    for (TC& x : cmat) {
        if constexpr (std::is_same_v<TC, bf16>) x = bf16::from_float(d(gen));
        else
            x = d(gen);
    }
    const auto at = [&](index_t i, index_t p) {
        return double((c.ta == Trans::no ? a[std::size_t(i * (ac + c.pad) + p)] : a[std::size_t(p * (ac + c.pad) + i)])
                          .to_float());
    };
    const auto bt = [&](index_t p, index_t j) {
        return double((c.tb == Trans::no ? b[std::size_t(p * (bc + c.pad) + j)] : b[std::size_t(j * (bc + c.pad) + p)])
                          .to_float());
    };
    const auto cv = [&](index_t i, index_t j) {
        if constexpr (std::is_same_v<TC, bf16>) return double(cmat[std::size_t(i * (c.n + c.pad) + j)].to_float());
        else
            return double(cmat[std::size_t(i * (c.n + c.pad) + j)]);
    };
    Run<TC> r;
    for (index_t i = 0; i < c.m; ++i)
        for (index_t j = 0; j < c.n; ++j) {
            double sum = 0, size = 0;
            for (index_t p = 0; p < c.k; ++p) sum += at(i, p) * bt(p, j), size += std::abs(at(i, p) * bt(p, j));
            const double want = c.alpha * sum + (c.beta != 0.0f ? c.beta * cv(i, j) : 0.0);
            r.want.push_back(want);
            double bound =
                (double(c.k) + 2) * std::ldexp(1.0, -23) * (std::abs(c.alpha) * size + std::abs(c.beta * cv(i, j)));
            if constexpr (std::is_same_v<TC, bf16>) bound += std::ldexp(std::abs(want), -8);  // C's own rounding
            r.bound.push_back(bound + 1e-30);
        }
    Ops::gemm_bf16<TC>(c.ta, c.tb, c.alpha, View<const bf16, 2>(a.data(), {ar, ac}, {ac + c.pad, 1}),
                       View<const bf16, 2>(b.data(), {br, bc}, {bc + c.pad, 1}), c.beta,
                       View<TC, 2>(cmat.data(), {c.m, c.n}, {c.n + c.pad, 1}));
    for (index_t i = 0; i < c.m; ++i)
        for (index_t j = 0; j < c.n; ++j) r.got.push_back(cv(i, j));
    return r;
}

std::vector<Case> cases() {
    std::vector<Case> out;
    const std::vector<std::array<index_t, 3>> shapes = {{1, 7, 5}, {3, 300, 129}, {300, 40, 64}, {64, 1100, 257}};
    for (const auto& s : shapes)
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes})
                for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}, std::pair{-2.0f, 0.25f}})
                    out.push_back({s[0], s[1], s[2], ta, tb, alpha, beta, index_t(s[0] % 3)});
    return out;
}

template <class TC>
void check_path(const char* path) {
    for (const Case& c : cases()) {
        const std::string path_name = path;
        CAPTURE(path_name);
        const std::string shape = std::to_string(c.m) + " x " + std::to_string(c.n) + " x " + std::to_string(c.k) +
                                  (c.ta == Trans::yes ? " A^T" : "") + (c.tb == Trans::yes ? " B^T" : "") + " alpha " +
                                  std::to_string(c.alpha) + " beta " + std::to_string(c.beta);
        CAPTURE(shape);
        const Run<TC> r = run<TC>(c, 7);
        std::size_t bad = 0;
        std::size_t first = r.got.size();
        for (std::size_t i = 0; i < r.got.size(); ++i)
            if (!(std::abs(r.got[i] - r.want[i]) <= r.bound[i])) first = std::min(first, i), ++bad;
        if (bad)
            MESSAGE("first bad " << first << ": " << r.got[first] << " want " << r.want[first] << " bound "
                                 << r.bound[first]);
        CHECK(bad == 0);
    }
}

}  // namespace

TEST_CASE("gemm_bf16 on the CPU: the path in use is reported, and asking for oneDNN where it cannot run is an error") {
    const Bf16GemmChoice restore;
    MESSAGE("gemm_bf16 runs on: " << backend::bf16_gemm_path());
    backend::set_bf16_gemm(Bf16Gemm::widened_f32);
    CHECK_FALSE(backend::bf16_gemm_uses_onednn());
    CHECK(backend::bf16_gemm_path().find("f32 (widened operands") == 0);
    backend::set_bf16_gemm(Bf16Gemm::automatic);
#if MOONMOE_WITH_ONEDNN
    if (backend::cpu_detail::onednn::native().bf16) {
        CHECK(backend::bf16_gemm_uses_onednn());
        CHECK(backend::bf16_gemm_path().find("oneDNN (") == 0);
        CHECK_NOTHROW(backend::set_bf16_gemm(Bf16Gemm::onednn));
    } else {
        CHECK_FALSE(backend::bf16_gemm_uses_onednn());
        CHECK_THROWS_WITH_AS(backend::set_bf16_gemm(Bf16Gemm::onednn),
                             doctest::Contains("this CPU has no native bf16 products"), std::runtime_error);
    }
#else
    CHECK_FALSE(backend::bf16_gemm_uses_onednn());
    CHECK_THROWS_WITH_AS(backend::set_bf16_gemm(Bf16Gemm::onednn), doctest::Contains("built without oneDNN"),
                         std::runtime_error);
#endif
}

TEST_CASE(
    "gemm_bf16 on the CPU, both paths: every transpose, alpha and beta, f32 and bf16 C, pitched, against double") {
    const Bf16GemmChoice restore;
    backend::set_bf16_gemm(Bf16Gemm::widened_f32);
    check_path<float>("widened f32");
    check_path<bf16>("widened f32");
    backend::set_bf16_gemm(Bf16Gemm::automatic);
    if (!backend::bf16_gemm_uses_onednn()) {
        MESSAGE("no oneDNN path here: " << backend::bf16_gemm_path());
        return;
    }
    check_path<float>("oneDNN");
    check_path<bf16>("oneDNN");
}

TEST_CASE("gemm_bf16 through oneDNN: repeatable bit for bit at a fixed thread count, across the pool's panels") {
    const Bf16GemmChoice restore;
    backend::set_bf16_gemm(Bf16Gemm::automatic);
    if (!backend::bf16_gemm_uses_onednn()) {
        MESSAGE("no oneDNN path here: " << backend::bf16_gemm_path());
        return;
    }
    const testing::ThreadCount restore_threads;
    for (int t : {1, 2}) {
        set_threads(t);
        const Case c{300, 1100, 257, Trans::no, Trans::yes, 1.0f, 0.0f, 0};
        const Run<float> first = run<float>(c, 3), second = run<float>(c, 3);
        CHECK(first.got == second.got);
    }
}

}  // namespace unit_backend_onednn
