#!/usr/bin/env python3
"""Generate the oracle of the bf16 compute policy (Precision<BF16>) for moonmoe's model test
(test/unit/hf_reference_bf16.cpp): transformers' DeepseekV3ForCausalLM run in bfloat16 on the tiny K2 model whose
weights are bf16 (test/data/tiny_k2_bf16/, made by make_reference.py), next to the same model run in float32.

    python tools/make_bf16_model_reference.py            # writes test/data/bf16/model_tiny_k2.safetensors
    python tools/make_bf16_model_reference.py --out DIR  # writes elsewhere (e.g. to check determinism)

The bf16 run is `from_pretrained(dtype=torch.bfloat16, attn_implementation="sdpa")`: every projection a bf16
product with f32 accumulation, RMSNorm's statistics and the router in f32 (transformers' own choices), the router
bias f32 (_keep_in_fp32_modules_strict), and attention through torch's scaled_dot_product_attention, whose CPU
kernel takes the bf16 q, k, v and computes scores and softmax in f32 (the "eager" path instead rounds the scores
to bf16 before the softmax; its distance is written to the log for comparison). The loss is transformers' own
(the bf16 logits widened to f32), the gradients those of its bf16 autograd.

File (safetensors):
    input_ids                I64  [2, 10]   test/data/tiny_k2_bf16/reference.safetensors's
    bf16.logits              BF16 [20, 256] logits of the bf16 run, rows = batch-major tokens
    bf16.loss                F32  [1]
    bf16.grad.<param>        BF16           gradient of every parameter in the bf16 run
    distance.logits          F32  [1]       ||f32 - bf16|| / ||bf16|| of the logits: how far transformers' own f32
                                            run is from its bf16 run (the yardstick of the test's tolerance)
    distance.loss            F32  [1]       |f32 - bf16| of the loss
    distance.grad.<param>    F32  [1]       the same relative distance per gradient
Deterministic: single-threaded CPU math, fixed inputs; reruns are byte-identical.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import DeepseekV3ForCausalLM  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "test" / "data" / "tiny_k2_bf16"


def run(dtype: torch.dtype, attn: str, input_ids: torch.Tensor):
    model = DeepseekV3ForCausalLM.from_pretrained(str(MODEL), dtype=dtype, attn_implementation=attn)
    model.train()  # dropout is 0; train() only so that nothing is cached
    out = model(input_ids=input_ids, labels=input_ids)
    out.loss.backward()
    logits = out.logits.detach().reshape(-1, out.logits.shape[-1])
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits, out.loss.detach().float(), grads


def per_expert(grads: dict) -> dict:
    """transformers 5 keeps the experts stacked in memory (gate_up_proj [E, 2I, H], gate rows first; down_proj
    [E, H, I]); the checkpoint and moonmoe name one matrix per expert: experts.<e>.{gate,up,down}_proj.weight."""
    out = {}
    for name, g in grads.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix, inner = name[: -len("gate_up_proj")], g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = g[e, :inner]
                out[f"{prefix}{e}.up_proj.weight"] = g[e, inner:]
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = g[e]
        else:
            out[name] = g
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data" / "bf16")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    input_ids = load_file(str(MODEL / "reference.safetensors"))["input_ids"]

    logits16, loss16, grads16 = run(torch.bfloat16, "sdpa", input_ids)
    logits32, loss32, grads32 = run(torch.float32, "eager", input_ids)
    eager16, _, _ = run(torch.bfloat16, "eager", input_ids)

    tensors = {"input_ids": input_ids.contiguous(), "bf16.logits": logits16.contiguous(),
               "bf16.loss": loss16.reshape(1).contiguous(),
               "distance.logits": torch.tensor([rel(logits32, logits16)], dtype=torch.float32),
               "distance.loss": torch.tensor([abs(float(loss32) - float(loss16))], dtype=torch.float32)}
    grads16, grads32 = per_expert(grads16), per_expert(grads32)
    for name, g in sorted(grads16.items()):
        tensors[f"bf16.grad.{name}"] = g.contiguous()
        tensors[f"distance.grad.{name}"] = torch.tensor([rel(grads32[name], g)], dtype=torch.float32)

    print(f"logits: |f32 - bf16(sdpa)| / |bf16| = {rel(logits32, logits16):.4g}; "
          f"eager bf16 vs sdpa bf16 = {rel(eager16, logits16):.4g}; loss f32 {float(loss32):.6f} bf16 {float(loss16):.6f}")
    worst = max((float(v[0]), k) for k, v in tensors.items() if k.startswith("distance.grad."))
    print(f"gradients: largest relative f32-vs-bf16 distance {worst[0]:.4g} ({worst[1]})")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "model_tiny_k2.safetensors"
    save_file(tensors, str(path), metadata={"torch": torch.__version__, "generator": "tools/make_bf16_model_reference.py"})
    print(f"wrote {path} ({path.stat().st_size} bytes, {len(tensors)} tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
