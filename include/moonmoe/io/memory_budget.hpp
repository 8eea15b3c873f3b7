// moonmoe/io/memory_budget.hpp: what a model read from config.json will allocate, checked before anything is.
//
// A config.json is untrusted input: `num_hidden_layers` 1e7 or `hidden_size` 2^62 would otherwise end in
// std::bad_alloc, the OOM killer, or (through a product that wraps around) a small allocation written past its
// end. estimate_model_memory() lists every parameter tensor the model will hold with its shape spelled in
// config.json's fields; each tensor's element count is an overflow-checked product (an overflow names the
// fields), and the totals are summed in double so they cannot wrap. check_memory_budget() compares the bytes
// with what the machine (or the caller) allows.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "../config/model_config.hpp"
#include "error.hpp"

namespace moonmoe {

/// Bytes a model keeps for its parameters: FP32 values and gradients, and optionally optimizer state (Muon's
/// momentum for matrices, AdamW's two moments for embeddings, head and norm gains). Activations are not included.
struct MemoryEstimate {
    double parameters = 0;  ///< elements
    double values_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
    std::string largest_tensor;  ///< "model.embed_tokens.weight [vocab_size 163840 x hidden_size 7168]"
    double largest_tensor_elements = 0;

    double total_bytes() const { return values_bytes + gradient_bytes + optimizer_bytes; }
};

namespace detail {

/// One tensor's shape as a product of named config.json fields, checked for overflow as it is built.
class NamedProduct {
public:
    NamedProduct(const std::string& source, std::string tensor) : source_(source), tensor_(std::move(tensor)) {}
    NamedProduct& times(index_t value, const char* field) {
        text_ += (text_.empty() ? "" : " x ") + std::string(field) + " " + std::to_string(value);
        const auto next = checked_mul(elements_, value);
        if (!next)
            throw io_error(source_ + ": " + tensor_ + " [" + text_ + "] " +
                           (value < 0 ? "has a negative size" : "has more elements than fit in 64 bits"));
        elements_ = *next;
        return *this;
    }
    index_t elements() const { return elements_; }
    std::string describe() const { return tensor_ + " [" + text_ + "]"; }

private:
    const std::string& source_;
    std::string tensor_, text_;
    index_t elements_ = 1;
};

/// The smaller of MemAvailable (/proc/meminfo) and the room left under this process's cgroup memory limit
/// (v2 memory.max - memory.current, or v1 memory.limit_in_bytes - memory.usage_in_bytes); nullopt if neither
/// can be read (not Linux).
inline std::optional<double> available_memory_bytes() {
    std::optional<double> best;
    const auto take = [&](double v) { best = best ? std::min(*best, v) : v; };
    if (std::ifstream meminfo("/proc/meminfo"); meminfo) {
        std::string key;
        double kib = 0;
        std::string unit;
        while (meminfo >> key >> kib) {
            std::getline(meminfo, unit);
            if (key == "MemAvailable:") {
                take(kib * 1024.0);
                break;
            }
        }
    }
    const auto read_number = [](const char* path) -> std::optional<double> {
        std::ifstream in(path);
        std::string text;
        if (!(in >> text) || text == "max") return std::nullopt;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        return end && *end == '\0' ? std::optional<double>(v) : std::nullopt;
    };
    const auto limit_minus_usage = [&](const char* limit_path, const char* usage_path) {
        const auto limit = read_number(limit_path);
        if (!limit || *limit >= 9.0e18) return;  // cgroup v1 writes a huge number for "no limit"
        take(std::max(0.0, *limit - read_number(usage_path).value_or(0.0)));
    };
    limit_minus_usage("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current");
    limit_minus_usage("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes");
    return best;
}

/// A parameter count, which may exceed any integer type for a crafted config: "1.23e+23" beyond 2^53.
inline std::string format_count(double n) {
    char buf[48];
    std::snprintf(buf, sizeof buf, n < 9.0e15 ? "%.0f" : "%.3g", n);
    return buf;
}

inline std::string format_bytes(double bytes) {
    char buf[48];
    if (bytes >= 1e12) std::snprintf(buf, sizeof buf, "%.3g TB", bytes / 1e12);
    else if (bytes >= 1e9)
        std::snprintf(buf, sizeof buf, "%.3g GB", bytes / 1e9);
    else
        std::snprintf(buf, sizeof buf, "%.3g MB", bytes / 1e6);
    return buf;
}

}  // namespace detail

/// Every parameter tensor of a DeepSeek-V3-architecture model of configuration `c` (MLA attention), by HF name and
/// config.json fields; throws io_error prefixed with `source` when a tensor's element count overflows.
inline MemoryEstimate estimate_model_memory(const ModelConfig& c, const std::string& source,
                                            bool with_optimizer_state = false) {
    MemoryEstimate m;
    const auto& a = c.attention;
    const auto& mo = c.moe;
    const index_t L = c.dims.layers, D = c.dims.dense_layers, H = c.dims.hidden;
    // `copies` tensors of this shape; `matrix` picks the optimizer state (Muon: 1 buffer, AdamW: 2).
    const auto add = [&](const detail::NamedProduct& p, double copies, bool matrix, bool has_grad = true) {
        const double n = double(p.elements()) * copies;
        m.parameters += n;
        m.values_bytes += 4.0 * n;
        if (has_grad) m.gradient_bytes += 4.0 * n;
        if (with_optimizer_state && has_grad) m.optimizer_bytes += (matrix ? 4.0 : 8.0) * n;
        if (double(p.elements()) > m.largest_tensor_elements)
            m.largest_tensor_elements = double(p.elements()), m.largest_tensor = p.describe();
    };
    const auto shape = [&](const char* tensor) { return detail::NamedProduct(source, tensor); };
    // A sum of two fields, which a crafted file can also push past 64 bits (qk_nope_head_dim = INT64_MAX).
    const auto sum = [&](index_t x, index_t y, const char* fields) {
        if (x > std::numeric_limits<index_t>::max() - y)
            throw io_error(source + ": " + fields + " = " + std::to_string(x) + " + " + std::to_string(y) +
                           " overflows 64 bits");
        return x + y;
    };
    const double layers = double(std::max<index_t>(L, 0)), dense = double(std::max<index_t>(D, 0));
    const double moe_layers = std::max(0.0, layers - dense);

    add(shape("model.embed_tokens.weight").times(c.dims.vocab, "vocab_size").times(H, "hidden_size"), 1, false);
    add(shape("lm_head.weight").times(c.dims.vocab, "vocab_size").times(H, "hidden_size"), 1, false);
    add(shape("model.norm.weight").times(H, "hidden_size"), 1, false);
    add(shape("input_layernorm.weight").times(H, "hidden_size"), 2 * layers, false);

    const index_t dqk = sum(a.nope_dim, a.rope_dim, "qk_nope_head_dim + qk_rope_head_dim");
    if (a.q_rank > 0) {
        add(shape("self_attn.q_a_proj.weight").times(a.q_rank, "q_lora_rank").times(H, "hidden_size"), layers, true);
        add(shape("self_attn.q_a_layernorm.weight").times(a.q_rank, "q_lora_rank"), layers, false);
        add(shape("self_attn.q_b_proj.weight")
                .times(a.heads, "num_attention_heads")
                .times(dqk, "(qk_nope_head_dim + qk_rope_head_dim)")
                .times(a.q_rank, "q_lora_rank"),
            layers, true);
    } else {
        add(shape("self_attn.q_proj.weight")
                .times(a.heads, "num_attention_heads")
                .times(dqk, "(qk_nope_head_dim + qk_rope_head_dim)")
                .times(H, "hidden_size"),
            layers, true);
    }
    add(shape("self_attn.kv_a_proj_with_mqa.weight")
            .times(sum(a.kv_rank, a.rope_dim, "kv_lora_rank + qk_rope_head_dim"), "(kv_lora_rank + qk_rope_head_dim)")
            .times(H, "hidden_size"),
        layers, true);
    add(shape("self_attn.kv_a_layernorm.weight").times(a.kv_rank, "kv_lora_rank"), layers, false);
    add(shape("self_attn.kv_b_proj.weight")
            .times(a.heads, "num_attention_heads")
            .times(sum(a.nope_dim, a.v_dim, "qk_nope_head_dim + v_head_dim"), "(qk_nope_head_dim + v_head_dim)")
            .times(a.kv_rank, "kv_lora_rank"),
        layers, true);
    add(shape("self_attn.o_proj.weight")
            .times(H, "hidden_size")
            .times(a.heads, "num_attention_heads")
            .times(a.v_dim, "v_head_dim"),
        layers, true);

    add(shape("mlp.gate_proj.weight").times(c.dims.dense_hidden, "intermediate_size").times(H, "hidden_size"),
        3 * dense, true);
    add(shape("mlp.gate.weight").times(mo.experts, "n_routed_experts").times(H, "hidden_size"), moe_layers, true);
    add(shape("mlp.gate.e_score_correction_bias").times(mo.experts, "n_routed_experts"), moe_layers, false, false);
    add(shape("mlp.experts.N.gate_proj.weight")
            .times(mo.expert_hidden, "moe_intermediate_size")
            .times(H, "hidden_size"),
        3 * double(std::max<index_t>(mo.experts, 0)) * moe_layers, true);
    add(shape("mlp.shared_experts.gate_proj.weight")
            .times(mo.shared, "n_shared_experts")
            .times(mo.expert_hidden, "moe_intermediate_size")
            .times(H, "hidden_size"),
        3 * moe_layers, true);
    return m;
}

/// Throws io_error (prefixed with `source`) when a model of configuration `c` would hold more than `limit`
/// bytes of parameters (values, gradients and, if asked, optimizer state), or, without a limit, more than the
/// memory available to this process now. The message gives the estimate, its parts and the largest tensor.
inline MemoryEstimate check_memory_budget(const ModelConfig& c, const std::string& source,
                                          std::optional<double> limit = std::nullopt,
                                          bool with_optimizer_state = false) {
    const MemoryEstimate m = estimate_model_memory(c, source, with_optimizer_state);
    const bool given = limit.has_value();
    if (!limit) limit = detail::available_memory_bytes();
    if (limit && m.total_bytes() > *limit)
        throw io_error(
            source + ": the model needs " + detail::format_bytes(m.total_bytes()) + " (" +
            detail::format_bytes(m.values_bytes) + " of FP32 values for " + detail::format_count(m.parameters) +
            " parameters, " + detail::format_bytes(m.gradient_bytes) + " of gradients" +
            (with_optimizer_state ? ", " + detail::format_bytes(m.optimizer_bytes) + " of optimizer state" : "") +
            "; the largest tensor is " + m.largest_tensor + "), more than the " + detail::format_bytes(*limit) +
            (given ? " allowed by the caller's memory_limit" : " of memory available to this process") +
            "; check num_hidden_layers, hidden_size, vocab_size and the expert counts");
    return m;
}

}  // namespace moonmoe
