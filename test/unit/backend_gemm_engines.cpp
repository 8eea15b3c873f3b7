// The engines of the CPU backend's products (backend/cpu/gemm_engine.hpp): gemm<float> on Eigen / the few-rows
// kernel, on the packed AVX-512 kernel and on oneDNN's f32 matmul; gemm_bf16 on oneDNN's native bf16 matmul (where
// the build has oneDNN and the CPU multiplies bf16 natively), on the few-rows kernel with W widened in registers, on
// the packed kernel (widened as it packs), on the AMX kernel (where the CPU has AMX-BF16) and on operands widened to
// f32. Each against products summed in double over the same operands, on shapes that cross the panel cuts of the pool
// and the kernels' tails, every transpose, alpha and beta, f32 and bf16 C, pitched views; the oneDNN engines
// repeatable bit for bit; the measured rules' lookup; the CPU's identity against /proc/cpuinfo. The cases that need
// oneDNN (or AMX) say so and check nothing more where this build or CPU lacks it (the message names which).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <moonmoe/backend/cpu.hpp>

#include "support/thread_count.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_backend_gemm_engines {

using namespace moonmoe;
using backend::Bf16Gemm;
using backend::F32Gemm;
using backend::GemmEngine;
using backend::Trans;
using Ops = backend::Ops<cpu>;

namespace {

/// Restores the process's GEMM choices when a case ends.
struct Bf16GemmChoice {
    Bf16Gemm saved = backend::cpu_detail::bf16_gemm_choice();
    F32Gemm saved_f32 = backend::cpu_detail::f32_gemm_choice();
    ~Bf16GemmChoice() {
        backend::cpu_detail::bf16_gemm_choice() = saved;
        backend::cpu_detail::f32_gemm_choice() = saved_f32;
    }
};

/// Makes the AMX kernel the engine of bf16 products and returns true, or says that this CPU has no AMX-BF16 and
/// returns false.
bool use_amx_engine() {
    if (!backend::cpu_detail::amx_gemm_available()) {
        MESSAGE("no AMX-BF16 here: the AMX kernel does not run");
        return false;
    }
    backend::set_bf16_gemm(Bf16Gemm::amx);
    return true;
}

struct Case {
    index_t m, n, k;
    Trans ta, tb;
    float alpha, beta;
    index_t pad;           ///< extra elements at the end of every row of A, B and C (pitched views)
    bool aligned = false;  ///< A and B start on a 64-byte line (else where their vectors' storage starts)
};

std::vector<bf16> random_bf16(std::size_t n, std::mt19937& gen) {
    std::normal_distribution<float> d;
    std::vector<bf16> v(n);
    for (bf16& x : v) x = bf16::from_float(d(gen));
    return v;
}

/// The product of one case through the current engine, operands of type TA (bf16: gemm_bf16; float: gemm, with
/// operands of full f32 precision), C [m, n] of type TC, and the double reference with the bound of an f32 sum's
/// error (k ulps of the sum of |terms|, plus C's own rounding for bf16).
template <class TC>
struct Run {
    std::vector<double> got, want, bound;
};

template <class TA>
std::vector<TA> random_operand(std::size_t n, std::mt19937& gen) {
    if constexpr (std::is_same_v<TA, bf16>) {
        return random_bf16(n, gen);
    } else {
        std::normal_distribution<float> d;
        std::vector<float> v(n);
        for (float& x : v) x = d(gen);
        return v;
    }
}

/// The first element of v that starts a 64-byte line (v holds at least 64 bytes more than it is used for).
template <class T>
T* first_on_line(std::vector<T>& v) {
    return v.data() + (64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64 / sizeof(T);
}

double widen(bf16 x) { return double(x.to_float()); }
double widen(float x) { return double(x); }

template <class TC, class TA = bf16>
Run<TC> run(const Case& c, std::uint32_t seed) {
    std::mt19937 gen(seed);
    const index_t ar = c.ta == Trans::no ? c.m : c.k, ac = c.ta == Trans::no ? c.k : c.m;
    const index_t br = c.tb == Trans::no ? c.k : c.n, bc = c.tb == Trans::no ? c.n : c.k;
    std::vector<TA> a_values = random_operand<TA>(std::size_t(ar * (ac + c.pad) + 64), gen),
                    b_values = random_operand<TA>(std::size_t(br * (bc + c.pad) + 64), gen);
    const TA* a = c.aligned ? first_on_line(a_values) : a_values.data();
    const TA* b = c.aligned ? first_on_line(b_values) : b_values.data();
    std::vector<TC> cmat(std::size_t(c.m * (c.n + c.pad)));
    std::normal_distribution<float> d;
    for (TC& x : cmat) {
        if constexpr (std::is_same_v<TC, bf16>) x = bf16::from_float(d(gen));
        else
            x = d(gen);
    }
    const auto at = [&](index_t i, index_t p) {
        return widen(c.ta == Trans::no ? a[std::size_t(i * (ac + c.pad) + p)] : a[std::size_t(p * (ac + c.pad) + i)]);
    };
    const auto bt = [&](index_t p, index_t j) {
        return widen(c.tb == Trans::no ? b[std::size_t(p * (bc + c.pad) + j)] : b[std::size_t(j * (bc + c.pad) + p)]);
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
    const View<const TA, 2> av(a, {ar, ac}, {ac + c.pad, 1}), bv(b, {br, bc}, {bc + c.pad, 1});
    const View<TC, 2> cv_out(cmat.data(), {c.m, c.n}, {c.n + c.pad, 1});
    if constexpr (std::is_same_v<TA, bf16>) Ops::gemm_bf16<TC>(c.ta, c.tb, c.alpha, av, bv, c.beta, cv_out);
    else
        Ops::gemm<float>(c.ta, c.tb, c.alpha, av, bv, c.beta, cv_out);
    for (index_t i = 0; i < c.m; ++i)
        for (index_t j = 0; j < c.n; ++j) r.got.push_back(cv(i, j));
    return r;
}

std::vector<Case> cases() {
    std::vector<Case> out;
    // the last three take the few-rows kernel as X W^T: k tails past whole SIMD widths, n past whole tiles of 4,
    // and more than one k-chunk (2048); as X W (gemm_small_nn, up to 16 rows) every shape of 16 rows or fewer, with
    // strips of 64 columns whole and cut short (7, 70, 130, 300, 530 columns) and tiles of 1 to 4 rows; the packed
    // kernel (gemm_packed.hpp: micro-tiles of 12 x 32, blocks of k 512 and 512 columns, op(B) transposed in 16 x 16
    // tiles) meets row and column tails in each, more than one column block in {64, 1100, 257} and more than one k
    // block, with a tail of one tile and two, in {13, 530, 530}; the AMX kernel (gemm_amx.hpp: micro-tiles of 32 x 32,
    // blocks of k 2048 padded to tiles of 32 and 256 columns) meets row tails (300 = 9 x 32 + 12), column tails, k
    // short of a whole tile in every shape but {300, 40, 64}, and more than one k block in {1, 70, 2100}; as X W^T of
    // up to 64 rows it takes W's rows as tiles of A (C^T = W X^T), X^T packed on the pool by 32 tokens and 1024 of k
    // where there are more than 32 tokens: {64, 1100, 257}, and {40, 70, 2100} with a short third part of k; X W^T
    // of 65 to 256 rows and more than 256 columns as (W X^T)^T, transposed back by 16 x 16 blocks with row and column
    // tails: {100, 300, 129}
    const std::vector<std::array<index_t, 3>> shapes = {{1, 7, 5},       {3, 300, 129},  {300, 40, 64},
                                                        {64, 1100, 257}, {40, 70, 2100}, {100, 300, 129},
                                                        {5, 130, 300},   {1, 70, 2100},  {13, 530, 530}};
    for (const auto& s : shapes)
        for (Trans ta : {Trans::no, Trans::yes})
            for (Trans tb : {Trans::no, Trans::yes})
                for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.0f}, std::pair{-2.0f, 0.25f}})
                    out.push_back({s[0], s[1], s[2], ta, tb, alpha, beta, index_t(s[0] % 3)});
    return out;
}

