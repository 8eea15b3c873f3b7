#!/usr/bin/env python3
"""The PyTorch side of the benchmark suite (bench/SUITE.md): the same benchmark names as our Google Benchmark
binaries, run in PyTorch on the CPU in float32 (or on a GPU, --device cuda, in float32 and bfloat16), written as JSON
for bench/compare.py.

    python3 bench/torch_suite.py [--quick] [--threads N] [--filter REGEX] [--min-time S] [--out PATH]
    python3 bench/torch_suite.py --device cuda [--dtypes f32,bf16] [--quick] ...   # -> results/torch_cuda.json
    python3 bench/torch_suite.py --list [--quick]     # the names, nothing run
    python3 bench/torch_suite.py --check              # semantic checks on small shapes (causality, decode, Muon)

Without --out, the whole suite writes results/torch.json (what bench/compare.py reads) and a partial run (--filter,
--quick) results/torch_partial.json, so re-timing a few rows never replaces the whole suite's file.

Each family (the first name component) runs in its own subprocess, so one family's memory is returned before the
next starts; the subprocess's peak RSS (which includes Python, torch and transformers, a few hundred MiB) is
recorded with every row of that family as `peak_rss_MiB_family`.

Timing: one untimed warm-up call, then timed calls until at least --min-time seconds of timed work and at least one
call; the mean wall time per call (time.perf_counter) is reported. Inputs, modules and weights are built outside
the timed region. Where a benchmark needs state restored between calls (gradients, QK-Clip's weights), that happens
between timed calls, outside the timer.

`forward` rows run with autograd recording (parameters require grad), i.e. the training forward that keeps what
backward needs, as ours does; `forward_backward` rows add `out.backward(dout)` with a fixed random dout. The
gradients of the parameters and of the input are set to None between calls (outside the timer), so every timed
backward writes fresh gradients (as the first micro-batch of a step does) instead of accumulating into old ones.

On the GPU (--device cuda): inputs, weights and modules live on the device; every timed call ends with
torch.cuda.synchronize() (as every timed call of moonmoe_cuda_bench ends with a stream synchronisation), so the time
is the GPU's. TF32 is off (torch.backends.cuda.matmul.allow_tf32 = False, float32 matmul precision "highest"): f32
rows are true float32, as our CUDA backend's pedantic cuBLAS calls. Each name has one row per --dtypes entry
(`variant` f32 or bf16: weights, inputs and activations in that type), except Muon (float32 weights; the variant is
the Newton-Schulz precision, as on the CPU), AdamW (default and fused, float32) and GEMM (float32 and bfloat16
operands on every device: the bf16 rows are what ours' gemm_bf16/... rows compare with).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import inspect
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = ["gemm", "syrk", "rmsnorm", "rope", "mla", "sdpa", "router", "moe", "layer", "ns", "muon", "qk_clip",
            "adamw"]

# ---- The suite, mirroring bench/SUITE.md: (name, small). `small` rows are what --quick (CI) runs. ----
SUITE = [
    ("gemm/nn/m:2048/n:2048/k:2048", False),   # the SGEMM reference
    ("gemm/nt/m:1024/n:1536/k:7168", False),   # q_a
    ("gemm/nt/m:1024/n:12288/k:1536", False),  # q_b
    ("gemm/nt/m:1024/n:576/k:7168", False),    # kv_a
    ("gemm/nt/m:1024/n:16384/k:512", False),   # kv_b
    ("gemm/nt/m:1024/n:7168/k:8192", False),   # o
    ("gemm/nt/m:192/n:2048/k:7168", False),    # one expert's gate at 192 tokens (a busy expert)
    ("gemm/nt/m:96/n:2048/k:7168", False),     # ... at 96 tokens
    ("gemm/nt/m:64/n:2048/k:7168", False),     # ... at 64 tokens
    ("gemm/nt/m:16/n:2048/k:7168", False),     # ... at 16 tokens
    ("gemm/nt/m:1/n:7168/k:8192", False),      # o_proj decoding one token
    ("gemm/nn/m:1024/n:7168/k:2048", False),
    ("gemm/tn/m:2048/n:7168/k:1024", False),
    ("gemm/nn/m:256/n:256/k:256", True),
    ("syrk/n:2048/k:7168", False),
    ("rmsnorm/forward/tokens:4096/dim:7168", False),
    ("rmsnorm/forward_backward/tokens:4096/dim:7168", False),
    ("rmsnorm/forward/tokens:64/dim:512", True),
    ("rmsnorm/forward_backward/tokens:64/dim:512", True),
    ("rope/forward/tokens:4096/heads:64/dim:64", False),
    ("rope/forward/tokens:64/heads:8/dim:32", True),
    ("mla/forward/k2/seq:1024", False),
    ("mla/forward_backward/k2/seq:1024", False),
    ("mla/decode/k2/cache:4096", False),
    ("mla/forward/small/seq:128", True),
    ("mla/forward_backward/small/seq:128", True),
    ("mla/decode/small/cache:256", True),
    # MLA's attention core alone (bench/sdpa.cpp): torch.nn.functional.scaled_dot_product_attention, causal
    ("sdpa/forward/k2/tokens:4096", False),
    ("sdpa/forward_backward/k2/tokens:4096", False),
    ("sdpa/forward/small/tokens:256", True),
    ("sdpa/forward_backward/small/tokens:256", True),
    ("router/forward/k2/tokens:4096", False),
    ("router/forward/small/tokens:256", True),
    ("moe/forward/k2/tokens:1024", False),
    ("moe/forward_backward/k2/tokens:1024", False),
    ("moe/forward/small/tokens:256", True),
    ("moe/forward_backward/small/tokens:256", True),
    ("layer/forward/k2/tokens:256", False),
    ("layer/forward_backward/k2/tokens:256", False),
    ("layer/forward_backward/k2/tokens:4096", False),  # issue 26: ours in bf16 (layer_bf16) vs autocast
    ("layer/forward/small/tokens:128", True),
    ("layer/forward_backward/small/tokens:128", True),
    *[(f"ns/{policy}/general/rows:{r}/cols:{c}", r == 256)
      for r, c in [(2048, 7168), (256, 512)] for policy in ("keller", "polar_express", "you")],
    *[(f"muon/step/rows:{r}/cols:{c}", r == 256)
      for r, c in [(2048, 7168), (7168, 2048), (1536, 7168), (12288, 1536), (576, 7168), (16384, 512),
                   (7168, 8192), (256, 512)]],
    ("qk_clip/mla/k2/heads:64", False),
    ("qk_clip/mla/small/heads:8", True),
    ("adamw/step/numel:117440512", False),  # 16384 x 7168, an embedding slice
    ("adamw/step/numel:131072", True),
]

# Rows per name: Muon has torch's float32-patched and default bfloat16 Newton-Schulz; AdamW default and fused; GEMM
# float32 and bfloat16 operands (the bf16 rows are what ours' gemm_bf16/... rows compare with); the decoder layer
# float32, bfloat16 (module and input in bfloat16) and bfloat16 autocast (float32 module and input, the forward under
# torch.autocast(dtype=bfloat16), the backward outside it, as torch's AMP recipe: what ours' layer_bf16/... rows
# compare with).
VARIANTS = {"muon": ["f32", "bf16"], "adamw": ["f32", "fused"], "gemm": ["f32", "bf16"],
            "layer": ["f32", "bf16", "autocast"]}

# Where the child runs (--device, --dtypes): every other family has one row per dtype; DTYPE is the current one.
DEVICE = "cpu"
DTYPES = ["f32"]
DTYPE = "f32"

CONFIGS = {
    "k2": dict(hidden=7168, heads=64, q_rank=1536, kv_rank=512, nope=128, rope=64, v=128, experts=384, top_k=8,
               routed_scale=2.827, expert_hidden=2048, shared_hidden=2048, local_experts=24),
    "small": dict(hidden=512, heads=8, q_rank=192, kv_rank=128, nope=64, rope=32, v=64, experts=16, top_k=2,
                  routed_scale=2.5, expert_hidden=256, shared_hidden=256, local_experts=16),
}
# Kimi K2's RoPE (both configs): theta 50000, YaRN factor 32 over 4096 original positions.
ROPE_PARAMETERS = dict(rope_type="yarn", rope_theta=50000.0, factor=32.0, original_max_position_embeddings=4096,
                       beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
MAX_POSITIONS = 131072  # 32 x 4096
RMS_EPS = 1e-6
QK_CLIP_TAU = 100.0

# Newton-Schulz coefficient schedules, from include/moonmoe/config/optimizer.hpp and optim/newton_schulz.hpp:
# (a, b, c) per iteration; `cycle` repeats the table, otherwise its last entry repeats past the end; the input is
# divided by max(||G||_F * safety + add_eps, 1e-7) (Polar Express: safety 1.02, add_eps 1e-6; others 1 and 0).
NS_POLICIES = {
    "keller": dict(table=[(3.4445, -4.7750, 2.0315)], cycle=True, safety=1.0, add_eps=0.0),
    "polar_express": dict(table=[(8.156554524902461, -22.48329292557795, 15.878769915207462),
                                 (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                                 (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                                 (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                                 (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)],
                          cycle=False, safety=1.02, add_eps=1e-6),
    "you": dict(table=[(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                       (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)], cycle=True, safety=1.0, add_eps=0.0),
}
NS_STEPS = 5
NS_CLAMP_EPS = 1e-7


def parse_name(name: str) -> tuple[list[str], dict[str, int]]:
    """'mla/forward/k2/seq:1024' -> (['mla', 'forward', 'k2'], {'seq': 1024})."""
    words, args = [], {}
    for part in name.split("/"):
        if ":" in part:
            key, value = part.split(":")
            args[key] = int(value)
        else:
            words.append(part)
    return words, args


def selected(quick: bool, pattern: str | None, family: str | None = None) -> list[str]:
    names = [n for n, small in SUITE if (small or not quick)]
    if pattern:
        names = [n for n in names if re.search(pattern, n)]
    if family:
        names = [n for n in names if n.split("/")[0] == family]
    return names


def rows_of(name: str) -> list[str]:
    return VARIANTS.get(name.split("/")[0], DTYPES)


# =====================================================================================================================
# Everything below runs in the per-family child (torch imported lazily so --list is instant).
# =====================================================================================================================

def torch_dtype():
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16}[DTYPE]


def place(x):
    """A tensor or module on DEVICE, floating point in DTYPE (tensors are built on the CPU from seeded generators, so
    every device and dtype starts from the same numbers)."""
    import torch
    if isinstance(x, torch.Tensor) and not x.is_floating_point():
        return x.to(DEVICE)
    return x.to(device=DEVICE, dtype=torch_dtype())


def sync():
    """Waits for the GPU's queued work (nothing to wait for on the CPU)."""
    if DEVICE == "cuda":
        import torch
        torch.cuda.synchronize()


