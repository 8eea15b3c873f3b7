#!/usr/bin/env python3
"""moonmoe_cuda_bench next to PyTorch on the same GPU, and issue 11's targets as ratios of one run.

    python3 bench/gpu_targets.py --ours build-gpu/results/bench/moonmoe_cuda.json
                                 [--torch build-gpu/results/bench/torch_cuda.json]
                                 [--markdown PATH] [--json PATH]

--ours: Google Benchmark JSON of moonmoe_cuda_bench (one file, or several: their rows are concatenated; see
bench/compare.py). Every row carries its precision as its label (f32 today) and, on the GPU, `of_bf16_cublas`: its
FLOP/s over the dense bf16 cuBLAS rate that the same process measured at start-up (bench/support/cublas_bf16.hpp).
--torch: bench/torch_suite.py --device cuda (rows per name and variant f32 / bf16); without it the table has our
side alone and the PyTorch targets read "no PyTorch run".

The targets (issue 11, "Verified on a GPU"), each a ratio within this run:
- MoE grouped expert GEMMs (moe/experts/k2/tokens:1024) at >= 60 % of the dense bf16 cuBLAS rate
- MLA forward + backward (mla/forward_backward/k2/seq:1024) at least as fast as PyTorch's DeepseekV3Attention at
  the same precision (PyTorch time / ours >= 1)
- a decoder layer forward + backward (layer/forward_backward/k2/tokens:256) >= 1.2x PyTorch eager
- a Muon step (muon/step/..., every K2 shape) at least as fast as torch.optim.Muon (the slowest shape decides)
Ours is compared with PyTorch's row of the same precision (our row's label). A target whose rows are missing is
reported as "not measured", never as met.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from compare import counter, load_ours, load_torch, ratio, sig3

MOE_EXPERTS = "moe/experts/k2/tokens:1024"
MLA = "mla/forward_backward/k2/seq:1024"
LAYER = "layer/forward_backward/k2/tokens:256"
MUON_PREFIX = "muon/step/"
# issue 26: bf16 on tensor cores
MOE_BF16 = "moe/experts_bf16/k2/tokens:4096"
SDPA = "sdpa/forward_backward/k2/tokens:4096"
SDPA_FORWARD = "sdpa/forward/k2/tokens:4096"
SDPA_MAX = "sdpa/forward_max/k2/tokens:4096"
LAYER_BF16 = "layer_bf16/forward_backward/k2/tokens:4096"
DECODE_BF16 = "mla/decode_step_bf16/k2/sequences:64/cache:4096"
LAYER_TORCH = "layer/forward_backward/k2/tokens:4096"
SMALL_MUON = "muon/step/rows:256/cols:512"


def precision(row: dict) -> str:
    return row["raw"].get("label") or "f32"


def torch_ratio(ours: dict, torch: dict, name: str, variant: str | None = None):
    """(PyTorch ms / ours ms, ours ms, PyTorch ms) for a name at our row's precision, or None when a side is missing."""
    r = ours.get(name)
    if not r or not math.isfinite(r["ms"]):
        return None
    t = torch.get((name, variant or precision(r)))
    if not t:
        return None
    return t["real_time_ms"] / r["ms"], r["ms"], t["real_time_ms"]