template <class TC, class TA = bf16>
void check_path(const char* path, const std::vector<Case>& list = cases()) {
    for (const Case& c : list) {
        const std::string path_name = path;
        CAPTURE(path_name);
        const std::string shape = std::to_string(c.m) + " x " + std::to_string(c.n) + " x " + std::to_string(c.k) +
                                  (c.ta == Trans::yes ? " A^T" : "") + (c.tb == Trans::yes ? " B^T" : "") + " alpha " +
                                  std::to_string(c.alpha) + " beta " + std::to_string(c.beta);
        CAPTURE(shape);
        const Run<TC> r = run<TC, TA>(c, 7);
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
    CHECK(backend::bf16_gemm_engine(Trans::no, Trans::yes, 1) == GemmEngine::widened);
    backend::set_bf16_gemm(Bf16Gemm::library);
    CHECK_FALSE(backend::bf16_gemm_uses_onednn());
    CHECK(backend::bf16_gemm_engine(Trans::no, Trans::yes, 1) == GemmEngine::library);
    if (backend::cpu_detail::amx_gemm_available()) {
        backend::set_bf16_gemm(Bf16Gemm::amx);
        CHECK(backend::bf16_gemm_engine(Trans::no, Trans::yes, 1) == GemmEngine::amx);
        CHECK(backend::bf16_gemm_path() == "library (AMX tiles; chosen)");
        CHECK(backend::gemm_engine_name(true, Trans::no, Trans::yes, 64, 64, 64) == "library (AMX tiles)");
    } else {
        CHECK_THROWS_WITH_AS(backend::set_bf16_gemm(Bf16Gemm::amx), doctest::Contains("needs AMX-BF16"),
                             std::runtime_error);
    }
    backend::set_bf16_gemm(Bf16Gemm::automatic);
#if MOONMOE_WITH_ONEDNN
    CHECK_NOTHROW(backend::set_f32_gemm(F32Gemm::onednn));
    CHECK(backend::f32_gemm_engine(Trans::no, Trans::no, 7) == GemmEngine::onednn);
    if (backend::cpu_detail::onednn::native().bf16) {
        CHECK(backend::bf16_gemm_uses_onednn());
        const bool ruled = !backend::cpu_detail::cpu_gemm_rules().empty();
        CHECK(backend::bf16_gemm_path().find(ruled ? "per product by the measured rules for " : "oneDNN (") == 0);
        CHECK_NOTHROW(backend::set_bf16_gemm(Bf16Gemm::onednn));
        CHECK(backend::bf16_gemm_path() == "oneDNN (" + backend::cpu_detail::onednn_isa() + ")");  // insisted
        CHECK(backend::bf16_gemm_engine(Trans::no, Trans::yes, 1) == GemmEngine::onednn);
    } else {
        CHECK_FALSE(backend::bf16_gemm_uses_onednn());
        CHECK_THROWS_WITH_AS(backend::set_bf16_gemm(Bf16Gemm::onednn),
                             doctest::Contains("this CPU has no native bf16 products"), std::runtime_error);
    }
#else
    CHECK_FALSE(backend::bf16_gemm_uses_onednn());
    CHECK(backend::bf16_gemm_engine(Trans::no, Trans::yes, 1) == GemmEngine::library);
    CHECK_THROWS_WITH_AS(backend::set_bf16_gemm(Bf16Gemm::onednn), doctest::Contains("built without oneDNN"),
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(backend::set_f32_gemm(F32Gemm::onednn), doctest::Contains("built without oneDNN"),
                         std::runtime_error);
#endif
    backend::set_f32_gemm(F32Gemm::library);
    CHECK(backend::f32_gemm_engine(Trans::no, Trans::yes, 1024) == GemmEngine::library);
}

TEST_CASE(
    "gemm_bf16 on the CPU, every engine: every transpose, alpha and beta, f32 and bf16 C, pitched, against "
    "double") {
    const Bf16GemmChoice restore;
    backend::set_bf16_gemm(Bf16Gemm::widened_f32);
    for (F32Gemm f32 : {F32Gemm::library, F32Gemm::onednn}) {
        if (f32 == F32Gemm::onednn && !backend::cpu_detail::onednn_built()) continue;
        backend::set_f32_gemm(f32);
        check_path<float>(f32 == F32Gemm::library ? "widened f32, library" : "widened f32, oneDNN f32");
        check_path<bf16>(f32 == F32Gemm::library ? "widened f32, library" : "widened f32, oneDNN f32");
    }
    backend::set_f32_gemm(F32Gemm::library);
    backend::set_bf16_gemm(Bf16Gemm::library);
    check_path<float>("library (few rows where it applies)");
    check_path<bf16>("library (few rows where it applies)");
    if (backend::cpu_detail::packed_gemm_available()) {
        backend::set_bf16_gemm(Bf16Gemm::packed);
        check_path<float>("packed");
        check_path<bf16>("packed");
    }
    if (use_amx_engine()) {
        check_path<float>("AMX");
        check_path<bf16>("AMX");
    }
    backend::set_bf16_gemm(Bf16Gemm::automatic);
    check_path<float>("automatic");
    if (!backend::bf16_gemm_uses_onednn()) {
        MESSAGE("no oneDNN path here: " << backend::bf16_gemm_path());
        return;
    }
    backend::set_bf16_gemm(Bf16Gemm::onednn);
    check_path<float>("oneDNN");
    check_path<bf16>("oneDNN");
}

TEST_CASE(
    "syrk_bf16 on the CPU, all of its ways (widened to the f32 SYRK, the AMX kernel's lower tiles mirrored as written, "
    "the few-rows kernel's and oneDNN's lower row panels mirrored): exactly symmetric, f32 and bf16 C, against "
    "double") {
    const Bf16GemmChoice restore;
    // three of the f32 SYRK's 256-row blocks, the last partial; on the AMX kernel: X packed (k short of a tile) over
    // two k blocks (2048) with row tails, X read in place (whole tiles) over three, and X W^T's few-rows path (n <=
    // 64); on oneDNN: row panels of 80 rows (the last of 40), of 64 (the last of 36), of 256 whose last is cut in two
    // pieces of columns (more than 2048), and one panel of all rows
    const std::vector<std::array<index_t, 2>> shapes = {{520, 96}, {100, 2100}, {256, 4128}, {40, 70}, {2100, 24}};
    const auto run = [&]<class TC>(TC, const char* way, index_t n, index_t k) {
        CAPTURE(way);
        CAPTURE(n);
        std::mt19937 gen(5);
        const std::vector<bf16> x = random_bf16(std::size_t(n * k), gen);
        const View<const bf16, 2> X(x.data(), {n, k}, {k, 1});
        std::vector<TC> c(std::size_t(n * n), convert<TC>(0.25f));  // symmetric C0
        Ops::syrk_bf16<TC>(2.0f, X, 3.0f, View<TC, 2>(c.data(), {n, n}, {n, 1}));
        std::size_t asymmetric = 0, bad = 0;
        for (index_t i = 0; i < n; ++i)
            for (index_t j = 0; j <= i; ++j) {
                const double got = convert<float>(c[std::size_t(i * n + j)]);
                asymmetric += got != convert<float>(c[std::size_t(j * n + i)]);
                if ((i + j) % 11) continue;
                double s = 0, mag = 0;
                for (index_t p = 0; p < k; ++p) {
                    const double t =
                        double(x[std::size_t(i * k + p)].to_float()) * x[std::size_t(j * k + p)].to_float();
                    s += t, mag += std::abs(t);
                }
                const double want = 2 * s + 0.75;
                const double rounding = std::is_same_v<TC, bf16> ? std::ldexp(std::abs(want), -8) : 0.0;
                bad += !(std::abs(got - want) <= 2 * double(k) * 6e-8 * (2 * mag + 0.75) + rounding);
            }
        CHECK(asymmetric == 0);
        CHECK(bad == 0);
        return c;
    };
    for (auto [n, k] : shapes) {
        backend::set_bf16_gemm(Bf16Gemm::widened_f32);
        run(bf16{}, "widened to f32, f32 SYRK", n, k);
        run(0.0f, "widened to f32, f32 SYRK", n, k);
        if (backend::cpu_detail::amx_gemm_available()) {
            backend::set_bf16_gemm(Bf16Gemm::amx);
            const std::vector<bf16> lower = run(bf16{}, "AMX, lower tiles", n, k);
            run(0.0f, "AMX, lower tiles", n, k);
            // the lower triangle holds the bits of the kernel's full product (a bf16 C's sums take the same path)
            std::mt19937 gen(5);
            const std::vector<bf16> x = random_bf16(std::size_t(n * k), gen);
            const View<const bf16, 2> X(x.data(), {n, k}, {k, 1});
            std::vector<bf16> full(std::size_t(n * n), bf16::from_float(0.25f));
            Ops::gemm_bf16<bf16>(Trans::no, Trans::yes, 2.0f, X, X, 3.0f, View<bf16, 2>(full.data(), {n, n}, {n, 1}));
            std::size_t differ = 0;
            for (index_t i = 0; i < n; ++i)
                for (index_t j = 0; j <= i; ++j)
                    differ += lower[std::size_t(i * n + j)].bits != full[std::size_t(i * n + j)].bits;
            CHECK(differ == 0);
        }
        if (backend::cpu_detail::small_gemm_bf16_available()) {
            backend::set_bf16_gemm(Bf16Gemm::library);
            run(bf16{}, "VDPBF16PS few-rows kernel, lower row panels of 32 up to 2048 rows, else widened", n, k);
            run(0.0f, "VDPBF16PS few-rows kernel, lower row panels of 32 up to 2048 rows, else widened", n, k);
        }
        if (!backend::cpu_detail::native_bf16()) continue;
        backend::set_bf16_gemm(Bf16Gemm::onednn);
        run(bf16{}, "oneDNN bf16, lower row panels", n, k);
        run(0.0f, "oneDNN bf16, lower row panels", n, k);
    }
    if (!backend::cpu_detail::amx_gemm_available()) MESSAGE("no AMX-BF16 here: the AMX kernel does not run");
    if (!backend::cpu_detail::native_bf16()) MESSAGE("no oneDNN bf16 here: " << backend::bf16_gemm_path());
}

TEST_CASE(
    "gemm_bf16 on the AMX kernel: an f32 C of 4 MiB and more streamed to memory a whole line at a time, the same bits "
    "as stored in place, against double") {
    const Bf16GemmChoice restore;
    if (!use_amx_engine()) return;
    // C = 0.5 op(A) B into a C on lines, into the same C one float off lines (nothing streamed) and into rows ldc
    // floats apart, each over 4 MiB (AmxBlocking::stream_c_bytes)
    const auto streamed = [](index_t m, index_t n, index_t k, Trans tb, index_t ldc) {
        const bool w_transposed = tb == Trans::yes;
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(w_transposed);
        CAPTURE(ldc);
        REQUIRE(std::size_t(m * n) * sizeof(float) >= backend::cpu_detail::AmxBlocking::stream_c_bytes);
        std::mt19937 gen(11);
        const std::vector<bf16> a = random_bf16(std::size_t(m * k), gen), b = random_bf16(std::size_t(k * n), gen);
        const View<const bf16, 2> av(a.data(), {m, k}, {k, 1});
        const View<const bf16, 2> bv = tb == Trans::no ? View<const bf16, 2>(b.data(), {k, n}, {n, 1})
                                                       : View<const bf16, 2>(b.data(), {n, k}, {k, 1});
        const auto bt = [&](index_t p, index_t j) { return b[std::size_t(tb == Trans::no ? p * n + j : j * k + p)]; };
        std::vector<float> on_lines(std::size_t(m * n) + 16), off_lines(std::size_t(m * n) + 16, 7.0f),
            pitched(std::size_t(m * ldc) + 16);
        float* c = first_on_line(on_lines);
        float* d = first_on_line(off_lines) + 1;
        float* e = first_on_line(pitched);
        Ops::gemm_bf16<float>(Trans::no, tb, 0.5f, av, bv, 0.0f, View<float, 2>(c, {m, n}, {n, 1}));
        Ops::gemm_bf16<float>(Trans::no, tb, 0.5f, av, bv, 0.0f, View<float, 2>(d, {m, n}, {n, 1}));
        Ops::gemm_bf16<float>(Trans::no, tb, 0.5f, av, bv, 0.0f, View<float, 2>(e, {m, n}, {ldc, 1}));
        std::size_t bad = 0, differ = 0, differ_pitched = 0;
        for (index_t i = 0; i < m; ++i)
            for (index_t j = 0; j < n; ++j) {
                double sum = 0, size = 0;
                for (index_t p = 0; p < k; ++p) {
                    const double t = widen(a[std::size_t(i * k + p)]) * widen(bt(p, j));
                    sum += t, size += std::abs(t);
                }
                const float got = c[i * n + j];
                bad += !(std::abs(got - 0.5 * sum) <= (double(k) + 2) * std::ldexp(1.0, -23) * 0.5 * size + 1e-30);
                differ += got != d[i * n + j];
                differ_pitched += got != e[i * ldc + j];
            }
        CHECK(bad == 0);
        CHECK(differ == 0);
        CHECK(differ_pitched == 0);
    };
    // X W: rows 4 KiB apart, the last 6 rows a part tile; then rows 1032 floats apart, every other row off the lines
    // of memory (stored, not streamed: a non-temporal store off a line faults)
    streamed(1030, 1024, 96, Trans::no, 1032);
    // X W^T of 200 tokens, computed as C^T = W X^T, its tiles transposed into C's rows: rows 5300 floats apart (a
    // line of 16 starts on a line of memory in one row of four), 200 = 6 x 32 + 8 tokens, a part tile of W's rows;
    // and C's rows 5312 apart, every line whole but the last of each row
    streamed(200, 5300, 64, Trans::yes, 5312);
}

TEST_CASE("the packed kernels' parts of C's columns: whole panels, every column once, widths within one panel") {
    using backend::cpu_detail::packed_driver::column_parts;
    using Bounds = std::vector<index_t>;
    // K2's kv_a (576 columns) on the AMX kernel's 32-column panels, two threads: 18 panels in 4 parts of 5, 5, 4, 4
    CHECK(column_parts(1024, 576, 32, 4, 2, false) == Bounds{0, 160, 320, 448, 576});
    CHECK(column_parts(1024, 576, 32, 4, 1, false) == Bounds{0, 576});  // one thread, one part
    CHECK(column_parts(1024, 100, 32, 4, 2, false) == Bounds{0, 100});  // narrower than two parts
    for (const index_t n : {129, 576, 1000, 1536, 7168})
        for (const int t : {2, 3, 8})
            for (const bool lower : {false, true}) {
                CAPTURE(n);
                CAPTURE(t);
                CAPTURE(lower);
                const Bounds b = column_parts(lower ? n : 1024, n, 16, 8, t, lower);
                const index_t parts = index_t(b.size()) - 1;
                CHECK(b.front() == 0);
                CHECK(b.back() == n);
                CHECK(parts <= 2 * t);
                index_t narrowest = n, widest = 0;
                for (index_t c = 0; c < parts; ++c) {
                    const index_t lo = b[std::size_t(c)], hi = b[std::size_t(c) + 1];
                    CHECK(lo <= hi);
                    CHECK((hi == n || hi % 16 == 0));
                    const index_t panels = (hi - lo + 15) / 16;
                    narrowest = std::min(narrowest, panels), widest = std::max(widest, panels);
                    if (!lower && c > 0) CHECK(hi - lo <= b[std::size_t(c)] - b[std::size_t(c) - 1]);  // wider first
                }
                if (!lower) CHECK(widest - narrowest <= 1);
            }
}

TEST_CASE(
    "oneDNN's C written dense: for 2 to 255 rows a C whose rows are not contiguous is handed over as a dense copy, "
    "read in only where asked, and copied back, and any other C as it is") {
    using backend::cpu_detail::onednn_dense_c;
    for (const index_t m : {1, 2, 100, 255, 256})
        for (const index_t pitch : {7, 9})  // C [m, 7] on its own or 7 columns of 9
            for (const bool reads_c : {false, true}) {
                CAPTURE(m);
                CAPTURE(pitch);
                CAPTURE(reads_c);
                std::vector<float> c(std::size_t(m * pitch));
                for (std::size_t i = 0; i < c.size(); ++i) c[i] = float(i);
                const View<float, 2> C(c.data(), {m, 7}, {pitch, 1});
                const bool dense_copy = pitch != 7 && m >= 2 && m <= 255;
                bool handed_dense = false, read_in = true;
                onednn_dense_c<float>(C, reads_c, [&](View<float, 2> out) {
                    handed_dense = out.strides[0] == 7;
                    CHECK((out.data == C.data) == !dense_copy);
                    for (index_t i = 0; i < m; ++i)
                        for (index_t j = 0; j < 7; ++j) {
                            float& v = out.data[i * out.strides[0] + j];
                            read_in = read_in && v == float(i * pitch + j);
                            v = -float(i * 7 + j);
                        }
                });
                CHECK(handed_dense == (pitch == 7 || dense_copy));
                CHECK(read_in == (reads_c || !dense_copy));
                std::size_t wrong = 0;
                for (index_t i = 0; i < m; ++i)
                    for (index_t j = 0; j < pitch; ++j)
                        wrong += c[std::size_t(i * pitch + j)] != (j < 7 ? -float(i * 7 + j) : float(i * pitch + j));
                CHECK(wrong == 0);
            }
}

TEST_CASE(
    "gemm_bf16 on the AMX kernel: A's rows read in place, a bf16 C rounded once as bf16::from_float rounds, NaN as "
    "0x7FC0") {
    const Bf16GemmChoice restore;
    if (!use_amx_engine()) return;
    // A is read in place where it is not transposed, its rows fill whole tiles and each starts on a 64-byte line
    using backend::cpu_detail::amx_reads_a_in_place;
    std::vector<bf16> storage(64 * 96 + 64);
    const bf16* line = first_on_line(storage);
    CHECK(amx_reads_a_in_place(Trans::no, View<const bf16, 2>(line, {64, 64}, {96, 1}), 64, 64));
    CHECK_FALSE(amx_reads_a_in_place(Trans::no, View<const bf16, 2>(line + 1, {64, 64}, {96, 1}), 64, 64));
    CHECK_FALSE(amx_reads_a_in_place(Trans::no, View<const bf16, 2>(line, {64, 64}, {80, 1}), 64, 64));
    CHECK_FALSE(amx_reads_a_in_place(Trans::no, View<const bf16, 2>(line, {48, 64}, {96, 1}), 48, 64));
    CHECK_FALSE(amx_reads_a_in_place(Trans::no, View<const bf16, 2>(line, {64, 48}, {96, 1}), 64, 48));
    CHECK_FALSE(amx_reads_a_in_place(Trans::yes, View<const bf16, 2>(line, {64, 64}, {96, 1}), 64, 64));
    // so read over one k block and over two (2048 + 32), dense and pitched by a line
    std::vector<Case> in_place;
    for (const auto& s : std::vector<std::array<index_t, 3>>{{96, 70, 2080}, {256, 40, 512}})
        for (Trans tb : {Trans::no, Trans::yes})
            for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-2.0f, 0.25f}})
                in_place.push_back({s[0], s[1], s[2], Trans::no, tb, alpha, beta, s[0] == 96 ? 0 : 32, true});
    check_path<float>("AMX, A in place", in_place);
    check_path<bf16>("AMX, A in place", in_place);
    // where C's tiles are whole and alpha 1, beta 0, an f32 C and a bf16 C take the same sums: the bf16 C is the f32
    // C rounded, bit for bit
    for (index_t k : {512, 2080}) {
        CAPTURE(k);
        const Case c{96, 64, k, Trans::no, Trans::yes, 1.0f, 0.0f, 0};
        const Run<float> f = run<float>(c, 3);
        const Run<bf16> h = run<bf16>(c, 3);
        std::size_t differ = 0;
        for (std::size_t i = 0; i < f.got.size(); ++i)
            differ += bf16::from_float(float(f.got[i])).to_float() != float(h.got[i]);
        CHECK(differ == 0);
    }
    // a NaN in a row of A makes that row of C NaN: bf16::from_float's 0x7FC0, whatever NaN the tiles produced
    const index_t m = 64, n = 96, k = 64;
    std::vector<bf16> a(std::size_t(m * k), bf16::from_float(1.0f)), b(std::size_t(k * n), bf16::from_float(-1.0f));
    a[3 * k + 5] = bf16{0xFFC1};  // a negative NaN with a payload
    std::vector<bf16> c(std::size_t(m * n), bf16::from_float(0.5f));
    Ops::gemm_bf16<bf16>(Trans::no, Trans::no, 1.0f, View<const bf16, 2>(a.data(), {m, k}, {k, 1}),
                         View<const bf16, 2>(b.data(), {k, n}, {n, 1}), 1.0f, View<bf16, 2>(c.data(), {m, n}, {n, 1}));
    std::size_t nan = 0, other = 0;
    for (index_t i = 0; i < m; ++i)
        for (index_t j = 0; j < n; ++j) {
            const bf16 v = c[std::size_t(i * n + j)];
            if (i == 3) nan += v.bits == 0x7FC0;
            else
                other += v.bits == bf16::from_float(-63.5f).bits;
        }
    CHECK(nan == std::size_t(n));
    CHECK(other == std::size_t((m - 1) * n));
}

