// moonmoe/backend/cuda/cudnn.hpp: cuDNN's fused scaled-dot-product attention as the engine of the CUDA backend's
// bf16 attention path (cuda/sdpa.hpp), from the header-only cudnn-frontend C++ API.
// header-check: gpu-prepare (nvcc with cudnn-frontend: compiled and linked by tools/gpu_check.sh prepare)
//
// Include it in one translation unit of a program built with nvcc (it registers the engine at static
// initialisation), add PyPI's nvidia-cudnn-frontend headers to the include path (its `include` folder) and link
// -lcudnn -lnvrtc (cuDNN 9, in the CUDA toolkit and in PyTorch's wheels; cudnn-frontend calls NVRTC). The CUDA backend
// does not include it itself: cudnn-frontend's headers take about 90 s of nvcc per translation unit.
//
// One graph per direction and shape, built at the first call (cudnn_frontend::graph::Graph::build with heuristics
// mode A) and cached per thread: causal (top-left diagonal), bf16 input and output, f32 softmax and accumulation.
// The packed sequences are cuDNN's ragged ("THD") layout: each [T, H, d] operand is a [b, H, s, d] tensor with
// strides {., d, H d, 1} and a ragged offset per sequence (its first row times H d elements), the sequences' lengths
// as seq_len_q / seq_len_kv with the padding mask; the statistics (log-sum-exps, f32) are [b, H, s, 1] with strides
// {., 1, H, 1} and ragged offsets of H per row: token-major [T, H], as the engine contract says. s is the longest
// sequence rounded up to a power of two (at least 64), so batches of varying lengths reuse a few graphs. The offsets
// and lengths go up in one small asynchronous upload per call; the workspace is kept per thread and stream, grown
// when a graph needs more. A shape cuDNN does not support (check at build) is remembered and declined, and the
// portable path runs it.
#pragma once

#include "sdpa.hpp"
#if defined(MOONMOE_CUDA_EMULATED)  // else cuda/memory.hpp has stopped with an #error
#if MOONMOE_CUDA_EMULATED
#error "moonmoe: backend/cuda/cudnn.hpp is nvcc-only (the emulated CUDA backend attends on its host engine)"
#endif

#include <cudnn.h>

#include <cudnn_frontend.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../../tensor/transfer.hpp"

namespace moonmoe::backend::cuda_detail {

namespace cudnn_sdpa {

namespace fe = cudnn_frontend;

/// Throws cuda_error naming the step and cuDNN's message.
inline void check(fe::error_t e, const char* step) {
    if (e.is_bad()) throw cuda_error("moonmoe: cudnn-frontend " + std::string(step) + " failed: " + e.get_message());
}

/// What a graph is built for.
struct Key {
    bool backward;
    index_t sequences, longest, tokens, heads, dim_qk, dim_v;
    std::uint32_t scale_bits;
    int device;
    bool operator==(const Key&) const = default;
};
struct KeyHash {
    std::size_t operator()(const Key& k) const {
        std::size_t h = std::size_t(k.backward);
        for (std::int64_t v : {k.sequences, k.longest, k.tokens, k.heads, k.dim_qk, k.dim_v, std::int64_t(k.scale_bits),
                               std::int64_t(k.device)})
            h ^= std::hash<std::int64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        return h;
    }
};

// The tensors' ids in a variant pack.
enum Uid : std::int64_t {
    q_uid = 1,
    k_uid,
    v_uid,
    o_uid,
    stats_uid,
    d_o_uid,
    dq_uid,
    dk_uid,
    dv_uid,
    offsets_qk_uid,
    offsets_v_uid,
    offsets_stats_uid,
    lengths_uid
};

/// A [b, H, s, d] ragged view of a packed [T, H, d] operand.
inline std::shared_ptr<fe::graph::Tensor_attributes> operand(
    fe::graph::Graph& g, const char* name, Uid uid, const Key& k, index_t d,
    const std::shared_ptr<fe::graph::Tensor_attributes>& ragged) {
    auto t = g.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim({k.sequences, k.heads, k.longest, d})
                          .set_stride({k.longest * k.heads * d, d, k.heads * d, 1}));
    t->set_ragged_offset(ragged);
    return t;
}

/// Sets an output's layout as operand() does.
inline void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, Uid uid, const Key& k, index_t d,
                   const std::shared_ptr<fe::graph::Tensor_attributes>& ragged) {
    t->set_output(true)
        .set_uid(uid)
        .set_dim({k.sequences, k.heads, k.longest, d})
        .set_stride({k.longest * k.heads * d, d, k.heads * d, 1})
        .set_ragged_offset(ragged);
}

inline std::shared_ptr<fe::graph::Tensor_attributes> int_column(fe::graph::Graph& g, const char* name, Uid uid,
                                                                index_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
}