def time_call(fn, min_time: float, reset=None) -> tuple[float, int]:
    """One untimed warm-up call, then timed calls until >= min_time s timed and >= 1 call; (mean ms, calls).
    `reset`, if given, runs before every call, outside the timer. On the GPU each call is timed to its end."""
    if reset:
        reset()
    fn()
    sync()
    total, calls = 0.0, 0
    while calls < 1 or total < min_time:
        if reset:
            reset()
            sync()
        t0 = time.perf_counter()
        fn()
        sync()
        total += time.perf_counter() - t0
        calls += 1
    return total / calls * 1e3, calls


def hf_config(cfg: str):
    from transformers import DeepseekV3Config
    c = CONFIGS[cfg]
    config = DeepseekV3Config(
        hidden_size=c["hidden"], num_attention_heads=c["heads"], num_key_value_heads=c["heads"],
        q_lora_rank=c["q_rank"], kv_lora_rank=c["kv_rank"], qk_nope_head_dim=c["nope"], qk_rope_head_dim=c["rope"],
        v_head_dim=c["v"], n_routed_experts=c["experts"], num_experts_per_tok=c["top_k"], n_group=1, topk_group=1,
        routed_scaling_factor=c["routed_scale"], n_shared_experts=1, moe_intermediate_size=c["expert_hidden"],
        norm_topk_prob=True, rms_norm_eps=RMS_EPS, max_position_embeddings=MAX_POSITIONS,
        rope_parameters=dict(ROPE_PARAMETERS), rope_interleave=True, attention_bias=False, attention_dropout=0.0,
        num_hidden_layers=1, first_k_dense_replace=0, vocab_size=256)
    config._attn_implementation = "sdpa"  # the default implementation
    return config