TEST_CASE("gemm on the CPU, f32 on each engine: every transpose, alpha and beta, pitched, against double") {
    const Bf16GemmChoice restore;
    backend::set_f32_gemm(F32Gemm::library);
    check_path<float, float>("library");
    if (backend::cpu_detail::packed_gemm_available()) {
        backend::set_f32_gemm(F32Gemm::packed);
        check_path<float, float>("packed");
    } else {
        CHECK_THROWS_WITH_AS(backend::set_f32_gemm(F32Gemm::packed), doctest::Contains("needs AVX-512"),
                             std::runtime_error);
    }
    if (!backend::cpu_detail::onednn_built()) {
        MESSAGE("built without oneDNN");
        return;
    }
    backend::set_f32_gemm(F32Gemm::onednn);
    check_path<float, float>("oneDNN f32");
}

#if MOONMOE_WITH_ONEDNN
TEST_CASE(
    "oneDNN's primitives: the most recently used are held, at most Primitives::capacity, and a product whose "
    "primitive was dropped makes it again and multiplies right") {
    namespace onednn = backend::cpu_detail::onednn;
    const index_t k = 40, n = 24, shapes = index_t(onednn::Primitives::capacity) + 30;
    std::vector<float> a(std::size_t(shapes * k)), b(std::size_t(n * k)), c(std::size_t(shapes * n));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 7) - 3) / 4;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2) / 2;
    const auto multiply = [&](index_t m) {  // C [m, n] = A [m, k] B [n, k]^T, every m a shape of its own
        onednn::gemm<float, float>(Trans::no, Trans::yes, 1.0f, View<const float, 2>(a.data(), {m, k}),
                                   View<const float, 2>(b.data(), {n, k}), 0.0f, View<float, 2>(c.data(), {m, n}));
        for (index_t i = 0; i < m; ++i)
            for (index_t j = 0; j < n; ++j) {
                double want = 0;  // small multiples of 1/8: exact in f32
                for (index_t p = 0; p < k; ++p) want += double(a[std::size_t(i * k + p)]) * b[std::size_t(j * k + p)];
                REQUIRE(c[std::size_t(i * n + j)] == want);
            }
    };
    const std::size_t made = onednn::primitives_made();
    for (index_t m = 1; m <= shapes; ++m) multiply(m);
    CHECK(onednn::primitives_made() - made == std::size_t(shapes));  // no other test multiplies 24 columns over 40
    CHECK(onednn::primitives_held() == onednn::Primitives::capacity);
    multiply(shapes);  // held: nothing made
    CHECK(onednn::primitives_made() - made == std::size_t(shapes));
    multiply(1);  // dropped long ago: made again
    CHECK(onednn::primitives_made() - made == std::size_t(shapes) + 1);
    CHECK(onednn::primitives_held() == onednn::Primitives::capacity);
}
#endif