/// The graph of one key; null where cuDNN does not support it.
inline std::shared_ptr<fe::graph::Graph> build(cudnnHandle_t handle, const Key& k) {
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const index_t b = k.sequences;
    auto off_qk = int_column(*g, "offsets_qk", offsets_qk_uid, b + 1);
    auto off_v = int_column(*g, "offsets_v", offsets_v_uid, b + 1);
    auto off_stats = int_column(*g, "offsets_stats", offsets_stats_uid, b + 1);
    auto lengths = int_column(*g, "lengths", lengths_uid, b);
    auto Q = operand(*g, "Q", q_uid, k, k.dim_qk, off_qk);
    auto K = operand(*g, "K", k_uid, k, k.dim_qk, off_qk);
    auto V = operand(*g, "V", v_uid, k, k.dim_v, off_v);
    const float scale = std::bit_cast<float>(k.scale_bits);
    if (!k.backward) {
        auto options = fe::graph::SDPA_attributes()
                           .set_name("moonmoe_sdpa")
                           .set_generate_stats(true)
                           .set_causal_mask(true)
                           .set_attn_scale(scale)
                           .set_padding_mask(true)
                           .set_seq_len_q(lengths)
                           .set_seq_len_kv(lengths);
        auto [O, stats] = g->sdpa(Q, K, V, options);
        output(O, o_uid, k, k.dim_v, off_v);
        stats->set_output(true)
            .set_uid(stats_uid)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({b, k.heads, k.longest, 1})
            .set_stride({k.longest * k.heads, 1, k.heads, 1})
            .set_ragged_offset(off_stats);
    } else {
        auto O = operand(*g, "O", o_uid, k, k.dim_v, off_v);
        auto dO = operand(*g, "dO", d_o_uid, k, k.dim_v, off_v);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(stats_uid)
                                   .set_dim({b, k.heads, k.longest, 1})
                                   .set_stride({k.longest * k.heads, 1, k.heads, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        stats->set_ragged_offset(off_stats);
        auto options = fe::graph::SDPA_backward_attributes()
                           .set_name("moonmoe_sdpa_backward")
                           .set_causal_mask(true)
                           .set_attn_scale(scale)
                           .set_padding_mask(true)
                           .set_seq_len_q(lengths)
                           .set_seq_len_kv(lengths)
                           .set_max_total_seq_len_q(k.tokens)
                           .set_max_total_seq_len_kv(k.tokens);
        auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, options);
        output(dQ, dq_uid, k, k.dim_qk, off_qk);
        output(dK, dk_uid, k, k.dim_qk, off_qk);
        output(dV, dv_uid, k, k.dim_v, off_v);
    }
    if (g->build(handle, {fe::HeurMode_t::A}).is_bad()) return nullptr;  // unsupported here: declined, remembered
    return g;
}

/// One thread's cuDNN handle, graphs and workspaces.
class Context {
public:
    Context() = default;
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;
    ~Context() {  // unchecked, at thread exit
        graphs_.clear();
        for (auto& [stream, w] : workspaces_) cudaFree(w.data);
        if (handle_) cudnnDestroy(handle_);
    }

    /// The handle, bound to the current stream.
    cudnnHandle_t handle() {
        if (!handle_ && cudnnCreate(&handle_) != CUDNN_STATUS_SUCCESS)
            throw cuda_error("moonmoe: cudnnCreate failed (is libcudnn.so.9 on the library path?)");
        if (cudnnSetStream(handle_, current_stream()) != CUDNN_STATUS_SUCCESS)
            throw cuda_error("moonmoe: cudnnSetStream failed");
        return handle_;
    }
    /// The graph of `k` (built at its first call), or null where cuDNN declined it.
    fe::graph::Graph* graph(const Key& k) {
        auto it = graphs_.find(k);
        if (it == graphs_.end()) it = graphs_.emplace(k, build(handle(), k)).first;
        return it->second.get();
    }
    /// At least `bytes` of workspace for the current stream (stream-ordered, kept).
    void* workspace(std::int64_t bytes) {
        Workspace& w = workspaces_[current_stream()];
        if (w.bytes < bytes) {
            if (w.data) MOONMOE_CUDA_CHECK(cudaFreeAsync(w.data, current_stream()));
            w.data = nullptr;
            MOONMOE_CUDA_CHECK(cudaMallocAsync(&w.data, std::size_t(bytes), current_stream()));
            w.bytes = bytes;
        }
        return w.data;
    }

private:
    struct Workspace {
        void* data = nullptr;
        std::int64_t bytes = 0;
    };
    cudnnHandle_t handle_ = nullptr;
    std::unordered_map<Key, std::shared_ptr<fe::graph::Graph>, KeyHash> graphs_;
    std::unordered_map<cudaStream_t, Workspace> workspaces_;
};

inline Context& context() {
    thread_local Context c;
    return c;
}

/// The offsets (in elements) and lengths of a problem's sequences, int32, in one upload: four columns, each padded
/// to 16 bytes.
struct Ragged {
    Tensor<std::int32_t, 1, cuda> data;
    index_t stride;
    std::int32_t* column(int c) { return data.data() + c * stride; }
};

inline Ragged ragged(const SdpaProblem& p) {
    const index_t b = index_t(p.offsets.size()) - 1, stride = (b + 1 + 3) / 4 * 4;
    std::vector<std::int32_t> host(std::size_t(4 * stride), 0);
    for (index_t s = 0; s <= b; ++s) {
        const index_t t = p.offsets[std::size_t(s)];
        host[std::size_t(s)] = std::int32_t(t * p.heads * p.dim_qk);
        host[std::size_t(stride + s)] = std::int32_t(t * p.heads * p.dim_v);
        host[std::size_t(2 * stride + s)] = std::int32_t(t * p.heads);
        if (s < b) host[std::size_t(3 * stride + s)] = std::int32_t(p.offsets[std::size_t(s) + 1] - t);
    }
    return {to_device<cuda>(host), stride};
}

inline Key key(const SdpaProblem& p, bool backward) {
    int device = 0;
    MOONMOE_CUDA_CHECK(cudaGetDevice(&device));
    index_t longest = 64;
    while (longest < p.longest) longest *= 2;
    return {backward, index_t(p.offsets.size()) - 1,         longest, p.tokens, p.heads, p.dim_qk,
            p.dim_v,  std::bit_cast<std::uint32_t>(p.scale), device};
}

/// Whether a problem fits cuDNN's int32 offsets.
inline bool fits(const SdpaProblem& p) {
    const index_t widest = p.dim_qk > p.dim_v ? p.dim_qk : p.dim_v;
    return p.tokens * p.heads * widest < index_t(1) << 31;
}

}  // namespace cudnn_sdpa