def rope_tables(config, positions):
    """cos, sin [1, len(positions), rope] from transformers' DeepseekV3RotaryEmbedding (YaRN)."""
    import torch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
    rotary = DeepseekV3RotaryEmbedding(config)
    assert rotary.rope_type == "yarn", rotary.rope_type
    pos = torch.as_tensor(positions).cpu().view(1, -1)
    return tuple(place(t) for t in rotary(torch.empty(1, dtype=torch.float32), pos))


def rope_interleave(x, cos, sin):
    """The query half of transformers' apply_rotary_pos_emb_interleave (same ops): the pairs (x0, x1), (x2, x3), ...
    rotated, written out as [rotated evens | rotated odds]. cos/sin broadcast against x[..., :R/2]."""
    import torch
    cos = cos[..., : cos.shape[-1] // 2]
    sin = sin[..., : sin.shape[-1] // 2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def make_attention(cfg: str):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    config = hf_config(cfg)
    return config, place(DeepseekV3Attention(config, layer_idx=0))


def attention_inputs(config, x):
    """(position_embeddings, attention_mask) for one causal sequence x [1, S, hidden], built as DeepseekV3Model does
    (for sdpa without padding the mask is None and sdpa runs with is_causal=True)."""
    import torch
    from transformers.masking_utils import create_causal_mask
    pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None, past_key_values=None,
                              position_ids=pos)
    return rope_tables(config, pos[0]), mask


def rmsnorm(dim):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    return DeepseekV3RMSNorm(dim, eps=RMS_EPS)


def fill_uniform_fan_in(tensor):
    """nn.Linear's default: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) for a [out, in] weight."""
    import torch
    bound = 1.0 / math.sqrt(tensor.shape[1])
    with torch.no_grad():
        tensor.uniform_(-bound, bound)
    return tensor


def route(x, weight, bias, top_k: int, scale: float):
    """K2's router with one group: sigmoid scores, top-k on scores + correction bias, weights normalised and scaled."""
    scores = (x @ weight.T).sigmoid()
    choice = scores + bias
    idx = choice.topk(top_k, dim=-1, sorted=False).indices
    w = scores.gather(1, idx)
    w /= w.sum(dim=-1, keepdim=True) + 1e-20
    return w * scale, idx


def build_moe(cfg: str):
    import torch
    from torch import nn

    c = CONFIGS[cfg]

    class SwiGLU(nn.Module):
        def __init__(self, hidden, inner):
            super().__init__()
            self.gate = nn.Linear(hidden, inner, bias=False)
            self.up = nn.Linear(hidden, inner, bias=False)
            self.down = nn.Linear(inner, hidden, bias=False)

        def forward(self, x):
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))

    class MoE(nn.Module):
        """Router over all experts; only the local experts 0..local-1 computed (pairs routed elsewhere skipped)."""

        def __init__(self):
            super().__init__()
            self.router = nn.Parameter(fill_uniform_fan_in(torch.empty(c["experts"], c["hidden"])))
            self.register_buffer("bias", torch.zeros(c["experts"]))
            self.experts = nn.ModuleList(SwiGLU(c["hidden"], c["expert_hidden"]) for _ in range(c["local_experts"]))
            self.shared = SwiGLU(c["hidden"], c["shared_hidden"])
            self.pairs = 0  # (token, expert) pairs computed by the last forward

        def forward(self, x):  # x [T, hidden]
            w, idx = route(x, self.router, self.bias, c["top_k"], c["routed_scale"])
            y = torch.zeros_like(x)
            pairs = 0
            for e, expert in enumerate(self.experts):
                tokens, slots = torch.where(idx == e)
                if tokens.numel() == 0:
                    continue
                pairs += tokens.numel()
                y.index_add_(0, tokens, (expert(x[tokens]) * w[tokens, slots, None]).to(y.dtype))  # autocast: bf16
            self.pairs = pairs
            return y + self.shared(x)

    return place(MoE())


def build_layer(cfg: str):
    from torch import nn
    config, attention = make_attention(cfg)
    hidden = CONFIGS[cfg]["hidden"]

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = rmsnorm(hidden)
            self.self_attn = attention
            self.post_attention_layernorm = rmsnorm(hidden)
            self.mlp = build_moe(cfg)

        def forward(self, x, position_embeddings, mask):  # x [1, T, hidden]
            h = x + self.self_attn(self.input_layernorm(x), position_embeddings, mask)[0]
            moe = self.mlp(self.post_attention_layernorm(h).view(-1, hidden)).view_as(h)
            return h + moe

    return config, place(Layer())


def training_calls(module, inputs, forward, backward: bool):
    """(call, reset) for a forward or forward_backward row; `forward()` returns the output."""
    import torch
    if not backward:
        return forward, None
    out = forward()
    dout = place(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)))
    del out

    def call():
        forward().backward(dout)

    def reset():  # fresh gradients every call, outside the timer
        for p in module.parameters():
            p.grad = None
        for t in inputs:
            t.grad = None
    return call, reset


# ---- one function per family: name -> list of rows (dicts without the family's peak RSS) ----

def randn(*shape, seed=0):
    import torch
    return place(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)))


def run_gemm(name, words, a, min_time):
    global DTYPE
    op, m, n, k = words[1], a["m"], a["n"], a["k"]
    rows = []
    for variant in VARIANTS["gemm"]:
        DTYPE = variant
        lhs = randn(k, m).T if op == "tn" else randn(m, k)                 # tn: A stored [K, M], used transposed
        rhs = randn(n, k, seed=1).T if op == "nt" else randn(k, n, seed=1)  # nt: B stored [N, K] (a Linear weight)
        ms, it = time_call(lambda: lhs @ rhs, min_time)
        rows.append(dict(variant=variant, real_time_ms=ms, iterations=it))
    DTYPE = "f32"
    return rows


