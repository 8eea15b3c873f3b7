#!/usr/bin/env python3
"""Our Google Benchmark results next to PyTorch's (bench/SUITE.md), as a markdown table.

    python3 bench/compare.py [--ours bench/results/moonmoe.json ...] [--torch bench/results/torch.json]
                             [--run-torch] [--quick] [--threads N] [--markdown PATH] [--one-thread FILE ...]

--ours: Google Benchmark JSON (--benchmark_out_format=json); a file may hold one such dict or a list of them, and
several files may be given: their "benchmarks" lists are concatenated. Aggregate rows are ignored, a trailing
"/real_time" is stripped. The PyTorch JSON comes from bench/torch_suite.py, which is run first when the file is
missing or --run-torch is given (with --quick, and --threads or else ours' thread count).

Ratio column: PyTorch time / ours, so > 1 means ours is faster.

Target column: the CPU goals of issue 28 for Kimi K2's rows (the small shapes and the SGEMM reference have none),
each a ratio within one run: every K2 product at least as fast as PyTorch's (`gemm/...` against its f32 matmul,
`gemm_bf16/...` against its bf16 matmul), our bf16 decode step of one sequence (`mla/decode_step_bf16/k2/sequences:1/...`,
bf16 weights and latent cache, as the issue asks decoding to run) 1.5x PyTorch's decode row (`mla/decode/k2/...`,
which has no bf16 step of its own) and 70 % of the copy bandwidth its binary measured (`of_copy`), the Muon step with bf16 Newton-Schulz (`muon_bf16/...`) 1.2x
torch.optim.Muon. A row short of its goal reads "**below**" and is listed under the table. A K2 row that streams
memory (its `of_read`, bytes per second over the rate at which its binary read as many bytes, at least 0.5) says how
close it reads to that rate, and for a product PyTorch's rate on the same bytes beside it: where both are near 1, the
memory, not the code, sets the row's time. With --one-thread FILE (ours again at 1 thread), a column gives each row's two-thread speed-up
(its 1-thread time / this time; goal 1.8 on K2 rows, meaningful on a quiet machine only). A K2 row below that goal
that reads at least READ_BOUND of the read rate at two threads also gives the memory's own speed-up in the two runs,
the rate at which two threads read as many bytes over one thread's (from both runs' `of_read`: t1 of_read1 /
t2 of_read2): a row at the read rate on both thread counts speeds up by that much and no more.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
SGEMM_NAME = "gemm/nn/m:2048/n:2048/k:2048"


# Issue 28's goals (module docstring): (name pattern, PyTorch / ours at least, the goal in words).
CPU_TARGETS = [
    (re.compile(r"^gemm_bf16/"), 1.0, "PyTorch's bf16 matmul"),
    (re.compile(r"^gemm/"), 1.0, "PyTorch's f32 matmul"),
    (re.compile(r"^mla/decode_step_bf16/k2/sequences:1/"), 1.5, "1.5x PyTorch's decode"),
    (re.compile(r"^muon_bf16/step/"), 1.2, "1.2x torch.optim.Muon"),
]
# The suite's small shapes (bench/SUITE.md, "Shapes"): what CI runs, not K2's.
SMALL_SHAPES = re.compile(r"/small/|m:256/n:256/k:256|n:256/k:256|tokens:64/|rows:256/cols:512|numel:131072")
TWO_THREAD_GOAL = 1.8
DECODE_STEP = re.compile(r"^mla/decode_step_bf16/k2/sequences:1/")  # the decode rows with issue 28's goals
DECODE_COPY_GOAL = 0.70  # the decode row's bytes per second over the same run's copy bandwidth (`of_copy`)
READ_NOTE = 0.5  # rows reading at least this fraction of the read rate for their bytes (`of_read`) say so in notes
READ_BOUND = 0.9  # a row reading at least this fraction at two threads is bound by the memory (module docstring)


def k2_row(name: str) -> bool:
    """A row at Kimi K2's sizes: not a small shape, not the SGEMM reference."""
    return not SMALL_SHAPES.search(name) and name != SGEMM_NAME