/// The engine (sdpa.hpp's contract) on cuDNN.
class CudnnSdpa final : public SdpaEngine {
public:
    const char* name() const override { return "cuDNN"; }

    bool forward(const SdpaProblem& p, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* stats) override {
        using namespace cudnn_sdpa;
        if (!fits(p)) return false;
        Context& ctx = context();
        fe::graph::Graph* g = ctx.graph(key(p, false));
        if (!g) return false;
        Ragged r = ragged(p);
        std::unordered_map<std::int64_t, void*> pack = operands(r, q, k, v, o, stats);
        run(ctx, *g, pack);
        return true;
    }

    bool backward(const SdpaProblem& p, const bf16* q, const bf16* k, const bf16* v, const bf16* o, const bf16* d_o,
                  const float* stats, bf16* dq, bf16* dk, bf16* dv) override {
        using namespace cudnn_sdpa;
        if (!fits(p)) return false;
        Context& ctx = context();
        fe::graph::Graph* g = ctx.graph(key(p, true));
        if (!g) return false;
        Ragged r = ragged(p);
        std::unordered_map<std::int64_t, void*> pack = operands(r, q, k, v, o, stats);
        pack.insert({{d_o_uid, const_cast<bf16*>(d_o)}, {dq_uid, dq}, {dk_uid, dk}, {dv_uid, dv}});
        run(ctx, *g, pack);
        return true;
    }

private:
    /// The variant pack's entries both directions share (cuDNN reads through every pointer it is given here).
    static std::unordered_map<std::int64_t, void*> operands(cudnn_sdpa::Ragged& r, const bf16* q, const bf16* k,
                                                            const bf16* v, const bf16* o, const float* stats) {
        using namespace cudnn_sdpa;
        return {{q_uid, const_cast<bf16*>(q)}, {k_uid, const_cast<bf16*>(k)},          {v_uid, const_cast<bf16*>(v)},
                {o_uid, const_cast<bf16*>(o)}, {stats_uid, const_cast<float*>(stats)}, {offsets_qk_uid, r.column(0)},
                {offsets_v_uid, r.column(1)},  {offsets_stats_uid, r.column(2)},       {lengths_uid, r.column(3)}};
    }

    static void run(cudnn_sdpa::Context& ctx, cudnn_sdpa::fe::graph::Graph& g,
                    std::unordered_map<std::int64_t, void*>& pack) {
        std::int64_t bytes = 0;
        cudnn_sdpa::check(g.get_workspace_size(bytes), "get_workspace_size");
        void* workspace = bytes > 0 ? ctx.workspace(bytes) : nullptr;
        cudnn_sdpa::check(g.execute(ctx.handle(), pack, workspace), "execute");
    }
};

inline CudnnSdpa& cudnn_sdpa_engine() {
    static CudnnSdpa engine;
    return engine;
}

/// Registers the engine when the program starts (this header is included once per program, in any number of
/// translation units: an inline variable is initialised once).
inline const bool cudnn_sdpa_registered = register_sdpa_engine(&cudnn_sdpa_engine());

}  // namespace moonmoe::backend::cuda_detail

#endif  // defined(MOONMOE_CUDA_EMULATED)
