#!/usr/bin/env python3
"""Generate the optimizer oracles under test/data/optim/ for moonmoe's C++ Muon / AdamW / QK-Clip tests.

    pip install -r tools/requirements.txt
    python tools/make_optimizer_reference.py            # writes test/data/optim/
    python tools/make_optimizer_reference.py --out DIR  # writes elsewhere (e.g. to check determinism)

Files (see tools/README.md, section "Optimizer oracles", for every tensor name and formula):

* muon_torch.safetensors      torch.optim.Muon, 3 steps, 3 hyper-parameter cases, 6 parameters, plus an
                              independent float64 re-implementation of the same algorithm (no bf16).
* newton_schulz.safetensors   SVD-built inputs and exact fp64 expectations U p(S) V^T for the Keller
                              quintic and the Polar Express (modded-nanogpt) schedules.
* adamw_torch.safetensors     torch.optim.AdamW, 3 steps on a vector and an embedding-like matrix.
* qk_clip.safetensors         Algorithm 1's QK-Clip (MLA) applied to test/data/tiny_k2 with the max logits of
                              its reference.safetensors, checked by re-running the HF forward; plus an MHA layout.

Deterministic: single-threaded CPU math, seeded generators, and a hand-written safetensors writer with a
fixed header order (safetensors' own writer orders __metadata__ keys at random).  versions.json keeps its
date when nothing else changed, so reruns are byte-identical.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import struct
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from torch.optim import _muon as torch_muon  # noqa: E402
from transformers import DeepseekV3ForCausalLM  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds3  # noqa: E402

transformers.utils.logging.disable_progress_bar()

SEED = 20250711
REPO = Path(__file__).resolve().parent.parent
TINY_K2 = REPO / "test" / "data" / "tiny_k2"

# ---- Muon ------------------------------------------------------------------------------------------
MUON_STEPS = 3
MUON_INIT_STD = 0.2    # initial weights (same std as make_reference.py's projections)
MUON_GRAD_STD = 1.0    # gradients fed at every step
MUON_PARAMS = [        # name, shape [rows = fan-out, cols = fan-in]
    ("wide", (48, 96)),
    ("tall", (96, 40)),
    ("square", (64, 64)),
    ("expert0", (32, 80)),   # an "expert stack" [3, 32, 80], as three 2-D params (torch Muon is 2-D only)
    ("expert1", (32, 80)),
    ("expert2", (32, 80)),
]
MUON_COMMON = dict(lr=0.02, weight_decay=0.1, momentum=0.95, ns_coefficients=(3.4445, -4.7750, 2.0315),
                   eps=1e-7, ns_steps=5)
MUON_CASES = {
    "match_nesterov": dict(MUON_COMMON, nesterov=True, adjust_lr_fn="match_rms_adamw"),
    "match_no_nesterov": dict(MUON_COMMON, nesterov=False, adjust_lr_fn="match_rms_adamw"),
    "original_nesterov": dict(MUON_COMMON, nesterov=True, adjust_lr_fn="original"),
}

# ---- Newton-Schulz ---------------------------------------------------------------------------------
NS_SHAPES = {          # name -> (rows, cols, zero singular value?)
    "24x40": (24, 40, False),
    "40x24": (40, 24, False),
    "32x32": (32, 32, False),
    "32x32_rank31": (32, 32, True),
}
KELLER = [(3.4445, -4.7750, 2.0315)] * 5
POLAR_EXPRESS = [  # modded-nanogpt train_gpt.py (num_iters=5, safety_factor=2e-2, cushion=2), spec §9
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
NS_SCHEDULES = {       # name -> (coefficients per iteration, norm multiplier, norm additive eps)
    "keller": (KELLER, 1.0, 0.0),               # X / ||X||_F          (exact-arithmetic oracle: no eps)
    "polar_express": (POLAR_EXPRESS, 1.02, 1e-6),  # X / (||X||_F * 1.02 + 1e-6)
}

# ---- AdamW -----------------------------------------------------------------------------------------
ADAMW = dict(lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
ADAMW_PARAMS = [("vector", (64,), 0.2), ("embedding", (50, 16), 1.0)]   # name, shape, init std
ADAMW_STEPS = 3

# ---- QK-Clip ---------------------------------------------------------------------------------------
MHA = dict(heads=4, head_dim=8, hidden=32, weight_std=0.2)
MHA_MAX_LOGIT = [250.0, 100.0, -7.5, 130.0]   # head 1 exactly at tau, head 2 <= 0: both untouched
MHA_TAU = 100.0
MHA_ALPHAS = [0.5, 0.25]


def log(msg: str = "") -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------------
# Deterministic safetensors writer.  safetensors' save_file serialises __metadata__ from a Rust HashMap,
# so the key order (hence the bytes) changes from run to run when there is more than one key.  This
# writer lays the file out like the reference serializer (tensor.rs `prepare`: tensors ordered by dtype,
# I64 > F64 > F32, then by name; data back to back in that order; compact JSON with "__metadata__" first;
# header padded with spaces to a multiple of 8, so every tensor is aligned) but with the metadata keys
# sorted.  With a single metadata key its output is byte-identical to save_file's (checked in main).
# Every file is read back with safe_open and compared.
# ----------------------------------------------------------------------------------------------------
_ST_DTYPE = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
_ST_RANK = {torch.int64: 0, torch.float64: 1, torch.float32: 2}   # reference order: Reverse(Dtype enum)


def save_st(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    meta = {"format": "pt"}
    meta.update(metadata or {})
    header: dict = {"__metadata__": {k: str(meta[k]) for k in sorted(meta)}}
    blobs, offset = [], 0
    for name in sorted(tensors, key=lambda k: (_ST_RANK[tensors[k].dtype], k)):
        t = tensors[name].detach().contiguous().cpu()
        data = t.numpy().tobytes()  # little-endian host (x86-64 / aarch64)
        header[name] = {"dtype": _ST_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    assert sys.byteorder == "little"
    path.write_bytes(struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs))
    with safe_open(str(path), "pt") as f:  # read back
        assert f.metadata() == header["__metadata__"]
        assert sorted(f.keys()) == sorted(tensors)
        for k in f.keys():
            assert torch.equal(f.get_tensor(k), tensors[k].detach().cpu()), k


def check_writer(tmpdir: Path) -> None:
    """save_st == safetensors.torch.save_file byte for byte when the metadata has one key."""
    from safetensors.torch import save as st_save
    sample = {"z": torch.arange(3, dtype=torch.float32), "b": torch.ones(2, dtype=torch.float64),
              "c": torch.arange(2), "a": torch.zeros(5, dtype=torch.float32), "d": torch.ones(1, 1, dtype=torch.int64)}
    probe = tmpdir / ".writer_probe.safetensors"
    try:
        save_st(sample, probe)
        assert probe.read_bytes() == st_save(sample, metadata={"format": "pt"}), "writer layout differs from save_file"
    finally:
        probe.unlink(missing_ok=True)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def fstr(x: float) -> str:
    return repr(float(x))


# ====================================================================================================
# 1. torch.optim.Muon vs an independent float64 re-implementation
# ====================================================================================================
def ns_f64(u: torch.Tensor, coeffs, eps: float, norm_mult: float = 1.0, norm_add: float = 0.0,
           clamp: bool = True) -> torch.Tensor:
    """Newton-Schulz on a 2-D float64 matrix, written out from torch/optim/_muon.py:56-71 (no bf16).

    clamp=True:  X / max(||X||_F, eps)            (torch; norm_mult = 1, norm_add = 0)
    clamp=False: X / (||X||_F * norm_mult + norm_add)  (exact oracles, Polar Express)
    """
    assert u.dtype in (torch.float64, torch.float32) and u.dim() == 2  # float32 only for error statistics
    x = u.clone()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    nrm = torch.linalg.vector_norm(x)
    x = x / (torch.clamp(nrm, min=eps) if clamp else nrm * norm_mult + norm_add)
    for a, b, c in coeffs:
        A = x @ x.T
        B = b * A + c * (A @ A)
        x = a * x + B @ x
    return x.T if tall else x


def adjusted_lr(lr: float, fn: str | None, shape) -> float:
    """torch/optim/_muon.py:74-87 (A, B = param.shape[:2])."""
    A, B = shape[:2]
    if fn is None or fn == "original":
        return lr * math.sqrt(max(1, A / B))
    if fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(A, B))
    raise ValueError(fn)


def muon_step_f64(p, buf, g, hp):
    """One Muon step (torch/optim/_muon.py:343-352) in the dtype of p (float64 for the stored oracle, float32
    only to measure what an all-f32 implementation achieves); returns new (p, buf, update_without_lr)."""
    mu = hp["momentum"]
    buf = buf + (1.0 - mu) * (g - buf)                     # buf.lerp_(grad, 1 - mu)
    u = g + mu * (buf - g) if hp["nesterov"] else buf      # grad.lerp(buf, mu) | buf
    x = ns_f64(u, [hp["ns_coefficients"]] * hp["ns_steps"], hp["eps"])
    alr = adjusted_lr(hp["lr"], hp["adjust_lr_fn"], p.shape)
    p = p * (1.0 - hp["lr"] * hp["weight_decay"])          # decoupled wd with the UNadjusted lr
    p = p - alr * x
    return p, buf, x


def make_muon(out: Path) -> dict:
    log("== muon_torch.safetensors")
    gen = torch.Generator().manual_seed(SEED + 1)
    init = {n: MUON_INIT_STD * torch.randn(s, generator=gen, dtype=torch.float32) for n, s in MUON_PARAMS}
    grads = {n: [MUON_GRAD_STD * torch.randn(s, generator=gen, dtype=torch.float32) for _ in range(MUON_STEPS)]
             for n, s in MUON_PARAMS}

    tensors: dict[str, torch.Tensor] = {}
    for n, _ in MUON_PARAMS:
        tensors[f"{n}.init"] = init[n]
        for t in range(MUON_STEPS):
            tensors[f"{n}.grad.{t + 1}"] = grads[n][t]

    meta = {"steps": str(MUON_STEPS), "step_index": "1-based: grad.t is fed at step t, after.t is the result",
            "params": ",".join(f"{n}:{s[0]}x{s[1]}" for n, s in MUON_PARAMS),
            "cases": ",".join(MUON_CASES),
            "shared": "init, grad, momentum, momentum64 do not depend on the case (asserted) and are stored once",
            "muon_dtype": "torch runs Newton-Schulz in bfloat16; *64 tensors are a float64 run rounded to f32"}
    stats = {}
    momentum_seen: dict[str, list[torch.Tensor]] = {}
    momentum64_seen: dict[str, list[torch.Tensor]] = {}
    for case, hp in MUON_CASES.items():
        for k, v in hp.items():
            meta[f"{case}.{k}"] = json.dumps(list(v)) if isinstance(v, tuple) else (
                json.dumps(v) if isinstance(v, bool) else str(v))
        # ---- torch ----
        params = [torch.nn.Parameter(init[n].clone()) for n, _ in MUON_PARAMS]
        opt = torch.optim.Muon(params, **hp)
        t_after, t_mom, t_upd = ({n: [] for n, _ in MUON_PARAMS} for _ in range(3))
        for t in range(MUON_STEPS):
            for (n, _), p in zip(MUON_PARAMS, params):
                p.grad = grads[n][t].clone()
            # torch's own orthogonalised update for this step, from its own f32 state (for the NS error stats)
            for (n, _), p in zip(MUON_PARAMS, params):
                buf = opt.state[p]["momentum_buffer"].clone() if p in opt.state else torch.zeros_like(p)
                buf.lerp_(p.grad, 1 - hp["momentum"])
                u = p.grad.lerp(buf, hp["momentum"]) if hp["nesterov"] else buf
                t_upd[n].append((u.clone(), torch_muon._zeropower_via_newtonschulz(
                    u, hp["ns_coefficients"], hp["ns_steps"], hp["eps"]).float()))
            opt.step()
            for (n, _), p in zip(MUON_PARAMS, params):
                assert torch.equal(p.grad, grads[n][t]), "torch Muon must not modify p.grad"
                t_after[n].append(p.detach().clone())
                t_mom[n].append(opt.state[p]["momentum_buffer"].clone())
                assert p.dtype == torch.float32 and t_mom[n][-1].dtype == torch.float32
        # ---- float64 re-implementation, independent state ----
        s64 = {n: (init[n].double(), torch.zeros(init[n].shape, dtype=torch.float64)) for n, _ in MUON_PARAMS}
        s32 = {n: (init[n].clone(), torch.zeros(init[n].shape, dtype=torch.float32)) for n, _ in MUON_PARAMS}
        stats[case] = {}
        for t in range(MUON_STEPS):
            for n, shape in MUON_PARAMS:
                p64, b64 = s64[n]
                p_prev = p64
                p64, b64, x64 = muon_step_f64(p64, b64, grads[n][t].double(), hp)
                s64[n] = (p64, b64)
                p32, b32, _ = muon_step_f64(*s32[n], grads[n][t], hp)
                s32[n] = (p32, b32)
                tensors[f"{case}.{n}.after.{t + 1}"] = t_after[n][t]
                tensors[f"{case}.{n}.after64.{t + 1}"] = p64.float()
                momentum_seen.setdefault(f"{n}.{t + 1}", []).append(t_mom[n][t])
                momentum64_seen.setdefault(f"{n}.{t + 1}", []).append(b64.float())
                # distances: torch (bf16 NS) vs float64
                alr = adjusted_lr(hp["lr"], hp["adjust_lr_fn"], shape)
                upd64 = alr * x64                               # this step's f64 update (without wd)
                dp = (t_after[n][t].double() - p64).abs().max().item()
                u_t, x_t = t_upd[n][t]
                x_ref = ns_f64(u_t.double(), [hp["ns_coefficients"]] * hp["ns_steps"], hp["eps"])
                ns_abs = (x_t.double() - x_ref).abs().max().item()
                ns_rel = ((x_t.double() - x_ref).norm() / x_ref.norm()).item()
                dm = (t_mom[n][t].double() - b64).abs().max().item() / b64.abs().max().item()
                stats[case][f"{n}.{t + 1}"] = dict(
                    param_maxabs=dp, param_over_update=dp / upd64.abs().max().item(),
                    ns_maxabs=ns_abs, ns_rel_fro=ns_rel, ns_max_entry=x_ref.abs().max().item(),
                    momentum_rel=dm, update_maxabs=upd64.abs().max().item(),
                    f32_param_maxabs=(p32.double() - p64).abs().max().item(),
                    step_maxabs=(p64 - p_prev).abs().max().item())
            for n, shape in MUON_PARAMS:
                meta[f"{case}.{n}.adjusted_lr"] = fstr(adjusted_lr(hp["lr"], hp["adjust_lr_fn"], shape))
    # momentum (torch f32 and f64) is case independent: m_t = lerp chain of the grads only
    for key, seen in momentum_seen.items():
        assert all(torch.equal(seen[0], m) for m in seen[1:]), f"momentum differs between cases: {key}"
        assert all(torch.equal(momentum64_seen[key][0], m) for m in momentum64_seen[key][1:])
        n, t = key.rsplit(".", 1)
        tensors[f"{n}.momentum.{t}"] = seen[0]
        tensors[f"{n}.momentum64.{t}"] = momentum64_seen[key][0]

    # torch's CPU lerp kernel (ATen/native/Lerp.h, weight < 0.5: self + w*(end - self)) evaluated as one fused
    # multiply-add per element in f32 reproduces the stored momentum bit for bit on this machine (reported,
    # not asserted: it depends on the CPU kernel using FMA).
    mism, total = 0, 0
    w32 = torch.tensor(1.0 - MUON_COMMON["momentum"], dtype=torch.float32).double()
    for n, _ in MUON_PARAMS:
        b = torch.zeros(init[n].shape, dtype=torch.float32)
        for t in range(MUON_STEPS):
            b = (b.double() + w32 * (grads[n][t] - b).double()).float()  # exact product, one rounding of the sum
            mism += int((b != tensors[f"{n}.momentum.{t + 1}"]).sum())
            total += b.numel()
    log(f"  momentum: f32 fma(w, g - m, m) with w = f32(1 - momentum) reproduces torch's buffer bitwise: "
        f"{total - mism}/{total} elements")

    # ---- summary / checks ----
    summary = {}
    for case in MUON_CASES:
        st = stats[case]
        worst = {k: max(v[k] for v in st.values()) for k in next(iter(st.values()))}
        summary[case] = worst
        log(f"  [{case}] torch(bf16 NS) vs float64, worst over params and steps: "
            f"|param diff| {worst['param_maxabs']:.3g} = {worst['param_over_update']:.3g} x max|update|; "
            f"NS output max|diff| {worst['ns_maxabs']:.3g} (max|entry| {worst['ns_max_entry']:.3g}), "
            f"rel. Frobenius {worst['ns_rel_fro']:.3g}; momentum rel {worst['momentum_rel']:.2g}; "
            f"(an all-f32 run of the same algorithm: |param diff| {worst['f32_param_maxabs']:.2g})")
        for t in range(1, MUON_STEPS + 1):
            row = {n: st[f"{n}.{t}"] for n, _ in MUON_PARAMS}
            log(f"    step {t}: |param diff| per param " + ", ".join(
                f"{n} {r['param_maxabs']:.2e} ({r['param_over_update']:.3f} upd)" for n, r in row.items()))
        assert worst["ns_rel_fro"] < 2e-2, worst
        assert worst["param_over_update"] < 0.1, worst
        assert worst["momentum_rel"] < 1e-6, worst
    save_st(tensors, out / "muon_torch.safetensors", meta)
    return {"muon_bf16_vs_f64": {c: {k: float(f"{v:.4g}") for k, v in s.items()} for c, s in summary.items()}}


# ====================================================================================================
# 2. Newton-Schulz on SVD-built inputs
# ====================================================================================================
def poly_chain(x: torch.Tensor, coeffs) -> torch.Tensor:
    for a, b, c in coeffs:
        x = a * x + b * x ** 3 + c * x ** 5
    return x


def make_newton_schulz(out: Path) -> dict:
    log("== newton_schulz.safetensors")
    gen = torch.Generator().manual_seed(SEED + 2)
    tensors: dict[str, torch.Tensor] = {}
    meta = {"expected": "U diag(p_5(...p_1(s / d))) V^T in float64, p_i(x) = a_i x + b_i x^3 + c_i x^5",
            "keller.coefficients": json.dumps([list(c) for c in KELLER]),
            "keller.normalisation": "d = ||G||_F (no eps)",
            "polar_express.coefficients": json.dumps([list(c) for c in POLAR_EXPRESS]),
            "polar_express.normalisation": "d = ||G||_F * 1.02 + 1e-6",
            "singular_values": "log-spaced from 1 down to 1e-3 (geomspace); the _rank31 case sets the last one to 0",
            "transpose": "a tall input is transposed before and after the iteration (irrelevant in exact arithmetic)"}
    for sched, (coeffs, _, _) in NS_SCHEDULES.items():
        tensors[f"ns.coefficients.{sched}"] = torch.tensor(coeffs, dtype=torch.float64)
    report = {}
    for shape_name, (m, n, zero) in NS_SHAPES.items():
        k = min(m, n)
        U, _ = torch.linalg.qr(torch.randn(m, k, generator=gen, dtype=torch.float64))
        V, _ = torch.linalg.qr(torch.randn(n, k, generator=gen, dtype=torch.float64))
        s = torch.logspace(0.0, -3.0, k, dtype=torch.float64)
        if zero:
            s[-1] = 0.0
        G = U @ torch.diag(s) @ V.T
        # sanity: the construction really has these singular values
        assert torch.allclose(torch.linalg.svdvals(G), s, atol=1e-13)
        fro = torch.linalg.vector_norm(s)
        for sched, (coeffs, mult, add) in NS_SCHEDULES.items():
            x = s / (fro * mult + add)
            ps = poly_chain(x, coeffs)
            expected = U @ torch.diag(ps) @ V.T
            # independent matrix-form iteration in float64 (Gram form X X^T with the transpose rule)
            it = ns_f64(G, coeffs, 0.0, mult, add, clamp=False)
            d_it = (it - expected).abs().max().item()
            assert d_it < 1e-12, (shape_name, sched, d_it)
            key = f"ns.{shape_name}.{sched}"
            tensors[f"{key}.input"] = G
            tensors[f"{key}.expected"] = expected
            tensors[f"{key}.singular_values"] = s.clone()
            tensors[f"{key}.expected_singular_values"] = ps
            if zero:
                assert ps[-1] == 0.0
            d32 = (ns_f64(G.float(), coeffs, 0.0, mult, add, clamp=False).double() - expected).abs().max().item()
            line = (f"  {key}: output sigma in [{ps[ps > 0].min().item():.4f}, {ps.max().item():.4f}]; "
                    f"U p(S) V^T vs matrix iteration in f64: max|diff| {d_it:.2g}, in f32: {d32:.2g}")
            report[f"{shape_name}.{sched}.f32_maxabs"] = float(f"{d32:.4g}")
            if sched == "keller":  # torch.optim.Muon's bf16 kernel on the same input (eps 1e-7 clamp)
                tb = torch_muon._zeropower_via_newtonschulz(G.float(), KELLER[0], 5, 1e-7).double()
                d_bf = (tb - expected).abs().max().item()
                line += f"; torch bf16 kernel max|diff| {d_bf:.3g} (max|entry| {expected.abs().max().item():.3g})"
                report[f"{shape_name}.keller.torch_bf16_maxabs"] = float(f"{d_bf:.4g}")
                assert d_bf < 0.5, d_bf
            log(line)
    # spec §9 table values for sigma in [1e-3, 1] (interval maps, not these particular inputs)
    grid = torch.logspace(-3.0, 0.0, 200001, dtype=torch.float64)
    for sched, want in (("keller", (0.47, 1.20, 0.696)), ("polar_express", (0.859, 1.141, 0.859))):
        vals = poly_chain(grid, NS_SCHEDULES[sched][0])
        got = (vals.min().item(), vals.max().item(), poly_chain(torch.tensor([1.0], dtype=torch.float64),
                                                                 NS_SCHEDULES[sched][0]).item())
        log(f"  spec §9 check {sched}: p(sigma in [1e-3,1]) min {got[0]:.4f} max {got[1]:.4f}, p(1) {got[2]:.4f}")
        assert all(abs(g - w) < 6e-3 for g, w in zip(got, want)), (sched, got, want)
    save_st(tensors, out / "newton_schulz.safetensors", meta)
    return {"ns_vs_expected": report}


# ====================================================================================================
# 3. torch.optim.AdamW
# ====================================================================================================
def make_adamw(out: Path) -> dict:
    log("== adamw_torch.safetensors")
    gen = torch.Generator().manual_seed(SEED + 3)
    tensors: dict[str, torch.Tensor] = {}
    params, grads = [], {}
    for n, shape, std in ADAMW_PARAMS:
        init = std * torch.randn(shape, generator=gen, dtype=torch.float32)
        tensors[f"{n}.init"] = init
        params.append(torch.nn.Parameter(init.clone()))
        grads[n] = [torch.randn(shape, generator=gen, dtype=torch.float32) for _ in range(ADAMW_STEPS)]
    opt = torch.optim.AdamW(params, **ADAMW, foreach=False, fused=False)  # the single-tensor path
    lr, (b1, b2), eps, wd = ADAMW["lr"], ADAMW["betas"], ADAMW["eps"], ADAMW["weight_decay"]
    ref = {n: (tensors[f"{n}.init"].double(), torch.zeros(s, dtype=torch.float64), torch.zeros(s, dtype=torch.float64))
           for n, s, _ in ADAMW_PARAMS}
    worst, worst_abs = 0.0, 0.0
    for t in range(1, ADAMW_STEPS + 1):
        for (n, _, _), p in zip(ADAMW_PARAMS, params):
            p.grad = grads[n][t - 1].clone()
            tensors[f"{n}.grad.{t}"] = grads[n][t - 1]
        opt.step()
        for (n, _, _), p in zip(ADAMW_PARAMS, params):
            st = opt.state[p]
            tensors[f"{n}.after.{t}"] = p.detach().clone()
            tensors[f"{n}.exp_avg.{t}"] = st["exp_avg"].clone()
            tensors[f"{n}.exp_avg_sq.{t}"] = st["exp_avg_sq"].clone()
            # float64 restatement of torch/optim/adam.py:417-547 (decoupled wd, bias-corrected, eps outside sqrt)
            p64, m64, v64 = ref[n]
            g = grads[n][t - 1].double()
            p64 = p64 * (1 - lr * wd)
            m64 = m64 + (1 - b1) * (g - m64)
            v64 = b2 * v64 + (1 - b2) * g * g
            denom = v64.sqrt() / math.sqrt(1 - b2 ** t) + eps
            p64 = p64 - (lr / (1 - b1 ** t)) * m64 / denom
            ref[n] = (p64, m64, v64)
            d = (p.detach().double() - p64).abs().max().item()
            worst = max(worst, d / lr)
            worst_abs = max(worst_abs, d)
            assert torch.allclose(st["exp_avg"].double(), m64, rtol=1e-6, atol=1e-7)
            assert torch.allclose(st["exp_avg_sq"].double(), v64, rtol=1e-6, atol=1e-9)
    log(f"  torch AdamW (f32) vs float64 restatement: max|param diff| = {worst_abs:.3g} = {worst:.3g} x lr "
        f"(f32 rounding of O(1) params; a step moves each entry by about lr)")
    assert worst < 2e-3
    meta = {"lr": fstr(lr), "betas": json.dumps([b1, b2]), "eps": fstr(eps), "weight_decay": fstr(wd),
            "steps": str(ADAMW_STEPS), "step_index": "1-based", "foreach": "false", "fused": "false",
            "params": ",".join(f"{n}:{'x'.join(map(str, s))}" for n, s, _ in ADAMW_PARAMS)}
    save_st(tensors, out / "adamw_torch.safetensors", meta)
    return {"adamw_f32_vs_f64_over_lr": float(f"{worst:.4g}")}


# ====================================================================================================
# 4. QK-Clip
# ====================================================================================================
_HF_EAGER = hf_ds3.eager_attention_forward
_RECORD: dict = {"on": False, "max_logit": {}}


def _recording_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Same recorder as tools/make_reference.py: max over batch, i, j <= i of matmul(q, k^T) * scaling."""
    if _RECORD["on"]:
        with torch.no_grad():
            k = hf_ds3.repeat_kv(key, module.num_key_value_groups)
            s = torch.matmul(query, k.transpose(2, 3)) * scaling
            n_q, n_k = s.shape[-2:]
            causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
            s = s.masked_fill(~causal, float("-inf"))
            _RECORD["max_logit"][module.layer_idx] = s.amax(dim=(0, 2, 3)).clone()
    return _HF_EAGER(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)


