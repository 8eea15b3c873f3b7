#!/usr/bin/env python3
"""Generate the RL oracle under test/data/rl/ for moonmoe's C++ tests (include/moonmoe/rl/).

A PyTorch rendering of Kimi K2's policy objective (the K2 technical report, section 3.2.3, the K1.5 algorithm),
budget control's penalty and the PTX loss, on the committed tiny checkpoint test/data/tiny_k2 (made by
tools/make_reference.py) run by Hugging Face's ``DeepseekV3ForCausalLM`` (float32, eager attention, eager
experts):

    L = (1/P) sum_x (1/K_x) sum_i (r_i - rbar_x - tau (log pi_theta(y_i|x) - log pi_old(y_i|x)))^2
        + ptx_weight * (mean next-token cross-entropy of the PTX batch)

with r_i the reward minus ``BUDGET_PENALTY`` where the response was truncated at its budget, rbar_x the mean of
the group's (penalised) rewards, and log pi_theta(y|x) the sum over the response's tokens of log_softmax(logits)
of the model run on the (prompt, response) sequence, prompt tokens masked. Groups of different K, responses of
different lengths (one of a single token), old log-probabilities that differ from the current ones (so the tau
term is exercised), one truncated response.

    pip install -r tools/requirements.txt
    python tools/make_rl_reference.py            # writes test/data/rl/
    python tools/make_rl_reference.py --out DIR  # writes DIR/rl/ (e.g. to check determinism)

``tiny_k2.safetensors`` (float32 unless noted; samples in group order, each sequence = prompt then response):
    prompt_ids, response_ids (int64, concatenated), prompt_lengths, response_lengths (int64, per sample)
    group_sizes (int64, per prompt group), reward, old_logp, truncated (int64 0/1) per sample
    token_logp                 log pi_theta of each response token, concatenated in sample order
    seq_logp                   their per-sample sums (float64)
    ptx_ids (int64), ptx_lengths (int64)   the PTX batch, packed
    settings [3] (float64)     tau, budget penalty, PTX weight
    loss.rl, loss.ptx, loss.total [1] (float64)
    grad.<name>                gradient of loss.total with respect to every parameter (on-disk names)

Checks done here: the objective's gradient with respect to each sample's log pi_theta against the closed form;
with pi_old = pi_theta the RL loss equals the groups' reward variance.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
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
from safetensors.torch import save_file  # noqa: E402
from transformers import DeepseekV3ForCausalLM  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the tiny checkpoint's loading, gradients under on-disk names and file writing, as the packed oracle does them
from make_packed_reference import load, on_disk_grads, save_st  # noqa: E402

transformers.utils.logging.disable_progress_bar()

SEED = 20261127
REPO = Path(__file__).resolve().parent.parent
# (prompt length, [response lengths]) per group: K = 3 and K = 2, a one-token response, uneven lengths.
GROUPS = [(4, [5, 1, 7]), (6, [3, 4])]
REWARDS = [[1.0, 0.0, 0.5], [0.25, -1.0]]
TRUNCATED = [[False, False, True], [False, False]]
OLD_LOGP_OFFSETS = [[0.3, -0.2, 0.1], [-0.4, 0.25]]  # log pi_old = log pi_theta + offset: the ratio is not 1
TAU, BUDGET_PENALTY, PTX_WEIGHT = 0.5, 0.3, 0.25
PTX_LENGTHS = [5, 3]


def log(msg: str = "") -> None:
    print(msg, flush=True)


def response_logp(model, prompt: torch.Tensor, response: torch.Tensor) -> torch.Tensor:
    """log pi_theta of each response token: the model on prompt + response, log_softmax in float64."""
    ids = torch.cat([prompt, response])[None]
    logits = model(input_ids=ids, use_cache=False).logits[0]
    lp = torch.log_softmax(logits.double(), dim=-1)
    p = prompt.shape[0]
    return lp[p - 1: ids.shape[1] - 1].gather(-1, response[:, None])[:, 0]


def k15_loss(seq_logp: list[torch.Tensor], old: list[list[float]], rewards: list[list[float]]) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float64)
    i = 0
    for g, rs in enumerate(rewards):
        r = torch.tensor(rs, dtype=torch.float64)
        rbar = r.mean()
        lx = torch.zeros((), dtype=torch.float64)
        for k in range(len(rs)):
            a = r[k] - rbar - TAU * (seq_logp[i] - old[g][k])
            lx = lx + a * a
            i += 1
        total = total + lx / len(rs)
    return total / len(rewards)


def run(model: DeepseekV3ForCausalLM, gen: torch.Generator) -> dict:
    vocab = model.config.vocab_size
    model.train()  # gradients; dropout is 0 and the noaux_tc router has no training-only branch
    model.zero_grad(set_to_none=True)
    prompts, responses = [], []
    for plen, rlens in GROUPS:
        prompt = torch.randint(0, vocab, (plen,), generator=gen, dtype=torch.int64)
        for n in rlens:
            prompts.append(prompt)
            responses.append(torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64))
    rewards = [[r - (BUDGET_PENALTY if t else 0.0) for r, t in zip(rs, ts)] for rs, ts in zip(REWARDS, TRUNCATED)]

    token_logp = [response_logp(model, p, r) for p, r in zip(prompts, responses)]
    seq_logp = [t.sum() for t in token_logp]
    flat = [s.item() for s in seq_logp]
    old, i = [], 0
    for offsets in OLD_LOGP_OFFSETS:
        old.append([flat[i + k] + offsets[k] for k in range(len(offsets))])
        i += len(offsets)

    # checks of the closed forms on detached log-probabilities
    x = torch.tensor(flat, dtype=torch.float64, requires_grad=True)
    loss_x = k15_loss(list(x), old, rewards)
    loss_x.backward()
    i, P = 0, len(rewards)
    for g, rs in enumerate(rewards):
        rbar, K = sum(rs) / len(rs), len(rs)
        for k in range(K):
            a = rs[k] - rbar - TAU * (flat[i] - old[g][k])
            assert abs(x.grad[i].item() - (-2.0 * TAU * a / (K * P))) < 1e-12
            i += 1
    starts = [sum(len(r) for _, r in GROUPS[:g]) for g in range(len(GROUPS))]
    on_policy = k15_loss(list(torch.tensor(flat, dtype=torch.float64)),
                         [flat[s: s + len(r)] for s, (_, r) in zip(starts, GROUPS)], rewards)
    variance = sum(torch.tensor(rs, dtype=torch.float64).var(unbiased=False).item() for rs in rewards) / P
    assert abs(on_policy.item() - variance) < 1e-12

    rl = k15_loss(seq_logp, old, rewards)
    ptx = [torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64) for n in PTX_LENGTHS]
    nll_sum, count = torch.zeros((), dtype=torch.float64), 0
    for seq in ptx:
        logits = model(input_ids=seq[None], use_cache=False).logits[0]
        lp = torch.log_softmax(logits.double(), dim=-1)
        nll_sum = nll_sum - lp[:-1].gather(-1, seq[1:, None]).sum()
        count += seq.shape[0] - 1
    ptx_loss = nll_sum / count
    total = rl + PTX_WEIGHT * ptx_loss
    total.backward()
    log(f"  rl {rl.item():.9f}, ptx {ptx_loss.item():.9f}, total {total.item():.9f}")
    log(f"  log pi_theta per sample {[round(v, 6) for v in flat]}")

    ref = {
        "prompt_ids": torch.cat([p for p in prompts]),
        "response_ids": torch.cat(responses),
        "prompt_lengths": torch.tensor([p.shape[0] for p in prompts], dtype=torch.int64),
        "response_lengths": torch.tensor([r.shape[0] for r in responses], dtype=torch.int64),
        "group_sizes": torch.tensor([len(r) for _, r in GROUPS], dtype=torch.int64),
        "reward": torch.tensor([r for rs in REWARDS for r in rs], dtype=torch.float32),
        "old_logp": torch.tensor([v for row in old for v in row], dtype=torch.float64),
        "truncated": torch.tensor([int(t) for ts in TRUNCATED for t in ts], dtype=torch.int64),
        "token_logp": torch.cat([t.detach() for t in token_logp]).float(),
        "seq_logp": torch.tensor(flat, dtype=torch.float64),
        "ptx_ids": torch.cat(ptx),
        "ptx_lengths": torch.tensor(PTX_LENGTHS, dtype=torch.int64),
        "settings": torch.tensor([TAU, BUDGET_PENALTY, PTX_WEIGHT], dtype=torch.float64),
        "loss.rl": rl.detach().reshape(1),
        "loss.ptx": ptx_loss.detach().reshape(1),
        "loss.total": total.detach().reshape(1),
    }
    for n, g in on_disk_grads(model).items():
        ref[f"grad.{n}"] = g
    return ref


def write_versions(d: Path) -> None:
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(d.iterdir()) if p.is_file() and p.name != "versions.json"}
    info = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "safetensors": safetensors.__version__, "seed": SEED, "generator": "tools/make_rl_reference.py",
        "groups": GROUPS, "files_sha256": files,
    }
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
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data", help="writes OUT/rl/ (default test/data)")
    args = ap.parse_args()
    d = args.out / "rl"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"seed {SEED}")
    versions = (d / "versions.json").read_text() if (d / "versions.json").exists() else None
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    if versions:
        (d / "versions.json").write_text(versions)
    log("== tiny_k2: K1.5 objective, budget penalty, PTX loss")
    save_st(run(load("tiny_k2"), torch.Generator().manual_seed(SEED)), d / "tiny_k2.safetensors")
    write_versions(d)
    for p in sorted(d.iterdir()):
        log(f"  {p.relative_to(args.out)}  {p.stat().st_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
