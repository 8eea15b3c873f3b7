// moonmoe/backend/cpu/onednn.hpp: bf16 matrix products on the CPU through oneDNN's matmul primitive
// (https://oneapi-src.github.io/oneDNN/dev_guide_matmul.html), which runs AVX512_BF16 (VDPBF16PS) or AMX tile
// kernels where the CPU has them, f32 accumulation. BlasOps<cpu>::gemm_bf16 (cpu/blas.hpp) calls it when
//   - the program is built with MOONMOE_WITH_ONEDNN=1 (CMake: -DMOONMOE_WITH_ONEDNN=ON, moonmoe::moonmoe then links
//     oneDNN; Debian: libdnnl-dev), and
//   - the CPU running it multiplies bf16 natively (oneDNN's effective ISA is avx512_core_bf16 or above: AVX512_BF16,
//     AMX), decided once at run time, and
//   - bf16_gemm() is automatic (the default) or onednn; MOONMOE_BF16_GEMM=onednn|f32 in the environment sets it.
// Otherwise gemm_bf16 widens its operands to f32 (exact) and runs the f32 GEMM: the same products with another
// summation order, so the two paths agree to f32 rounding, not bitwise.
//
// Threads: the library's own pool cuts a product into panels (cpu/blas.hpp, as for f32) and each panel is one
// oneDNN call on one thread (OpenMP's thread count set to 1 on that thread for the call), so oneDNN's OpenMP teams
// never spin against the pool, and results are repeatable for a fixed thread count, as the f32 GEMM's are.
// Primitives are created once per (shape, strides, transposes, alpha, beta, C type) and kept.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../blas.hpp"

#if MOONMOE_WITH_ONEDNN
#include <map>
#include <mutex>
#include <tuple>
#include <vector>
#include <oneapi/dnnl/dnnl.hpp>
#if defined(_OPENMP)
#include <omp.h>
#endif
#endif

namespace moonmoe::backend {

/// How BlasOps<cpu>::gemm_bf16 multiplies: `automatic` takes oneDNN where it is built in and the CPU has native bf16
/// products, else f32; `onednn` insists (an error where it cannot); `widened_f32` always widens to f32.
enum class Bf16Gemm { automatic, onednn, widened_f32 };

namespace cpu_detail {

/// The process-wide choice: MOONMOE_BF16_GEMM (onednn, f32) on first use, then set_bf16_gemm().
inline Bf16Gemm& bf16_gemm_choice() {
    static Bf16Gemm choice = [] {
        const char* env = std::getenv("MOONMOE_BF16_GEMM");
        const std::string_view v = env ? env : "";
        if (v == "onednn") return Bf16Gemm::onednn;
        if (v == "f32") return Bf16Gemm::widened_f32;
        return Bf16Gemm::automatic;
    }();
    return choice;
}

#if MOONMOE_WITH_ONEDNN
namespace onednn {

inline const dnnl::engine& engine() {
    static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

/// Whether oneDNN runs bf16 products natively on this CPU (AVX512_BF16 or AMX), and the ISA's name.
struct Native {
    bool bf16 = false;
    std::string isa;
};
inline const Native& native() {
    static const Native n = [] {
        const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
        const auto has = [&](dnnl::cpu_isa want) {
            return (static_cast<unsigned>(isa) & static_cast<unsigned>(want)) == static_cast<unsigned>(want);
        };
        Native r;
        r.bf16 = has(dnnl::cpu_isa::avx512_core_bf16);
        r.isa = has(dnnl::cpu_isa::avx512_core_amx) ? "avx512_core_amx"
                : r.bf16                            ? "avx512_core_bf16"
                : has(dnnl::cpu_isa::avx512_core)   ? "avx512_core"
                : has(dnnl::cpu_isa::avx2)          ? "avx2"
                                                    : "sse41";
        return r;
    }();
    return n;
}

/// One product's primitive, by everything that fixes it.
using Key = std::tuple<index_t, index_t, index_t, int, int, index_t, index_t, index_t, float, float, bool>;

/// A created primitive, its operands' descriptions and the scratch memory it needs.
struct Entry {
    dnnl::memory::desc a, b, c;
    dnnl::matmul matmul;
    std::size_t scratch_bytes = 0;
};

inline const Entry& primitive(const Key& key) {
    static std::mutex mutex;
    static std::map<Key, Entry> cache;
    const std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
    const auto [m, n, k, ta, tb, lda, ldb, ldc, alpha, beta, c_bf16] = key;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    // op(A) [m, k] and op(B) [k, n] as strided views of the row-major operands; C [m, n] row-major.
    Entry e{dnnl::memory::desc({m, k}, dt::bf16, ta ? dims{1, lda} : dims{lda, 1}),
            dnnl::memory::desc({k, n}, dt::bf16, tb ? dims{1, ldb} : dims{ldb, 1}),
            dnnl::memory::desc({m, n}, c_bf16 ? dt::bf16 : dt::f32, dims{ldc, 1}), dnnl::matmul()};
    dnnl::primitive_attr attr;
    // The caller's scratch memory, one per thread: with oneDNN's own (shared unless it was built for concurrent
    // execution) two panels running the same primitive on two threads overwrite each other's partial sums.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);  // C = alpha op(A) op(B) + beta C, rounded once to C's type
        attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, engine());
    e.matmul = dnnl::matmul(pd);
    e.scratch_bytes = pd.scratchpad_desc().get_size();
    return cache.emplace(key, std::move(e)).first->second;
}

/// OpenMP's thread count set to 1 on this thread while alive (restored also when oneDNN throws).
class OneThread {
public:
#if defined(_OPENMP)
    OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(saved_); }
#else
    OneThread() = default;
#endif
    OneThread(const OneThread&) = delete;
    OneThread& operator=(const OneThread&) = delete;

private:
    [[maybe_unused]] int saved_ = 1;
};

/// C = alpha op(A) op(B) + beta C on this thread (m, n, k > 0; shapes checked by the caller).
template <class TC>
void gemm(Trans ta, Trans tb, float alpha, View<const bf16, 2> A, View<const bf16, 2> B, float beta, View<TC, 2> C) {
    const index_t m = C.shape[0], n = C.shape[1], k = ta == Trans::no ? A.shape[1] : A.shape[0];
    const Key key{m,
                  n,
                  k,
                  ta == Trans::yes,
                  tb == Trans::yes,
                  A.strides[0],
                  B.strides[0],
                  C.strides[0],
                  alpha,
                  beta,
                  std::is_same_v<TC, bf16>};
    const Entry& e = primitive(key);
    dnnl::memory a(e.a, engine(), const_cast<bf16*>(A.data));
    dnnl::memory b(e.b, engine(), const_cast<bf16*>(B.data));
    dnnl::memory c(e.c, engine(), C.data);
    thread_local dnnl::stream stream(engine());
    thread_local std::vector<unsigned char> scratch;
    if (scratch.size() < e.scratch_bytes) scratch.resize(e.scratch_bytes);
    const dnnl::memory::desc scratch_desc({index_t(e.scratch_bytes)}, dnnl::memory::data_type::u8,
                                          dnnl::memory::dims{1});
    dnnl::memory pad(scratch_desc, engine(), scratch.data());
    const OneThread one;  // the pool runs the panels (header comment)
    e.matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, pad}});
    stream.wait();
}

}  // namespace onednn
#endif

}  // namespace cpu_detail