def run_syrk(name, words, a, min_time):
    x = randn(a["n"], a["k"])
    ms, it = time_call(lambda: x @ x.T, min_time)
    return [dict(real_time_ms=ms, iterations=it)]


def run_rmsnorm(name, words, a, min_time):
    backward = words[1] == "forward_backward"
    norm = place(rmsnorm(a["dim"]))
    x = randn(a["tokens"], a["dim"]).requires_grad_(backward)
    call, reset = training_calls(norm, [x], lambda: norm(x), backward)
    ms, it = time_call(call, min_time, reset)
    return [dict(real_time_ms=ms, iterations=it)]


def run_rope(name, words, a, min_time):
    cfg = next(c for c, d in CONFIGS.items() if d["rope"] == a["dim"] and d["heads"] == a["heads"])
    T, H, R, nope = a["tokens"], a["heads"], a["dim"], CONFIGS[cfg]["nope"]
    q_flat = randn(T, H * (nope + R))                               # as after q_b_proj
    q = q_flat.view(1, T, H, nope + R).transpose(1, 2)              # [1, H, T, nope + R], as HF lays it out
    q_rot = q[..., nope:]
    cos, sin = rope_tables(hf_config(cfg), range(T))
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)                    # HF's unsqueeze_dim=1
    ms, it = time_call(lambda: rope_interleave(q_rot, cos, sin), min_time)
    return [dict(real_time_ms=ms, iterations=it)]


def absorbed_decode(attention, x, cache_kv, cache_pe, cos, sin):
    """One token x [1, hidden] at position L-1 against the latent cache ([L, kv_rank], [L, rope]), absorbed MLA:
    the new latent is written at L-1, scores = scaling (q_nope W_UK c^T + q_pe k_pe^T), o = (p c) W_UV^T, o_proj."""
    import torch
    H, dn, dr, dv = attention.num_heads, attention.qk_nope_head_dim, attention.qk_rope_head_dim, attention.v_head_dim
    r = attention.kv_lora_rank
    q = attention.q_b_proj(attention.q_a_layernorm(attention.q_a_proj(x))).view(H, dn + dr)
    q_nope, q_pe = q.split([dn, dr], dim=-1)
    latent, k_pe = attention.kv_a_proj_with_mqa(x).split([r, dr], dim=-1)
    last = cache_kv.shape[0] - 1
    cache_kv[last] = attention.kv_a_layernorm(latent)[0]
    cache_pe[last] = rope_interleave(k_pe, cos, sin)[0]
    q_pe = rope_interleave(q_pe, cos, sin)                                     # [H, dr]
    w_kv = attention.kv_b_proj.weight.view(H, dn + dv, r)
    w_uk, w_uv = w_kv[:, :dn], w_kv[:, dn:]                                    # [H, dn, r], [H, dv, r]
    q_lat = torch.bmm(q_nope.unsqueeze(1), w_uk).squeeze(1)                    # [H, r]
    scores = torch.addmm(q_lat @ cache_kv.T, q_pe, cache_pe.T) * attention.scaling  # [H, L]
    p = scores.softmax(dim=-1)
    o_lat = p @ cache_kv                                                       # [H, r]
    o = torch.bmm(o_lat.unsqueeze(1), w_uv.transpose(1, 2)).reshape(1, H * dv)  # [1, H dv]
    return attention.o_proj(o)


def run_mla(name, words, a, min_time):
    import torch
    op, cfg = words[1], words[2]
    config, attention = make_attention(cfg)
    hidden = CONFIGS[cfg]["hidden"]
    if op == "decode":
        L = a["cache"]
        cache_kv = randn(L, attention.kv_lora_rank, seed=2)
        cache_pe = randn(L, attention.qk_rope_head_dim, seed=3)
        x = randn(1, hidden)
        cos, sin = (t[0, -1] for t in rope_tables(config, [L - 1]))

        def call():
            with torch.no_grad():
                return absorbed_decode(attention, x, cache_kv, cache_pe, cos, sin)
        ms, it = time_call(call, min_time)
        return [dict(real_time_ms=ms, iterations=it)]
    backward = op == "forward_backward"
    x = randn(1, a["seq"], hidden).requires_grad_(backward)
    position_embeddings, mask = attention_inputs(config, x)
    call, reset = training_calls(attention, [x], lambda: attention(x, position_embeddings, mask)[0], backward)
    ms, it = time_call(call, min_time, reset)
    return [dict(real_time_ms=ms, iterations=it)]


# bench/sdpa.cpp's shapes: heads, q/k head size (nope + rope), v head size
SDPA_SHAPES = {"k2": (64, 192, 128), "small": (8, 96, 64)}


def run_sdpa(name, words, a, min_time):
    import torch
    import torch.nn.functional as F
    H, dq, dv = SDPA_SHAPES[words[2]]
    T = a["tokens"]
    backward = words[1] == "forward_backward"
    q = randn(1, H, T, dq).requires_grad_(backward)
    k = randn(1, H, T, dq, seed=1).requires_grad_(backward)
    v = randn(1, H, T, dv, seed=2).requires_grad_(backward)
    grad = randn(1, H, T, dv, seed=3)
    scale = dq ** -0.5

    def call():
        if not backward:
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        out.backward(grad)

    def reset():
        for t in (q, k, v):
            t.grad = None
    ms, it = time_call(call, min_time, reset if backward else None)
    return [dict(real_time_ms=ms, iterations=it)]


def run_router(name, words, a, min_time):
    import torch
    c = CONFIGS[words[2]]
    x = randn(a["tokens"], c["hidden"])
    weight = place(fill_uniform_fan_in(torch.empty(c["experts"], c["hidden"])))
    bias = place(torch.zeros(c["experts"]))
    ms, it = time_call(lambda: route(x, weight, bias, c["top_k"], c["routed_scale"]), min_time)
    return [dict(real_time_ms=ms, iterations=it)]


def run_moe(name, words, a, min_time):
    backward = words[1] == "forward_backward"
    cfg = words[2]
    moe = build_moe(cfg)
    x = randn(a["tokens"], CONFIGS[cfg]["hidden"]).requires_grad_(backward)
    call, reset = training_calls(moe, [x], lambda: moe(x), backward)
    ms, it = time_call(call, min_time, reset)
    return [dict(real_time_ms=ms, iterations=it, pairs=moe.pairs)]