hf_ds3.eager_attention_forward = _recording_eager


def max_logits(model, input_ids) -> dict[int, torch.Tensor]:
    model.eval()
    _RECORD["on"], _RECORD["max_logit"] = True, {}
    with torch.no_grad():
        model(input_ids=input_ids, use_cache=False)
    _RECORD["on"] = False
    return {i: v.float() for i, v in _RECORD["max_logit"].items()}


def clip_mla(w_qb, w_kvb, smax, tau, heads, nope, rope, v):
    """Algorithm 1 lines 9-16 for one MLA layer; float64 factors, one rounding to f32."""
    qb, kvb = w_qb.double().clone(), w_kvb.double().clone()
    gamma = torch.ones(heads, dtype=torch.float64)
    clipped = torch.zeros(heads, dtype=torch.int64)
    for h in range(heads):
        S = float(smax[h])
        if S > tau:
            g = tau / S
            gamma[h], clipped[h] = g, 1
            q0, k0 = h * (nope + rope), h * (nope + v)
            qb[q0:q0 + nope] *= math.sqrt(g)                 # W_qc (q_nope)
            qb[q0 + nope:q0 + nope + rope] *= g              # W_qr (q_rope)
            kvb[k0:k0 + nope] *= math.sqrt(g)                # W_kc (k_nope); v rows untouched
    return qb.float(), kvb.float(), gamma, clipped