TEST_CASE(
    "gemm and gemm_bf16 through oneDNN and the few-rows kernels: repeatable bit for bit at a fixed thread count, the "
    "few-rows kernels at any") {
    const Bf16GemmChoice restore;
    const testing::ThreadCount restore_threads;
    const auto repeatable = [](const Case& c, auto tag) {
        using TA = decltype(tag);
        const Run<float> first = run<float, TA>(c, 3), second = run<float, TA>(c, 3);
        CHECK(first.got == second.got);
        return first.got;
    };
    // 40 rows in the lanes against 1100 rows of W: 18 blocks of tiles, each through 5 (bf16) or 3 (f32) chunks of k
    const Case few{40, 1100, 3000, Trans::no, Trans::yes, 1.0f, 0.0f, 0};
    std::vector<double> one_thread[2];
    for (int t : {1, 2}) {
        set_threads(t);
        backend::set_bf16_gemm(Bf16Gemm::library);
        backend::set_f32_gemm(F32Gemm::library);
        const std::vector<double> got[2] = {repeatable(few, bf16{}), repeatable(few, float{})};
        for (int i = 0; i < 2; ++i) {
            if (t == 1) one_thread[i] = got[i];
            CHECK(got[i] == one_thread[i]);
        }
        if (!backend::cpu_detail::onednn_built()) continue;
        backend::set_f32_gemm(F32Gemm::onednn);
        repeatable(Case{300, 1100, 257, Trans::no, Trans::yes, 1.0f, 0.0f, 0}, float{});
        if (!backend::cpu_detail::native_bf16()) continue;
        backend::set_bf16_gemm(Bf16Gemm::onednn);
        repeatable(Case{300, 1100, 257, Trans::no, Trans::yes, 1.0f, 0.0f, 0}, bf16{});
    }
}