def cpu_target(name: str) -> tuple[float, str] | None:
    """(goal, words) of a K2 row with one of issue 28's goals, else None."""
    if not k2_row(name):
        return None
    for pattern, goal, words in CPU_TARGETS:
        if pattern.search(name):
            return goal, words
    return None


def sig3(x: float) -> str:
    """3 significant figures, no exponent: 0.0123, 1.23, 12.3, 123, 1230."""
    if x is None or not math.isfinite(x):
        return "—"
    if x == 0:
        return "0"
    digits = 2 - math.floor(math.log10(abs(x)))
    if digits <= 0:
        return f"{round(x, digits):.0f}"
    return f"{x:.{digits}f}"


def strip_name(name: str) -> str:
    return name[: -len("/real_time")] if name.endswith("/real_time") else name


def load_ours(paths: list[str]) -> tuple[dict, list[dict]]:
    """(merged context, rows in file order); repeated names (repetitions) are averaged into one row."""
    context: dict = {}
    rows: dict[str, dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        for doc in data if isinstance(data, list) else [data]:
            for k, v in doc.get("context", {}).items():
                context.setdefault(k, v)
            for b in doc.get("benchmarks", []):
                if b.get("run_type") == "aggregate":
                    continue
                name = strip_name(b.get("run_name") or b["name"])
                ms = float(b["real_time"]) * UNIT_MS[b.get("time_unit", "ns")] if "real_time" in b else math.nan
                row = rows.setdefault(name, dict(name=name, times=[], raw=b))
                if b.get("error_occurred"):
                    row["error"] = b.get("error_message", "error")
                else:
                    row["times"].append(ms)
    for row in rows.values():
        row["ms"] = sum(row["times"]) / len(row["times"]) if row["times"] else math.nan
    return context, list(rows.values())


def load_torch(path: Path) -> tuple[dict, dict[tuple[str, str], dict]]:
    data = json.loads(path.read_text())
    return data.get("context", {}), {(b["name"], b.get("variant", "f32")): b for b in data.get("benchmarks", [])}


def counter(row: dict, key: str):
    v = row["raw"].get(key)
    return float(v) if isinstance(v, (int, float)) else None


def sgemm_rate(context: dict, rows: list[dict]) -> tuple[float | None, str]:
    """Our SGEMM rate in GFLOP/s: each binary measures its own at start-up (the per-row `sgemm_FLOP/s` counter, the
    denominator of that row's of_sgemm); reported as the range over the binaries. Older files: the `sgemm_GFLOP/s`
    context entry, else the gemm/nn 2048^3 row."""
    per_row = sorted({round(counter(r, "sgemm_FLOP/s") * 1e-9, 1) for r in rows if counter(r, "sgemm_FLOP/s")})
    if per_row:
        spread = f"{sig3(per_row[0])}-{sig3(per_row[-1])} over the binaries, " if len(per_row) > 1 else ""
        return per_row[-1], (f"highest; {spread}each measured by its binary at start-up (2048^3, best of 10) and "
                             f"used for that binary's % of SGEMM")
    v = context.get("sgemm_GFLOP/s")
    if v is not None:
        try:
            return float(v), "measured by our binaries at start-up"
        except ValueError:
            pass
    for r in rows:
        if r["name"] == SGEMM_NAME and counter(r, "FLOP/s"):
            return counter(r, "FLOP/s") * 1e-9, f"from {SGEMM_NAME}"
    return None, ""


def peak_column(ours_row: dict, torch_row: dict | None) -> str:
    """Layer-family rows: ours' peak of live tensor memory in the loop (allocator counter, weights included), ours'
    family process peak RSS (run_suite.sh), and the PyTorch family process's peak RSS (which also holds Python,
    torch and transformers, ~550 MiB)."""
    if ours_row["name"].split("/")[0] not in ("mla", "moe", "layer"):
        return ""
    fmt = lambda v: "—" if v is None else f"{v:.0f}"
    return " / ".join([fmt(counter(ours_row, "peak_MiB")), fmt(counter(ours_row, "process_peak_rss_MiB")),
                       fmt((torch_row or {}).get("peak_rss_MiB_family"))])


def torch_counterpart(name: str) -> tuple[str, str]:
    """The PyTorch row (name, variant) a name is compared with: ns/<policy>/symmetric/... -> the general algorithm of
    that shape; gemm_bf16/... and muon_bf16/... -> torch's gemm/... with bfloat16 operands and muon/... with its
    default bfloat16 Newton-Schulz; layer_bf16/... -> torch's layer/... under bfloat16 autocast; our bf16 decode step
    of one sequence -> torch's (f32) decode row at that cache."""
    parts = name.split("/")
    if parts[0] == "ns" and len(parts) > 2 and parts[2] == "symmetric":
        parts[2] = "general"
    if parts[0] in ("gemm_bf16", "muon_bf16"):
        return "/".join([parts[0][: -len("_bf16")]] + parts[1:]), "bf16"
    if parts[0] == "layer_bf16":
        return "/".join(["layer"] + parts[1:]), "autocast"
    if name.startswith("mla/decode_step_bf16/k2/sequences:1/"):  # one sequence: PyTorch's decode row of that cache
        return "mla/decode/k2/" + parts[-1], "f32"
    return "/".join(parts), "f32"


def ratio(torch_ms, ours_ms) -> str:
    if torch_ms is None or not ours_ms or not math.isfinite(ours_ms):
        return "—"
    return f"{torch_ms / ours_ms:.2f}"


def build_table(ours_ctx: dict, ours: list[dict], torch_ctx: dict | None, torch: dict,
                one_thread: dict[str, tuple[float, float | None]] | None = None) -> str:
    rate, rate_source = sgemm_rate(ours_ctx, ours)
    lines = []
    cpu = torch_ctx.get("cpu") if torch_ctx else None
    host = ", ".join(x for x in [
        f"host {ours_ctx['host_name']}" if ours_ctx.get("host_name") else "",
        f"{ours_ctx['num_cpus']} CPUs" if ours_ctx.get("num_cpus") else "",
        f"{ours_ctx['mhz_per_cpu']} MHz" if ours_ctx.get("mhz_per_cpu") else ""] if x)
    lines.append(f"- CPU: {cpu or 'unknown'}{f' ({host})' if host else ''}")
    ours_threads, torch_threads = ours_ctx.get("threads"), (torch_ctx or {}).get("threads")
    warn = ""
    if ours_threads is not None and torch_threads is not None and str(ours_threads) != str(torch_threads):
        warn = " — **thread counts differ**"
    lines.append(f"- threads: ours {ours_threads if ours_threads is not None else '?'}, "
                 f"PyTorch {torch_threads if torch_threads is not None else '?'}{warn}")
    lines.append(f"- ours: moonmoe built {ours_ctx.get('moonmoe_build', '?')}, run {ours_ctx.get('date', '?')}")
    if torch_ctx:
        lines.append(f"- PyTorch {torch_ctx.get('torch', '?')}, transformers {torch_ctx.get('transformers', '?')}, "
                     f"run {torch_ctx.get('date', '?')}{', --quick' if torch_ctx.get('quick') else ''}")
    else:
        lines.append("- PyTorch: no results")
    lines.append(f"- SGEMM: {sig3(rate) + ' GFLOP/s (' + rate_source + ')' if rate else 'not measured'}")
    if bf16_rate := ours_ctx.get("bf16_gemm_GFLOP/s"):
        lines.append(f"- bf16 GEMM (the CPU's own bf16 peak for the `_bf16` rows' notes): {bf16_rate} GFLOP/s, "
                     f"{ours_ctx.get('bf16_gemm_size', '?')}^3, {ours_ctx.get('bf16_gemm_path', '?')}")
    lines.append("")
    scaling = one_thread is not None
    lines.append("| benchmark | ours ms | PyTorch ms | PyTorch / ours | target | ours GFLOP/s | ours % of SGEMM "
                 + ("| 1 thread / this | " if scaling else "| ")
                 + "peak MiB: ours tensors / ours RSS / PyTorch RSS | notes |")
    lines.append("|---|---:|---:|---:|---|---:|---:|" + ("---:|" if scaling else "") + "---:|---|")
    below: list[str] = []
    for r in ours:
        name, ms = r["name"], r["ms"]
        family = name.split("/")[0]
        key, variant = torch_counterpart(name)
        t = torch.get((key, variant))
        t_ms = t["real_time_ms"] if t else None
        notes = []
        if "error" in r:
            notes.append(f"ours: {r['error']}")
        if len(r["times"]) > 1:
            notes.append(f"ours mean of {len(r['times'])} runs")
        if family == "ns" and key != name and t:
            notes.append(f"vs PyTorch {key.split('/')[2]}")
        if variant == "bf16" and t:
            notes.append("vs PyTorch bf16")
        if family == "mla" and key != name and t:
            notes.append(f"vs PyTorch's `{key}` (f32)")
        if family == "muon" and variant == "f32":
            t16 = torch.get((key, "bf16"))
            if t16:
                notes.append(f"torch bf16 {sig3(t16['real_time_ms'])} ms ({ratio(t16['real_time_ms'], ms)}x)")
        if family == "adamw":
            tf = torch.get((key, "fused"))
            if tf:
                notes.append(f"torch fused {sig3(tf['real_time_ms'])} ms ({ratio(tf['real_time_ms'], ms)}x)")
        if family.endswith("_bf16") and (of_bf16 := counter(r, "of_bf16_gemm")) is not None:
            notes.append(f"{of_bf16 * 100:.0f}% of the bf16 GEMM")
        if family in ("muon", "muon_bf16") and (first := counter(r, "first_call_ms")) is not None:
            notes.append(f"first call {sig3(first)} ms")
        if family in ("moe", "layer"):
            ours_pairs, torch_pairs = counter(r, "pairs"), (t or {}).get("pairs")
            if ours_pairs is not None or torch_pairs is not None:
                fmt = lambda p: "?" if p is None else f"{p:.0f}"
                notes.append(f"pairs ours {fmt(ours_pairs)} / torch {fmt(torch_pairs)}")
            overhead = counter(r, "overhead")
            if overhead is not None:
                notes.append(f"overhead {overhead * 100:.1f}%" if overhead <= 1.0 else f"overhead {sig3(overhead)}")
        if (of_read := counter(r, "of_read")) is not None and of_read >= READ_NOTE and k2_row(name):
            # a row that streams memory: how close it reads to the machine's rate for as many bytes, and PyTorch's
            # same product (the same bytes) beside it
            same_bytes = family in ("gemm", "gemm_bf16") and t_ms
            notes.append(f"reads at {of_read:.2f} of the read rate"
                         + (f" (PyTorch {of_read * ms / t_ms:.2f})" if same_bytes else ""))
        flops = counter(r, "FLOP/s")
        of_sgemm = counter(r, "of_sgemm")
        target = ""
        if goal := cpu_target(name):
            got = t_ms / ms if t_ms is not None and ms and math.isfinite(ms) else None
            if got is None:
                target = f">= {goal[0]:g}: not measured"
                below.append(f"`{name}`: no PyTorch row to compare with {goal[1]}")
            elif got < goal[0]:
                target = f">= {goal[0]:g}: **below**"
                below.append(f"`{name}`: {got:.2f}x, goal {goal[0]:g} ({goal[1]})")
            else:
                target = f">= {goal[0]:g}: met"
        of_copy = counter(r, "of_copy")
        if k2_row(name) and DECODE_STEP.search(name) and of_copy is not None:
            met = of_copy >= DECODE_COPY_GOAL
            target += f"{'; ' if target else ''}{of_copy:.2f} of copy: {'met' if met else '**below**'}"
            if not met:
                below.append(f"`{name}`: {of_copy:.2f} of the copy bandwidth (goal {DECODE_COPY_GOAL:g})")
        cells = [f"`{name}`", sig3(ms), sig3(t_ms) if t_ms is not None else "—", ratio(t_ms, ms), target,
                 sig3(flops * 1e-9) if flops else "—", f"{of_sgemm * 100:.1f}%" if of_sgemm is not None else "—"]
        if scaling:
            one, one_read = one_thread.get(name, (None, None))
            speedup = one / ms if one and ms and math.isfinite(ms) else None
            cell = f"{speedup:.2f}" if speedup else "—"
            if speedup and k2_row(name) and speedup < TWO_THREAD_GOAL:
                cell += " **below**"
                why = f"`{name}`: two threads {speedup:.2f}x one thread (goal {TWO_THREAD_GOAL:g})"
                if of_read is not None and of_read >= READ_BOUND and one_read:
                    memory = one * one_read / (ms * of_read)  # two threads' read rate over one thread's
                    cell += f" (memory {memory:.2f})"
                    why += (f"; it reads at {of_read:.2f} of the read rate, and two threads read {memory:.2f}x one "
                            "thread's rate in these runs")
                below.append(why)
            cells.append(cell)
        cells += [peak_column(r, t), "; ".join(notes)]
        lines.append("| " + " | ".join(cells) + " |")
    if below:
        lines.append("")
        lines.append(f"Below issue 28's targets ({len(below)}):")
        lines.extend(f"- {b}" for b in below)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", nargs="+", default=[str(HERE / "results" / "moonmoe.json")],
                    help="Google Benchmark JSON file(s)")
    ap.add_argument("--torch", default=str(HERE / "results" / "torch.json"))
    ap.add_argument("--run-torch", action="store_true", help="run bench/torch_suite.py first")
    ap.add_argument("--quick", action="store_true", help="when running torch_suite.py: only the small shapes")
    ap.add_argument("--threads", type=int, help="when running torch_suite.py (default: ours' thread count)")
    ap.add_argument("--markdown", help="also write the table to this file")
    ap.add_argument("--one-thread", nargs="+", metavar="FILE",
                    help="ours' results of the same rows at 1 thread: adds each row's two-thread speed-up")
    args = ap.parse_args()

    missing = [p for p in args.ours if not Path(p).exists()]
    if missing:
        sys.exit(f"compare.py: no results of ours at {', '.join(missing)} (run build/bench/bench_<family> "
                 "--benchmark_out=<file> --benchmark_out_format=json)")
    ours_ctx, ours = load_ours(args.ours)

    torch_path = Path(args.torch)
    if args.run_torch or not torch_path.exists():
        cmd = [sys.executable, str(HERE / "torch_suite.py"), "--out", str(torch_path)]
        threads = args.threads or ours_ctx.get("threads")
        if threads:
            cmd += ["--threads", str(threads)]
        if args.quick:
            cmd.append("--quick")
        print("running " + " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
    torch_ctx, torch = load_torch(torch_path) if torch_path.exists() else (None, {})

    one_thread = None
    if args.one_thread:
        one_ctx, one_rows = load_ours(args.one_thread)
        if str(one_ctx.get("threads", "1")) != "1":
            print(f"compare.py: --one-thread results ran with {one_ctx.get('threads')} threads", file=sys.stderr)
        one_thread = {r["name"]: (r["ms"], counter(r, "of_read")) for r in one_rows if math.isfinite(r["ms"])}
    text = build_table(ours_ctx, ours, torch_ctx, torch, one_thread)
    print(text, end="")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
