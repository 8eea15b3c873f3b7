// moonmoe/optim/newton_schulz.hpp: the Newton-Schulz orthogonalisation at the heart of Muon (Keller Jordan's
// quintic; Polar Express, arXiv 2505.16932), with the coefficient schedule as a policy (config/optimizer.hpp:
// KellerQuintic, PolarExpress, YouQuintic, or your own struct with a `table` of (a, b, c) and `cycle`).
//
//   X = G / max(||G||_F * safety + add_eps, clamp_eps), transposed first if G is tall (so X X^T is the small Gram)
//   each iteration (a, b, c):  A = X X^T,  B = b A + c A A,  X = a X + B X
// X X^T and A A are symmetric: Products::symmetric computes them as SYRK (one triangle, half the FLOPs; A A = A A^T
// because A is symmetric). Products::general uses plain GEMMs, kept for measurement and as the reference path.
// Per iteration on n x m (n <= m): general 4 n^2 m + 2 n^3 FLOPs, symmetric 3 n^2 m + n^3.
//
// newton_schulz_bf16 is the same iteration in bf16, as torch.optim.Muon runs it (torch/optim/_muon.py,
// _zeropower_via_newtonschulz): G is rounded to bf16 and divided by its norm (the norm of the rounded values,
// itself rounded to bf16 and clamped at eps), then every product has bf16 operands, f32 accumulation and one
// rounding of alpha * product + beta * C to bf16 (BlasOps::gemm_bf16 with a bf16 C, as torch's addmm and cuBLAS
// do); the result is bf16, widened exactly into an f32 `out`. Products general (4 n^2 m + 2 n^3 FLOPs per
// iteration) or symmetric (BlasOps::syrk_bf16), as in f32.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "../backend/backend.hpp"
#include "../config/optimizer.hpp"
#include "../tensor/tensor.hpp"