def run_layer(name, words, a, min_time):
    global DTYPE
    import torch
    backward = words[1] == "forward_backward"
    cfg = words[2]
    rows = []
    for variant in VARIANTS["layer"]:
        DTYPE = "bf16" if variant == "bf16" else "f32"
        torch.manual_seed(0)
        config, layer = build_layer(cfg)
        x = randn(1, a["tokens"], CONFIGS[cfg]["hidden"]).requires_grad_(backward)
        position_embeddings, mask = attention_inputs(config, x)

        def forward():
            with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16, enabled=variant == "autocast"):
                return layer(x, position_embeddings, mask)

        call, reset = training_calls(layer, [x], forward, backward)
        ms, it = time_call(call, min_time, reset)
        rows.append(dict(variant=variant, real_time_ms=ms, iterations=it, pairs=layer.mlp.pairs))
        del layer, x, call, reset
        gc.collect()
    DTYPE = "f32"
    return rows


def newton_schulz(g, policy: str, steps: int = NS_STEPS):
    """NS of optim/newton_schulz.hpp with plain matmuls (Products::general), float32: X = G (transposed if tall) /
    max(||G|| safety + add_eps, 1e-7); per iteration A = X X^T, B = b A + c A A, X = a X + B X."""
    import torch
    p = NS_POLICIES[policy]
    tall = g.shape[0] > g.shape[1]
    x = g.T if tall else g
    x = x / (x.norm() * p["safety"] + p["add_eps"]).clamp(min=NS_CLAMP_EPS)
    table = p["table"]
    for it in range(steps):
        a, b, c = table[it % len(table)] if p["cycle"] else table[min(it, len(table) - 1)]
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    return x.T if tall else x


def run_ns(name, words, a, min_time):
    assert words[2] == "general", "only the general products exist in PyTorch"
    g = randn(a["rows"], a["cols"])
    ms, it = time_call(lambda: newton_schulz(g, words[1]), min_time)
    return [dict(real_time_ms=ms, iterations=it)]


def float32_newtonschulz():
    """torch.optim._muon._zeropower_via_newtonschulz with its casts to bfloat16 replaced by float32, compiled from
    torch's own source (so every other line is torch's). torch 2.15 casts once (`grad.to(dtype=torch.bfloat16)`);
    the H200's torch 2.11 spelled it otherwise, so every spelling of the cast is replaced, and the patched function
    must return float32 for a float32 input."""
    import torch
    import torch.optim._muon as muon_module
    source = inspect.getsource(muon_module._zeropower_via_newtonschulz)
    patched = source.replace("torch.bfloat16", "torch.float32").replace(".bfloat16()", ".float()")
    if patched == source:
        raise RuntimeError("torch's Muon Newton-Schulz changed: no cast to bfloat16 found to replace")
    namespace: dict = {}
    exec(compile(patched, "<torch.optim._muon._zeropower_via_newtonschulz, float32>", "exec"),
         dict(vars(muon_module)), namespace)
    f = namespace["_zeropower_via_newtonschulz"]
    probe = f(torch.randn(8, 12), (3.4445, -4.7750, 2.0315), 5, 1e-7)
    if probe.dtype != torch.float32:
        raise RuntimeError(f"torch's Muon Newton-Schulz changed: the patched iteration returned {probe.dtype}")
    return f


class muon_precision:
    """Context: torch's Muon with its default (bf16) or the float32 Newton-Schulz patched into torch.optim._muon."""

    def __init__(self, variant: str):
        self.variant = variant

    def __enter__(self):
        import torch.optim._muon as muon_module
        self.original = muon_module._zeropower_via_newtonschulz
        if self.variant == "f32":
            muon_module._zeropower_via_newtonschulz = float32_newtonschulz()
        return self

    def __exit__(self, *exc):
        import torch.optim._muon as muon_module
        muon_module._zeropower_via_newtonschulz = self.original


def run_muon(name, words, a, min_time):
    import torch
    rows = []
    for variant in VARIANTS["muon"]:
        p = torch.nn.Parameter(randn(a["rows"], a["cols"]) * 0.02)
        p.grad = randn(a["rows"], a["cols"], seed=1)
        opt = torch.optim.Muon([p], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True,
                               adjust_lr_fn="match_rms_adamw")
        with muon_precision(variant):
            ms, it = time_call(opt.step, min_time)
        rows.append(dict(variant=variant, real_time_ms=ms, iterations=it))
        del p, opt
        gc.collect()
    return rows


def run_qk_clip(name, words, a, min_time):
    import torch
    c = CONFIGS[words[2]]
    H, dn, dr, dv = a["heads"], c["nope"], c["rope"], c["v"]
    q_b0 = randn(H * (dn + dr), c["q_rank"]) * 0.02
    kv_b0 = randn(H * (dn + dv), c["kv_rank"], seed=1) * 0.02
    q_b, kv_b = q_b0.clone(), kv_b0.clone()
    max_logit = place(torch.linspace(150.0, 250.0, H))  # every head over tau

    def clip():
        gamma = (QK_CLIP_TAU / max_logit).clamp(max=1.0)[:, None, None]  # [H, 1, 1]
        root = gamma.sqrt()
        q = q_b.view(H, dn + dr, -1)
        q[:, :dn].mul_(root)
        q[:, dn:].mul_(gamma)
        kv_b.view(H, dn + dv, -1)[:, :dn].mul_(root)  # v rows unchanged

    def reset():  # the original weights back between calls (repeated clipping would underflow to denormals)
        q_b.copy_(q_b0)
        kv_b.copy_(kv_b0)
    ms, it = time_call(clip, min_time, reset)
    return [dict(real_time_ms=ms, iterations=it)]


