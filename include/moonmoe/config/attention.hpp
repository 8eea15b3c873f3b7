// moonmoe/config/attention.hpp: `Attention<MLA<...>>` (Multi-head Latent Attention) or `Attention<MHA<...>>`.
//
// MLA (DeepSeek-V2, arXiv 2405.04434 §2.1): q = q_b_proj(norm(q_a_proj(x))) (or q_proj(x) when QRank<0>, as in
// DeepSeek-V2-Lite and Moonlight), a shared latent c_kv (KVRank) plus one RoPE key head shared by all heads, and
// per-head nope / rope / v dims. Defaults are Kimi K2's. MHA is plain multi-head attention (optionally grouped-query).
#pragma once

#include "named.hpp"

namespace moonmoe {
namespace slots {
struct attention;
struct attention_policy;
struct heads;
struct kv_heads;
struct q_rank;
struct kv_rank;
struct nope_dim;
struct rope_dim;
struct v_dim;
struct head_dim;
}  // namespace slots

template <index_t N>
using Heads = Value<slots::heads, N>;  ///< num_attention_heads
template <index_t N>
using KVHeads = Value<slots::kv_heads, N>;  ///< MHA only: key/value heads (grouped-query)
template <index_t N>
using QRank = Value<slots::q_rank, N>;  ///< q_lora_rank; QRank<0> = no query compression
template <index_t N>
using KVRank = Value<slots::kv_rank, N>;  ///< kv_lora_rank
template <index_t N>
using NopeDim = Value<slots::nope_dim, N>;  ///< qk_nope_head_dim
template <index_t N>
using RopeDim = Value<slots::rope_dim, N>;  ///< qk_rope_head_dim (MHA: rotated part of a head)
template <index_t N>
using VDim = Value<slots::v_dim, N>;  ///< v_head_dim
template <index_t N>
using HeadDim = Value<slots::head_dim, N>;  ///< MHA only: query/key/value head dim

/// Without query compression (`QRank<NoQCompression>`), queries come from one `q_proj` [heads*(nope+rope), hidden].
inline constexpr index_t NoQCompression = 0;

enum class AttentionKind { mla, mha };

struct AttentionConfig {
    AttentionKind kind;
    index_t heads;
    index_t kv_heads;  ///< MLA: equal to heads (one latent shared by all heads)
    index_t q_rank;    ///< MLA: 0 = no query compression
    index_t kv_rank;   ///< MLA only
    index_t nope_dim;  ///< MLA: per-head query/key part without RoPE; MHA: head_dim - rope_dim
    index_t rope_dim;  ///< rotated per-head query/key part (MLA: also the width of the shared RoPE key)
    index_t v_dim;

    constexpr index_t qk_head_dim() const {
        return nope_dim == Dynamic || rope_dim == Dynamic ? Dynamic : nope_dim + rope_dim;
    }
};

template <class... Args>
struct MLA {
    using slot = slots::attention_policy;
    using accepted =
        detail::slot_list<slots::heads, slots::q_rank, slots::kv_rank, slots::nope_dim, slots::rope_dim, slots::v_dim>;
    MOONMOE_CHECK_ARGUMENTS("MLA<...>", accepted, Args);
    static constexpr index_t heads = detail::value_of<slots::heads, index_t{64}, Args...>;
    static constexpr AttentionConfig value{
        .kind = AttentionKind::mla,
        .heads = heads,
        .kv_heads = heads,
        .q_rank = detail::value_of<slots::q_rank, index_t{1536}, Args...>,
        .kv_rank = detail::value_of<slots::kv_rank, index_t{512}, Args...>,
        .nope_dim = detail::value_of<slots::nope_dim, index_t{128}, Args...>,
        .rope_dim = detail::value_of<slots::rope_dim, index_t{64}, Args...>,
        .v_dim = detail::value_of<slots::v_dim, index_t{128}, Args...>,
    };
    template <class... New>
    using with = typename detail::replacing<MLA, New...>::template apply<Args...>;
};

template <class... Args>
struct MHA {
    using slot = slots::attention_policy;
    using accepted = detail::slot_list<slots::heads, slots::kv_heads, slots::head_dim, slots::rope_dim>;
    MOONMOE_CHECK_ARGUMENTS("MHA<...>", accepted, Args);
    static constexpr index_t heads = detail::value_of<slots::heads, index_t{64}, Args...>;
    static constexpr index_t head_dim = detail::value_of<slots::head_dim, index_t{128}, Args...>;
    static constexpr index_t rope_dim = detail::value_of<slots::rope_dim, head_dim, Args...>;
    static constexpr AttentionConfig value{
        .kind = AttentionKind::mha,
        .heads = heads,
        .kv_heads = detail::value_of<slots::kv_heads, heads, Args...>,
        .q_rank = 0,
        .kv_rank = 0,
        .nope_dim = head_dim == Dynamic || rope_dim == Dynamic ? Dynamic : head_dim - rope_dim,
        .rope_dim = rope_dim,
        .v_dim = head_dim,
    };
    template <class... New>
    using with = typename detail::replacing<MHA, New...>::template apply<Args...>;
};

/// `Attention<MLA<...>>` or `Attention<MHA<...>>`; `Attention<>` is Kimi K2's MLA.
template <class P = MLA<>>
struct Attention {
    using slot = slots::attention;
    static_assert(std::is_same_v<detail::slot_of_t<P>, slots::attention_policy>,
                  "Attention<P>: P must be an attention policy, MLA<...> or MHA<...>");
    using policy = P;
    static constexpr AttentionConfig value = P::value;
};

}  // namespace moonmoe
