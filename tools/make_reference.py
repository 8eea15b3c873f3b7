#!/usr/bin/env python3
"""Generate the PyTorch / Hugging Face oracles under test/data/ for moonmoe's C++ tests.

Builds two tiny random ``DeepseekV3ForCausalLM`` models (the TinyK2 and TinyV3 presets of
include/moonmoe/config/presets.hpp), runs Hugging Face's own float32 computation on them and writes
checkpoints, logits, loss, gradients, hidden states, per-head max attention logits, router choices,
greedy-decoding results, an FP8 block-quantised checkpoint and a BF16 checkpoint.

    pip install -r tools/requirements.txt
    python tools/make_reference.py            # writes test/data/
    python tools/make_reference.py --out DIR  # writes elsewhere (e.g. to check determinism)

Deterministic: a rerun with the same library versions on the same kind of CPU rewrites identical
bytes (single-threaded CPU math, seeded generators, fixed file layout; versions.json keeps its date
when no file hash changed).  See tools/README.md for what every file holds.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, GenerationConfig  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds3  # noqa: E402

transformers.utils.logging.disable_progress_bar()

SEED = 20250711
BATCH, SEQ = 2, 10
PROMPT_LEN, NEW_TOKENS = 5, 8
FP8_BLOCK = 16
E4M3_MAX = 448.0
LINEAR_STD = 0.2      # 2-D / 3-D projection weights (attention, MLPs, experts, router, lm_head)
EMBED_STD = 1.0       # model.embed_tokens.weight
NORM_STD = 0.1        # RMSNorm weights are 1 + NORM_STD * randn
BIAS_STD = 0.05       # e_score_correction_bias

REPO = Path(__file__).resolve().parent.parent

COMMON = dict(
    hidden_size=64, vocab_size=256, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8, n_shared_experts=1,
    moe_intermediate_size=16, norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
    tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0, rope_interleave=True,
    bos_token_id=0, eos_token_id=1, hidden_act="silu", num_nextn_predict_layers=0,
)

MODELS = {
    # Kimi K2 shape (presets.hpp TinyK2).
    "tiny_k2": dict(
        COMMON, num_hidden_layers=3, first_k_dense_replace=1, qk_rope_head_dim=4, n_routed_experts=8,
        num_experts_per_tok=2, n_group=1, topk_group=1, routed_scaling_factor=2.827, rope_theta=50000.0,
        rope_scaling=dict(type="yarn", factor=32.0, original_max_position_embeddings=128, beta_fast=1.0,
                          beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
    ),
    # DeepSeek-V3 shape (presets.hpp TinyV3).  rms_norm_eps stays 1e-6 to match the preset (see README).
    "tiny_v3": dict(
        COMMON, num_hidden_layers=4, first_k_dense_replace=2, qk_rope_head_dim=8, n_routed_experts=16,
        num_experts_per_tok=4, n_group=4, topk_group=2, routed_scaling_factor=2.5, rope_theta=10000.0,
        rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=256, beta_fast=32.0,
                          beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
    ),
}


# ----------------------------------------------------------------------------------------------
# Instrumentation: per-head max scaled attention logit, recorded from HF's own eager attention.
# DeepseekV3Attention.forward looks `eager_attention_forward` up as a module global at call time
# (ALL_ATTENTION_FUNCTIONS.get_interface("eager", eager_attention_forward)), so wrapping the global
# sees exactly the query/key (rope applied, nope|rope concatenated) and the scaling HF uses.
# ----------------------------------------------------------------------------------------------
_HF_EAGER = hf_ds3.eager_attention_forward
_RECORD: dict = {"on": False, "max_logit": {}}


def _recording_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    if _RECORD["on"]:
        with torch.no_grad():
            k = hf_ds3.repeat_kv(key, module.num_key_value_groups)
            s = torch.matmul(query, k.transpose(2, 3)) * scaling  # exactly HF's pre-mask logits
            n_q, n_k = s.shape[-2:]
            causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
            if attention_mask is not None:  # HF's additive mask must be the plain causal mask here
                hf_allowed = attention_mask[..., :n_k] == 0 if attention_mask.dtype != torch.bool \
                    else attention_mask[..., :n_k]
                assert torch.equal(hf_allowed.expand(s.shape[0], 1, n_q, n_k)[0, 0], causal), "mask mismatch"
            s = s.masked_fill(~causal, float("-inf"))
            _RECORD["max_logit"][module.layer_idx] = s.amax(dim=(0, 2, 3)).clone()
    return _HF_EAGER(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)


hf_ds3.eager_attention_forward = _recording_eager


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------
def log(msg: str = "") -> None:
    print(msg, flush=True)


def make_config(name: str) -> DeepseekV3Config:
    cfg = DeepseekV3Config(**MODELS[name])
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def build_model(name: str) -> DeepseekV3ForCausalLM:
    cfg = make_config(name)
    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(cfg).to(torch.float32)
    model.set_attn_implementation("eager")
    model.set_experts_implementation("eager")
    gen = torch.Generator().manual_seed(SEED + sum(map(ord, name)))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if pname.endswith("norm.weight"):
                p.copy_(1.0 + NORM_STD * noise)
            elif pname == "model.embed_tokens.weight":
                p.copy_(EMBED_STD * noise)
            else:
                p.copy_(LINEAR_STD * noise)
        for bname, b in model.named_buffers():
            if bname.endswith("e_score_correction_bias"):
                b.copy_(BIAS_STD * torch.randn(b.shape, generator=gen, dtype=torch.float32))
    return model


def on_disk_name_pairs(model: DeepseekV3ForCausalLM):
    """Yield (on-disk HF checkpoint name, tensor) for every parameter, splitting fused experts.

    transformers 5.x keeps experts fused in memory: gate_up_proj [E, 2I, H] (gate rows first, see
    DeepseekV3Experts.forward: `.chunk(2, dim=-1)` -> gate, up) and down_proj [E, H, I].  On disk,
    checkpoints keep one tensor per expert (conversion_mapping.py, "qwen2_moe": MergeModulelist(dim=0)
    then Concatenate(dim=1)).
    """
    for pname, p in model.named_parameters():
        if pname.endswith("mlp.experts.gate_up_proj"):
            prefix = pname[: -len("gate_up_proj")]
            inter = p.shape[1] // 2
            for e in range(p.shape[0]):
                yield f"{prefix}{e}.gate_proj.weight", (pname, e, slice(0, inter))
                yield f"{prefix}{e}.up_proj.weight", (pname, e, slice(inter, 2 * inter))
        elif pname.endswith("mlp.experts.down_proj"):
            prefix = pname[: -len("down_proj")]
            for e in range(p.shape[0]):
                yield f"{prefix}{e}.down_proj.weight", (pname, e, slice(None))
        else:
            yield pname, (pname, None, None)


def split_fused(model, tensors_by_param: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for disk_name, (pname, e, rows) in on_disk_name_pairs(model):
        t = tensors_by_param[pname]
        out[disk_name] = (t if e is None else t[e, rows]).detach().to(torch.float32).contiguous().clone()
    return out


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def save_st(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})


def select_experts(scores: torch.Tensor, bias: torch.Tensor | None, n_group: int, topk_group: int,
                   k: int, group_limit: bool) -> torch.Tensor:
    """Independent restatement of DeepseekV3TopkRouter's selection, returns a [T, E] bool mask."""
    choice = scores + bias if bias is not None else scores.clone()
    T, E = choice.shape
    if group_limit and n_group > 1:
        gs = choice.view(T, n_group, E // n_group).topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(topk_group, dim=-1)[1], True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // n_group, dim=1), float("-inf"))
    idx = choice.topk(k, dim=-1)[1]
    return torch.zeros(T, E, dtype=torch.bool).scatter_(1, idx, True)


def expected_yarn(cfg: DeepseekV3Config):
    """YaRN (arXiv 2309.00071) as transformers' _compute_yarn_parameters computes it, written out independently."""
    rp = cfg.rope_parameters
    dim, base, factor = cfg.qk_rope_head_dim, rp["rope_theta"], rp["factor"]
    lorig = rp["original_max_position_embeddings"]

    def corr(r):
        return dim * math.log(lorig / (r * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(corr(rp["beta_fast"])), 0)
    high = min(math.ceil(corr(rp["beta_slow"])), dim - 1)
    if low == high:
        high += 0.001
    inv = []
    for i in range(dim // 2):
        extra = 1.0 / base ** (2 * i / dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        inv.append(extra / factor * ramp + extra * (1 - ramp))
    m = 0.1 * rp["mscale_all_dim"] * math.log(factor) + 1.0
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5 * m * m
    return torch.tensor(inv, dtype=torch.float64), scale, (low, high)


# ----------------------------------------------------------------------------------------------
# Source facts checked at run time (documented with file/line references in tools/README.md)
# ----------------------------------------------------------------------------------------------
def check_source_facts(model: DeepseekV3ForCausalLM, name: str) -> dict:
    cfg = model.config
    rot = model.model.rotary_emb
    inv_exp, scale_exp, (low, high) = expected_yarn(cfg)
    assert rot.rope_type == "yarn", rot.rope_type
    assert rot.attention_scaling == 1.0, f"YaRN attention_factor must be 1.0, got {rot.attention_scaling}"
    assert torch.allclose(rot.inv_freq.double(), inv_exp, rtol=1e-6, atol=0), (rot.inv_freq, inv_exp)
    attn0 = model.model.layers[0].self_attn
    assert abs(attn0.scaling - scale_exp) < 1e-12, (attn0.scaling, scale_exp)
    for layer in model.model.layers:
        a = layer.self_attn
        assert a.q_a_layernorm.variance_epsilon == 1e-6 and a.kv_a_layernorm.variance_epsilon == 1e-6
        assert layer.input_layernorm.variance_epsilon == cfg.rms_norm_eps
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
        bname = f"model.layers.{i}.mlp.gate.e_score_correction_bias"
        assert bname in buffers and bname not in params and not buffers[bname].requires_grad
        assert f"model.layers.{i}.mlp.gate.weight" in params
    facts = dict(
        inv_freq=[float(x) for x in rot.inv_freq], attention_scaling=rot.attention_scaling,
        softmax_scale=attn0.scaling, correction_range=(low, high),
    )
    log(f"  [{name}] yarn: correction range (original_max_position_embeddings) low={low} high={high}; "
        f"inv_freq={[f'{x:.6g}' for x in facts['inv_freq']]}; attention_factor={rot.attention_scaling}; "
        f"softmax_scale={attn0.scaling:.8f} (= qk_head_dim^-0.5 * mscale^2)")
    return facts


# ----------------------------------------------------------------------------------------------
# Reference forward / backward
# ----------------------------------------------------------------------------------------------
def run_reference(model: DeepseekV3ForCausalLM, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    cfg = model.config
    L = cfg.num_hidden_layers
    router_out: dict[int, tuple] = {}
    last_layer_out: list = []
    layer_outs: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        if i >= cfg.first_k_dense_replace:
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda m, inp, out, i=i: router_out.__setitem__(i, tuple(o.detach().clone() for o in out))))
        hooks.append(layer.register_forward_hook(
            lambda m, inp, out, i=i: layer_outs.__setitem__(
                i, (out[0] if isinstance(out, tuple) else out).detach().clone())))

    model.train()  # gradients; dropout is 0 and the noaux_tc router has no training-only branch
    model.zero_grad(set_to_none=True)
    _RECORD["on"], _RECORD["max_logit"] = True, {}
    out = model(input_ids=input_ids, labels=input_ids, output_hidden_states=True, use_cache=False)
    _RECORD["on"] = False
    out.loss.backward()
    for h in hooks:
        h.remove()

    ref: dict[str, torch.Tensor] = {
        "input_ids": input_ids.clone(),
        "logits": out.logits.detach().float().clone(),
        "loss": out.loss.detach().float().reshape(1).clone(),
    }
    # Independent check of HF's loss: mean token cross-entropy over the B*(S-1) shifted targets.
    lp = torch.log_softmax(out.logits.detach().double()[:, :-1], dim=-1)
    nll = -lp.gather(-1, input_ids[:, 1:, None]).mean()
    assert abs(nll.item() - out.loss.item()) < 1e-5, (nll.item(), out.loss.item())

    hs = out.hidden_states
    assert len(hs) == L + 1
    for i, h in enumerate(hs):
        ref[f"hidden.{i}"] = h.detach().float().clone()
    # hidden.0 = embeddings, hidden.i (1 <= i < L) = output of decoder layer i-1,
    # hidden.L = model.norm(output of layer L-1) (HF overwrites the last entry with last_hidden_state).
    assert torch.equal(hs[0], model.model.embed_tokens(input_ids))
    for i in range(1, L):
        assert torch.equal(hs[i], layer_outs[i - 1])
    assert torch.equal(hs[L], model.model.norm(layer_outs[L - 1]))
    ref["hidden_last_prenorm"] = layer_outs[L - 1].float().clone()

    grads = split_fused(model, {n: p.grad for n, p in model.named_parameters()})
    for n, g in grads.items():
        ref[f"grad.{n}"] = g
    for i in range(L):
        ref[f"max_logit.{i}"] = _RECORD["max_logit"][i].float()
    for i, (logits_r, w, idx) in sorted(router_out.items()):
        ref[f"topk_idx.{i}"] = idx.to(torch.int64)
        ref[f"topk_weight.{i}"] = w.float()
        ref[f"_router_logits.{i}"] = logits_r  # internal, removed before writing
    return ref


def router_report(model: DeepseekV3ForCausalLM, ref: dict, name: str) -> dict:
    cfg = model.config
    k, ng, tg = cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    report = {}
    for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
        scores = ref[f"_router_logits.{i}"].sigmoid()
        bias = model.model.layers[i].mlp.gate.e_score_correction_bias.detach()
        idx, w = ref[f"topk_idx.{i}"], ref[f"topk_weight.{i}"]
        hf_sel = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, idx, True)
        mine = select_experts(scores, bias, ng, tg, k, group_limit=True)
        assert torch.equal(hf_sel, mine), f"router restatement disagrees with HF in layer {i}"
        g = scores.gather(1, idx)
        w_exp = g / (g.sum(-1, keepdim=True) + 1e-20) * cfg.routed_scaling_factor
        assert torch.allclose(w, w_exp, rtol=1e-6, atol=1e-7)
        unbiased = select_experts(scores, None, ng, tg, k, group_limit=True)
        no_group = select_experts(scores, bias, ng, tg, k, group_limit=False)
        n_bias = int((unbiased != hf_sel).any(-1).sum())
        n_group = int((no_group != hf_sel).any(-1).sum())
        report[i] = dict(tokens=scores.shape[0], bias_changes_selection=n_bias, group_limit_changes_selection=n_group)
        log(f"  [{name}] layer {i}: tokens whose top-{k} changes because of e_score_correction_bias: "
            f"{n_bias}/{scores.shape[0]}; because of group limiting (n_group={ng}, topk_group={tg}): "
            f"{n_group}/{scores.shape[0]}")
        assert n_bias > 0, "bias must change the selection for some token"
        if ng > 1:
            assert n_group > 0, "group limiting must drop an otherwise chosen expert for some token"
    return report


def logits_of(model: DeepseekV3ForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits.float()


def load_hf(path: Path, **kw) -> DeepseekV3ForCausalLM:
    m = DeepseekV3ForCausalLM.from_pretrained(str(path), attn_implementation="eager",
                                              experts_implementation="eager", **kw)
    return m.to(torch.float32) if kw.get("dtype") is None else m


# ----------------------------------------------------------------------------------------------
# Greedy decoding (tiny_k2)
# ----------------------------------------------------------------------------------------------
def run_generate(model: DeepseekV3ForCausalLM, prompt: torch.Tensor) -> dict[str, torch.Tensor]:
    model.eval()
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0, eos_token_id=None,
                            pad_token_id=None, bos_token_id=0, use_cache=True, num_beams=1)
    # EOS stopping is disabled (the model's own generation_config would otherwise re-insert eos_token_id=1),
    # so exactly NEW_TOKENS argmax tokens are produced.
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        with torch.no_grad():
            out = model.generate(prompt, generation_config=gcfg, output_logits=True, return_dict_in_generate=True)
    finally:
        model.generation_config.eos_token_id = saved_eos
    seq = out.sequences
    step_logits = torch.cat([lg.float() for lg in out.logits], dim=0)
    assert seq.shape == (1, PROMPT_LEN + NEW_TOKENS), seq.shape
    assert step_logits.shape == (NEW_TOKENS, model.config.vocab_size)
    assert torch.equal(step_logits.argmax(-1), seq[0, PROMPT_LEN:]), "greedy token != argmax of logits"
    # Cross-check against full recomputation without a cache.
    with torch.no_grad():
        full = model(input_ids=seq, use_cache=False).logits[0, PROMPT_LEN - 1:-1].float()
    diff = (full - step_logits).abs().max().item()
    assert diff < 1e-4, diff
    log(f"  [tiny_k2] generate: prompt {prompt[0].tolist()} -> new {seq[0, PROMPT_LEN:].tolist()}; "
        f"cached vs uncached logits max |diff| = {diff:.3g}")
    return {"prompt_ids": prompt.clone(), "generated_ids": seq.clone(), "step_logits": step_logits.contiguous()}


# ----------------------------------------------------------------------------------------------
# Checkpoint variants
# ----------------------------------------------------------------------------------------------
def is_quantised_linear(name: str, t: torch.Tensor) -> bool:
    """Attention, dense-MLP, shared- and routed-expert projections; not embeddings, lm_head, router, norms."""
    if t.dim() != 2 or name in ("model.embed_tokens.weight", "lm_head.weight") or name.endswith("mlp.gate.weight"):
        return False
    return name.endswith("_proj.weight") or name.endswith("_proj_with_mqa.weight")


def quantise_fp8_blocks(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-style block quantisation: per [block x block] tile scale = amax/448, q = e4m3(w/scale).
    Partial edge tiles use only their real elements (equivalent to zero padding)."""
    rows, cols = w.shape
    br, bc = -(-rows // block), -(-cols // block)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    scale = torch.empty(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            amax = tile.abs().max()
            s = amax / E4M3_MAX if amax > 0 else torch.tensor(1.0)
            scale[i, j] = s
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = \
                (tile / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantise_fp8_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: int) -> torch.Tensor:
    rows, cols = q.shape
    s = scale_inv.repeat_interleave(block, 0).repeat_interleave(block, 1)[:rows, :cols]
    return q.to(torch.float32) * s


def config_dict(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def legacy_config(cfg_json: dict) -> dict:
    """The same config in the layout of the released DeepSeek-V3 / Kimi-K2 config.json files
    (rope_theta + rope_scaling{type: yarn}, torch_dtype) instead of transformers 5's rope_parameters."""
    d = dict(cfg_json)
    rp = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rp.pop("rope_theta")
    rp.pop("rope_type", None)
    rp["type"] = "yarn"
    d["rope_scaling"] = rp
    d["torch_dtype"] = d.pop("dtype")
    d.pop("head_dim", None)      # derived by DeepseekV3Config.__post_init__ (= qk_rope_head_dim)
    d.pop("qk_head_dim", None)   # derived (= qk_nope_head_dim + qk_rope_head_dim)
    return d


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------
def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_versions(d: Path, extra: dict | None = None) -> None:
    files = {p.name: sha256(p) for p in sorted(d.iterdir()) if p.is_file() and p.name != "versions.json"}
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "seed": SEED,
        "generator": "tools/make_reference.py",
        "files_sha256": files,
    }
    if extra:
        info.update(extra)
    vpath = d / "versions.json"
    date = datetime.date.today().isoformat()
    if vpath.exists():  # keep the date if nothing else changed, so reruns are byte-identical
        old = json.loads(vpath.read_text())
        if {k: v for k, v in old.items() if k != "date"} == info:
            date = old.get("date", date)
    info["date"] = date
    write_json(vpath, info)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data", help="output directory (default test/data)")
    args = ap.parse_args()
    out_root: Path = args.out
    out_root.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"safetensors {safetensors.__version__}, seed {SEED}")

    models, refs, facts = {}, {}, {}
    for idx_m, name in enumerate(MODELS):
        log(f"== {name}")
        model = build_model(name)
        models[name] = model
        facts[name] = check_source_facts(model, name)
        gen = torch.Generator().manual_seed(SEED + 1000 + idx_m)
        input_ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)
        ref = run_reference(model, input_ids)
        rr = router_report(model, ref, name)
        refs[name] = ref

        # train-mode logits == eval-mode logits (dropout 0, no training-only router branch)
        assert torch.equal(logits_of(model, input_ids), ref["logits"]), "train/eval logits differ"
        # default kernels (sdpa attention, grouped_mm experts) only differ by rounding
        model.set_attn_implementation("sdpa")
        model.set_experts_implementation("grouped_mm")
        d_default = (logits_of(model, input_ids) - ref["logits"]).abs().max().item()
        model.set_attn_implementation("eager")
        model.set_experts_implementation("eager")
        log(f"  [{name}] logits: eager vs default kernels (sdpa, grouped_mm) max |diff| = {d_default:.3g}")

        d = out_root / name
        if d.exists():
            shutil.rmtree(d)
        model.save_pretrained(str(d))
        (d / "generation_config.json").unlink(missing_ok=True)
        disk = read_safetensors(d / "model.safetensors")
        expect = split_fused(model, dict(model.named_parameters()))
        for i in range(model.config.first_k_dense_replace, model.config.num_hidden_layers):
            bname = f"model.layers.{i}.mlp.gate.e_score_correction_bias"
            expect[bname] = model.model.layers[i].mlp.gate.e_score_correction_bias.detach().clone()
        assert sorted(disk) == sorted(expect), set(disk) ^ set(expect)
        assert all(torch.equal(disk[k], expect[k]) and disk[k].dtype == torch.float32 for k in disk)
        grad_names = {k[len("grad."):] for k in ref if k.startswith("grad.")}
        assert grad_names == {k for k in disk if not k.endswith("e_score_correction_bias")}

        reloaded = load_hf(d)
        assert torch.equal(logits_of(reloaded, input_ids), ref["logits"]), "reloaded logits differ"
        log(f"  [{name}] from_pretrained({d.relative_to(out_root)}) logits identical: yes")
        to_write = {k: v for k, v in ref.items() if not k.startswith("_")}
        save_st(to_write, d / "reference.safetensors")
        n_params = sum(v.numel() for v in disk.values())
        log(f"  [{name}] {n_params} weights, loss {ref['loss'].item():.6f}, "
            f"max_logit per layer {[round(ref[f'max_logit.{i}'].max().item(), 3) for i in range(model.config.num_hidden_layers)]}")
        zero_grad_experts = [k for k in grad_names if ".experts." in k and not ref[f"grad.{k}"].any()]
        log(f"  [{name}] expert weight tensors with an all-zero gradient (expert chosen by no token): "
            f"{len(zero_grad_experts)}")
        if name == "tiny_k2":
            gen_p = torch.Generator().manual_seed(SEED + 2000)
            prompt = torch.randint(2, model.config.vocab_size, (1, PROMPT_LEN), generator=gen_p, dtype=torch.int64)
            save_st(run_generate(model, prompt), d / "generate.safetensors")
        write_versions(d, {"router_checks": {str(k): v for k, v in rr.items()}})

    # ---- tiny_v3 sharded checkpoint (released-config layout) -------------------------------------
    log("== tiny_v3_sharded")
    model, ref = models["tiny_v3"], refs["tiny_v3"]
    d = out_root / "tiny_v3_sharded"
    if d.exists():
        shutil.rmtree(d)
    model.save_pretrained(str(d), max_shard_size="400KB")
    (d / "generation_config.json").unlink(missing_ok=True)
    write_json(d / "config.json", legacy_config(config_dict(d)))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert 2 <= len(shards) <= 3, shards
    single = read_safetensors(out_root / "tiny_v3" / "model.safetensors")
    merged = {}
    for s in shards:
        for k, v in read_safetensors(d / s).items():
            assert index["weight_map"][k] == s
            merged[k] = v
    assert sorted(merged) == sorted(single) and all(torch.equal(merged[k], single[k]) for k in single)
    reloaded = load_hf(d)
    assert reloaded.config.rope_parameters["original_max_position_embeddings"] == 256
    assert torch.equal(reloaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)
    assert torch.equal(logits_of(reloaded, ref["input_ids"]), ref["logits"])
    log(f"  shards {shards}; legacy rope_scaling config reloads with identical logits: yes")
    write_versions(d)

    # ---- tiny_k2 FP8 (block 16) ------------------------------------------------------------------
    log("== tiny_k2_fp8")
    model, ref = models["tiny_k2"], refs["tiny_k2"]
    src = read_safetensors(out_root / "tiny_k2" / "model.safetensors")
    d = out_root / "tiny_k2_fp8"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    fp8, deq = {}, {}
    partial = []
    for name, w in src.items():
        if is_quantised_linear(name, w):
            q, s = quantise_fp8_blocks(w, FP8_BLOCK)
            fp8[name], fp8[f"{name}_scale_inv"] = q, s
            deq[name] = dequantise_fp8_blocks(q, s, FP8_BLOCK)
            if w.shape[0] % FP8_BLOCK or w.shape[1] % FP8_BLOCK:
                partial.append(name)
            rel = ((deq[name] - w).abs().max() / w.abs().max()).item()
            assert rel < 2 ** -4, (name, rel)  # e4m3 has 3 mantissa bits
        else:
            fp8[name] = w
    save_st(fp8, d / "model.safetensors")
    save_st(deq, d / "dequantized.safetensors")
    cfg = config_dict(out_root / "tiny_k2")
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    write_json(d / "config.json", cfg)
    # HF logits of the dequantised weights (float32 compute), for an end-to-end FP8 load test.
    mdeq = load_hf(out_root / "tiny_k2")
    with torch.no_grad():
        sd = mdeq.state_dict()
        for name, t in deq.items():
            m = _param_view(mdeq, sd, name)
            m.copy_(t)
    save_st({"input_ids": ref["input_ids"], "logits": logits_of(mdeq, ref["input_ids"])}, d / "reference.safetensors")
    log(f"  {len(deq)} tensors quantised to F8_E4M3 with [{FP8_BLOCK},{FP8_BLOCK}] blocks; "
        f"with partial edge blocks: {sorted(set(n.split('.')[-2] for n in partial))}")
    write_versions(d)

    # ---- tiny_k2 BF16 ----------------------------------------------------------------------------
    log("== tiny_k2_bf16")
    d = out_root / "tiny_k2_bf16"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir()
    bf = {k: (v if k.endswith("e_score_correction_bias") else v.to(torch.bfloat16)) for k, v in src.items()}
    save_st(bf, d / "model.safetensors")
    save_st({k: v.to(torch.float32) for k, v in bf.items()}, d / "as_f32.safetensors")
    cfg = config_dict(out_root / "tiny_k2")
    cfg["dtype"] = "bfloat16"
    write_json(d / "config.json", cfg)
    mbf = load_hf(d, dtype=torch.bfloat16)
    assert mbf.model.layers[1].mlp.gate.e_score_correction_bias.dtype == torch.float32  # _keep_in_fp32_modules_strict
    assert torch.equal(mbf.model.embed_tokens.weight, bf["model.embed_tokens.weight"])
    m32 = load_hf(out_root / "tiny_k2")
    with torch.no_grad():
        sd = m32.state_dict()
        for name, t in bf.items():
            _param_view(m32, sd, name).copy_(t.to(torch.float32))
    save_st({"input_ids": ref["input_ids"], "logits": logits_of(m32, ref["input_ids"])}, d / "reference.safetensors")
    log("  bf16 weights (router bias kept F32), exact f32 copies, f32-compute logits of the bf16 weights")
    write_versions(d)

    # ---- summary -------------------------------------------------------------------------------
    log("== files")
    total = 0
    for p in sorted(out_root.rglob("*")):
        if p.is_file():
            total += p.stat().st_size
            log(f"  {p.relative_to(out_root)}  {p.stat().st_size}")
    log(f"  total {total} bytes ({total / 2**20:.2f} MiB)")
    return 0


def _param_view(model: DeepseekV3ForCausalLM, sd: dict, disk_name: str) -> torch.Tensor:
    """The in-memory tensor (a view into a fused expert parameter if needed) for an on-disk name."""
    if disk_name in sd:
        return sd[disk_name]
    prefix, rest = disk_name.split(".experts.")
    e, proj, _ = rest.split(".")
    e = int(e)
    if proj == "down_proj":
        return sd[f"{prefix}.experts.down_proj"][e]
    fused = sd[f"{prefix}.experts.gate_up_proj"][e]
    inter = fused.shape[0] // 2
    return fused[:inter] if proj == "gate_proj" else fused[inter:]


if __name__ == "__main__":
    sys.exit(main())
