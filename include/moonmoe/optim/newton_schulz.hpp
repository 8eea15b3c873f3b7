// moonmoe/optim/newton_schulz.hpp: the Newton-Schulz orthogonalisation at the heart of Muon (Keller Jordan's
// quintic; Polar Express, arXiv 2505.16932), with the coefficient schedule as a policy (config/optimizer.hpp: KellerQuintic, PolarExpress,
// YouQuintic, or your own struct with a `table` of (a, b, c) and `cycle`).
//
//   X = G / max(||G||_F * safety + add_eps, clamp_eps), transposed first if G is tall (so X X^T is the small Gram)
//   each iteration (a, b, c):  A = X X^T,  B = b A + c A A,  X = a X + B X
// X X^T and A A are symmetric: Products::symmetric computes them as SYRK (one triangle, half the FLOPs; A A = A A^T
// because A is symmetric). Products::general uses plain GEMMs, kept for measurement and as the reference path.
// Per iteration on n x m (n <= m): general 4 n^2 m + 2 n^3 FLOPs, symmetric 3 n^2 m + n^3.
#pragma once

#include <type_traits>
#include <utility>

#include "../backend/backend.hpp"
#include "../config/optimizer.hpp"
#include "../tensor/tensor.hpp"

namespace moonmoe::optim {

enum class Products { symmetric, general };

namespace detail {
template <class C>
constexpr double norm_safety() {
    if constexpr (requires { C::norm_safety; }) return C::norm_safety;
    else return 1.0;
}
template <class C>
constexpr double norm_add_eps() {  // Polar Express (modded-nanogpt): ||X||_F * 1.02 + 1e-6
    if constexpr (requires { C::norm_safety; }) return 1e-6;
    else return 0.0;
}
template <class C>
constexpr NSCoefficients coefficients(int iteration) {
    constexpr int n = int(std::size(C::table));
    return C::table[C::cycle ? iteration % n : (iteration < n ? iteration : n - 1)];
}
}  // namespace detail

/// FLOPs of `steps` iterations on an n x m matrix (the smaller side first), as counted above.
constexpr double newton_schulz_flops(index_t rows, index_t cols, int steps, Products p) {
    const double n = double(rows < cols ? rows : cols), m = double(rows < cols ? cols : rows);
    return steps * (p == Products::symmetric ? 3 * n * n * m + n * n * n : 4 * n * n * m + 2 * n * n * n);
}

/// Scratch for one matrix shape, reused across calls (Muon keeps one per shape); all of it on the backend.
template <class T, class B = cpu>
struct NSWorkspace {
    Tensor<T, 2, B> x, x_next, a, b;
    Tensor<double, 1, B> sum_squares{Shape<1>{1}};  ///< ||G||_F^2
    Tensor<T, 1, B> inverse_norm{Shape<1>{1}};       ///< the factor of X = G / norm
    void fit(index_t n, index_t m) {
        if (x.size(0) == n && x.size(1) == m) return;
        x = Tensor<T, 2, B>({n, m}), x_next = Tensor<T, 2, B>({n, m});
        a = Tensor<T, 2, B>({n, n}), b = Tensor<T, 2, B>({n, n});
    }
};

/// out = NS(G) with the schedule `Coeffs`, `steps` iterations; G and out are [rows, cols], T = float or double.
template <class Coeffs = KellerQuintic, class T = float, class B = cpu>
void newton_schulz(std::type_identity_t<View<const T, 2, B>> G, View<T, 2, B> out, int steps, NSWorkspace<T, B>& ws,
                   Products products = Products::symmetric, double clamp_eps = 1e-7) {
    using Ops = backend::Ops<B>;
    using backend::Trans;
    const index_t rows = G.shape[0], cols = G.shape[1];
    if (out.shape != G.shape) throw_shape_mismatch("newton_schulz", out.shape, G.shape);
    const bool tall = rows > cols;
    const index_t n = tall ? cols : rows, m = tall ? rows : cols;
    ws.fit(n, m);
    // X = G (or G^T) / norm, the norm in double and the factor computed on the backend
    Ops::template sum_squares<T>(G, ws.sum_squares.view());
    Ops::map(fn::InverseNorm<T>{detail::norm_safety<Coeffs>(), detail::norm_add_eps<Coeffs>(), clamp_eps},
             ws.inverse_norm.template reshape<2>({1, 1}),
             View<const double, 2, B>(ws.sum_squares.template reshape<2>({1, 1})));
    Ops::template scaled_copy<T>(tall ? Trans::yes : Trans::no, G, ws.inverse_norm.view(), ws.x.view());
    for (int it = 0; it < steps; ++it) {
        const NSCoefficients k = detail::coefficients<Coeffs>(it);
        if (products == Products::symmetric) {
            Ops::template syrk<T>(T(1), ws.x.view(), T(0), ws.a.view());               // A = X X^T
            Ops::template syrk<T>(T(k.c), ws.a.view(), T(0), ws.b.view());             // B = c A A^T = c A A
        } else {
            Ops::template gemm<T>(Trans::no, Trans::yes, T(1), ws.x.view(), ws.x.view(), T(0), ws.a.view());
            Ops::template gemm<T>(Trans::no, Trans::no, T(k.c), ws.a.view(), ws.a.view(), T(0), ws.b.view());
        }
        Ops::map(fn::Axpby<T>{T(k.b), T(1)}, ws.b.view(), View<const T, 2, B>(ws.a.view()));  // B = b A + B
        Ops::template copy<T>(ws.x.view(), ws.x_next.view());
        Ops::template gemm<T>(Trans::no, Trans::no, T(1), ws.b.view(), ws.x.view(), T(k.a), ws.x_next.view());  // aX + BX
        std::swap(ws.x, ws.x_next);
    }
    if (tall) Ops::template transpose<T>(ws.x.view(), out);
    else Ops::template copy<T>(ws.x.view(), out);
}

}  // namespace moonmoe::optim