/// Sets how gemm_bf16 multiplies from now on (the default: automatic, or MOONMOE_BF16_GEMM). Asking for onednn
/// where it cannot run is an error naming why.
inline void set_bf16_gemm(Bf16Gemm g) {
#if MOONMOE_WITH_ONEDNN
    if (g == Bf16Gemm::onednn && !cpu_detail::onednn::native().bf16)
        throw std::runtime_error("set_bf16_gemm(onednn): this CPU has no native bf16 products (oneDNN's ISA: " +
                                 cpu_detail::onednn::native().isa + "); use automatic or widened_f32");
#else
    if (g == Bf16Gemm::onednn)
        throw std::runtime_error("set_bf16_gemm(onednn): moonmoe was built without oneDNN (MOONMOE_WITH_ONEDNN)");
#endif
    cpu_detail::bf16_gemm_choice() = g;
}

/// Whether gemm_bf16 runs on oneDNN now (the choice, the build and the CPU together).
inline bool bf16_gemm_uses_onednn() {
#if MOONMOE_WITH_ONEDNN
    return cpu_detail::bf16_gemm_choice() != Bf16Gemm::widened_f32 && cpu_detail::onednn::native().bf16;
#else
    return false;
#endif
}

/// What gemm_bf16 runs on, for reports: "oneDNN (avx512_core_bf16)" or "f32 (widened operands; ...why)".
inline std::string bf16_gemm_path() {
#if MOONMOE_WITH_ONEDNN
    if (bf16_gemm_uses_onednn()) return "oneDNN (" + cpu_detail::onednn::native().isa + ")";
    if (cpu_detail::bf16_gemm_choice() == Bf16Gemm::widened_f32) return "f32 (widened operands; chosen)";
    return "f32 (widened operands; oneDNN's ISA here, " + cpu_detail::onednn::native().isa +
           ", has no native bf16 products)";
#else
    return "f32 (widened operands; built without oneDNN)";
#endif
}

}  // namespace moonmoe::backend
