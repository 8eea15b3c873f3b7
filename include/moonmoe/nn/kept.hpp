// moonmoe/nn/kept.hpp: a matrix a module keeps from its forward for its backward, stored as the activation policy
// says (config/activations.hpp, docs/activation_memory.md): f32, bf16 (2 bytes, exact for the bf16 values of
// Precision<BF16>) or FP8-E4M3 in 1 x 128 tiles (tensor/fp8_tiles.hpp; lossy). The backward takes it back as f32:
// the f32 tensor itself, or a widened / dequantized copy.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

#include "../backend/backend.hpp"
#include "../config/activations.hpp"
#include "../tensor/fp8_tiles.hpp"
#include "../tensor/tensor.hpp"

namespace moonmoe::nn {

/// How one kept matrix is stored (config/activations.hpp): ActivationsConfig::value_format() for the values the
/// compute policy rounds, mlp_input_format() for the MoE up-projections' and SwiGLU's inputs.
using moonmoe::KeptFormat;

template <class B = cpu>
struct KeptMatrix {
    using Ops = backend::Ops<B>;
    Tensor<float, 2, B> f32;
    Tensor<bf16, 2, B> b16;
    Fp8Tiles<B> fp8;
    KeptFormat format = KeptFormat::f32;
    bool held = false;  ///< a forward kept it (it may have no rows)

    KeptMatrix() = default;
    /// Keeps `t` as `f`: the tensor itself under f32, else a converted copy (and `t` is freed).
    KeptMatrix(Tensor<float, 2, B>&& t, KeptFormat f) : format(f), held(true) {
        if (f == KeptFormat::f32) {
            f32 = std::move(t);
        } else if (f == KeptFormat::bf16) {
            b16 = Tensor<bf16, 2, B>(t.shape());
            if (t.numel() > 0) Ops::template cast<bf16, float>(t.view(), b16.view());
        } else {
            fp8 = Fp8Tiles<B>(t.shape());
            if (t.numel() > 0) Ops::quantize_fp8_tiles(t.view(), fp8.codes.view(), fp8.scales.view());
        }
        t = Tensor<float, 2, B>{};
    }
    /// Keeps a copy of `x` as `f`.
    static KeptMatrix copy(View<const float, 2, B> x, KeptFormat f) {
        Tensor<float, 2, B> t(x.shape);
        if (x.numel() > 0) Ops::copy(x, t.view());
        return KeptMatrix(std::move(t), f);
    }

    bool empty() const { return !held; }
    /// The bytes held.
    std::size_t bytes() const { return f32.bytes() + b16.bytes() + fp8.bytes(); }

    /// The kept values in f32, handing the storage over: the f32 tensor itself, or a widened (exact) or dequantized
    /// copy. `what` names the matrix for the error when nothing is kept.
    Tensor<float, 2, B> take(const char* what) {
        if (!held)
            throw std::logic_error(std::string("backward: ") + what +
                                   " was not kept by the forward (run forward before backward, once per backward)");
        Tensor<float, 2, B> out;
        if (format == KeptFormat::f32) {
            out = std::move(f32);
        } else if (format == KeptFormat::bf16) {
            out = Tensor<float, 2, B>(b16.shape());
            if (out.numel() > 0) Ops::template cast<float, bf16>(b16.view(), out.view());
        } else {
            out = Tensor<float, 2, B>(fp8.shape());
            if (out.numel() > 0) Ops::dequantize_fp8_tiles(fp8.codes.view(), fp8.scales.view(), out.view());
        }
        *this = KeptMatrix{};
        return out;
    }
};

/// The forward's input for a backward: the module's kept copy (taken into `scratch`), or `given` when the module did
/// not keep it (keep_input false: its caller recomputed it), which must then be set (unless there are no rows).
template <class B>
View<const float, 2, B> input_for_backward(KeptMatrix<B>& kept, Tensor<float, 2, B>& scratch,
                                           View<const float, 2, B> given, index_t rows, const std::string& module) {
    if (!kept.empty()) {
        scratch = kept.take("the input");
        return scratch.view();
    }
    if (!given.data && rows > 0)
        throw std::logic_error(module +
                               ".backward: the input was not kept (keep_input is false): pass the "
                               "forward's input");
    return given;
}

}  // namespace moonmoe::nn
