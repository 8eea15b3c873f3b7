// GEMM primitives at Kimi K2 shapes (bench/SUITE.md): every projection of MLA at 1024 tokens as x W^T, one expert's
// gate at 64 and 16 tokens, o_proj for one decoded token, the backward forms (dy W and dy^T x), and the symmetric
// X X^T of Newton-Schulz.
// FLOPs: 2 m n k per product; SYRK is counted at the 2 n^2 k of the full product it replaces (so its FLOP/s and
// of_sgemm compare wall time with a plain GEMM of the same result). gemm_bf16/...: the same products with bf16
// operands and f32 accumulation (on the CPU through oneDNN where the CPU has native bf16 products; compared with
// PyTorch's bf16 matmul by compare.py). On the GPU (moonmoe_cuda_bench) also the dense bf16 cuBLAS product,
// gemm/bf16_cublas (support/cublas_bf16.hpp).
// bench-smoke-filter: :256/
#include "support/suite.hpp"

namespace bench {
namespace {

using moonmoe::backend::Trans;

void gemm(benchmark::State& state, Trans ta, Trans tb, index_t m, index_t n, index_t k) {
    Mat a(ta == Trans::no ? moonmoe::Shape<2>{m, k} : moonmoe::Shape<2>{k, m});
    Mat b(tb == Trans::no ? moonmoe::Shape<2>{k, n} : moonmoe::Shape<2>{n, k});
    Mat c({m, n});
    Ops::fill_normal(a.view(), 0.0f, 1.0f, 1);
    Ops::fill_normal(b.view(), 0.0f, 1.0f, 2);
    measure(state, {2.0 * m * n * k, 4.0 * (m * k + k * n + m * n)},
            [&] { Ops::gemm(ta, tb, 1.0f, a.view(), b.view(), 0.0f, c.view()); });
    if constexpr (std::is_same_v<Backend, moonmoe::cpu>)
        state.SetLabel("f32, " + moonmoe::backend::gemm_engine_name(false, ta, tb, m, n, k));
}

/// The same product with bf16 operands, f32 accumulation and an f32 C (BlasOps::gemm_bf16): on the CPU through
/// oneDNN where the CPU multiplies bf16 natively, else on operands widened to f32 (the row's label says which).
void gemm_bf16(benchmark::State& state, Trans ta, Trans tb, index_t m, index_t n, index_t k) {
    using moonmoe::bf16;
    const moonmoe::Shape<2> sa = ta == Trans::no ? moonmoe::Shape<2>{m, k} : moonmoe::Shape<2>{k, m};
    const moonmoe::Shape<2> sb = tb == Trans::no ? moonmoe::Shape<2>{k, n} : moonmoe::Shape<2>{n, k};
    Mat a32(sa), b32(sb), c({m, n});
    moonmoe::Tensor<bf16, 2, Backend> a(sa), b(sb);
    Ops::fill_normal(a32.view(), 0.0f, 1.0f, 1);
    Ops::fill_normal(b32.view(), 0.0f, 1.0f, 2);
    Ops::template cast<bf16, float>(a32.view(), a.view());
    Ops::template cast<bf16, float>(b32.view(), b.view());
    measure(state, {2.0 * m * n * k, 2.0 * (m * k + k * n) + 4.0 * m * n},
            [&] { Ops::template gemm_bf16<float>(ta, tb, 1.0f, a.view(), b.view(), 0.0f, c.view()); });
    if constexpr (std::is_same_v<Backend, moonmoe::cpu>)
        state.SetLabel("bf16, " + moonmoe::backend::gemm_engine_name(true, ta, tb, m, n, k));
    else
        state.SetLabel("bf16");
}

void syrk(benchmark::State& state, index_t n, index_t k) {
    Mat x({n, k}), c({n, n});
    Ops::fill_normal(x.view(), 0.0f, 1.0f, 1);
    measure(state, {2.0 * n * n * k, 4.0 * (n * k + n * n)}, [&] { Ops::syrk(1.0f, x.view(), 0.0f, c.view()); });
}

#if MOONMOE_BENCH_HAVE_CUBLAS
/// The dense bf16 cuBLAS product of support/cublas_bf16.hpp, as a row of its own (label bf16).
void bf16_cublas(benchmark::State& state, index_t m, index_t n, index_t k) {
    const Bf16Gemm g(m, n, k);
    measure(state, {g.flops(), 2.0 * double(m * k + k * n + m * n)}, [&] { g.run(); });
    state.SetLabel("bf16");
}
#endif

void register_benchmarks() {
    struct Case {
        const char* form;
        Trans ta, tb;
        index_t m, n, k;
    };
    const Case cases[] = {
        {"nn", Trans::no, Trans::no, 2048, 2048, 2048},    // the SGEMM reference
        {"nt", Trans::no, Trans::yes, 1024, 1536, 7168},   // q_a_proj
        {"nt", Trans::no, Trans::yes, 1024, 12288, 1536},  // q_b_proj
        {"nt", Trans::no, Trans::yes, 1024, 576, 7168},    // kv_a_proj_with_mqa
        {"nt", Trans::no, Trans::yes, 1024, 16384, 512},   // kv_b_proj
        {"nt", Trans::no, Trans::yes, 1024, 7168, 8192},   // o_proj
        {"nt", Trans::no, Trans::yes, 192, 2048, 7168},    // one expert's gate_proj at 192 tokens (a busy expert)
        {"nt", Trans::no, Trans::yes, 96, 2048, 7168},     // ... at 96 tokens (4096 tokens x 8 / 384 experts: ~85)
        {"nt", Trans::no, Trans::yes, 64, 2048, 7168},     // ... at 64 tokens
        {"nt", Trans::no, Trans::yes, 16, 2048, 7168},     // ... at 16 tokens (1024 tokens x 8 / 384 experts: ~21)
        {"nt", Trans::no, Trans::yes, 1, 7168, 8192},      // o_proj decoding one token
        {"nn", Trans::no, Trans::no, 1024, 7168, 2048},    // dx = dy W of gate_proj / up_proj
        {"tn", Trans::yes, Trans::no, 2048, 7168, 1024},   // dW = dy^T x of gate_proj / up_proj
        {"nn", Trans::no, Trans::no, 256, 256, 256},       // small
    };
    for (const Case& c : cases)
        add(std::string("gemm/") + c.form + "/" + shape_args({{"m", c.m}, {"n", c.n}, {"k", c.k}}),
            [c](benchmark::State& s) { gemm(s, c.ta, c.tb, c.m, c.n, c.k); });
    for (const Case& c : cases)
        add(std::string("gemm_bf16/") + c.form + "/" + shape_args({{"m", c.m}, {"n", c.n}, {"k", c.k}}),
            [c](benchmark::State& s) { gemm_bf16(s, c.ta, c.tb, c.m, c.n, c.k); });
    add("syrk/" + shape_args({{"n", 2048}, {"k", 7168}}), [](benchmark::State& s) { syrk(s, 2048, 7168); });
    add("syrk/" + shape_args({{"n", 256}, {"k", 256}}), [](benchmark::State& s) { syrk(s, 256, 256); });
#if MOONMOE_BENCH_HAVE_CUBLAS
    for (index_t n : {index_t(8192), index_t(256)})
        add("gemm/bf16_cublas/" + shape_args({{"m", n}, {"n", n}, {"k", n}}),
            [n](benchmark::State& s) { bf16_cublas(s, n, n, n); });
#endif
}

}  // namespace
}  // namespace bench

MOONMOE_BENCH_MAIN()
