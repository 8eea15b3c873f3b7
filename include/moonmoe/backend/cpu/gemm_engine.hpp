// moonmoe/backend/cpu/gemm_engine.hpp: which engine runs each matrix product of the CPU backend.
//
// The engines:
//   library  Eigen's GEBP kernel in panels on the pool, and the unpacked kernel for X W^T with few rows of X
//            (gemm_small.hpp), which also takes a bf16 W, widened in registers as it streams by (for bf16 operands
//            the engine is that kernel where it applies, on AVX512_BF16's dot products where the CPU has them
//            (gemm_small_bf16.hpp), else `widened`)
//   packed   the library's packed AVX-512 GEMM (gemm_packed.hpp), C cut into parts of its own on the pool; f32 or
//            bf16 operands, bf16 widened as it is packed (on a CPU without AVX-512: `library`)
//   onednn   oneDNN's matmul on the operands as stored (onednn.hpp): f32, or bf16 where the CPU multiplies bf16
//            natively (AVX512_BF16, AMX)
//   widened  bf16 operands widened to f32 (exact), then the f32 product's own engine
//   amx      the library's bf16 GEMM on AMX tiles (gemm_amx.hpp), cut as the packed engine cuts C; bf16 operands
//            only, on a CPU with AMX-BF16 (else as `packed`)
// Which is fastest depends on the CPU and on the product. On an Intel Xeon with AVX512_BF16 and no AMX, bf16
// products run at half the f32 rate, so a bf16 product of more than a few rows is faster on f32 FMAs (the packed
// kernel, which widens as it packs, ahead of widening whole operands first), and oneDNN's f32 kernels, in panels,
// beat Eigen's on the large products of every form; on a Xeon with AMX, the library's AMX kernel beats the AMX
// kernels of the oneDNN it is built with; on AMD Zen 4, whose AVX512_BF16 runs at twice the f32 rate, oneDNN's bf16
// kernels win the large products and the library's VDPBF16PS kernel the few-rows ones (docs/cpu_gemm.md). So the choice
// is measured, not guessed: tools/gemm_rules.py times every engine on the benchmark suite's Kimi K2 products at one and
// two threads and prints the rules below for the CPU it ran on; an engine other than the default is written only where
// the geometric mean of its time over the default's, across those products and both thread counts, is at most 0.95. A
// rule names the CPU (CPUID's vendor, family and model, and oneDNN's ISA, since a hypervisor can hide AMX from one
// model), the operands' type, the transposes and the range of rows of op(A) over which it holds (neighbouring ranges of
// one form that chose the same engine are one rule). Without a rule: f32 on the library, bf16 on oneDNN where native,
// else on the library.
//
// The choice depends on those alone, so on one machine a product's result stays bitwise repeatable for a fixed
// thread count across calls and processes (replicas on the ranks of an MPI job compare exactly). Engines differ
// in their f32 summation order only.
//
// Overrides for every product: set_f32_gemm / MOONMOE_F32_GEMM=library|packed|onednn and set_bf16_gemm /
// MOONMOE_BF16_GEMM=onednn|library|packed|amx|f32 (read on first use).
#pragma once

#include <cstdlib>
#include <initializer_list>
#include <utility>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "../../tensor/tensor.hpp"
#include "../blas.hpp"
#include "cpu_features.hpp"
#include "gemm_amx.hpp"
#include "gemm_packed.hpp"
#include "gemm_small.hpp"
#include "gemm_small_bf16.hpp"
#include "onednn.hpp"

