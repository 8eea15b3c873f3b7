#!/usr/bin/env python3
"""Times the suite's small rows and a set of K2 rows at 1 and 2 threads, on a quiet machine and with one and two
competing processes (plain busy loops, pinned nowhere), and prints the ratios: loaded / quiet per thread count, and
2 threads / 1 thread. The targets (issue 9): two threads never slower than one, and one competing process costing
at most 2.5x; a row that misses one is marked with `*`.

    python3 bench/contention.py [--quick] [--build-dir DIR] [--no-build] [--family NAME]... [--threads 1,2]
                                [--loads 0,1,2] [--min-time S] [--rounds N] [--json FILE] [--markdown FILE]

  --quick      only the small rows (each file's `bench-smoke-filter`), about two minutes on 2 cores
  --build-dir  the CMake build whose build/bench/bench_<family> binaries run (default: build, the release preset)
  --no-build   do not (re)build the benchmark targets first
  --family     only these families (default: every family of bench/SUITE.md; K2 rows where K2_ROWS names some)
  --threads    thread counts (MOONMOE_BENCH_THREADS), default 1,2
  --loads      numbers of competing busy processes, default 0,1,2
  --min-time   Google Benchmark's minimum time per row in seconds (default 0.1 quick, 0.3 full)
  --rounds     quiet rows are measured this many times, the thread counts side by side and their order reversed
               every round, and the fastest kept (default 2): "2t / 1t" then compares the two on the same
               machine state rather than two sweeps minutes apart
  --json       also write every measurement (milliseconds per iteration) to FILE

Without --quick it takes about 15-20 minutes on 2 cores (the K2 MoE rows hold 24 full-width experts: 4 GiB).
"Quiet" means no competing process of ours: other work on the machine still counts, so the script prints the load
average beside each configuration; repeat a run to see the noise.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ["gemm", "rmsnorm", "rope", "mla", "router", "moe", "layer", "ns", "muon", "qk_clip", "adamw"]

# K2 rows of the full run: a few per family, each well under a few seconds at 2 threads (bench/results/table.md).
K2_ROWS = {
    "gemm": [r"gemm/nn/m:2048/n:2048/k:2048/", r"gemm/nt/m:1024/n:12288/k:1536/", r"gemm/nt/m:64/n:2048/k:7168/",
             r"syrk/n:2048/k:7168/"],
    "rmsnorm": [r"rmsnorm/forward_backward/tokens:4096/"],
    "rope": [r"rope/forward/tokens:4096/"],
    "mla": [r"mla/forward/k2/", r"mla/decode/k2/"],
    "router": [r"router/forward/k2/"],
    "moe": [r"moe/forward/k2/"],
    "muon": [r"muon/step/rows:12288/cols:1536/", r"muon/step/rows:576/cols:7168/"],
    "qk_clip": [r"qk_clip/mla/k2/"],
    "adamw": [r"adamw/step/numel:117440512/"],
}


def smoke_filter(family):
    for line in (ROOT / "bench" / f"{family}.cpp").read_text().splitlines()[:40]:
        m = re.match(r"\s*//\s*bench-smoke-filter:\s*(.*\S)\s*$", line)
        if m:
            return m.group(1)
    return None


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def start_busy(n):
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True) for _ in range(n)]


def stop_busy(procs):
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def run_rows(binary, regex, threads, load, min_time, repetitions):
    """Milliseconds per iteration of every row matching regex (the median of the repetitions)."""
    env = dict(os.environ, MOONMOE_BENCH_THREADS=str(threads), MOONMOE_BENCH_SGEMM_SIZE="256")
    env.pop("OMP_NUM_THREADS", None)
    args = [str(binary), f"--benchmark_filter={regex}", f"--benchmark_min_time={min_time}",
            "--benchmark_format=json"]
    if repetitions > 1:
        args += [f"--benchmark_repetitions={repetitions}", "--benchmark_report_aggregates_only=true"]
    busy = start_busy(load)
    try:
        time.sleep(0.2 if load else 0)  # let the busy loops take their CPUs first
        out = subprocess.run(args, env=env, capture_output=True, text=True)
    finally:
        stop_busy(busy)
    if out.returncode != 0:
        sys.exit(f"contention.py: {binary.name} {regex!r} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    times = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        if repetitions > 1 and b.get("aggregate_name") != "median":
            continue
        name = b.get("run_name", b["name"]).removesuffix("/real_time")
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
        times[name] = b["real_time"] * scale
    return times


def build(build_dir, families):
    if not (build_dir / "CMakeCache.txt").exists():
        if build_dir.resolve() != (ROOT / "build").resolve():
            sys.exit(f"contention.py: {build_dir} is not a configured CMake build (configure it, or use --no-build)")
        subprocess.run(["cmake", "--preset", "release"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build_dir), "-j2", "--target", *[f"bench_{f}" for f in families]],
                   check=True)


def fmt_ms(v):
    return "—" if v is None else f"{v:.3g}"


def fmt_ratio(v, limit=None):
    if v is None:
        return "—"
    return f"{v:.2f}" + ("*" if limit is not None and v > limit else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--build-dir", default=str(ROOT / "build"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--loads", default="0,1,2")
    ap.add_argument("--min-time", type=float, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    families = a.family or FAMILIES
    for f in families:
        if f not in FAMILIES:
            sys.exit(f"contention.py: no family '{f}'; families: {' '.join(FAMILIES)}")
    threads = [int(t) for t in a.threads.split(",")]
    loads = [int(n) for n in a.loads.split(",")]
    min_time = a.min_time if a.min_time is not None else (0.1 if a.quick else 0.3)
    build_dir = Path(a.build_dir)
    if not a.no_build:
        build(build_dir, families)

    # (family, regex, repetitions): small rows three times each (median), K2 rows once (they are long)
    jobs = [(f, smoke_filter(f), 3) for f in families]
    if not a.quick:
        jobs += [(f, "^(" + "|".join(K2_ROWS[f]) + ")", 1) for f in families if f in K2_ROWS]
    started = time.time()
    results = {}  # (threads, load) -> {row: ms}
    load_seen = {}  # load -> (load average before, after)
    print(f"contention.py: {len(jobs)} row groups x {len(threads)} thread counts x {len(loads)} loads, quiet "
          f"rows {a.rounds} rounds; load average {loadavg():.2f} at the start", file=sys.stderr)
    for load in loads:
        before = loadavg()
        rounds = a.rounds if load == 0 else 1
        for family, regex, reps in jobs:
            # thread counts side by side per row group, their order reversed every round, the fastest round kept:
            # a drift of the machine's other load between two long sweeps does not decide "2t / 1t"
            for r in range(rounds):
                for t in threads if r % 2 == 0 else threads[::-1]:
                    got = results.setdefault((t, load), {})
                    for row, ms in run_rows(build_dir / "bench" / f"bench_{family}", regex, t, load, min_time,
                                            reps).items():
                        got[row] = min(got.get(row, ms), ms)
        load_seen[load] = (before, loadavg())
        print(f"  [{time.time() - started:6.0f} s] {load} competing: {len(results[(threads[0], load)])} rows at "
              f"{threads} threads (load average {before:.2f} -> {load_seen[load][1]:.2f})", file=sys.stderr)

    rows = list(results[(threads[0], loads[0])])
    lines = [f"threads {threads}, competing busy processes {loads}, quiet rows the fastest of {a.rounds} rounds; "
             "load average (1 min) per load: " + ", ".join(f"+{n}: {b:.1f}->{e:.1f}" for n, (b, e) in load_seen.items()),
             ""]
    head = ["row"] + [f"{t}t ms" for t in threads]
    if 1 in threads and 2 in threads:
        head += [f"2t/1t +{n}" if n else "2t/1t" for n in loads]
    head += [f"{t}t +{n} / quiet" for n in loads if n for t in threads]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    get = lambda t, n, r: results.get((t, n), {}).get(r)
    ratio = lambda x, y: x / y if x is not None and y else None
    for r in rows:
        cells = [f"`{r}`"] + [fmt_ms(get(t, 0, r)) for t in threads]
        if 1 in threads and 2 in threads:
            cells += [fmt_ratio(ratio(get(2, n, r), get(1, n, r)), None if n else 1.0) for n in loads]
        cells += [fmt_ratio(ratio(get(t, n, r), get(t, 0, r)), 2.5 if n == 1 else None)
                  for n in loads if n for t in threads]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        Path(a.markdown).write_text(table + "\n")
    if a.json:
        Path(a.json).write_text(json.dumps({"load_average": {f"+{n}": v for n, v in load_seen.items()},
                                            "ms": {f"{t}t+{n}": v for (t, n), v in results.items()}}, indent=1))
    print(f"contention.py: {time.time() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