TEST_CASE(
    "gemm and gemm_bf16 on the packed and AMX kernels: the same bits at one thread and at two, wherever C is cut") {
    const Bf16GemmChoice restore;
    const testing::ThreadCount restore_threads;
    if (!backend::cpu_detail::packed_gemm_available()) {
        MESSAGE("no AVX-512 here: the packed kernel does not run");
        return;
    }
    const bool amx = backend::cpu_detail::amx_gemm_available();
    if (!amx) MESSAGE("no AMX-BF16 here: the AMX kernel's runs are left out");
    // columns cut into parts (1100 columns), rows cut (40 columns, 400 rows), X W^T of 64 rows over five k blocks of
    // the packed kernel (512 each) and on the AMX kernel's few-rows path (W's rows in the tiles), and X W of 100 rows
    // over two of the AMX kernel's k blocks (2048), the second short of a whole tile, with whole tiles of C kept in
    // the tiles between them (alpha 1, beta 0) beside tails through the epilogue
    for (const Case& c : {Case{100, 1100, 530, Trans::no, Trans::yes, 1.0f, 0.0f, 0},
                          Case{400, 40, 530, Trans::yes, Trans::no, 0.5f, 1.0f, 1},
                          Case{64, 300, 2100, Trans::no, Trans::yes, 1.0f, 0.0f, 0},
                          Case{100, 300, 2100, Trans::no, Trans::no, 1.0f, 0.0f, 0}}) {
        CAPTURE(c.m);
        const auto runs = [&] {  // f32 and bf16 on the packed kernel, then bf16 on the AMX kernel
            backend::set_f32_gemm(F32Gemm::packed);
            backend::set_bf16_gemm(Bf16Gemm::packed);
            std::vector<std::vector<double>> r = {run<float, float>(c, 11).got, run<float, bf16>(c, 11).got};
            if (amx) {
                backend::set_bf16_gemm(Bf16Gemm::amx);
                r.push_back(run<float, bf16>(c, 11).got);
            }
            return r;
        };
        set_threads(1);
        const auto one = runs();
        set_threads(2);
        CHECK(runs() == one);
    }
}

