#!/usr/bin/env python3
"""Generate the FP8-E4M3 activation-storage oracles under test/data/fp8/ (test/unit/tensor_fp8_tiles.cpp).

    python tools/make_fp8_reference.py            # writes test/data/fp8/
    python tools/make_fp8_reference.py --out DIR  # writes elsewhere (e.g. to check determinism)

The recipe (Kimi K2 technical report, §2.4.3; DeepSeek-V3 technical report, §3.3.2, "tile-wise" 1 x 128 activation
quantization), in torch's own operations: each row is cut into tiles of 128 consecutive elements (the last one
shorter when the row length is not a multiple of 128); per tile

    amax  = |x|.amax()                  (a NaN propagates)
    scale = amax / 448                  (f32; 448 is float8_e4m3fn's largest finite value)
    scale = 1 where scale == 0          (a tile of zeros, or one whose amax / 448 underflows)
    code  = (x / scale).to(torch.float8_e4m3fn)     (IEEE division, round to nearest even, saturating at 448)
    x'    = code.float() * scale

Files:

* tiles.safetensors   for each case <c>:
      <c>.x            F32      [rows, cols]   the input
      <c>.codes        F8_E4M3  [rows, cols]   torch's codes
      <c>.scales       F32      [rows, ceil(cols / 128)]
      <c>.dequantized  F32      [rows, cols]   code.float() * scale
  cases: "ragged" (5 x 300, rows of N(0, 1) at scales 1e-3 .. 1e3: a short last tile, negative values), "special"
  (crafted tiles: all zeros, -0 only, a huge value beside tiny ones whose codes are subnormal or 0, values exactly
  on the ties between adjacent codes with an exact power-of-two scale, normal and subnormal, negative ones, an amax
  whose amax / 448 underflows to 0), "short" (3 x 7: a row shorter than one tile),
  "nonfinite" (2 x 130: an inf in one tile, a NaN in another).
* versions.json       versions, seed, sha256 of the file.

Deterministic: a seeded generator, single-threaded CPU math; reruns are byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path

import safetensors
import torch
from safetensors.torch import save_file

SEED = 20260713
TILE = 128
E4M3_MAX = 448.0
REPO = Path(__file__).resolve().parent.parent


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [rows, cols] (float8_e4m3fn) and scales [rows, ceil(cols / 128)] (f32) of the recipe above."""
    rows, cols = x.shape
    tiles = -(-cols // TILE)
    padded = torch.zeros(rows, tiles * TILE, dtype=torch.float32)  # zeros change no tile's amax
    padded[:, :cols] = x
    t = padded.view(rows, tiles, TILE)
    amax = t.abs().amax(dim=-1)
    scale = amax / E4M3_MAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)  # NaN != 0: a NaN scale stays NaN
    codes = (t / scale.unsqueeze(-1)).to(torch.float8_e4m3fn).view(rows, tiles * TILE)[:, :cols]
    return codes.contiguous(), scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    cols = codes.shape[1]
    return codes.float() * scale.repeat_interleave(TILE, dim=1)[:, :cols]


def ragged(gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(5, 300, generator=gen, dtype=torch.float32)
    return x * torch.tensor([1e-3, 1e-1, 1.0, 10.0, 1e3], dtype=torch.float32).unsqueeze(1)


def special(gen: torch.Generator) -> torch.Tensor:
    x = torch.zeros(4, 2 * TILE, dtype=torch.float32)
    # row 0: an all-zero tile, then a tile of N(0, 1) values
    x[0, TILE:] = torch.randn(TILE, generator=gen)
    # row 1: one huge value among tiny ones (scale 1000 / 448: the tiny ones' codes are subnormal, or 0 below half
    # the smallest), then a tile of -0 only (amax 0: scale 1)
    x[1, :TILE] = torch.linspace(1e-4, 3e-2, TILE) * torch.where(torch.arange(TILE) % 2 == 0, 1.0, -1.0)
    x[1, 77] = 1000.0
    x[1, TILE:] = -0.0
    # row 2: amax 448 (scale exactly 1), so x / scale = x: the ties between adjacent codes, which round to the even
    # code; then the same ties scaled by 2^-6 in a tile of amax 448 * 2^-6 (scale 2^-6, exact)
    ties = [
        448.0, 1.0625, 1.1875, -1.0625, -1.1875,  # between 1 and 1.125 (to 1), 1.125 and 1.25 (to 1.25)
        272.0, 304.0, -272.0, 432.0,              # 256 | 288 (to 256), 288 | 320 (to 320), 416 | 448 (to 448)
        0.5 * 2**-9, 1.5 * 2**-9, 2.5 * 2**-9,    # subnormal ties: to 0, 2 and 2 units of 2^-9
        -1.5 * 2**-9, 7.5 * 2**-9,                # 7.5 units: to 8 units (2^-6, the smallest normal)
        9 * 2**-9,                                # 2^-6 * 1.125: a normal code, exact
        3.0, -3.25, 0.0, -0.0,
    ]
    x[2, :len(ties)] = torch.tensor(ties)
    x[2, len(ties):TILE] = torch.randn(TILE - len(ties), generator=gen)  # |x| < 448
    x[2, TILE:TILE + len(ties)] = torch.tensor(ties) * 2**-6
    # row 3: an amax whose amax / 448 underflows to 0 (scale 1: codes 0), then negative values only
    x[3, :4] = torch.tensor([1e-44, -3e-45, 0.0, 1.4e-45])
    x[3, TILE:] = -torch.rand(TILE, generator=gen) * 5.0
    return x


def short(gen: torch.Generator) -> torch.Tensor:
    return torch.randn(3, 7, generator=gen, dtype=torch.float32) * 3.0


def nonfinite(gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(2, TILE + 2, generator=gen, dtype=torch.float32)
    x[0, 5] = float("inf")     # scale inf: finite values give ±0, inf / inf gives NaN
    x[1, 130 - 1] = -1.0
    x[1, 3] = float("nan")     # scale NaN: every code of the tile is NaN
    return x


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data" / "fp8")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)

    out = {}
    for name, make in (("ragged", ragged), ("special", special), ("short", short), ("nonfinite", nonfinite)):
        x = make(gen)
        codes, scales = quantize(x)
        out[f"{name}.x"] = x
        out[f"{name}.codes"] = codes
        out[f"{name}.scales"] = scales
        out[f"{name}.dequantized"] = dequantize(codes, scales)
    tiles = args.out / "tiles.safetensors"
    save_file({k: v.contiguous() for k, v in out.items()}, str(tiles))

    versions = {
        "generator": "tools/make_fp8_reference.py",
        "seed": SEED,
        "torch": torch.__version__,
        "safetensors": safetensors.__version__,
        "python": platform.python_version(),
        "files_sha256": {tiles.name: hashlib.sha256(tiles.read_bytes()).hexdigest()},
    }
    (args.out / "versions.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
