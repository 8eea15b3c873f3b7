#!/usr/bin/env python3
"""Generate the packed-batch and batched-decoding oracles under test/data/packed/ for moonmoe's C++ tests.

Loads the committed tiny checkpoints (test/data/tiny_k2, test/data/tiny_v3; made by tools/make_reference.py)
with Hugging Face's ``DeepseekV3ForCausalLM`` (float32, eager attention, eager experts) and runs several token
sequences of different lengths through it, each one alone, as transformers computes a single sequence. The C++
tests run the same sequences packed into one batch (``nn::TokenLayout::packed``) and compare.

    pip install -r tools/requirements.txt
    python tools/make_packed_reference.py            # writes test/data/packed/
    python tools/make_packed_reference.py --out DIR  # writes DIR/packed/ (e.g. to check determinism)

Files (all float32 unless noted; T = total tokens, rows in packed order: sequence 0's tokens, then sequence 1's):

``<model>.safetensors`` (tiny_k2, tiny_v3)
    input_ids [T] (int64), lengths [n] (int64)
    logits [T, vocab]             each sequence's logits, computed alone
    loss.per_sequence [n]         transformers' loss of each sequence alone (labels = input_ids: the mean over
                                  its length - 1 shifted targets); 0 for a one-token sequence, which has no target
    loss.sum [1]                  sum of loss.per_sequence
    loss.token_mean [1]           the mean over all T - n targets (float64 from the per-sequence losses): what a
                                  packed batch's train_step returns, and transformers' loss on the same batch packed
                                  with position_ids (DataCollatorWithFlattening)
    grad.<name>                   gradient of loss.sum with respect to every parameter (on-disk names)
    max_logit.<layer> [heads]     maximum over the sequences of the per-head maximum scaled q.k (QK-Clip's S_max)
    topk_idx.<layer> [T, k] (int64), topk_weight.<layer> [T, k]   router choices and weights per token

``generate_tiny_k2.safetensors``
    prompt_ids [P] (int64), prompt_lengths [n] (int64)
    generated_ids [n, NEW_TOKENS] (int64), step_logits [n, NEW_TOKENS, vocab]
    greedy decoding of each prompt alone with ``generate`` (KV cache on, no EOS stop)

Checks done here: the gradient of the sum equals the sum of each sequence's own gradient (accumulation), and
transformers run on the packed batch (one row, position_ids restarting at 0 per sequence: its block-diagonal
causal mask) gives the same logits as the sequences run alone.
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
from transformers import DeepseekV3ForCausalLM, GenerationConfig  # noqa: E402
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_ds3  # noqa: E402

transformers.utils.logging.disable_progress_bar()

SEED = 20250712
REPO = Path(__file__).resolve().parent.parent
# Lengths chosen to cover a one-token sequence, a long one beside short ones, and uneven order.
LENGTHS = {"tiny_k2": [6, 1, 11, 3], "tiny_v3": [4, 9, 1, 7, 2]}
PROMPT_LENGTHS = [5, 2, 8]
NEW_TOKENS = 6

# ----------------------------------------------------------------------------------------------
# Per-head max scaled logit, recorded from HF's own eager attention. DeepseekV3Attention.forward looks
# `eager_attention_forward` up as a module global at call time, so wrapping the global sees exactly the
# query / key (RoPE applied, nope | rope concatenated) and the scaling HF uses. One sequence per call here,
# so the allowed keys are the plain causal ones.
# ----------------------------------------------------------------------------------------------
_HF_EAGER = hf_ds3.eager_attention_forward
_RECORD: dict = {"on": False, "max_logit": {}}


def _recording_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    if _RECORD["on"]:
        with torch.no_grad():
            k = hf_ds3.repeat_kv(key, module.num_key_value_groups)
            s = torch.matmul(query, k.transpose(2, 3)) * scaling
            n_q, n_k = s.shape[-2:]
            causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
            s = s.masked_fill(~causal, float("-inf"))
            m = s.amax(dim=(0, 2, 3))
            prev = _RECORD["max_logit"].get(module.layer_idx)
            _RECORD["max_logit"][module.layer_idx] = m.clone() if prev is None else torch.maximum(prev, m)
    return _HF_EAGER(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)


hf_ds3.eager_attention_forward = _recording_eager


def log(msg: str = "") -> None:
    print(msg, flush=True)


def load(name: str) -> DeepseekV3ForCausalLM:
    m = DeepseekV3ForCausalLM.from_pretrained(str(REPO / "test" / "data" / name), attn_implementation="eager",
                                              experts_implementation="eager")
    return m.to(torch.float32)


def on_disk_grads(model: DeepseekV3ForCausalLM) -> dict[str, torch.Tensor]:
    """Every parameter gradient under its on-disk checkpoint name; transformers 5 keeps experts fused in memory
    (gate_up_proj [E, 2I, H] with gate rows first, down_proj [E, H, I]), checkpoints hold one tensor per expert."""
    out = {}
    for pname, p in model.named_parameters():
        g = p.grad.detach().to(torch.float32)
        if pname.endswith("mlp.experts.gate_up_proj"):
            prefix, inter = pname[: -len("gate_up_proj")], g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = g[e, :inter].contiguous().clone()
                out[f"{prefix}{e}.up_proj.weight"] = g[e, inter:].contiguous().clone()
        elif pname.endswith("mlp.experts.down_proj"):
            prefix = pname[: -len("down_proj")]
            for e in range(g.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = g[e].contiguous().clone()
        else:
            out[pname] = g.contiguous().clone()
    return out


def run_packed_reference(model: DeepseekV3ForCausalLM, lengths: list[int], gen: torch.Generator) -> dict:
    cfg = model.config
    vocab = cfg.vocab_size
    seqs = [torch.randint(0, vocab, (1, n), generator=gen, dtype=torch.int64) for n in lengths]
    router_out: dict[int, list] = {i: [] for i in range(cfg.first_k_dense_replace, cfg.num_hidden_layers)}
    hooks = [model.model.layers[i].mlp.gate.register_forward_hook(
        lambda m, inp, out, i=i: router_out[i].append(tuple(o.detach().clone() for o in out)))
        for i in router_out]

    model.train()  # gradients; dropout is 0 and the noaux_tc router has no training-only branch
    model.zero_grad(set_to_none=True)
    _RECORD["on"], _RECORD["max_logit"] = True, {}
    logits, losses, own_grads = [], [], []
    for ids in seqs:
        if ids.shape[1] > 1:
            out = model(input_ids=ids, labels=ids, use_cache=False)
            before = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
            out.loss.backward()  # accumulates: the gradient of the sum of the per-sequence losses
            own_grads.append({n: p.grad - before[n] for n, p in model.named_parameters()})
            lp = torch.log_softmax(out.logits.detach().double()[0, :-1], dim=-1)
            nll = -lp.gather(-1, ids[0, 1:, None]).mean()
            assert abs(nll.item() - out.loss.item()) < 1e-5, (nll.item(), out.loss.item())
            losses.append(out.loss.detach().float().reshape(()))
        else:  # no target: transformers' mean over zero targets is NaN, so the sequence adds nothing to the loss
            out = model(input_ids=ids, use_cache=False)
            losses.append(torch.zeros((), dtype=torch.float32))
        logits.append(out.logits.detach().float()[0])
    _RECORD["on"] = False
    for h in hooks:
        h.remove()

    # the accumulated gradient is the sum of each sequence's own gradient
    for n, p in model.named_parameters():
        own = sum(g[n] for g in own_grads)
        assert torch.allclose(p.grad, own, rtol=0, atol=1e-6 * max(1.0, own.abs().max().item())), n

    counts = torch.tensor([n - 1 for n in lengths], dtype=torch.float64)
    per_seq = torch.stack(losses)
    ref = {
        "input_ids": torch.cat([s[0] for s in seqs]),
        "lengths": torch.tensor(lengths, dtype=torch.int64),
        "logits": torch.cat(logits),
        "loss.per_sequence": per_seq,
        "loss.sum": per_seq.sum().reshape(1),
        "loss.token_mean": ((per_seq.double() * counts).sum() / counts.sum()).float().reshape(1),
    }
    for n, g in on_disk_grads(model).items():
        ref[f"grad.{n}"] = g
    for i in range(cfg.num_hidden_layers):
        ref[f"max_logit.{i}"] = _RECORD["max_logit"][i].float()
    for i, outs in router_out.items():
        assert len(outs) == len(lengths)
        ref[f"topk_idx.{i}"] = torch.cat([o[2] for o in outs]).to(torch.int64)
        ref[f"topk_weight.{i}"] = torch.cat([o[1] for o in outs]).float()
    return ref


def check_packed_hf(model: DeepseekV3ForCausalLM, ref: dict, name: str) -> None:
    """transformers itself on the packed batch: one row, position_ids restarting per sequence."""
    positions = torch.cat([torch.arange(n) for n in ref["lengths"].tolist()])[None]
    model.eval()
    with torch.no_grad():
        packed = model(input_ids=ref["input_ids"][None], position_ids=positions, use_cache=False).logits[0].float()
    diff = (packed - ref["logits"]).abs().max().item() / ref["logits"].abs().max().item()
    assert diff < 1e-5, diff
    log(f"  [{name}] transformers on the packed batch (position_ids restarting) vs per sequence: "
        f"max |diff| / max |logit| = {diff:.3g}")


def run_generate(model: DeepseekV3ForCausalLM, gen: torch.Generator) -> dict:
    model.eval()
    gcfg = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=0, eos_token_id=None,
                            pad_token_id=None, bos_token_id=0, use_cache=True, num_beams=1)
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # exactly NEW_TOKENS argmax tokens per prompt
    prompts, generated, step_logits = [], [], []
    try:
        for n in PROMPT_LENGTHS:
            prompt = torch.randint(2, model.config.vocab_size, (1, n), generator=gen, dtype=torch.int64)
            with torch.no_grad():
                out = model.generate(prompt, generation_config=gcfg, output_logits=True, return_dict_in_generate=True)
            seq, lg = out.sequences[0], torch.cat([x.float() for x in out.logits], dim=0)
            assert seq.shape == (n + NEW_TOKENS,) and torch.equal(lg.argmax(-1), seq[n:])
            prompts.append(prompt[0])
            generated.append(seq[n:])
            step_logits.append(lg)
            log(f"  [tiny_k2] generate: prompt {prompt[0].tolist()} -> {seq[n:].tolist()}")
    finally:
        model.generation_config.eos_token_id = saved_eos
    return {
        "prompt_ids": torch.cat(prompts), "prompt_lengths": torch.tensor(PROMPT_LENGTHS, dtype=torch.int64),
        "generated_ids": torch.stack(generated), "step_logits": torch.stack(step_logits).contiguous(),
    }


def save_st(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file({k: v.contiguous() for k, v in sorted(tensors.items())}, str(path), metadata={"format": "pt"})


def write_versions(d: Path) -> None:
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(d.iterdir()) if p.is_file() and p.name != "versions.json"}
    info = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "safetensors": safetensors.__version__, "seed": SEED, "generator": "tools/make_packed_reference.py",
        "lengths": LENGTHS, "prompt_lengths": PROMPT_LENGTHS, "new_tokens": NEW_TOKENS, "files_sha256": files,
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
    ap.add_argument("--out", type=Path, default=REPO / "test" / "data", help="writes OUT/packed/ (default test/data)")
    args = ap.parse_args()
    d = args.out / "packed"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    log(f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"seed {SEED}")
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for i, name in enumerate(LENGTHS):
        log(f"== {name}: sequences of {LENGTHS[name]} tokens")
        model = load(name)
        ref = run_packed_reference(model, LENGTHS[name], torch.Generator().manual_seed(SEED + i))
        check_packed_hf(model, ref, name)
        save_st(ref, d / f"{name}.safetensors")
        log(f"  [{name}] losses {[round(x, 6) for x in ref['loss.per_sequence'].tolist()]}, "
            f"sum {ref['loss.sum'].item():.6f}, token mean {ref['loss.token_mean'].item():.6f}")
        if name == "tiny_k2":
            save_st(run_generate(model, torch.Generator().manual_seed(SEED + 100)), d / "generate_tiny_k2.safetensors")
    write_versions(d)
    for p in sorted(d.iterdir()):
        log(f"  {p.relative_to(args.out)}  {p.stat().st_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