namespace moonmoe::backend {

/// An engine of the CPU backend's products (header comment).
enum class GemmEngine { library, onednn, widened, packed, amx };

/// How BlasOps<cpu>::gemm (f32) multiplies: `automatic` follows the measured rules; the others insist.
enum class F32Gemm { automatic, library, onednn, packed };

/// How BlasOps<cpu>::gemm_bf16 multiplies: `automatic` follows the measured rules (oneDNN where native unless a
/// rule says otherwise); `onednn` insists (an error where it cannot); `library` takes the library's few-rows kernel
/// where it applies and widens elsewhere; `packed` takes the packed kernel, which widens as it packs; `amx` the AMX
/// kernel (an error where the CPU lacks AMX); `widened_f32` always widens both operands to f32.
enum class Bf16Gemm { automatic, onednn, library, widened_f32, packed, amx };

/// One measured choice (header comment): on `cpu`, products of `bf16` (else f32) operands with these transposes
/// and min_rows <= m <= max_rows rows of op(A) run on `engine`.
struct GemmRule {
    std::string_view cpu;
    bool bf16;
    Trans ta, tb;
    index_t min_rows, max_rows;
    GemmEngine engine;
};

/// A rule's max_rows when it holds for any number of rows.
inline constexpr index_t max_rows = index_t(1) << 62;

/// The rules measured so far, one block per CPU (tools/gemm_rules.py printed them; docs/cpu_gemm.md has the runs).
inline constexpr GemmRule measured_gemm_rules[] = {
    // Intel Xeon family 6 model 207 (Emerald Rapids) with AVX512_BF16, AMX hidden (KVM guest, 2 vCPUs); oneDNN
    // 2.6.3; tools/gemm_rules.py twice on 2026-11-28 (docs/cpu_gemm.md, "The library's packed kernel"): f32 X W^T,
    // X W and dY^T X on oneDNN from 256 rows (0.83-0.87x the library's time) and X W^T on it from 17 to 255 rows
    // (0.83x at 64 rows; 0.90x with 192 rows added); bf16 on the packed kernel from 256 rows (0.50-0.53x oneDNN's
    // native bf16 time, which runs at half the f32 rate on this CPU; widened to f32 and oneDNN's f32 kernels
    // 0.54-0.56x, and a 268 MB f32 copy of o_proj's operands per call) and for X W^T from 17 to 255 rows
    // (0.62-0.70x), and X W^T up to 16 rows on the library's few-rows kernel (0.80-0.82x). bf16 X W of up to 16 rows
    // on the few-rows X W kernel (gemm_small_nn): MLA's absorbed decode, q_nope [1, 128] W_UK[h] [128, 512] for 64
    // heads, 0.173 against oneDNN's 0.234 ms (2026-11-28, later; docs/cpu_gemm.md, "The decode step").
    {"GenuineIntel 6.207 avx512_core_bf16", false, Trans::no, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"GenuineIntel 6.207 avx512_core_bf16", false, Trans::no, Trans::yes, 17, max_rows, GemmEngine::onednn},
    {"GenuineIntel 6.207 avx512_core_bf16", false, Trans::yes, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"GenuineIntel 6.207 avx512_core_bf16", true, Trans::no, Trans::no, 256, max_rows, GemmEngine::packed},
    {"GenuineIntel 6.207 avx512_core_bf16", true, Trans::no, Trans::yes, 17, max_rows, GemmEngine::packed},
    {"GenuineIntel 6.207 avx512_core_bf16", true, Trans::no, Trans::yes, 1, 16, GemmEngine::library},
    {"GenuineIntel 6.207 avx512_core_bf16", true, Trans::no, Trans::no, 1, 16, GemmEngine::library},
    {"GenuineIntel 6.207 avx512_core_bf16", true, Trans::yes, Trans::no, 256, max_rows, GemmEngine::packed},
    // AMD EPYC family 25 model 17 (Zen 4) with AVX512_BF16 and no AMX (KVM guest, 2 vCPUs; oneDNN 2.6.3's ISA
    // avx512_core_bf16); tools/gemm_rules.py on 2026-11-29 (docs/cpu_gemm.md, "AMD Zen 4: bf16 few-rows products on
    // VDPBF16PS"): f32 on oneDNN for X W and dY^T X from 256 rows (0.72-0.75x the library's time), X W^T of one row
    // (0.80x) and from 65 rows (0.70-0.72x; the packed kernel 0.76x); f32 X W^T of 2 to 64 rows on the library's
    // few-rows kernel (oneDNN 1.13-1.53x its time); bf16 X W^T of 2 to 64 rows on the library's VDPBF16PS kernel
    // (0.63x oneDNN's time at 16 rows, 0.93x at 64), everything else bf16 on oneDNN's native kernels, which run at
    // twice the f32 rate here (the packed kernel, widening to f32, 2.0x their time).
    {"AuthenticAMD 25.17 avx512_core_bf16", false, Trans::no, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"AuthenticAMD 25.17 avx512_core_bf16", false, Trans::no, Trans::yes, 1, 1, GemmEngine::onednn},
    {"AuthenticAMD 25.17 avx512_core_bf16", false, Trans::no, Trans::yes, 65, max_rows, GemmEngine::onednn},
    {"AuthenticAMD 25.17 avx512_core_bf16", false, Trans::yes, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"AuthenticAMD 25.17 avx512_core_bf16", true, Trans::no, Trans::yes, 2, 64, GemmEngine::library},
    // AMD EPYC family 26 model 2 (Zen 5, full-width 512-bit FMAs) with AVX512_BF16 and no AMX (KVM guest, 2 vCPUs;
    // oneDNN 2.6.3's ISA avx512_core_bf16); tools/gemm_rules.py --repetitions 3 on 2026-12-07 (docs/cpu_gemm.md,
    // "AMD Zen 5: the rules measured"): f32 X W, X W^T and dY^T X from 256 rows, and X W^T from 65, on oneDNN
    // (0.60-0.68x the library's time; the packed kernel 3-6 % behind it) and X W^T of one row too (0.78x); f32 X W^T
    // of 2 to 64 rows on the library's few-rows kernel (oneDNN 1.4-2.4x its time at two threads); bf16 X W^T of 2 to
    // 127 rows on the library's VDPBF16PS kernel, everything else bf16 on oneDNN's native kernels (widened to f32,
    // 2.0x their time). The kernel's share moved run by run: 2-64 rows first (0.50x oneDNN's time at 16 rows, 0.81x
    // at 64), 2-127 with the suite's 96-row expert (0.92x at 96 rows; 192 rows 1.02x, "AMD Zen 5: an expert of 96
    // tokens, ..."), 2-255 in a third run on a quiet host (192 rows 0.949x, at the margin; "AMD Zen 5: the README's
    // table measured again, ..."), and 2-127 again in a fourth, once oneDNN's panels of C's columns were written dense
    // (blas.hpp's onednn_dense_c_min_rows; 128-255 rows 1.01x, 192 rows 6.9 against 6.6 ms at two threads; "AMD Zen
    // 5: oneDNN's panels written dense"). One row stays on oneDNN: the kernel took 1.27x its time in the third run
    // and 0.96x in the fourth (0.90x in the first, when the 117 MB weight was read at another rate of the memory's;
    // in paired runs after it oneDNN took 2.7-2.9 ms and the kernel 3.4-3.5 at two threads).
    {"AuthenticAMD 26.2 avx512_core_bf16", false, Trans::no, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"AuthenticAMD 26.2 avx512_core_bf16", false, Trans::no, Trans::yes, 1, 1, GemmEngine::onednn},
    {"AuthenticAMD 26.2 avx512_core_bf16", false, Trans::no, Trans::yes, 65, max_rows, GemmEngine::onednn},
    {"AuthenticAMD 26.2 avx512_core_bf16", false, Trans::yes, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"AuthenticAMD 26.2 avx512_core_bf16", true, Trans::no, Trans::yes, 2, 127, GemmEngine::library},
    // Intel Xeon family 6 model 167 with AMX (KVM guest, 2 vCPUs; oneDNN 2.6.3's ISA avx512_core_amx);
    // tools/gemm_rules.py on 2026-11-28, after the AMX kernel's blocks of op(B) became 256 columns wide
    // (docs/cpu_gemm.md, "Wider blocks of op(B) on AMX"): f32 on oneDNN from 17 rows (0.77-0.84x the library's
    // time; dY^T X 0.80x, the packed kernel 0.83x); bf16 on the library's AMX kernel for every form from 256 rows
    // (X W and X W^T 0.73x, dY^T X 0.63x oneDNN 2.6.3's AMX kernels' time) and for X W^T of any rows (17-255 0.90x,
    // 2-16 0.54x: W read straight into the tiles, one token 0.91x).
    {"GenuineIntel 6.167 avx512_core_amx", false, Trans::no, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"GenuineIntel 6.167 avx512_core_amx", false, Trans::no, Trans::yes, 17, max_rows, GemmEngine::onednn},
    {"GenuineIntel 6.167 avx512_core_amx", false, Trans::yes, Trans::no, 256, max_rows, GemmEngine::onednn},
    {"GenuineIntel 6.167 avx512_core_amx", true, Trans::no, Trans::no, 256, max_rows, GemmEngine::amx},
    {"GenuineIntel 6.167 avx512_core_amx", true, Trans::no, Trans::yes, 1, max_rows, GemmEngine::amx},
    {"GenuineIntel 6.167 avx512_core_amx", true, Trans::yes, Trans::no, 256, max_rows, GemmEngine::amx},
};

namespace cpu_detail {

inline bool onednn_built() {
#if MOONMOE_WITH_ONEDNN
    return true;
#else
    return false;
#endif
}

inline bool native_bf16() {
#if MOONMOE_WITH_ONEDNN
    return onednn::native().bf16;
#else
    return false;
#endif
}

/// oneDNN's ISA on this CPU ("avx512_core_bf16"), "" without oneDNN.
inline std::string onednn_isa() {
#if MOONMOE_WITH_ONEDNN
    return onednn::native().isa;
#else
    return {};
#endif
}

/// The running CPU as the rules name it: "GenuineIntel 6.207 avx512_core_bf16" (the ISA part only with oneDNN).
inline const std::string& cpu_signature() {
    static const std::string s = [] {
        const CpuFeatures& f = cpu_features();
        std::string r = std::string(f.vendor) + " " + std::to_string(f.family) + "." + std::to_string(f.model);
        return onednn_built() ? r + " " + onednn_isa() : r;
    }();
    return s;
}

/// The rules of `rules` that name `cpu`.
inline std::vector<GemmRule> rules_for(std::string_view cpu, std::span<const GemmRule> rules) {
    std::vector<GemmRule> r;
    for (const GemmRule& g : rules)
        if (g.cpu == cpu) r.push_back(g);
    return r;
}

/// The measured rules for this CPU (none without oneDNN: the rules' signatures name oneDNN's ISA).
inline const std::vector<GemmRule>& cpu_gemm_rules() {
    static const std::vector<GemmRule> rules = rules_for(cpu_signature(), measured_gemm_rules);
    return rules;
}

/// The engine of the first of `rules` that holds for these operands, transposes and rows, or `fallback`.
inline GemmEngine ruled_engine(std::span<const GemmRule> rules, bool bf16, Trans ta, Trans tb, index_t m,
                               GemmEngine fallback) {
    for (const GemmRule& g : rules)
        if (g.bf16 == bf16 && g.ta == ta && g.tb == tb && m >= g.min_rows && m <= g.max_rows) return g.engine;
    return fallback;
}

/// The value of the environment variable `name` among `values` (name, choice), or `automatic`.
template <class E>
E choice_from_env(const char* name, std::initializer_list<std::pair<std::string_view, E>> values) {
    const char* env = std::getenv(name);
    for (const auto& [text, choice] : values)
        if (env && text == env) return choice;
    return E::automatic;
}

/// The process-wide choices: the environment's on first use, then set_f32_gemm / set_bf16_gemm.
inline F32Gemm& f32_gemm_choice() {
    static F32Gemm choice = choice_from_env<F32Gemm>(
        "MOONMOE_F32_GEMM", {{"library", F32Gemm::library}, {"onednn", F32Gemm::onednn}, {"packed", F32Gemm::packed}});
    return choice;
}
inline Bf16Gemm& bf16_gemm_choice() {
    static Bf16Gemm choice = choice_from_env<Bf16Gemm>("MOONMOE_BF16_GEMM", {{"onednn", Bf16Gemm::onednn},
                                                                             {"library", Bf16Gemm::library},
                                                                             {"packed", Bf16Gemm::packed},
                                                                             {"amx", Bf16Gemm::amx},
                                                                             {"f32", Bf16Gemm::widened_f32}});
    return choice;
}

/// The engine to run where `packed` was asked for: packed where the CPU has AVX-512, else library.
inline GemmEngine packed_or_library() { return packed_gemm_available() ? GemmEngine::packed : GemmEngine::library; }

/// The engine to run where `amx` was asked for: amx where the CPU has AMX-BF16, else as `packed`.
inline GemmEngine amx_or_packed() { return amx_gemm_available() ? GemmEngine::amx : packed_or_library(); }

/// The error of asking for the packed engine on a CPU without AVX-512.
inline void require_packed(const char* what) {
    if (!packed_gemm_available())
        throw std::runtime_error(std::string(what) +
                                 "(packed): the packed kernel needs AVX-512, which this CPU (or this build) lacks");
}

}  // namespace cpu_detail

/// Sets how f32 products multiply from now on (the default: automatic, or MOONMOE_F32_GEMM). Asking for oneDNN in
/// a build without it, or for the packed kernel on a CPU without AVX-512, is an error.
inline void set_f32_gemm(F32Gemm g) {
    if (g == F32Gemm::onednn && !cpu_detail::onednn_built())
        throw std::runtime_error("set_f32_gemm(onednn): moonmoe was built without oneDNN (MOONMOE_WITH_ONEDNN)");
    if (g == F32Gemm::packed) cpu_detail::require_packed("set_f32_gemm");
    cpu_detail::f32_gemm_choice() = g;
}

/// Sets how gemm_bf16 multiplies from now on (the default: automatic, or MOONMOE_BF16_GEMM). Asking for onednn,
/// packed or amx where it cannot run is an error naming why.
inline void set_bf16_gemm(Bf16Gemm g) {
    if (g == Bf16Gemm::packed) cpu_detail::require_packed("set_bf16_gemm");
    if (g == Bf16Gemm::amx && !cpu_detail::amx_gemm_available())
        throw std::runtime_error(
            "set_bf16_gemm(amx): the AMX kernel needs AMX-BF16 and AVX-512 with the tile state "
            "granted to this process, which this CPU (or this build, or the kernel) lacks");
#if MOONMOE_WITH_ONEDNN
    if (g == Bf16Gemm::onednn && !cpu_detail::native_bf16())
        throw std::runtime_error("set_bf16_gemm(onednn): this CPU has no native bf16 products (oneDNN's ISA: " +
                                 cpu_detail::onednn::native().isa + "); use automatic or widened_f32");
#else
    if (g == Bf16Gemm::onednn)
        throw std::runtime_error("set_bf16_gemm(onednn): moonmoe was built without oneDNN (MOONMOE_WITH_ONEDNN)");
#endif
    cpu_detail::bf16_gemm_choice() = g;
}

/// The engine of an f32 product C [m, .] = op(A) op(B): library, packed or onednn.
inline GemmEngine f32_gemm_engine(Trans ta, Trans tb, index_t m) {
    switch (cpu_detail::f32_gemm_choice()) {
    case F32Gemm::library: return GemmEngine::library;
    case F32Gemm::onednn: return GemmEngine::onednn;
    case F32Gemm::packed: return cpu_detail::packed_or_library();
    case F32Gemm::automatic: break;
    }
    const GemmEngine e = cpu_detail::ruled_engine(cpu_detail::cpu_gemm_rules(), false, ta, tb, m, GemmEngine::library);
    return e == GemmEngine::packed ? cpu_detail::packed_or_library() : e;
}

/// The engine of a bf16 product C [m, .] = op(A) op(B): onednn (native bf16), library (the few-rows kernel where
/// the shape allows it, else widened), packed or widened.
inline GemmEngine bf16_gemm_engine(Trans ta, Trans tb, index_t m) {
    switch (cpu_detail::bf16_gemm_choice()) {
    case Bf16Gemm::onednn: return cpu_detail::native_bf16() ? GemmEngine::onednn : GemmEngine::library;
    case Bf16Gemm::library: return GemmEngine::library;
    case Bf16Gemm::packed: return cpu_detail::packed_or_library();
    case Bf16Gemm::amx: return cpu_detail::amx_or_packed();
    case Bf16Gemm::widened_f32: return GemmEngine::widened;
    case Bf16Gemm::automatic: break;
    }
    if (!cpu_detail::native_bf16()) return GemmEngine::library;
    const GemmEngine e = cpu_detail::ruled_engine(cpu_detail::cpu_gemm_rules(), true, ta, tb, m, GemmEngine::onednn);
    if (e == GemmEngine::amx) return cpu_detail::amx_or_packed();
    return e == GemmEngine::packed ? cpu_detail::packed_or_library() : e;
}

/// Whether gemm_bf16 may run on oneDNN's native bf16 kernels now (the choice, the build and the CPU together; the
/// rules may still widen some shapes).
inline bool bf16_gemm_uses_onednn() {
    const Bf16Gemm c = cpu_detail::bf16_gemm_choice();
    return cpu_detail::native_bf16() && (c == Bf16Gemm::automatic || c == Bf16Gemm::onednn);
}

/// What a product of this kind runs on, for reports: "oneDNN bf16 (avx512_core_bf16)", "widened to f32, then
/// oneDNN f32", "library (few rows)", "Eigen", for C [m, n] = op(A) op(B) with k the inner size.
inline std::string gemm_engine_name(bool bf16, Trans ta, Trans tb, index_t m, index_t n, index_t k) {
    const bool few = cpu_detail::takes_small_gemm(ta, tb, m, n, k),
               few_nn = bf16 && cpu_detail::takes_small_gemm_nn(ta, tb, m),
               few_dp = bf16 && cpu_detail::takes_small_gemm_bf16(ta, tb, m, n, k);
    const auto f32_name = [&] {
        switch (f32_gemm_engine(ta, tb, m)) {
        case GemmEngine::onednn: return std::string("oneDNN f32");
        case GemmEngine::packed: return std::string("library (packed)");
        default: return std::string(few ? "library (few rows)" : "Eigen");
        }
    };
    if (!bf16) return f32_name();
    switch (bf16_gemm_engine(ta, tb, m)) {
    case GemmEngine::onednn: return "oneDNN bf16 (" + cpu_detail::onednn_isa() + ")";
    case GemmEngine::library:
        if (few_dp) return "library (few rows, VDPBF16PS)";
        if (few || few_nn) return "library (few rows, bf16 W)";
        break;
    case GemmEngine::packed: return "library (packed, bf16 widened as packed)";
    case GemmEngine::amx: return "library (AMX tiles)";
    case GemmEngine::widened: break;
    }
    return "widened to f32, then " + f32_name();
}

/// What gemm_bf16 runs on, for reports: "oneDNN (avx512_core_bf16)"; where this CPU has measured rules, "per product
/// by the measured rules for <CPU>, else oneDNN (...)" (on AMX the large products run on the library's kernel); or
/// "f32 (widened operands...; why)". gemm_engine_name() says it for one product.
inline std::string bf16_gemm_path() {
    const Bf16Gemm c = cpu_detail::bf16_gemm_choice();
    if (bf16_gemm_uses_onednn()) {
        const std::string onednn = "oneDNN (" + cpu_detail::onednn_isa() + ")";
        if (c != Bf16Gemm::automatic || cpu_detail::cpu_gemm_rules().empty()) return onednn;
        return "per product by the measured rules for " + cpu_detail::cpu_signature() + ", else " + onednn;
    }
    if (c == Bf16Gemm::widened_f32) return "f32 (widened operands; chosen)";
    if (c == Bf16Gemm::amx && cpu_detail::amx_gemm_available()) return "library (AMX tiles; chosen)";
    if (c == Bf16Gemm::packed && cpu_detail::packed_gemm_available())
        return "library (packed, bf16 widened as packed; chosen)";
    const std::string few =
        cpu_detail::small_gemm_bf16_available()
            ? "f32 (widened operands; X W^T with few rows as bf16 on the library's VDPBF16PS kernel; "
            : "f32 (widened operands, X W^T with few rows on the library's kernel; ";
    if (c == Bf16Gemm::library) return few + "chosen)";
    if (!cpu_detail::onednn_built()) return few + "built without oneDNN)";
    return few + "oneDNN's ISA here, " + cpu_detail::onednn_isa() + ", has no native bf16 products)";
}

}  // namespace moonmoe::backend