namespace moonmoe::optim {

using moonmoe::Products;  // config/optimizer.hpp: NSProducts<P> of the type's Muon<...>

namespace detail {
template <class C>
constexpr double norm_safety() {
    if constexpr (requires { C::norm_safety; }) return C::norm_safety;
    else
        return 1.0;
}
template <class C>
constexpr double norm_add_eps() {  // Polar Express (modded-nanogpt): ||X||_F * 1.02 + 1e-6
    if constexpr (requires { C::norm_safety; }) return 1e-6;
    else
        return 0.0;
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

/// A bound on every element of Newton-Schulz's output under the schedule `Coeffs`, `steps` iterations: the
/// iteration acts on each singular value s of X alone, s -> a s + b s^3 + c s^5, and X starts with every s at most
/// 1 / safety (the norm's division); an element of a matrix is at most its largest singular value. The largest
/// |value| any iteration takes a grid of 4097 points in [0, 1.01 / safety] to (the 1 % covers the bf16 iteration's
/// rounded norm and products), doubled for the rounding between grid points and of the products. The optimizer's
/// pre-check (Optimizer::step) needs it; infinity when the schedule diverges.
template <class Coeffs = KellerQuintic>
double newton_schulz_bound(int steps) {
    const double top = 1.01 / detail::norm_safety<Coeffs>();
    double bound = 0;
    for (int g = 0; g <= 4096; ++g) {
        double s = top * g / 4096;
        for (int it = 0; it < steps && std::isfinite(s); ++it) {
            const NSCoefficients k = detail::coefficients<Coeffs>(it);
            s = s * (k.a + s * s * (k.b + s * s * k.c));
            bound = std::max(bound, std::abs(s));
        }
        if (!std::isfinite(s) || !(bound < 1e30)) return INFINITY;
    }
    return 2 * std::max(bound, top);
}

/// Scratch for one matrix shape, reused across calls (Muon keeps one per shape); all of it on the backend.
template <class T, class B = cpu>
struct NSWorkspace {
    Tensor<T, 2, B> x, x_next, a, b;
    Tensor<double, 1, B> sum_squares{Shape<1>{1}};  ///< ||G||_F^2
    Tensor<T, 1, B> inverse_norm{Shape<1>{1}};      ///< the factor of X = G / norm
    void fit(index_t n, index_t m) {
        if (x.size(0) == n && x.size(1) == m) return;
        x = Tensor<T, 2, B>({n, m}), x_next = Tensor<T, 2, B>({n, m});
        a = Tensor<T, 2, B>({n, n}), b = Tensor<T, 2, B>({n, n});
    }
};

/// Scratch for the bf16 iteration on one matrix shape (Muon keeps one per shape); all of it on the backend.
template <class B = cpu>
struct NSWorkspaceBF16 {
    Tensor<float, 2, B> g32;  ///< newton_schulz_bf16's G rounded to bf16, as f32 (Muon's step rounds its own)
    Tensor<bf16, 2, B> g16;   ///< a tall G / norm in bf16, as stored (transposed into x), and X^T at the end
    Tensor<bf16, 2, B> x, x_next, a, b;
    Tensor<double, 1, B> sum_squares{Shape<1>{1}};
    Tensor<float, 1, B> norm{Shape<1>{1}};
    void fit(index_t rows, index_t cols) {
        const index_t n = rows > cols ? cols : rows, m = rows > cols ? rows : cols;
        if (g16.size(0) == rows && g16.size(1) == cols) return;
        g16 = Tensor<bf16, 2, B>({rows, cols});
        x = Tensor<bf16, 2, B>({n, m}), x_next = Tensor<bf16, 2, B>({n, m});
        a = Tensor<bf16, 2, B>({n, n}), b = Tensor<bf16, 2, B>({n, n});
    }
};

namespace detail {
/// torch's `X.norm().clamp(min=eps)` on a bf16 X: the norm (summed here in double) rounded to bf16, then the
/// clamp, whose result is bf16 too.
struct BF16Norm {
    float clamp_eps;
    MOONMOE_HD void operator()(float& norm, double sum_squares) const {
        const float rounded = bf16::from_float(float(sqrt(sum_squares))).to_float();
        norm = bf16::from_float(rounded < clamp_eps ? clamp_eps : rounded).to_float();  // NaN kept
    }
};
/// y = bf16(x / norm): torch's in-place div_ of a bf16 tensor by a bf16 scalar (divided in f32, rounded once).
struct DivideToBF16 {
    const float* norm;  // one element, on the backend
    MOONMOE_HD void operator()(bf16& y, float x) const { y = bf16::from_float(x / *norm); }
};
}  // namespace detail

namespace detail {
/// NS(G) in bf16 from G already rounded to bf16 (held in f32, as newton_schulz_bf16 rounds it first): its iterations,
/// and the result as a bf16 view of the workspace [rows, cols] (ws.x, or ws.g16 transposed back when G is tall),
/// valid until the workspace is used again.
template <class Coeffs, class B>
View<const bf16, 2, B> newton_schulz_bf16_rounded(View<const float, 2, B> rounded, int steps, NSWorkspaceBF16<B>& ws,
                                                  double clamp_eps, Products products) {
    using Ops = backend::Ops<B>;
    using backend::Trans;
    const index_t rows = rounded.shape[0], cols = rounded.shape[1];
    const bool tall = rows > cols;
    ws.fit(rows, cols);
    // X = G / norm(G), transposed when G is tall
    Ops::template sum_squares<float>(rounded, ws.sum_squares.view());
    Ops::map(BF16Norm{float(clamp_eps)}, ws.norm.template reshape<2>({1, 1}),
             View<const double, 2, B>(ws.sum_squares.template reshape<2>({1, 1})));
    if (tall) {
        Ops::map(DivideToBF16{ws.norm.data()}, ws.g16.view(), rounded);
        Ops::template transpose<bf16>(ws.g16.view(), ws.x.view());
    } else {
        Ops::map(DivideToBF16{ws.norm.data()}, ws.x.view(), rounded);
    }
    for (int it = 0; it < steps; ++it) {
        const NSCoefficients k = coefficients<Coeffs>(it);
        // A = X X^T, then B = c A A + b A, each rounded once (torch's mm and addmm)
        if (products == Products::symmetric) {
            Ops::template syrk_bf16<bf16>(1.0f, ws.x.view(), 0.0f, ws.a.view());
            Ops::template copy<bf16>(ws.a.view(), ws.b.view());
            Ops::template syrk_bf16<bf16>(float(k.c), ws.a.view(), float(k.b), ws.b.view());
        } else {
            Ops::template gemm_bf16<bf16>(Trans::no, Trans::yes, 1.0f, ws.x.view(), ws.x.view(), 0.0f, ws.a.view());
            Ops::template copy<bf16>(ws.a.view(), ws.b.view());
            Ops::template gemm_bf16<bf16>(Trans::no, Trans::no, float(k.c), ws.a.view(), ws.a.view(), float(k.b),
                                          ws.b.view());
        }
        Ops::template copy<bf16>(ws.x.view(), ws.x_next.view());  // X = a X + B X, rounded once
        Ops::template gemm_bf16<bf16>(Trans::no, Trans::no, 1.0f, ws.b.view(), ws.x.view(), float(k.a),
                                      ws.x_next.view());
        std::swap(ws.x, ws.x_next);
    }
    if (!tall) return ws.x.view();
    Ops::template transpose<bf16>(ws.x.view(), ws.g16.view());
    return ws.g16.view();
}
}  // namespace detail

/// out = NS(G) in bf16 (see the header comment), G and out f32 [rows, cols]; the schedule `Coeffs`, `steps`
/// iterations, clamp_eps torch's eps. Products::general (the default) multiplies full products, as torch does;
/// Products::symmetric the symmetric X X^T and A A (= A A^T) by the backend's syrk_bf16, with the same roundings.
/// On the CPU the symmetric products compute the lower triangle only, whichever engine runs bf16 products (the
/// widened f32 SYRK, the AMX kernel's lower tiles, oneDNN's row panels: cpu/blas.hpp), a quarter fewer FLOPs per
/// iteration at 2048 x 7168; Muon's default (config/optimizer.hpp's NSProducts).
template <class Coeffs = KellerQuintic, class B = cpu>
void newton_schulz_bf16(std::type_identity_t<View<const float, 2, B>> G, View<float, 2, B> out, int steps,
                        NSWorkspaceBF16<B>& ws, double clamp_eps = 1e-7, Products products = Products::general) {
    using Ops = backend::Ops<B>;
    if (out.shape != G.shape) throw_shape_mismatch("newton_schulz_bf16", out.shape, G.shape);
    if (ws.g32.shape() != G.shape) ws.g32 = Tensor<float, 2, B>(G.shape);
    Ops::map(fn::RoundedCopy{}, ws.g32.view(), G);  // G rounded to bf16, kept in f32 for the norm
    const View<const bf16, 2, B> o = detail::newton_schulz_bf16_rounded<Coeffs, B>(
        View<const float, 2, B>(ws.g32.view()), steps, ws, clamp_eps, products);
    Ops::template cast<float, bf16>(o, out);
}

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
            Ops::template syrk<T>(T(1), ws.x.view(), T(0), ws.a.view());    // A = X X^T
            Ops::template syrk<T>(T(k.c), ws.a.view(), T(0), ws.b.view());  // B = c A A^T = c A A
        } else {
            Ops::template gemm<T>(Trans::no, Trans::yes, T(1), ws.x.view(), ws.x.view(), T(0), ws.a.view());
            Ops::template gemm<T>(Trans::no, Trans::no, T(k.c), ws.a.view(), ws.a.view(), T(0), ws.b.view());
        }
        Ops::map(fn::Axpby<T>{T(k.b), T(1)}, ws.b.view(), View<const T, 2, B>(ws.a.view()));  // B = b A + B
        Ops::template copy<T>(ws.x.view(), ws.x_next.view());
        Ops::template gemm<T>(Trans::no, Trans::no, T(1), ws.b.view(), ws.x.view(), T(k.a),
                              ws.x_next.view());  // aX + BX
        std::swap(ws.x, ws.x_next);
    }
    if (tall) Ops::template transpose<T>(ws.x.view(), out);
    else
        Ops::template copy<T>(ws.x.view(), out);
}

/// The Newton-Schulz of a workspace's precision: f32 (NSWorkspace<float>) or bf16 (NSWorkspaceBF16); Muon's step
/// calls this, so the workspace it is handed chooses the policy.
template <class Coeffs, class B>
void orthogonalise(View<const float, 2, B> G, View<float, 2, B> out, int steps, NSWorkspace<float, B>& ws,
                   Products products) {
    newton_schulz<Coeffs, float, B>(G, out, steps, ws, products);
}
template <class Coeffs, class B>
void orthogonalise(View<const float, 2, B> G, View<float, 2, B> out, int steps, NSWorkspaceBF16<B>& ws,
                   Products products) {
    newton_schulz_bf16<Coeffs, B>(G, out, steps, ws, 1e-7, products);
}

}  // namespace moonmoe::optim