def targets(ours: dict, torch: dict, have_torch: bool) -> list[dict]:
    out = []

    def add(what, goal, value, detail):
        status = "not measured" if value is None else ("met" if value >= goal else "NOT met")
        out.append(dict(target=what, goal=goal, value=value, status=status, detail=detail))

    e = ours.get(MOE_EXPERTS)
    of_bf16 = counter(e, "of_bf16_cublas") if e else None
    add("MoE grouped expert GEMMs / dense bf16 cuBLAS", 0.60, of_bf16,
        f"`{MOE_EXPERTS}` ({precision(e)}): {sig3((counter(e, 'FLOP/s') or math.nan) * 1e-12)} TFLOP/s, "
        f"{sig3((counter(e, 'of_sgemm') or math.nan) * 100)} % of the f32 cuBLAS rate" if e else f"no `{MOE_EXPERTS}` row")
    no_torch = "no PyTorch run" if not have_torch else "a row is missing"
    for what, name, goal in [("MLA forward + backward: PyTorch / ours", MLA, 1.0),
                             ("decoder layer forward + backward: PyTorch eager / ours", LAYER, 1.2)]:
        got = torch_ratio(ours, torch, name)
        add(what, goal, got[0] if got else None,
            f"`{name}` ({precision(ours[name]) if name in ours else '?'}): ours {sig3(got[1])} ms, PyTorch "
            f"{sig3(got[2])} ms" if got else f"`{name}`: {no_torch}")
    muon = [(n, torch_ratio(ours, torch, n, "f32")) for n in ours if n.startswith(MUON_PREFIX) and n != SMALL_MUON]
    measured = [(n, g) for n, g in muon if g]
    worst = min(measured, key=lambda x: x[1][0]) if measured else None
    add("Muon step: torch.optim.Muon (f32 Newton-Schulz) / ours, slowest K2 shape", 1.0,
        worst[1][0] if worst and len(measured) == len(muon) else None,
        (f"{len(measured)} of {len(muon)} shapes compared; slowest `{worst[0]}`: ours {sig3(worst[1][1])} ms, "
         f"PyTorch {sig3(worst[1][2])} ms" if worst else f"muon rows: {no_torch}"))
    issue26(ours, torch, add, no_torch)
    return out


def issue26(ours: dict, torch: dict, add, no_torch: str) -> None:
    """Issue 26's targets: the bf16 paths against the dense bf16 cuBLAS rate and PyTorch's bf16 on the same GPU."""
    e = ours.get(MOE_BF16)
    add("issue 26: MoE grouped expert GEMMs in bf16 / dense bf16 cuBLAS", 0.70,
        counter(e, "of_bf16_cublas") if e else None,
        f"`{MOE_BF16}`: {sig3((counter(e, 'FLOP/s') or math.nan) * 1e-12)} TFLOP/s" if e else f"no `{MOE_BF16}` row")
    got = torch_ratio(ours, torch, SDPA, "bf16")
    fwd, fmax = ours.get(SDPA_FORWARD), ours.get(SDPA_MAX)
    clip = (f"; QK-Clip's exact maxima add {sig3(fmax['ms'] - fwd['ms'])} ms to the forward's {sig3(fwd['ms'])} ms"
            if fwd and fmax else "")
    engine = f" (cuDNN: {'yes' if counter(ours[SDPA], 'cudnn') else 'no'})" if SDPA in ours else ""
    add("issue 26: MLA attention forward + backward in bf16: PyTorch SDPA / ours", 0.80, got[0] if got else None,
        (f"`{SDPA}`{engine}: ours {sig3(got[1])} ms, PyTorch {sig3(got[2])} ms{clip}" if got
         else f"`{SDPA}`: {no_torch}{clip}"))
    r, t = ours.get(LAYER_BF16), torch.get((LAYER_TORCH, "autocast"))
    speed = t["real_time_ms"] / r["ms"] if r and t and math.isfinite(r["ms"]) else None
    add("issue 26: K2 layer forward + backward at 4096 tokens in bf16: PyTorch (autocast) / ours", 1.0, speed,
        f"`{LAYER_BF16}`: ours {sig3(r['ms'])} ms, PyTorch {sig3(t['real_time_ms'])} ms" if speed
        else f"`{LAYER_BF16}`: {'no row of ours' if not r else no_torch}")
    add("issue 26: K2 layer forward + backward in bf16, model FLOP/s / dense bf16 cuBLAS", 0.35,
        counter(r, "of_bf16_cublas") if r else None, f"`{LAYER_BF16}`" if r else f"no `{LAYER_BF16}` row")
    d = ours.get(DECODE_BF16)
    add("issue 26: absorbed bf16 decode step (graph), 64 sequences at cache 4096: bytes read / copy bandwidth", 0.60,
        counter(d, "of_copy") if d else None,
        f"`{DECODE_BF16}`: {sig3(d['ms'])} ms per step" if d else f"no `{DECODE_BF16}` row")


