#!/usr/bin/env python3
"""Measures which engine runs each kind of CPU matrix product fastest on this machine and prints the rules for
include/moonmoe/backend/cpu/gemm_engine.hpp (its header comment says what a rule is and how it is used).

    python3 tools/gemm_rules.py [--bench build/bench/bench_gemm] [--min-time 0.3] [--repetitions 2]

Runs the benchmark suite's Kimi K2 products (bench/gemm.cpp: the MLA projections at 1024 tokens, an expert's gate at
192, 96, 64 and 16 tokens, o_proj for one decoded token, the backward forms X W and dY^T X) with every engine forced in
turn (MOONMOE_F32_GEMM, MOONMOE_BF16_GEMM), at one and at two threads (MOONMOE_BENCH_THREADS), each row the best of
its repetitions. Rows are grouped by operand type, transposes and rows of op(A) (CLASSES: one, a decoded token;
tiny 2..16, sparse experts; few 17..64, busier experts up to the f32 few-rows kernel's limit; some 65..127, an
expert's share of a batch of thousands of tokens; more 128..255; many >= 256).
In a group, an engine replaces the default only where the geometric mean of its time over the default's, over the
group's rows at both thread counts, is at most 1 - MARGIN. f32 is decided first; the bf16 "widened" engine then runs
on the f32 engine chosen for its group. Neighbouring classes of one form that chose the same engine are written as one
rule over their rows. Prints a markdown table of the times and the C++ rules. Takes about 12 minutes on 2 cores; run
it on a quiet machine.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

MARGIN = 0.05
# classes of rows of op(A): (name, fewest, most) as the rules write them; rows between the classes keep the default
CLASSES = (("one", 1, 1), ("tiny", 2, 16), ("few", 17, 64), ("some", 65, 127), ("more", 128, 255), ("many", 256, None))
# the suite's Kimi K2 products that the rules are measured on: by form and by rows of op(A) (token counts)
PRODUCTS = r"(nn|nt|tn)/m:(1|16|64|96|192|1024|2048)/"
ROWS = rf"^gemm(_bf16)?/{PRODUCTS}n:[0-9]+/k:[0-9]+$"


def run(bench, env_extra, threads, min_time, reps, bf16):
    env = dict(os.environ, MOONMOE_BENCH_THREADS=str(threads), **env_extra)
    family = "gemm_bf16" if bf16 else "gemm"
    out = subprocess.run([bench, f"--benchmark_filter=^{family}/{PRODUCTS}",
                          f"--benchmark_min_time={min_time}", f"--benchmark_repetitions={reps}",
                          "--benchmark_format=json"], env=env, check=True, capture_output=True, text=True)
    data = json.loads(out.stdout)
    best = {}
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name = b["run_name"].removesuffix("/real_time")
        if not re.match(ROWS, name):
            continue
        best[name] = min(best.get(name, math.inf), b["real_time"])  # ms
    return best, data["context"]


def has_amx():
    """Whether this CPU has AMX-BF16 (then the bf16 "amx" engine is timed too; elsewhere it would run as "packed")."""
    try:
        with open("/proc/cpuinfo") as f:
            return re.search(r"\bamx_bf16\b", f.read()) is not None
    except OSError:
        return False


def group_of(name):
    _, form, m = re.match(r"^gemm(_bf16)?/(nn|nt|tn)/m:([0-9]+)/", name).groups()
    return form, next(c for c, lo, hi in CLASSES if int(m) >= lo and (hi is None or int(m) <= hi))


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def merged(choices):
    """The choices as runs of neighbouring classes (CLASSES' order) of one operand type and form on one engine."""
    order = [c for c, _, _ in CLASSES]
    key = lambda c: (c[0], c[1], order.index(c[2]))
    runs = []
    for c in sorted(choices, key=key):
        last = runs[-1][-1] if runs else None
        if last and last[:2] == c[:2] and last[3] == c[3] and order.index(last[2]) + 1 == order.index(c[2]):
            runs[-1].append(c)
        else:
            runs.append([c])
    return runs


def rule(cpu, run):
    """The C++ rule for one run of classes, with each class's ratio in its comment."""
    bf16, form, first, engine, _ = run[0]
    lo = next(lo for c, lo, _ in CLASSES if c == first)
    hi = next(hi or "max_rows" for c, _, hi in CLASSES if c == run[-1][2])
    ta = "Trans::yes" if form[0] == "t" else "Trans::no"
    tb = "Trans::yes" if form[1] == "t" else "Trans::no"
    ratios = ", ".join(f"{c[2]} {c[4]:.2f}x" for c in run)
    return (f'    {{"{cpu}", {"true" if bf16 else "false"}, {ta}, {tb}, {lo}, {hi}, GemmEngine::{engine}}},'
            f"  // the default's time: {ratios}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default="build/bench/bench_gemm")
    ap.add_argument("--min-time", default="0.3")
    ap.add_argument("--repetitions", type=int, default=2)
    a = ap.parse_args()
    if not os.access(a.bench, os.X_OK):
        sys.exit(f"gemm_rules.py: no benchmark binary {a.bench} (cmake --build build --target bench_gemm)")

    f32_engines = {"library": {"MOONMOE_F32_GEMM": "library"}, "onednn": {"MOONMOE_F32_GEMM": "onednn"},
                   "packed": {"MOONMOE_F32_GEMM": "packed"}}
    bf16_engines = {"onednn": {"MOONMOE_BF16_GEMM": "onednn"},
                    "library": {"MOONMOE_BF16_GEMM": "library", "MOONMOE_F32_GEMM": "library"},
                    "packed": {"MOONMOE_BF16_GEMM": "packed"},
                    **({"amx": {"MOONMOE_BF16_GEMM": "amx"}} if has_amx() else {}),
                    "widened/library": {"MOONMOE_BF16_GEMM": "f32", "MOONMOE_F32_GEMM": "library"},
                    "widened/onednn": {"MOONMOE_BF16_GEMM": "f32", "MOONMOE_F32_GEMM": "onednn"}}
    times = {}  # (bf16, engine, threads) -> {row: ms}
    context = {}
    for bf16, engines in ((False, f32_engines), (True, bf16_engines)):
        for engine, env in engines.items():
            for threads in (1, 2):
                print(f"gemm_rules.py: {'bf16' if bf16 else 'f32'} on {engine}, {threads} thread(s)", file=sys.stderr)
                times[bf16, engine, threads], context = run(a.bench, env, threads, a.min_time, a.repetitions, bf16)
    cpu = context.get("cpu", "?")

    choices, f32_choice = [], {}  # (bf16, form, class, engine, ratio) where an engine replaces the default
    print(f"CPU: {cpu}\n")
    print("| row | threads | " + " | ".join([f"f32 {e}" for e in f32_engines] + [f"bf16 {e}" for e in bf16_engines]) + " |")
    print("|---|---:|" + "---:|" * (len(f32_engines) + len(bf16_engines)))
    for bf16 in (False, True):
        engines = bf16_engines if bf16 else f32_engines
        rows = sorted(times[bf16, next(iter(engines)), 1])
        for row in rows:
            for threads in (1, 2):
                cells = [f"{times[bf16, e, threads][row]:.1f}" if not bf16 else "" for e in f32_engines]
                cells += [f"{times[bf16, e, threads][row]:.1f}" if bf16 else "" for e in bf16_engines]
                print(f"| {row} | {threads} | " + " | ".join(cells) + " |")
        groups = sorted({group_of(r) for r in rows})
        for form, size in groups:
            members = [r for r in rows if group_of(r) == (form, size)]
            default = "library" if not bf16 else "onednn"
            widened = "widened/" + f32_choice.get((form, size), "library")
            if widened not in bf16_engines:  # widened onto the packed kernel: the packed bf16 engine does it better
                widened = "widened/library"
            candidates = (["onednn", "packed"] if not bf16 else
                          (["library", "packed", widened] if size != "many" else ["packed", widened]) +
                          [e for e in ("amx",) if e in bf16_engines])
            best, best_ratio = default, 1.0
            for c in candidates:
                ratio = geomean([times[bf16, c, t][r] / times[bf16, default, t][r] for r in members for t in (1, 2)])
                print(f"{'bf16' if bf16 else 'f32'} {form} {size}: {c} / {default} = {ratio:.3f}", file=sys.stderr)
                if ratio <= 1 - MARGIN and ratio < best_ratio:
                    best, best_ratio = c, ratio
            if not bf16:
                f32_choice[form, size] = best
            if best != default:
                choices.append((bf16, form, size, best.split("/")[0], best_ratio))
    rules = [rule(cpu, run) for run in merged(choices)]
    print("\nRules for gemm_engine.hpp's measured_gemm_rules:")
    print("\n".join(rules) if rules else "    (none: the defaults won everywhere)")


if __name__ == "__main__":
    main()
