// moonmoe/backend/cpu/onednn.hpp: matrix products on the CPU through oneDNN's matmul primitive
// (https://oneapi-src.github.io/oneDNN/dev_guide_matmul.html), in the program when it is built with
// MOONMOE_WITH_ONEDNN=1 (CMake: -DMOONMOE_WITH_ONEDNN=ON, moonmoe::moonmoe then links oneDNN; Debian: libdnnl-dev).
// bf16 operands run AVX512_BF16 (VDPBF16PS) or AMX tile kernels where the CPU has them, f32 operands oneDNN's f32
// kernels (brgemm on AVX-512), both accumulating in f32. Which products come here is gemm_engine.hpp's choice.
//
// Threads: the library's own pool cuts a product into panels (cpu/blas.hpp's onednn_panels) and each panel is one
// oneDNN call on one thread (OpenMP's thread count set to 1 on that thread for the call), so oneDNN's OpenMP teams
// never spin against the pool, and results are repeatable for a fixed thread count. A panel of C's columns (or a
// pitched C) of 2 to 255 rows is written into a dense scratch and copied into C, which lets oneDNN run its brgemm
// kernels instead of gemm:jit (cpu/blas.hpp's onednn_dense_c_min_rows).
// Primitives are made once per (shape, strides, transposes, alpha, beta, operand and C types) and the 1024 most
// recently used are kept.
#pragma once

#include <string>
#include <type_traits>

#include "../../numeric/bf16.hpp"
#include "../../tensor/tensor.hpp"
#include "../blas.hpp"

#if MOONMOE_WITH_ONEDNN
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>
#include <oneapi/dnnl/dnnl.hpp>
#if defined(_OPENMP)
#include <omp.h>
#endif
#endif

namespace moonmoe::backend {

namespace cpu_detail {

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

/// One product's primitive, by everything that fixes it (the last two: bf16 operands, bf16 C).
using Key = std::tuple<index_t, index_t, index_t, int, int, index_t, index_t, index_t, float, float, bool, bool>;

/// A created primitive, its operands' descriptions and the scratch memory it needs.
struct Entry {
    dnnl::memory::desc a, b, c;
    dnnl::matmul matmul;
    std::size_t scratch_bytes = 0;
};

/// The primitives most recently used, at most `capacity` of them (the least recently used is dropped when a new one
/// would pass it), and how many were made in all. Each primitive holds oneDNN's generated kernels, about 70 KB on
/// AMD Zen 4, and takes 0.15-0.2 ms to make: products of varying shapes (an expert's token count, a prompt's length)
/// would otherwise add one for good per shape; 1024 of them hold about 70 MB.
struct Primitives {
    static constexpr std::size_t capacity = 1024;
    using Held = std::shared_ptr<const Entry>;  // a thread's product keeps its primitive while another drops it
    std::mutex mutex;
    std::list<std::pair<Key, Held>> recent;  // most recently used first
    std::map<Key, std::list<std::pair<Key, Held>>::iterator> index;
    std::size_t made = 0;
};
inline Primitives& primitives() {
    static Primitives p;
    return p;
}

/// How many primitives have been made in this process (a product whose shape or strides vary from call to call
/// makes more), and how many are held now.
inline std::size_t primitives_made() {
    Primitives& p = primitives();
    const std::lock_guard<std::mutex> lock(p.mutex);
    return p.made;
}
inline std::size_t primitives_held() {
    Primitives& p = primitives();
    const std::lock_guard<std::mutex> lock(p.mutex);
    return p.recent.size();
}

inline Entry make_primitive(const Key& key) {
    const auto [m, n, k, ta, tb, lda, ldb, ldc, alpha, beta, ab_bf16, c_bf16] = key;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dt ab = ab_bf16 ? dt::bf16 : dt::f32;
    // op(A) [m, k] and op(B) [k, n] as strided views of the row-major operands; C [m, n] row-major.
    Entry e{dnnl::memory::desc({m, k}, ab, ta ? dims{1, lda} : dims{lda, 1}),
            dnnl::memory::desc({k, n}, ab, tb ? dims{1, ldb} : dims{ldb, 1}),
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
    return e;
}

/// The primitive for `key`: the held one, or a new one (made outside the lock, so that other threads' products
/// need not wait for oneDNN's code generation).
inline Primitives::Held primitive(const Key& key) {
    Primitives& p = primitives();
    {
        const std::lock_guard<std::mutex> lock(p.mutex);
        if (auto it = p.index.find(key); it != p.index.end()) {
            p.recent.splice(p.recent.begin(), p.recent, it->second);
            return it->second->second;
        }
    }
    auto made = std::make_shared<const Entry>(make_primitive(key));
    const std::lock_guard<std::mutex> lock(p.mutex);
    ++p.made;
    if (auto it = p.index.find(key); it != p.index.end()) return it->second->second;  // another thread was faster
    p.recent.emplace_front(key, made);
    p.index.emplace(key, p.recent.begin());
    if (p.recent.size() > Primitives::capacity) {
        p.index.erase(p.recent.back().first);
        p.recent.pop_back();
    }
    return made;
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

/// C = alpha op(A) op(B) + beta C on this thread (m, n, k > 0; shapes checked by the caller); T = bf16 (f32 or bf16
/// C) or float (f32 C).
template <class T, class TC>
void gemm(Trans ta, Trans tb, float alpha, View<const T, 2> A, View<const T, 2> B, float beta, View<TC, 2> C) {
    static_assert(std::is_same_v<T, bf16> || std::is_same_v<TC, float>, "onednn::gemm: f32 operands give an f32 C");
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
                  std::is_same_v<T, bf16>,
                  std::is_same_v<TC, bf16>};
    const Primitives::Held held = primitive(key);
    const Entry& e = *held;
    dnnl::memory a(e.a, engine(), const_cast<T*>(A.data));
    dnnl::memory b(e.b, engine(), const_cast<T*>(B.data));
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

}  // namespace moonmoe::backend