def run_adamw(name, words, a, min_time):
    import torch
    rows = []
    for variant in VARIANTS["adamw"]:
        p = torch.nn.Parameter(randn(a["numel"]) * 0.02)
        p.grad = randn(a["numel"], seed=1)
        extra = dict(fused=True) if variant == "fused" else {}
        opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **extra)
        try:
            ms, it = time_call(opt.step, min_time)
        except (RuntimeError, NotImplementedError) as e:
            print(f"    adamw fused unsupported here: {e}", file=sys.stderr)
            continue
        rows.append(dict(variant=variant, real_time_ms=ms, iterations=it))
        del p, opt
        gc.collect()
    return rows


RUNNERS = {f: globals()[f"run_{f}"] for f in FAMILIES}


def run_dtypes(family, name, words, a, min_time) -> list[dict]:
    """The rows of one name: the family's own variants (Muon, AdamW; float32 tensors), or one run per dtype."""
    global DTYPE
    if family in VARIANTS:
        DTYPE = "f32"
        return RUNNERS[family](name, words, a, min_time)
    rows = []
    for dtype in DTYPES:
        DTYPE = dtype
        import torch
        torch.manual_seed(0)
        rows += [dict(r, variant=dtype) for r in RUNNERS[family](name, words, a, min_time)]
        gc.collect()
    return rows


