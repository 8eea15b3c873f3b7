#!/usr/bin/env python3
"""Generate the bfloat16 oracles under test/data/bf16/ for moonmoe's precision tests (test/unit/backend_precision.cpp).

    python tools/make_bf16_reference.py            # writes test/data/bf16/
    python tools/make_bf16_reference.py --out DIR  # writes elsewhere (e.g. to check determinism)

Files:

* conversions.safetensors     torch's own conversions, element by element:
      f32_to_bf16.input  F32 [n]   edge cases (signed zeros, ties to even, values just off a tie, float and bf16
                                   subnormals, the largest bf16, the midpoint above it, the largest float, infinities,
                                   NaNs with payloads) followed by random floats over the whole exponent range
      f32_to_bf16.output BF16 [n]  input.to(torch.bfloat16)
      bf16_to_f32.input  BF16 [m]  every 16th bit pattern, plus the edge patterns
      bf16_to_f32.output F32 [m]   input.to(torch.float32)
* newton_schulz_bf16.safetensors  torch.optim.Muon's Newton-Schulz (torch/optim/_muon.py,
      _zeropower_via_newtonschulz: the input cast to bfloat16, divided by its norm clamped at eps = 1e-7, five
      iterations of the Keller quintic with bf16 matmuls and addmm), for inputs of several shapes:
      <case>.g      F32   the input (an f32 matrix, as Muon's momentum is)
      <case>.torch  BF16  torch's result
      <case>.f64    F32   the same iteration in float64 from the f32 input, rounded to f32 (the exact rendering)
* versions.json               versions, seed, sha256 of each file and the distances the test relies on.

Deterministic: seeded generators, single-threaded CPU math; reruns are byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import struct
import sys
from pathlib import Path

import safetensors
import torch
from safetensors.torch import save_file
from torch.optim import _muon as torch_muon

SEED = 20261123
REPO = Path(__file__).resolve().parent.parent
NS_CASES = [("wide", (32, 64)), ("tall", (64, 32)), ("square", (48, 48)), ("wide_large", (96, 160))]
COEFFS = (torch_muon.DEFAULT_A, torch_muon.DEFAULT_B, torch_muon.DEFAULT_C)


def f32_from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)


def bf16_from_bits(bits: list[int]) -> torch.Tensor:
    return torch.tensor([b - 0x10000 if b >= 0x8000 else b for b in bits], dtype=torch.int16).view(torch.bfloat16)


def conversion_inputs(gen: torch.Generator) -> torch.Tensor:
    edge = [
        0x00000000, 0x80000000,              # +0, -0
        0x3F800000, 0xBF800000,              # +-1
        0x3F808000, 0x3F818000,              # 1 + 2^-8 (tie, to even 1), 1 + 3 2^-8 (tie, to even 1 + 2^-6)
        0x3F808001, 0x3F807FFF,              # just above / below the first tie
        0xBF818000, 0xBF808000,              # negative ties
        0x3F80FFFF, 0x3FFFFFFF,              # carries into the next binade
        0x00000001, 0x80000001, 0x00400000,  # float subnormals (flush to +-0 at bf16's precision)
        0x00010000, 0x00008000, 0x00018000,  # the smallest bf16 subnormal, its half (tie to 0), 1.5 of it (tie up)
        0x00008001, 0x007F8000, 0x007FFFFF,  # just above half, the top of the subnormals (ties / carries to 2^-126)
        0x00800000, 0x80800000,              # smallest normals
        0x7F7F0000, 0xFF7F0000,              # the largest bf16
        0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001,  # below, at and above the midpoint to 2^128: max, inf (tie to even), inf
        0x7F7FFFFF, 0xFF7FFFFF,              # the largest float: rounds to inf
        0x7F800000, 0xFF800000,              # +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001,  # quiet NaNs, a signalling NaN with the smallest payload
        0x7FFFFFFF, 0xFFFFFFFF, 0x7F80FFFF,  # NaN payloads that would carry into the exponent if rounded as numbers
    ]
    # random bit patterns over every exponent (NaNs and infinities included where they fall), and random normals
    rand_bits = torch.randint(0, 2**32, (2048,), generator=gen, dtype=torch.int64).tolist()
    # values on and next to ties: the low 16 bits 0x8000 exactly, 0x7FFF, 0x8001
    tie_bits = []
    for b in torch.randint(0, 2**32, (256,), generator=gen, dtype=torch.int64).tolist():
        base = b & 0xFFFF0000
        tie_bits += [base | 0x8000, base | 0x7FFF, base | 0x8001]
    return f32_from_bits(edge + rand_bits + tie_bits)


def bf16_inputs() -> torch.Tensor:
    edge = [0x0000, 0x8000, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81,
            0xFFFF, 0x3F80, 0xBF80]
    return bf16_from_bits(edge + list(range(0, 0x10000, 16)))


def ns_f64(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """The same iteration in float64 (no bf16), for the exact rendering."""
    a, b, c = COEFFS
    x = g.double()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def ns_bf16_emulated(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """An independent rendering of torch's bf16 iteration: each product summed in float64 (exact for the bf16
    products; f32 accumulation differs only in the order of rounding) and rounded once to bf16, as cuBLAS and
    oneDNN do with alpha / beta; the norm in float64 rounded to bf16. Reported, not stored: how far two faithful
    bf16 renderings can drift apart, which bounds what the C++ test may ask."""
    a, b, c = COEFFS
    bf = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    x = bf(g)
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    n = bf(x.norm().clamp(min=eps))
    x = bf((x.float() / n.float()).double())
    for _ in range(steps):
        gram = bf(x @ x.T)
        upd = bf(c * (gram @ gram) + b * gram)
        x = bf(a * x + upd @ x)
    return x.T if tall else x


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data" / "bf16")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)

    f32_in = conversion_inputs(gen)
    bf_in = bf16_inputs()
    conv = {"f32_to_bf16.input": f32_in, "f32_to_bf16.output": f32_in.to(torch.bfloat16),
            "bf16_to_f32.input": bf_in, "bf16_to_f32.output": bf_in.to(torch.float32)}
    save_file({k: v.contiguous() for k, v in conv.items()}, str(args.out / "conversions.safetensors"))

    ns = {}
    checks = {}
    for name, shape in NS_CASES:
        g = torch.randn(shape, generator=gen, dtype=torch.float32)
        t = torch_muon._zeropower_via_newtonschulz(g, COEFFS, 5, 1e-7)
        assert t.dtype == torch.bfloat16
        exact = ns_f64(g)
        emu = ns_bf16_emulated(g)
        ns[f"{name}.g"] = g
        ns[f"{name}.torch"] = t
        ns[f"{name}.f64"] = exact.float()
        td = t.double()
        checks[name] = {
            "torch_vs_f64_maxabs": float(f"{(td - exact).abs().max().item():.4g}"),
            "emulated_vs_torch_maxabs": float(f"{(emu - td).abs().max().item():.4g}"),
            "emulated_vs_torch_differing": float(f"{(emu != td).double().mean().item():.4g}"),
            "max_entry": float(f"{td.abs().max().item():.4g}"),
        }
        print(name, checks[name])
    save_file({k: v.contiguous() for k, v in ns.items()}, str(args.out / "newton_schulz_bf16.safetensors"))

    versions = {
        "generator": "tools/make_bf16_reference.py",
        "seed": SEED,
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
        "checks": {"newton_schulz": checks},
        "files_sha256": {f: sha256(args.out / f) for f in ("conversions.safetensors", "newton_schulz_bf16.safetensors")},
    }
    (args.out / "versions.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