def build_markdown(ours_ctx: dict, rows: list[dict], torch_ctx: dict | None, torch: dict, goals: list[dict]) -> str:
    lines = ["# moonmoe on the GPU: the CUDA benchmarks and issue 11's targets", ""]
    lines.append(f"- device: {ours_ctx.get('device', '?')}; ours built {ours_ctx.get('moonmoe_build', '?')}")
    lines.append(f"- dense cuBLAS rates of this run: f32 (no TF32) {ours_ctx.get('sgemm_GFLOP/s', '?')} GFLOP/s "
                 f"({ours_ctx.get('sgemm_size', '?')}^3), bf16 {ours_ctx.get('bf16_cublas_GFLOP/s', '?')} GFLOP/s "
                 f"({ours_ctx.get('bf16_cublas_size', '?')}^3); copy bandwidth {ours_ctx.get('copy_GB/s', '?')} GB/s "
                 "(read + written, 1 GiB device to device)")
    if torch_ctx:
        lines.append(f"- PyTorch {torch_ctx.get('torch', '?')} (CUDA {torch_ctx.get('torch_cuda', '?')}), transformers "
                     f"{torch_ctx.get('transformers', '?')} on {torch_ctx.get('gpu', '?')}, TF32 off")
    else:
        lines.append("- PyTorch: not run (absent on this machine, or no CUDA device for it): our side alone")
    lines += ["", "## Targets", "", "| target | goal | this run | status | rows |", "|---|---:|---:|---|---|"]
    for g in goals:
        value = "—" if g["value"] is None else f"{g['value']:.2f}"
        lines.append(f"| {g['target']} | >= {g['goal']:.2f} | {value} | {g['status']} | {g['detail']} |")
    lines += ["", "## Every row", "",
              "| benchmark | precision | ours ms | PyTorch ms (same precision) | PyTorch / ours | PyTorch bf16 ms "
              "| ours TFLOP/s | % of f32 cuBLAS | % of bf16 cuBLAS |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p = precision(r)
        t = torch.get((r["name"], p))
        t16 = torch.get((r["name"], "bf16"))
        flops, of32, of16 = counter(r, "FLOP/s"), counter(r, "of_sgemm"), counter(r, "of_bf16_cublas")
        pct = lambda v: "—" if v is None else f"{v * 100:.1f}%"
        lines.append("| " + " | ".join([
            f"`{r['name']}`", p, sig3(r["ms"]), sig3(t["real_time_ms"]) if t else "—",
            ratio(t["real_time_ms"], r["ms"]) if t else "—",
            sig3(t16["real_time_ms"]) if t16 and p != "bf16" else "—",
            sig3(flops * 1e-12) if flops else "—", pct(of32), pct(of16)]) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", nargs="+", required=True, help="moonmoe_cuda_bench JSON file(s)")
    ap.add_argument("--torch", help="bench/torch_suite.py --device cuda JSON")
    ap.add_argument("--markdown", help="write the tables here (else stdout)")
    ap.add_argument("--json", help="write the targets and the compared rows here")
    args = ap.parse_args()
    ours_ctx, rows = load_ours(args.ours)
    have_torch = bool(args.torch) and Path(args.torch).exists()
    torch_ctx, torch = load_torch(Path(args.torch)) if have_torch else (None, {})
    by_name = {r["name"]: r for r in rows}
    goals = targets(by_name, torch, have_torch)
    text = build_markdown(ours_ctx, rows, torch_ctx, torch, goals)
    if args.markdown:
        Path(args.markdown).write_text(text)
    else:
        print(text, end="")
    if args.json:
        compared = [dict(name=r["name"], precision=precision(r), ours_ms=r["ms"],
                         torch_ms=(torch.get((r["name"], precision(r))) or {}).get("real_time_ms"),
                         torch_bf16_ms=(torch.get((r["name"], "bf16")) or {}).get("real_time_ms"),
                         of_sgemm=counter(r, "of_sgemm"), of_bf16_cublas=counter(r, "of_bf16_cublas")) for r in rows]
        Path(args.json).write_text(json.dumps(dict(context=dict(ours=ours_ctx, torch=torch_ctx), targets=goals,
                                                   rows=compared), indent=1, default=str) + "\n")
    for g in goals:
        print(f"gpu_targets: {g['target']}: {g['status']}", file=sys.stderr)


if __name__ == "__main__":
    main()
