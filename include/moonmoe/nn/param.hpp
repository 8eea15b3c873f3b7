// moonmoe/nn/param.hpp: a trainable tensor with its gradient, what kind of tensor it is, and how modules list them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "../backend/backend.hpp"
#include "../config/precision.hpp"
#include "../numeric/bf16.hpp"
#include "../tensor/tensor.hpp"

namespace moonmoe {

/// Tells the optimizer what a parameter is: Muon takes matrices and expert matrices, AdamW the
/// rest; the router bias has no gradient and moves by the load-balancing rule.
enum class ParamKind { matrix, expert_matrix, embedding, output_head, vector, router_bias };

inline const char* param_kind_name(ParamKind k) {
    switch (k) {
    case ParamKind::matrix: return "matrix";
    case ParamKind::expert_matrix: return "expert_matrix";
    case ParamKind::embedding: return "embedding";
    case ParamKind::output_head: return "output_head";
    case ParamKind::vector: return "vector";
    case ParamKind::router_bias: return "router_bias";
    }
    return "?";
}

/// A parameter and its gradient (f32, same shape; empty for the router bias, which gets none), stored as the
/// precision policy says (config/precision.hpp, docs/precision.md):
///
///   f32 weights, f32 compute    value             the parameter
///   f32 weights, bf16 compute   value + value16   the master, and the bf16 working copy the products read
///   bf16 weights                value16           the parameter; an optimizer that steps it keeps its f32 master
///                                                 in its own state and rounds it into value16 after each change
template <int Rank, class B = cpu>
struct Param {
    Tensor<float, Rank, B> value;
    Tensor<bf16, Rank, B> value16;
    Tensor<float, Rank, B> grad;
    ParamKind kind = ParamKind::matrix;

    Param() = default;
    /// Zeros of `shape`, stored in `storage` (f32 or bf16).
    Param(Shape<Rank> shape, ParamKind k, NumberFormat storage = NumberFormat::f32)
        : grad(k == ParamKind::router_bias ? Shape<Rank>{} : shape), kind(k) {
        if (storage == NumberFormat::bf16) value16 = Tensor<bf16, Rank, B>(shape);
        else
            value = Tensor<float, Rank, B>(shape);
    }

    const Shape<Rank>& shape() const { return value.empty() && !value16.empty() ? value16.shape() : value.shape(); }
    index_t size(int d) const { return shape()[d]; }
    /// Stored in bf16: value16 is the parameter, and there is no f32 value.
    bool stored_bf16() const { return value.empty() && !value16.empty(); }

    /// Sets the storage and the working copy for `p`: bf16 weights keep value16 alone (rounded from the f32 value
    /// if there was one); f32 weights keep value, with a bf16 working copy under bf16 compute.
    void set_precision(const PrecisionConfig& p) {
        if (p.weights == NumberFormat::bf16) {
            if (!value.empty()) {
                if (value16.empty()) value16 = Tensor<bf16, Rank, B>(value.shape());
                round_into_value16();
                value = Tensor<float, Rank, B>{};
            }
            return;
        }
        if (value.empty() && !value16.empty()) {  // from bf16 storage: the values widen exactly
            value = Tensor<float, Rank, B>(value16.shape());
            widen_into_value();
        }
        if (p.compute == NumberFormat::bf16) {
            if (value16.empty()) value16 = Tensor<bf16, Rank, B>(value.shape());
            refresh();
        } else {
            value16 = Tensor<bf16, Rank, B>{};
        }
    }

    /// value16 = value rounded to bf16, where both exist (after an optimizer step, QK-Clip, a load).
    void refresh() {
        if (!value.empty() && !value16.empty()) round_into_value16();
    }

private:
    void round_into_value16() { backend::cast_flat<bf16, float, B>(value.data(), value16.data(), value.numel()); }
    void widen_into_value() { backend::cast_flat<float, bf16, B>(value16.data(), value.data(), value16.numel()); }
};

/// What visit_params hands out: the HF name, the kind, the shape, and flat pointers to value and gradient.
///
/// value and grad point into the memory of the model's backend: host memory for Backend<cpu>, device memory for
/// Backend<cuda>. Only the host-visible backend lets the host dereference them; io (checkpoints, optimizer state)
/// moves their data with Memory<B>::to_host / to_device, and optim/ only wraps them in backend views for the
/// primitives (it never reads or writes them on the host).
///
/// A parameter stored in bf16 (Precision<BF16, Weights<BF16>>) has value16 and no value: its f32 master, where
/// there is one, is an optimizer's (optim/optimizer.hpp).
struct ParamRef {
    std::string name;
    ParamKind kind;
    std::vector<index_t> shape;
    float* value;              ///< backend memory (see above); null for a parameter stored in bf16
    float* grad;               ///< backend memory; null for the router bias
    bf16* value16 = nullptr;   ///< the bf16 parameter, or the bf16 working copy of value; null under f32 alone
    bool stored_bf16 = false;  ///< value16 is the parameter itself (and value is null)
    index_t numel() const {
        const auto n = checked_product(shape);
        if (!n) throw shape_error("parameter '" + name + "': shape " + shape_string(shape) + " overflows");
        return *n;
    }
};

using ParamVisitor = std::function<void(const ParamRef&)>;

/// Hands `f` the parameter's elements [offset, offset + numel(shape)) as a ParamRef (a slice of a stacked
/// parameter: one expert of the stacked experts).
template <int Rank, class B>
void visit_slice(const std::string& name, Param<Rank, B>& p, std::vector<index_t> shape, index_t offset,
                 const ParamVisitor& f) {
    const auto at = [offset](auto& t) { return t.empty() ? nullptr : t.data() + offset; };
    f(ParamRef{name, p.kind, std::move(shape), at(p.value), at(p.grad), at(p.value16), p.stored_bf16()});
}

template <int Rank, class B>
void visit(const std::string& name, Param<Rank, B>& p, const ParamVisitor& f) {
    visit_slice(name, p, std::vector<index_t>(p.shape().begin(), p.shape().end()), 0, f);
}

}  // namespace moonmoe
