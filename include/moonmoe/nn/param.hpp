// moonmoe/nn/param.hpp: a trainable tensor with its gradient, what kind of tensor it is, and how modules list them.
#pragma once

#include <functional>
#include <string>
#include <vector>

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

/// A parameter and its gradient (same shape; empty for the router bias, which gets none).
template <int Rank, class B = cpu>
struct Param {
    Tensor<float, Rank, B> value;
    Tensor<float, Rank, B> grad;
    ParamKind kind = ParamKind::matrix;

    Param() = default;
    Param(Shape<Rank> shape, ParamKind k) : value(shape), grad(k == ParamKind::router_bias ? Shape<Rank>{} : shape), kind(k) {}
};

/// What visit_params hands out: the HF name, the kind, the shape, and flat pointers to value and gradient.
///
/// value and grad point into the memory of the model's backend: host memory for Backend<cpu>, device memory for
/// Backend<cuda>. Only the host-visible backend lets the host dereference them; io (checkpoints, optimizer state)
/// moves their data with Memory<B>::to_host / to_device, and optim/ only wraps them in backend views for the
/// primitives (it never reads or writes them on the host).
struct ParamRef {
    std::string name;
    ParamKind kind;
    std::vector<index_t> shape;
    float* value;  ///< backend memory (see above)
    float* grad;   ///< backend memory; null for the router bias
    index_t numel() const {
        const auto n = checked_product(shape);
        if (!n) throw shape_error("parameter '" + name + "': shape " + shape_string(shape) + " overflows");
        return *n;
    }
};

using ParamVisitor = std::function<void(const ParamRef&)>;

template <int Rank, class B>
void visit(const std::string& name, Param<Rank, B>& p, const ParamVisitor& f) {
    f(ParamRef{name, p.kind, std::vector<index_t>(p.value.shape().begin(), p.value.shape().end()), p.value.data(),
               p.grad.empty() ? nullptr : p.grad.data()});
}

}  // namespace moonmoe