TEST_CASE("the measured rules: the first rule of this CPU whose rows hold, else the default") {
    using backend::GemmRule;
    using backend::max_rows;
    const std::string here = "TestCPU 6.1 isa";
    const GemmRule rules[] = {
        {here, true, Trans::no, Trans::yes, 1, 16, GemmEngine::library},
        {here, true, Trans::no, Trans::yes, 256, max_rows, GemmEngine::widened},
        {here, false, Trans::no, Trans::no, 256, max_rows, GemmEngine::onednn},
        {"OtherCPU 6.2 isa", false, Trans::no, Trans::yes, 1, max_rows, GemmEngine::onednn},
    };
    const std::vector<GemmRule> mine = backend::cpu_detail::rules_for(here, rules);
    REQUIRE(mine.size() == 3);
    const auto engine = [&](bool bf16, Trans ta, Trans tb, index_t m) {
        return backend::cpu_detail::ruled_engine(mine, bf16, ta, tb, m, GemmEngine::onednn);
    };
    CHECK(engine(true, Trans::no, Trans::yes, 1) == GemmEngine::library);
    CHECK(engine(true, Trans::no, Trans::yes, 16) == GemmEngine::library);
    CHECK(engine(true, Trans::no, Trans::yes, 17) == GemmEngine::onednn);  // between the classes: the default
    CHECK(engine(true, Trans::no, Trans::yes, 255) == GemmEngine::onednn);
    CHECK(engine(true, Trans::no, Trans::yes, 256) == GemmEngine::widened);
    CHECK(engine(true, Trans::no, Trans::yes, 100000) == GemmEngine::widened);
    CHECK(engine(true, Trans::yes, Trans::no, 1024) == GemmEngine::onednn);   // another form
    CHECK(engine(false, Trans::no, Trans::yes, 1024) == GemmEngine::onednn);  // only OtherCPU's rule: the default
    CHECK(engine(false, Trans::no, Trans::no, 2048) == GemmEngine::onednn);
    CHECK(backend::cpu_detail::ruled_engine(mine, false, Trans::no, Trans::no, 2, GemmEngine::library) ==
          GemmEngine::library);
}