def clip_mha(wq, wk, smax, tau, heads, hd, alpha):
    """Per-head MHA QK-Clip: q rows *= gamma^alpha, k rows *= gamma^(1-alpha), gamma = min(1, tau/S)."""
    q, k = wq.double().clone(), wk.double().clone()
    for h in range(heads):
        S = float(smax[h])
        if S > tau:  # S <= 0 never reaches the power (tau > 0): no NaN
            g = tau / S
            q[h * hd:(h + 1) * hd] *= g ** alpha
            k[h * hd:(h + 1) * hd] *= g ** (1 - alpha)
    return q.float(), k.float()


def make_qk_clip(out: Path) -> dict:
    log("== qk_clip.safetensors")
    cfg = json.loads((TINY_K2 / "config.json").read_text())
    heads, nope, rope, v = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                            cfg["v_head_dim"])
    L = cfg["num_hidden_layers"]
    weights = read_safetensors(TINY_K2 / "model.safetensors")
    ref = read_safetensors(TINY_K2 / "reference.safetensors")
    input_ids = ref["input_ids"]
    smax = {i: ref[f"max_logit.{i}"] for i in range(L)}
    allmax = torch.cat([smax[i] for i in range(L)])
    tau = torch.median(allmax).item()   # lower median of the 12 values: one head sits exactly at tau
    log(f"  tau = median of {allmax.numel()} head maxima = {tau!r}")

    model = DeepseekV3ForCausalLM.from_pretrained(str(TINY_K2), attn_implementation="eager",
                                                  experts_implementation="eager").to(torch.float32)
    base = max_logits(model, input_ids)
    for i in range(L):  # the recorder reproduces reference.safetensors (eval vs train mode: same numbers)
        assert torch.equal(base[i], smax[i]), (i, base[i], smax[i])

    tensors: dict[str, torch.Tensor] = {"tau": torch.tensor([tau], dtype=torch.float32)}
    clipped_w = {}
    for i in range(L):
        qn, kn = f"model.layers.{i}.self_attn.q_b_proj.weight", f"model.layers.{i}.self_attn.kv_b_proj.weight"
        qb, kvb, gamma, clipped = clip_mla(weights[qn], weights[kn], smax[i], tau, heads, nope, rope, v)
        assert qb.shape == (heads * (nope + rope), cfg["q_lora_rank"])
        assert kvb.shape == (heads * (nope + v), cfg["kv_lora_rank"])
        for h in range(heads):  # untouched rows stay bit-identical
            k0 = h * (nope + v)
            assert torch.equal(kvb[k0 + nope:k0 + nope + v], weights[kn][k0 + nope:k0 + nope + v])
            if not clipped[h]:
                q0 = h * (nope + rope)
                assert torch.equal(qb[q0:q0 + nope + rope], weights[qn][q0:q0 + nope + rope])
                assert torch.equal(kvb[k0:k0 + nope], weights[kn][k0:k0 + nope])
        tensors[qn], tensors[kn] = qb, kvb
        tensors[f"clipped.{i}"] = clipped
        tensors[f"gamma.{i}"] = gamma.float()
        tensors[f"max_logit.{i}"] = smax[i].clone()
        clipped_w[i] = (qn, qb, kn, kvb)
        log(f"  layer {i}: max_logit {[round(x, 4) for x in smax[i].tolist()]} -> clipped heads "
            f"{[h for h in range(heads) if clipped[h]]}, gamma {[round(x, 4) for x in gamma.tolist()]}")
    n_clip = sum(int(tensors[f"clipped.{i}"].sum()) for i in range(L))
    assert 0 < n_clip < heads * L

    def substitute(layers):
        m = DeepseekV3ForCausalLM.from_pretrained(str(TINY_K2), attn_implementation="eager",
                                                  experts_implementation="eager").to(torch.float32)
        sd = m.state_dict()
        with torch.no_grad():
            for i in layers:
                qn, qb, kn, kvb = clipped_w[i]
                sd[qn].copy_(qb)
                sd[kn].copy_(kvb)
        return m

    # (a) all layers clipped at once (what the optimizer step produces).  Layers > 0 then see different
    #     inputs, so only layer 0 is an exact gamma * S test; later layers are reported.
    after = max_logits(substitute(range(L)), input_ids)
    # (b) one layer clipped at a time: that layer sees exactly its original inputs -> exact gamma * S.
    isolated = {i: max_logits(substitute([i]), input_ids)[i] for i in range(L)}
    worst_iso, worst_all, over = 0.0, 0.0, []
    for i in range(L):
        tensors[f"max_logit_after.{i}"] = after[i]
        tensors[f"max_logit_after_isolated.{i}"] = isolated[i]
        for h in range(heads):
            if tensors[f"clipped.{i}"][h]:
                r_iso = isolated[i][h].item() / tau - 1.0
                worst_iso = max(worst_iso, abs(r_iso))
                r_all = after[i][h].item() / tau - 1.0
                worst_all = max(worst_all, r_all)
                if r_all > 1e-5:
                    over.append((i, h, after[i][h].item()))
            else:
                assert torch.equal(isolated[i][h], smax[i][h]), "unclipped head must be bit-identical"
        log(f"  layer {i}: max_logit after clip (all layers) {[round(x, 4) for x in after[i].tolist()]}, "
            f"(this layer only) {[round(x, 4) for x in isolated[i].tolist()]}")
    assert worst_iso < 1e-5, worst_iso
    assert torch.allclose(after[0], isolated[0], rtol=0, atol=0)
    log(f"  clipped heads, layer clipped alone: |S_after / tau - 1| <= {worst_iso:.2g} "
        f"(exact gamma*S up to f32 rounding)")
    log(f"  clipped heads, all layers clipped: max(S_after / tau - 1) = {worst_all:.3g}; heads above tau(+1e-5): "
        f"{over if over else 'none'}")

    # ---- MHA variant ----
    gen = torch.Generator().manual_seed(SEED + 4)
    H, hd, hid = MHA["heads"], MHA["head_dim"], MHA["hidden"]
    wq = MHA["weight_std"] * torch.randn(H * hd, hid, generator=gen, dtype=torch.float32)
    wk = MHA["weight_std"] * torch.randn(H * hd, hid, generator=gen, dtype=torch.float32)
    mha_max = torch.tensor(MHA_MAX_LOGIT, dtype=torch.float32)
    tensors.update({"mha.q_weight": wq, "mha.k_weight": wk, "mha.max_logit": mha_max,
                    "mha.tau": torch.tensor([MHA_TAU], dtype=torch.float32),
                    "mha.clipped": (mha_max > MHA_TAU).to(torch.int64)})
    x = torch.randn(2, 10, hid, generator=gen, dtype=torch.float64)

    def head_logits(q_w, k_w):
        q = (x @ q_w.double().T).view(2, 10, H, hd)
        k = (x @ k_w.double().T).view(2, 10, H, hd)
        return torch.einsum("bihd,bjhd->bhij", q, k)

    before = head_logits(wq, wk)
    for alpha in MHA_ALPHAS:
        qa, ka = clip_mha(wq, wk, mha_max, MHA_TAU, H, hd, alpha)
        assert torch.isfinite(qa).all() and torch.isfinite(ka).all()
        aft = head_logits(qa, ka)
        for h in range(H):
            rows = slice(h * hd, (h + 1) * hd)
            if MHA_MAX_LOGIT[h] > MHA_TAU:
                g = MHA_TAU / MHA_MAX_LOGIT[h]
                assert torch.allclose(aft[:, h], g * before[:, h], rtol=1e-6, atol=1e-6)  # logits scale by gamma
            else:
                assert torch.equal(qa[rows], wq[rows]) and torch.equal(ka[rows], wk[rows])
        tensors[f"mha.alpha{alpha}.q_after"] = qa
        tensors[f"mha.alpha{alpha}.k_after"] = ka
    log(f"  MHA: max_logit {MHA_MAX_LOGIT}, tau {MHA_TAU}: heads 0 and 3 clipped (gamma "
        f"{MHA_TAU / MHA_MAX_LOGIT[0]:.4g}, {MHA_TAU / MHA_MAX_LOGIT[3]:.4g}); head 1 (== tau) and head 2 (< 0) "
        f"untouched; alphas {MHA_ALPHAS}; q.k logits of clipped heads scale by gamma: yes")

    meta = {"source": "test/data/tiny_k2 model.safetensors + reference.safetensors (input_ids, max_logit.<layer>)",
            "tau": f"median (lower middle, torch.median) of all {allmax.numel()} head maxima = {tau!r}",
            "rule": "S > tau: gamma = tau/S; q_b_proj head rows [h*(nope+rope), +nope) *= sqrt(gamma), "
                    "[+nope, +rope) *= gamma; kv_b_proj rows [h*(nope+v), +nope) *= sqrt(gamma); v rows and "
                    "kv_a_proj_with_mqa untouched; factors in float64, weights rounded to f32 once",
            "layout": f"heads {heads}, nope {nope}, rope {rope}, v {v}",
            "max_logit_after": "recomputed with every layer clipped at once (later layers see changed inputs)",
            "max_logit_after_isolated": "recomputed with only that layer clipped (its inputs unchanged)",
            "mha.rule": "S > tau: gamma = tau/S; q rows of head h *= gamma^alpha, k rows *= gamma^(1-alpha); "
                        "S <= tau (incl. S <= 0) untouched",
            "mha.layout": f"heads {H}, head_dim {hd}, hidden {hid}; weights [heads*head_dim, hidden]"}
    save_st(tensors, out / "qk_clip.safetensors", meta)
    return {"qk_clip": {"tau": tau, "clipped_heads": n_clip, "isolated_rel_err": float(f"{worst_iso:.3g}"),
                        "all_layers_max_over_tau": float(f"{worst_all:.3g}")}}