def run_family(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    if DEVICE == "cuda":  # f32 rows are true float32, as our CUDA backend's pedantic cuBLAS calls
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    names = selected(args.quick, args.filter, args.family)
    index, rows = args.index_base, []

    def write(complete):  # after every benchmark: a family killed later (out of memory) keeps the rows it finished
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
        Path(args.out).write_text(json.dumps(dict(rows=rows, peak_rss_MiB=peak, complete=complete)))

    for name in names:
        words, a = parse_name(name)
        torch.manual_seed(0)  # per benchmark: forward and forward_backward of a config get the same weights
        try:
            results = run_dtypes(args.family, name, words, a, args.min_time)
        except Exception as e:  # report and go on with the family's other rows
            print(f"[{index + 1}/{args.total}] {name} ... FAILED: {type(e).__name__}: {e}", file=sys.stderr)
            index += len(rows_of(name))
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            continue
        for r in results:
            index += 1
            r = dict(name=name, variant=r.pop("variant", "f32"), **r)
            extra = f" ({r['variant']})" if len(rows_of(name)) > 1 else ""
            pairs = f", {r['pairs']} pairs" if "pairs" in r else ""
            ms = r["real_time_ms"]
            print(f"[{index}/{args.total}] {name}{extra} ... {f'{ms:.1f}' if ms >= 100 else f'{ms:.4g}'} ms "
                  f"({r['iterations']} it{pairs})", file=sys.stderr, flush=True)
            rows.append(r)
        write(False)
        gc.collect()
    write(True)


# =====================================================================================================================
# Parent: one subprocess per family, then the JSON.
# =====================================================================================================================

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def run_suite(args) -> None:
    names = selected(args.quick, args.filter)
    total = sum(len(rows_of(n)) for n in names)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import torch
    import transformers
    context = dict(torch=torch.__version__, transformers=transformers.__version__, threads=args.threads,
                   cpu=cpu_model(), date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                   min_time_s=args.min_time, quick=args.quick, device=DEVICE, dtypes=DTYPES)
    if DEVICE == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("torch_suite: --device cuda, but torch sees no CUDA device")
        context.update(gpu=torch.cuda.get_device_name(), torch_cuda=torch.version.cuda, tf32=False)
    benchmarks, index = [], 0
    print(f"torch_suite: {len(names)} benchmarks ({total} rows), {args.threads} threads, on {DEVICE}",
          file=sys.stderr)
    for family in FAMILIES:
        family_names = [n for n in names if n.split("/")[0] == family]
        if not family_names:
            continue
        with tempfile.NamedTemporaryFile(suffix=f".{family}.json", delete=False) as tmp:
            tmp_path = tmp.name
        cmd = [sys.executable, os.path.abspath(__file__), "--family", family, "--out", tmp_path,
               "--threads", str(args.threads), "--min-time", str(args.min_time),
               "--device", args.device, "--dtypes", ",".join(DTYPES),
               "--index-base", str(index), "--total", str(total)]
        if args.quick:
            cmd.append("--quick")
        if args.filter:
            cmd += ["--filter", args.filter]
        proc = subprocess.run(cmd)
        index += sum(len(rows_of(n)) for n in family_names)
        try:
            result = json.loads(Path(tmp_path).read_text())
        except (OSError, ValueError):
            result = None
        finally:
            Path(tmp_path).unlink(missing_ok=True)
        if not result or not result["rows"]:
            print(f"  family {family}: no results (exit code {proc.returncode})", file=sys.stderr)
            continue
        peak = round(result["peak_rss_MiB"], 1)
        if not result.get("complete"):
            print(f"  family {family}: stopped (exit code {proc.returncode}{', killed: out of memory?' if proc.returncode == -9 else ''}) "
                  f"after {len(result['rows'])} rows; those are kept, peak RSS at least {peak:.0f} MiB", file=sys.stderr)
        else:
            print(f"  family {family}: peak RSS {peak:.0f} MiB", file=sys.stderr)
        for r in result["rows"]:
            r["peak_rss_MiB_family"] = peak
            benchmarks.append(r)
    out.write_text(json.dumps(dict(context=context, benchmarks=benchmarks), indent=1) + "\n")
    print(f"wrote {out} ({len(benchmarks)} rows)", file=sys.stderr)


# =====================================================================================================================
# --check: the semantics the timings rely on, verified on small shapes.
# =====================================================================================================================

def check() -> None:
    import torch
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf
    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    def ok(what, cond, detail=""):
        print(f"{'ok  ' if cond else 'FAIL'} {what} {detail}")
        if not cond:
            raise SystemExit(1)

    # RMSNorm: HF's module is the plain math (no hub kernel swapped in).
    x = randn(8, 512)
    norm = rmsnorm(512)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        ref = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS))
    ok("rmsnorm = HF math", torch.equal(norm(x), ref))

    # RoPE: our q-only copy equals HF's apply_rotary_pos_emb_interleave bit for bit.
    config = hf_config("small")
    T, H, R, nope = 16, 8, 32, 64
    q = randn(T, H * (nope + R)).view(1, T, H, nope + R).transpose(1, 2)[..., nope:]
    cos, sin = rope_tables(config, range(T))
    k = randn(1, 1, T, R)
    q_hf, _ = hf.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    ok("rope = HF interleave", torch.equal(rope_interleave(q, cos.unsqueeze(1), sin.unsqueeze(1)), q_hf))
    ok("yarn attention scaling", abs(hf.DeepseekV3RotaryEmbedding(config).attention_scaling - 1.0) < 1e-12,
       f"(cos/sin factor {hf.DeepseekV3RotaryEmbedding(config).attention_scaling})")

    # MLA causality with the mask the model builds (sdpa): changing later tokens leaves earlier outputs alone.
    config, attention = make_attention("small")
    ok("attention implementation", config._attn_implementation == "sdpa", config._attn_implementation)
    expected_scale = (CONFIGS["small"]["nope"] + CONFIGS["small"]["rope"]) ** -0.5 * (0.1 * math.log(32) + 1) ** 2
    ok("softmax scaling incl. YaRN mscale^2", abs(attention.scaling - expected_scale) < 1e-9, f"({attention.scaling})")
    S, cut = 24, 10
    x1 = randn(1, S, 512)
    x2 = x1.clone()
    x2[:, cut:] = randn(1, S - cut, 512, seed=5)
    pe, mask = attention_inputs(config, x1)
    with torch.no_grad():
        y1, y2 = attention(x1, pe, mask)[0], attention(x2, pe, mask)[0]
    ok("mla causal: earlier rows unchanged", torch.allclose(y1[:, :cut], y2[:, :cut], rtol=0, atol=1e-6),
       f"(mask {'None -> sdpa is_causal' if mask is None else tuple(mask.shape)})")
    ok("mla causal: later rows changed", (y1[:, cut:] - y2[:, cut:]).abs().max() > 1e-3)
    # ... and against an explicit eager reference with a -inf upper triangle.
    config._attn_implementation = "eager"
    bool_mask = torch.ones(S, S, dtype=torch.bool).tril()
    additive = torch.zeros(S, S).masked_fill(~bool_mask, float("-inf"))[None, None]
    with torch.no_grad():
        y_eager = attention(x1, pe, additive)[0]
    config._attn_implementation = "sdpa"
    ok("mla sdpa = eager with explicit causal mask", torch.allclose(y1, y_eager, rtol=1e-4, atol=1e-5),
       f"(max diff {(y1 - y_eager).abs().max():.2e})")

    # Absorbed decode = HF's full-sequence forward at the last position, cache built from the same tokens.
    L = 24
    xs = randn(1, L, 512, seed=9)
    pe, mask = attention_inputs(config, xs)
    with torch.no_grad():
        y_full = attention(xs, pe, mask)[0][0, -1]
        latent, k_pe = attention.kv_a_proj_with_mqa(xs[0]).split([attention.kv_lora_rank, attention.qk_rope_head_dim], -1)
        cache_kv = attention.kv_a_layernorm(latent).clone()
        cache_pe = rope_interleave(k_pe, pe[0][0], pe[1][0]).clone()
        cache_kv[-1], cache_pe[-1] = 7.0, 7.0  # decode must overwrite the last slot
        y_dec = absorbed_decode(attention, xs[0, -1:], cache_kv, cache_pe, pe[0][0, -1], pe[1][0, -1])[0]
    ok("mla decode (absorbed) = HF forward, last token", torch.allclose(y_dec, y_full, rtol=1e-4, atol=1e-5),
       f"(max diff {(y_dec - y_full).abs().max():.2e})")

    # Router = HF's DeepseekV3TopkRouter (1 group).
    hcfg = hf_config("small")
    router = hf.DeepseekV3TopkRouter(hcfg)
    fill_uniform_fan_in(router.weight.data)
    with torch.no_grad():
        router.e_score_correction_bias.uniform_(-0.1, 0.1)
        xr = randn(64, 512)
        _, w_hf, idx_hf = router(xr)
        w, idx = route(xr, router.weight, router.e_score_correction_bias, 2, 2.5)
    order, order_hf = idx.sort(-1), idx_hf.sort(-1)
    ok("router = HF DeepseekV3TopkRouter", torch.equal(order.values, order_hf.values) and
       torch.allclose(w.gather(1, order.indices), w_hf.gather(1, order_hf.indices)))

    # MoE: the router weight gets a gradient; pairs = routed (token, local expert) pairs; y matches a dense loop.
    moe = build_moe("small")
    xm = randn(32, 512).requires_grad_()
    y = moe(xm)
    y.backward(randn(*y.shape))
    ok("moe router gradient", moe.router.grad is not None and moe.router.grad.abs().sum() > 0, f"(pairs {moe.pairs})")
    with torch.no_grad():
        w, idx = route(xm, moe.router, moe.bias, 2, 2.5)
        dense = moe.shared(xm)
        for t in range(32):
            for s in range(2):
                dense[t] += w[t, s] * moe.experts[int(idx[t, s])](xm[t:t + 1])[0]
    ok("moe = per-token reference", torch.allclose(y, dense, rtol=1e-4, atol=1e-5) and moe.pairs == 64)

    # Newton-Schulz: float64 run of the same schedule agrees; the result is near-orthogonal (Polar Express).
    g = randn(64, 160)
    for policy in NS_POLICIES:
        diff = (newton_schulz(g, policy) - newton_schulz(g.double(), policy).float()).abs().max()
        sv = torch.linalg.svdvals(newton_schulz(g.double(), policy))
        ok(f"ns {policy}: f32 vs f64", diff < 1e-4, f"(max diff {diff:.1e}; singular values {sv.min():.3f}..{sv.max():.3f})")
    ok("ns tall = transposed wide", torch.allclose(newton_schulz(g.T, "keller"), newton_schulz(g, "keller").T))

    # Muon f32 patch: dtype, agreement with float64, used by torch.optim.Muon.step, bf16 stays bf16 by default.
    import torch.optim._muon as muon_module
    f32 = float32_newtonschulz()
    coeffs = (3.4445, -4.7750, 2.0315)
    gm = randn(96, 256)
    out32 = f32(gm, coeffs, 5, 1e-7)
    out64 = newton_schulz(gm.double(), "keller")
    out16 = muon_module._zeropower_via_newtonschulz(gm, coeffs, 5, 1e-7)
    ok("muon f32 NS dtype", out32.dtype == torch.float32 and out16.dtype == torch.bfloat16, f"({out32.dtype}, {out16.dtype})")
    e32, e16 = (out32.double() - out64).abs().max(), (out16.double() - out64).abs().max()
    ok("muon f32 NS = float64 NS", e32 < 1e-4, f"(f32 err {e32:.1e}, bf16 err {e16:.1e})")
    ok("muon f32 NS transposes tall", torch.allclose(f32(gm.T, coeffs, 5, 1e-7), out32.T))
    calls = []
    for variant in ("f32", "bf16"):
        p = torch.nn.Parameter(randn(96, 256) * 0.02)
        p.grad = randn(96, 256, seed=1)
        p0 = p.detach().clone()
        opt = torch.optim.Muon([p], lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True,
                               adjust_lr_fn="match_rms_adamw")
        with muon_precision(variant):
            inner = muon_module._zeropower_via_newtonschulz
            muon_module._zeropower_via_newtonschulz = lambda *a, _f=inner, **k: (calls.append(variant), _f(*a, **k))[1]
            opt.step()
            muon_module._zeropower_via_newtonschulz = inner
        # expected: buf = 0.05 g; update = lerp(g, buf, 0.95); p = p (1 - lr wd) - lr 0.2 sqrt(256) NS(update)
        update = p.grad.lerp(torch.zeros_like(p.grad).lerp_(p.grad, 1 - 0.95), 0.95)
        ns_fn = f32 if variant == "f32" else muon_module._zeropower_via_newtonschulz
        expected = (p0 * (1 - 0.02 * 0.1)).add_(ns_fn(update, coeffs, 5, 1e-7), alpha=-0.02 * 0.2 * math.sqrt(256))
        ok(f"muon step ({variant}) = formula", torch.allclose(p.detach(), expected, rtol=1e-5, atol=1e-6))
    ok("muon step called the patched NS", calls == ["f32", "bf16"], str(calls))
    ok("muon patch restored", muon_module._zeropower_via_newtonschulz.__code__.co_filename.endswith("_muon.py"))

    # QK-Clip: nope rows of q_b and kv_b times sqrt(gamma), rope rows of q_b times gamma, v rows untouched.
    c = CONFIGS["small"]
    H, dn, dr, dv = 8, c["nope"], c["rope"], c["v"]
    q_b, kv_b = randn(H * (dn + dr), c["q_rank"]), randn(H * (dn + dv), c["kv_rank"], seed=1)
    logits = torch.linspace(150.0, 250.0, H)
    gamma = 100.0 / logits
    q_ref, kv_ref = q_b.clone().view(H, dn + dr, -1), kv_b.clone().view(H, dn + dv, -1)
    for h in range(H):
        q_ref[h, :dn] *= gamma[h].sqrt()
        q_ref[h, dn:] *= gamma[h]
        kv_ref[h, :dn] *= gamma[h].sqrt()
    q_view, kv_view = q_b.view(H, dn + dr, -1), kv_b.view(H, dn + dv, -1)
    g3 = gamma.clamp(max=1.0)[:, None, None]
    q_view[:, :dn].mul_(g3.sqrt()), q_view[:, dn:].mul_(g3), kv_view[:, :dn].mul_(g3.sqrt())
    ok("qk_clip = per-head loop", torch.allclose(q_b, q_ref.view_as(q_b)) and torch.allclose(kv_b, kv_ref.view_as(kv_b)))

    # AdamW fused on CPU.
    p = torch.nn.Parameter(randn(1000))
    p.grad = randn(1000, seed=1)
    q = torch.nn.Parameter(p.detach().clone())
    q.grad = p.grad.clone()
    torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1).step()
    torch.optim.AdamW([q], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True).step()
    ok("adamw fused = default", torch.allclose(p, q, rtol=1e-5, atol=1e-7))
    print("all checks passed")