TEST_CASE("the measured rules: per CPU and form, ranges of rows that do not overlap, and AMX only on AMX") {
    using backend::GemmRule;
    const auto& rules = backend::measured_gemm_rules;
    for (std::size_t i = 0; i < std::size(rules); ++i) {
        const GemmRule& r = rules[i];
        CAPTURE(r.cpu);
        CAPTURE(i);
        CHECK(r.min_rows >= 1);
        CHECK(r.min_rows <= r.max_rows);
        if (r.engine == GemmEngine::amx) {  // only a bf16 product, only where the ISA names AMX
            CHECK(r.bf16);
            CHECK(r.cpu.find("amx") != std::string_view::npos);
        }
        for (std::size_t j = i + 1; j < std::size(rules); ++j) {
            const GemmRule& o = rules[j];
            if (o.cpu != r.cpu || o.bf16 != r.bf16 || o.ta != r.ta || o.tb != r.tb) continue;
            CAPTURE(j);
            CHECK((o.max_rows < r.min_rows || r.max_rows < o.min_rows));  // a later rule would never be reached
        }
    }
}

TEST_CASE("the CPU as the rules name it: CPUID's vendor, family and model, as /proc/cpuinfo shows them") {
    const std::string signature = backend::cpu_detail::cpu_signature();
    MESSAGE("this CPU: " << signature);
    std::smatch m;
    REQUIRE(std::regex_match(signature, m, std::regex(R"(^(\S*) ([0-9]+)\.([0-9]+)( \S+)?$)")));
    std::ifstream info("/proc/cpuinfo");
    std::string line, vendor, family, model;
    while (std::getline(info, line) && (vendor.empty() || family.empty() || model.empty())) {
        const auto value = [&] { return line.substr(line.find(':') + 2); };
        if (line.rfind("vendor_id", 0) == 0) vendor = value();
        else if (line.rfind("cpu family", 0) == 0)
            family = value();
        else if (line.rfind("model\t", 0) == 0 || line.rfind("model ", 0) == 0)
            model = value();
    }
    if (vendor.empty() || !backend::cpu_detail::cpu_features().vendor[0]) {
        MESSAGE("no x86 /proc/cpuinfo to compare with");
        return;
    }
    CHECK(m[1].str() == vendor);
    CHECK(m[2].str() == family);
    CHECK(m[3].str() == model);
}

}  // namespace unit_backend_gemm_engines