# ====================================================================================================
def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_versions(d: Path, extra: dict) -> None:
    files = {p.name: sha256(p) for p in sorted(d.iterdir()) if p.is_file() and p.name != "versions.json"}
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "seed": SEED,
        "generator": "tools/make_optimizer_reference.py",
        "files_sha256": files,
    }
    info.update(extra)
    info = json.loads(json.dumps(info))  # normalise tuples etc. for the comparison below
    vpath = d / "versions.json"
    date = datetime.date.today().isoformat()
    if vpath.exists():  # keep the date if nothing else changed, so reruns are byte-identical
        old = json.loads(vpath.read_text())
        if {k: v for k, v in old.items() if k != "date"} == info:
            date = old.get("date", date)
    info["date"] = date
    vpath.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data" / "optim",
                    help="output directory (default test/data/optim)")
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    check_writer(out)
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"safetensors {safetensors.__version__}, seed {SEED}")
    extra = {}
    extra.update(make_muon(out))
    extra.update(make_newton_schulz(out))
    extra.update(make_adamw(out))
    extra.update(make_qk_clip(out))
    write_versions(out, {"checks": extra})

    log("== files")
    total = 0
    for p in sorted(out.iterdir()):
        if p.is_file():
            total += p.stat().st_size
            log(f"  {p.name}  {p.stat().st_size}")
    log(f"  total {total} bytes ({total / 2**20:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
