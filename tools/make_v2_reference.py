#!/usr/bin/env python3
"""Generate the DeepSeek-V2 oracles under test/data/tiny_v2*/ for moonmoe's C++ tests.

Builds two tiny random ``DeepseekV2ForCausalLM`` models and runs transformers' own float32 computation on them
(models/deepseek_v2/modeling_deepseek_v2.py):

  tiny_v2_lite  DeepSeek-V2-Lite's shape: no query compression (q_lora_rank null), topk_method greedy (softmax
                scores, top-k over all experts, weights not normalised, routed_scaling_factor 1), two shared
                experts, YaRN with mscale = mscale_all_dim = 0.707 (V2-Lite's values: the softmax scale carries
                mscale(40, 0.707)^2, cos/sin are not scaled).
  tiny_v2       DeepSeek-V2's shape: query compression, topk_method group_limited_greedy (a group scores as its
                largest expert score; the dropped groups' scores are zeroed), routed_scaling_factor 3, YaRN with
                mscale 1 and mscale_all_dim 0.707, so cos/sin carry mscale(40, 1) / mscale(40, 0.707).

Each directory holds config.json and model.safetensors as save_pretrained writes them, and reference.safetensors:
input_ids, logits, loss, every parameter gradient (grad.<HF name>), the router's choices and weights per MoE layer
(topk_idx.<layer>, topk_weight.<layer>) and the per-head maximum scaled attention logit (max_logit.<layer>).

    pip install -r tools/requirements.txt
    python tools/make_v2_reference.py            # writes test/data/tiny_v2_lite, test/data/tiny_v2
    python tools/make_v2_reference.py --out DIR

Deterministic on the same library versions and kind of CPU (single thread, seeded generators).
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

import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM  # noqa: E402
from transformers.models.deepseek_v2 import modeling_deepseek_v2 as hf_ds2  # noqa: E402

transformers.utils.logging.disable_progress_bar()

SEED = 20250712
BATCH, SEQ = 2, 10
LINEAR_STD = 0.2   # projection, expert, router and lm_head weights
EMBED_STD = 1.0    # model.embed_tokens.weight
NORM_STD = 0.1     # RMSNorm weights are 1 + NORM_STD * randn
REPO = Path(__file__).resolve().parent.parent

COMMON = dict(
    hidden_size=64, vocab_size=256, intermediate_size=96, num_attention_heads=4, num_key_value_heads=4,
    kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=16,
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
    attention_dropout=0.0, bos_token_id=0, eos_token_id=1, hidden_act="silu", rope_theta=10000.0,
    norm_topk_prob=False, first_k_dense_replace=1,
)

MODELS = {
    "tiny_v2_lite": dict(
        COMMON, num_hidden_layers=3, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2,
        topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
        rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=256, beta_fast=32.0,
                          beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707),
    ),
    "tiny_v2": dict(
        COMMON, num_hidden_layers=4, q_lora_rank=32, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
        topk_method="group_limited_greedy", n_group=4, topk_group=2, routed_scaling_factor=3.0,
        rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=256, beta_fast=32.0,
                          beta_slow=1.0, mscale=1.0, mscale_all_dim=0.707),
    ),
}

# Per-head maximum scaled logit, from transformers' own eager attention (looked up as a module global at call time).
_HF_EAGER = hf_ds2.eager_attention_forward
_RECORD: dict = {"on": False, "max_logit": {}}


def _recording_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    if _RECORD["on"]:
        with torch.no_grad():
            k = hf_ds2.repeat_kv(key, module.num_key_value_groups)
            s = torch.matmul(query, k.transpose(2, 3)) * scaling
            n_q, n_k = s.shape[-2:]
            causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
            _RECORD["max_logit"][module.layer_idx] = s.masked_fill(~causal, float("-inf")).amax(dim=(0, 2, 3)).clone()
    return _HF_EAGER(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)


hf_ds2.eager_attention_forward = _recording_eager


def log(msg: str = "") -> None:
    print(msg, flush=True)


def build_model(name: str) -> DeepseekV2ForCausalLM:
    cfg = DeepseekV2Config(**MODELS[name])
    torch.manual_seed(SEED)
    model = DeepseekV2ForCausalLM(cfg).to(torch.float32)
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
    return model


def split_fused(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """On-disk names: transformers 5 keeps experts fused in memory (gate_up_proj [E, 2I, H], gate rows first;
    down_proj [E, H, I]); checkpoints hold one tensor per expert."""
    out = {}
    for name, t in tensors.items():
        t = t.detach().to(torch.float32)
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = t[e, :inter].contiguous().clone()
                out[f"{prefix}{e}.up_proj.weight"] = t[e, inter:].contiguous().clone()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = t[e].contiguous().clone()
        else:
            out[name] = t.contiguous().clone()
    return out


def select_v2(logits: torch.Tensor, cfg: DeepseekV2Config) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's routing written out independently (arXiv 2405.04434 §2.1.2-2.1.3 and the released
    modeling_deepseek.py): softmax, optional group limit by each group's largest score, top-k, times the scale.
    Returns a [T, E] selection mask and the [T, E] weights (0 where not selected)."""
    s = torch.softmax(logits.double(), dim=-1)
    T, E = s.shape
    choice = s.clone()
    if cfg.topk_method == "group_limited_greedy":
        g = cfg.n_group
        best = s.view(T, g, E // g).amax(-1)
        keep = torch.zeros(T, g, dtype=torch.bool).scatter_(1, best.topk(cfg.topk_group, dim=-1)[1], True)
        choice = choice.masked_fill(~keep.repeat_interleave(E // g, dim=1), 0.0)
    idx = choice.topk(cfg.num_experts_per_tok, dim=-1)[1]
    mask = torch.zeros(T, E, dtype=torch.bool).scatter_(1, idx, True)
    return mask, torch.where(mask, s * cfg.routed_scaling_factor, torch.zeros_like(s))


def run_reference(model: DeepseekV2ForCausalLM, input_ids: torch.Tensor) -> tuple[dict, dict]:
    cfg = model.config
    router_out: dict[int, tuple] = {}
    hooks = [layer.mlp.gate.register_forward_hook(
        lambda m, inp, out, i=i: router_out.__setitem__(i, tuple(o.detach().clone() for o in out)))
        for i, layer in enumerate(model.model.layers) if i >= cfg.first_k_dense_replace]
    model.train()  # dropout 0; the V2 router has no training-only branch
    model.zero_grad(set_to_none=True)
    _RECORD["on"], _RECORD["max_logit"] = True, {}
    out = model(input_ids=input_ids, labels=input_ids, use_cache=False)
    _RECORD["on"] = False
    out.loss.backward()
    for h in hooks:
        h.remove()

    lp = torch.log_softmax(out.logits.detach().double()[:, :-1], dim=-1)
    nll = -lp.gather(-1, input_ids[:, 1:, None]).mean()
    assert abs(nll.item() - out.loss.item()) < 1e-5, (nll.item(), out.loss.item())

    ref = {"input_ids": input_ids.clone(), "logits": out.logits.detach().float().clone(),
           "loss": out.loss.detach().float().reshape(1).clone()}
    for n, g in split_fused({n: p.grad for n, p in model.named_parameters()}).items():
        ref[f"grad.{n}"] = g
    for i in range(cfg.num_hidden_layers):
        ref[f"max_logit.{i}"] = _RECORD["max_logit"][i].float()
    checks = {}
    for i, (router_logits, w, idx) in sorted(router_out.items()):
        ref[f"topk_idx.{i}"] = idx.to(torch.int64)
        ref[f"topk_weight.{i}"] = w.float()
        mask, weights = select_v2(router_logits, cfg)
        hf_mask = torch.zeros_like(mask).scatter_(1, idx, True)
        assert torch.equal(mask, hf_mask), f"layer {i}: transformers' V2 selection differs from the restatement"
        assert torch.allclose(weights.gather(1, idx).float(), w, rtol=1e-6, atol=0), f"layer {i}: weights differ"
        if cfg.topk_method == "group_limited_greedy":
            ungrouped = torch.softmax(router_logits.double(), -1).topk(cfg.num_experts_per_tok, dim=-1)[1]
            free = torch.zeros_like(mask).scatter_(1, ungrouped, True)
            checks[str(i)] = {"tokens": mask.shape[0],
                              "group_limit_changes_selection": int((free != mask).any(-1).sum())}
    return ref, checks


def check_rope_and_scale(model: DeepseekV2ForCausalLM, name: str) -> None:
    """The YaRN numbers written out independently of transformers (YaRN, arXiv 2309.00071; DeepSeek-V2 §2.1.3)."""
    cfg = model.config
    rp = cfg.rope_parameters
    dim, base, factor, lorig = cfg.qk_rope_head_dim, rp["rope_theta"], rp["factor"], rp["original_max_position_embeddings"]

    def corr(r):
        return dim * math.log(lorig / (r * 2 * math.pi)) / (2 * math.log(base))

    def mscale(m):
        return 0.1 * m * math.log(factor) + 1.0

    low, high = max(math.floor(corr(rp["beta_fast"])), 0), min(math.ceil(corr(rp["beta_slow"])), dim - 1)
    inv = []
    for i in range(dim // 2):
        extra = 1.0 / base ** (2 * i / dim)
        ramp = min(max((i - low) / (high - low if high != low else 0.001), 0.0), 1.0)
        inv.append(extra / factor * ramp + extra * (1 - ramp))
    rot = model.model.rotary_emb
    assert torch.allclose(rot.inv_freq.double(), torch.tensor(inv, dtype=torch.float64), rtol=1e-6, atol=0)
    attention_factor = mscale(rp["mscale"]) / mscale(rp["mscale_all_dim"])
    assert abs(rot.attention_scaling - attention_factor) < 1e-12, (rot.attention_scaling, attention_factor)
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5 * mscale(rp["mscale_all_dim"]) ** 2
    assert abs(model.model.layers[0].self_attn.scaling - scale) < 1e-12
    log(f"  [{name}] yarn range ({low}, {high}), cos/sin factor {attention_factor:.9f}, softmax scale {scale:.9f}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_versions(d: Path, extra: dict) -> None:
    info = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "safetensors": safetensors.__version__, "seed": SEED, "generator": "tools/make_v2_reference.py",
        "files_sha256": {p.name: sha256(p) for p in sorted(d.iterdir()) if p.is_file() and p.name != "versions.json"},
        **extra,
    }
    vpath = d / "versions.json"
    date = datetime.date.today().isoformat()
    if vpath.exists():  # keep the date when nothing else changed, so reruns are byte-identical
        old = json.loads(vpath.read_text())
        if {k: v for k, v in old.items() if k != "date"} == info:
            date = old.get("date", date)
    info["date"] = date
    vpath.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")
    for n, name in enumerate(MODELS):
        log(f"== {name}")
        model = build_model(name)
        check_rope_and_scale(model, name)
        gen = torch.Generator().manual_seed(SEED + 1000 + n)
        input_ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)
        ref, checks = run_reference(model, input_ids)

        d = args.out / name
        if d.exists():
            shutil.rmtree(d)
        model.save_pretrained(str(d))
        (d / "generation_config.json").unlink(missing_ok=True)
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            disk = {k: f.get_tensor(k) for k in f.keys()}
        expect = split_fused(dict(model.named_parameters()))
        assert sorted(disk) == sorted(expect), set(disk) ^ set(expect)
        assert all(torch.equal(disk[k], expect[k]) for k in disk)
        assert {k[len("grad."):] for k in ref if k.startswith("grad.")} == set(disk)
        config = json.loads((d / "config.json").read_text())
        assert config["architectures"] == ["DeepseekV2ForCausalLM"] and config["model_type"] == "deepseek_v2"

        reloaded = DeepseekV2ForCausalLM.from_pretrained(str(d), dtype=torch.float32)
        reloaded.set_attn_implementation("eager")
        reloaded.set_experts_implementation("eager")
        reloaded.eval()
        with torch.no_grad():
            assert torch.equal(reloaded(input_ids=input_ids, use_cache=False).logits, ref["logits"]), "reload differs"
        save_file({k: v.contiguous() for k, v in sorted(ref.items())}, str(d / "reference.safetensors"),
                  metadata={"format": "pt"})
        write_versions(d, {"router_checks": checks})
        log(f"  [{name}] {sum(v.numel() for v in disk.values())} weights, loss {ref['loss'].item():.6f}, "
            f"router {checks or 'greedy'}; reloaded logits identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