def main() -> None:
    default_threads = int(os.environ.get("MOONMOE_BENCH_THREADS") or os.cpu_count() or 1)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=default_threads)
    ap.add_argument("--quick", action="store_true", help="only the small (CI) shapes")
    ap.add_argument("--filter", help="regex, re.search on benchmark names")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of timed calls per benchmark (>= 1 call)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where PyTorch runs")
    ap.add_argument("--dtypes", help="comma-separated, of f32 and bf16: one row per dtype (default: f32 on the CPU, "
                                     "f32,bf16 on cuda)")
    ap.add_argument("--out", help="default: results/torch.json (cpu) or results/torch_cuda.json (cuda); with --filter "
                                  "or --quick, results/torch_partial.json or results/torch_cuda_partial.json")
    ap.add_argument("--list", action="store_true", help="print the selected names and exit")
    ap.add_argument("--check", action="store_true", help="verify the semantics on small shapes and exit")
    ap.add_argument("--family", choices=FAMILIES, help=argparse.SUPPRESS)     # child mode
    ap.add_argument("--index-base", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global DEVICE, DTYPES
    DEVICE = args.device
    DTYPES = (args.dtypes or ("f32,bf16" if DEVICE == "cuda" else "f32")).split(",")
    if not set(DTYPES) <= {"f32", "bf16"}:
        ap.error(f"--dtypes: f32 and bf16 only, got {args.dtypes}")
    if args.out is None:
        # a partial run (--filter, --quick) does not replace the whole suite's file that bench/compare.py reads
        stem = "torch_cuda" if DEVICE == "cuda" else "torch"
        partial = args.filter or args.quick
        args.out = str(Path(__file__).resolve().parent / "results" / (f"{stem}_partial.json" if partial else f"{stem}.json"))
        if partial and not (args.list or args.check or args.family):
            print(f"torch_suite.py: a partial run (--filter/--quick) writes {args.out} (--out to choose)", file=sys.stderr)
    if args.list:
        for n in selected(args.quick, args.filter):
            print(n)
    elif args.check:
        check()
    elif args.family:
        run_family(args)
    else:
        run_suite(args)


if __name__ == "__main__":
    main()
