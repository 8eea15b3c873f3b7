#!/usr/bin/env python3
"""Check that transformers loads a checkpoint moonmoe saved, and record its logits as a golden.

test/data/saved_tiny/checkpoint is written by moonmoe's own save_transformer (a TinyK2 from
nn::init_weights with a fixed seed, sharded into three safetensors files with an index; see
test/unit/io_save.cpp, whose first test also checks that the writer still produces these bytes).
This script loads it with ``DeepseekV3ForCausalLM.from_pretrained`` (float32, eager attention),
refuses any missing, unexpected or mismatched tensor, runs fixed token ids and writes

    test/data/saved_tiny/reference.safetensors   input_ids [2, 12] (I64), logits [2, 12, 256] (F32)
    test/data/saved_tiny/versions.json           library versions and file hashes

Regenerate (after a deliberate change of the checkpoint format or the initialiser):

    MOONMOE_SAVE_TINY_TO=test/data/saved_tiny/checkpoint build/test/moonmoe_unit_tests -tc="*saved_tiny*"
    pip install -r tools/requirements.txt && python tools/make_saved_reference.py

test/data/saved_parallel is the same model saved by a Parallel<2, 2, 2> run on 8 processes with
parallel::save_checkpoint (four shards written by the ranks that own the tensors; test/mpi/checkpoint.cpp):

    MOONMOE_SAVE_PARALLEL_TO=test/data/saved_parallel mpirun -np 8 build/test/moonmoe_mpi_tests -tc="*saved_parallel*"
    python tools/make_saved_reference.py --data test/data/saved_parallel

--compare A B loads two checkpoints the same way and prints how far apart transformers' logits on them are (the
largest difference over the largest logit of B), failing above 1e-5; nothing is written. test/mpi/checkpoint.cpp
writes a trained Parallel<2, 2, 2> run's checkpoint and the one process's beside it for this:

    MOONMOE_TRAINED_CHECKPOINTS_TO=/tmp/trained mpirun -np 8 build/test/moonmoe_mpi_tests -tc="*saves one checkpoint*"
    python tools/make_saved_reference.py --compare /tmp/trained/parallel_2_2_2 /tmp/trained/one_process

Deterministic: single-threaded CPU math on fixed inputs; versions.json keeps its date when nothing
else changed.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import safetensors  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import DeepseekV3ForCausalLM  # noqa: E402

transformers.utils.logging.disable_progress_bar()

REPO = Path(__file__).resolve().parent.parent
# Two sequences of 12 tokens: spread over the vocabulary, with repeats so attention has something to find.
INPUT_IDS = [[0, 17, 34, 255, 128, 17, 34, 99, 3, 200, 17, 34],
             [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233]]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(checkpoint: Path) -> DeepseekV3ForCausalLM:
    model, info = DeepseekV3ForCausalLM.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:  # a tensor transformers did not find, did not expect, or found with another shape
        raise SystemExit(f"{checkpoint}: transformers did not load every tensor as saved: {problems}")
    return model.eval()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=REPO / "test" / "data" / "saved_tiny",
                    help="directory holding checkpoint/ (default test/data/saved_tiny); outputs go there")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"),
                    help="compare transformers' logits on checkpoints A and B instead (writes nothing)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.compare:
        ids = torch.tensor(INPUT_IDS, dtype=torch.int64)
        with torch.no_grad():
            a, b = (load(c)(input_ids=ids, use_cache=False).logits.float() for c in args.compare)
        error = (a - b).abs().max().item() / b.abs().max().item()
        print(f"transformers' logits on {args.compare[0]} against {args.compare[1]}: {error:.3g} of the largest "
              f"logit ({'within' if error <= 1e-5 else 'beyond'} 1e-5)")
        return 0 if error <= 1e-5 else 1
    checkpoint = args.data / "checkpoint"
    model = load(checkpoint)

    ids = torch.tensor(INPUT_IDS, dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
    save_file({"input_ids": ids, "logits": logits.contiguous()}, str(args.data / "reference.safetensors"),
              metadata={"format": "pt"})

    # What the golden is sensitive to: the logits move well beyond the tests' tolerance (1e-5 of the largest
    # logit) when transformers reads the RoPE layout the other way, so a wrong rope field would be caught.
    scale = logits.abs().max().item()
    model.config.rope_interleave = not model.config.rope_interleave
    for layer in model.model.layers:
        layer.self_attn.config.rope_interleave = model.config.rope_interleave
    with torch.no_grad():
        flipped = model(input_ids=ids, use_cache=False).logits.float()
    rope_sensitivity = (flipped - logits).abs().max().item() / scale
    print(f"logits: max |logit| {scale:.4g}; with rope_interleave flipped they move by {rope_sensitivity:.3g} "
          f"of that")

    info = {
        "generator": "tools/make_saved_reference.py",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "rope_interleave_flip_changes_logits_by": float(f"{rope_sensitivity:.3g}"),
        "files_sha256": {str(p.relative_to(args.data)): sha256(p)
                         for p in sorted(args.data.rglob("*")) if p.is_file() and p.name != "versions.json"},
    }
    vpath = args.data / "versions.json"
    date = datetime.date.today().isoformat()
    if vpath.exists():  # keep the date if nothing else changed, so reruns are byte-identical
        old = json.loads(vpath.read_text())
        if {k: v for k, v in old.items() if k != "date"} == info:
            date = old.get("date", date)
    info["date"] = date
    vpath.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.data / 'reference.safetensors'} and {vpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
