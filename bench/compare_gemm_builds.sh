#!/usr/bin/env bash
# Builds bench/gemm_backends.cpp in several CPU build variants, each in its own build
# directory, runs each with JSON output, and prints one comparison table (median of the
# repetitions). The results and the decision they led to are in docs/cpu_gemm.md.
#
#   bash bench/compare_gemm_builds.sh [options]
#     --out DIR        build directories and results (default: <repo>/build-gemm)
#     --reps N         --benchmark_repetitions (default 3; the table shows the median)
#     --min-time S     --benchmark_min_time in seconds (default 0.5)
#     --filter REGEX   extra --benchmark_filter applied to every variant (default: all)
#     --variants LIST  comma-separated subset of the variants below (default: all)
#     --no-build       reuse the binaries already built under --out
#     --table-only     only print the table from the JSON files already under --out
#     --wait-idle S    before each run, wait up to S seconds (default 600) until other
#                      processes use < 10% of one CPU: this is a 2-vCPU machine shared with
#                      builds, and a compile next to a 2-thread GEMM halves it.
#                      The binary also redoes, up to $MOONMOE_BENCH_REDO (default here 8)
#                      times, each 0.1 s batch of calls that ran next to a busy process.
#     --retries N      rerun (up to N times, default 3) the benchmarks that have fewer than
#                      half their repetitions clean, i.e. with other_cpus <= 0.1 (the CPUs
#                      other processes kept busy during the timed loop, measured by the
#                      binary), or whose clean repetitions differ by more than 10% (the
#                      host's other guests are invisible from here). The table uses the
#                      clean repetitions of all runs and marks with * a cell that has none
#                      and with ~ one whose clean repetitions still differ by more than 10%.
#
# Variants. Flags go through CMAKE_CXX_FLAGS with MOONMOE_CPU_ARCH=none, so each variant
# is exactly the flags listed (plus Release's -O3 -DNDEBUG); OpenMP and BLAS through the
# MOONMOE_WITH_OPENMP / MOONMOE_WITH_BLAS options (BLAS: EIGEN_USE_BLAS + OpenBLAS).
#   name            CXX flags                               BLAS  runtime env / filter
#   avx2            -mavx2 -mfma                            OFF
#   native          -march=native                           OFF
#   native-blas     -march=native                           ON
#   native-serial   -march=native -DEIGEN_DONT_PARALLELIZE  OFF   (only eigen, 1 thread)
#   native-noomp    -march=native, MOONMOE_WITH_OPENMP=OFF  OFF   (only eigen, 1 thread)
#   native-blas-skx native-blas's binary, OPENBLAS_CORETYPE=SkylakeX (OpenBLAS AVX-512
#                   kernels instead of the Haswell ones 0.3.21 picks on Zen 5)
#   native-passive  native-blas's binary, OMP_WAIT_POLICY=passive (mixed/ only)
#   native-blas-tuned  native-blas's binary with both: the opt-in recipe of docs/cpu_gemm.md
#                   (K2 shapes and mixed/ only)
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$src/build-gemm"
reps=3
min_time=0.5
filter=""
only=""
build=1
run=1
wait_idle=600
retries=3

while (( $# )); do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --filter) filter=$2; shift 2 ;;
    --variants) only=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --table-only) build=0; run=0; shift ;;
    --wait-idle) wait_idle=$2; shift 2 ;;
    --retries) retries=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_gemm_builds.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# name | build dir | CXX flags | BLAS | OpenMP | env | filter
variants=(
  "avx2|avx2|-mavx2 -mfma|OFF|ON||"
  "native|native|-march=native|OFF|ON||"
  "native-blas|native-blas|-march=native|ON|ON||"
  "native-serial|native-serial|-march=native -DEIGEN_DONT_PARALLELIZE|OFF|ON||^gemm/eigen/.*threads:1"
  "native-noomp|native-noomp|-march=native|OFF|OFF||^gemm/eigen/.*threads:1"
  "native-blas-skx|native-blas|-march=native|ON|ON|OPENBLAS_CORETYPE=SkylakeX|^(peak|gemm/blas|mixed|repeat)/"
  "native-passive|native-blas|-march=native|ON|ON|OMP_WAIT_POLICY=passive|^mixed/"
  "native-blas-tuned|native-blas|-march=native|ON|ON|OPENBLAS_CORETYPE=SkylakeX OMP_WAIT_POLICY=passive|^(peak/.*threads:1|gemm/eigen/.*/k2_|mixed/)"
)

selected() {
  [[ -z "$only" ]] && return 0
  [[ ",$only," == *",$1,"* ]]
}

mkdir -p "$out/results"
jobs=$(nproc 2>/dev/null || echo 2)

if (( build )); then
  declare -A built=()
  for v in "${variants[@]}"; do
    IFS='|' read -r name dir flags blas omp env vfilter <<<"$v"
    selected "$name" || continue
    [[ -n "${built[$dir]:-}" ]] && continue
    built[$dir]=1
    echo "==== configure + build $dir: CXXFLAGS='$flags' BLAS=$blas OpenMP=$omp" >&2
    cmake -S "$src" -B "$out/$dir" -DCMAKE_BUILD_TYPE=Release \
      -DMOONMOE_BUILD_TESTS=OFF -DMOONMOE_BUILD_EXAMPLES=OFF -DMOONMOE_BUILD_BENCHMARKS=ON \
      -DMOONMOE_WITH_CUDA=OFF -DMOONMOE_CPU_ARCH=none \
      "-DCMAKE_CXX_FLAGS=$flags" -DMOONMOE_WITH_BLAS="$blas" -DMOONMOE_WITH_OPENMP="$omp" \
      >"$out/$dir.configure.log" 2>&1 || { cat "$out/$dir.configure.log" >&2; exit 1; }
    cmake --build "$out/$dir" -j"$jobs" --target bench_gemm_backends \
      >"$out/$dir.build.log" 2>&1 || { tail -50 "$out/$dir.build.log" >&2; exit 1; }
  done
fi

hz=$(getconf CLK_TCK)
busy_jiffies() {  # user + nice + system + irq + softirq + steal, all CPUs
  awk '/^cpu /{ print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}
wait_until_idle() {
  local deadline=$((SECONDS + wait_idle)) b0 b1
  while :; do
    b0=$(busy_jiffies); sleep 2; b1=$(busy_jiffies)
    (( (b1 - b0) * 10 <= 2 * hz )) && return 0  # < 0.1 CPU over 2 s
    if (( SECONDS >= deadline )); then
      echo "     (machine still busy after ${wait_idle} s; running anyway)" >&2
      return 0
    fi
  done
}

# Benchmarks of one variant (all its result files) with fewer than half their repetitions
# clean; prints an anchored filter regex for them, or nothing.
dirty_filter() {
  python3 - "$out/results" "$1" "$reps" <<'PY'
import glob, json, os, re, sys
from collections import defaultdict
results, variant, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
clean, rates, seen = defaultdict(int), defaultdict(list), []
for path in sorted(glob.glob(os.path.join(results, variant + ".json")) +
                   glob.glob(os.path.join(results, variant + ".retry*.json"))):
    try:
        data = json.load(open(path))
    except (OSError, ValueError):
        continue
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" or b.get("error_occurred"):
            continue
        n = b.get("run_name", b["name"])
        if n not in seen:
            seen.append(n)
        if 0 <= b.get("other_cpus", 0) <= 0.1:
            clean[n] += 1
            if "GFLOP/s" in b:
                rates[n].append(b["GFLOP/s"])
need = (reps + 1) // 2
def spread(r):
    return (max(r) - min(r)) / max(r) if len(r) > 1 else 0.0
dirty = [n for n in seen if clean[n] < need or spread(rates[n]) > 0.10]
if dirty:
    print("^(" + "|".join(re.escape(n) for n in dirty) + ")$")
PY
}

run_bench() {  # variant dir env filter json
  local name=$1 dir=$2 env=$3 f=$4 json=$5
  local args=("--benchmark_repetitions=$reps" "--benchmark_min_time=$min_time"
              --benchmark_format=json "--benchmark_out=$json" --benchmark_out_format=json)
  [[ -n "$f" ]] && args+=("--benchmark_filter=$f")
  wait_until_idle
  echo "==== run $name -> $(basename "$json") ($(uptime | sed 's/.*load average/load average/'))" >&2
  env MOONMOE_BENCH_REDO="${MOONMOE_BENCH_REDO:-8}" $env "$out/$dir/bench/bench_gemm_backends" \
    "${args[@]}" >/dev/null 2>>"$out/results/$name.stderr"
}

if (( run )); then
  for v in "${variants[@]}"; do
    IFS='|' read -r name dir flags blas omp env vfilter <<<"$v"
    selected "$name" || continue
    rm -f "$out/results/$name".*
    # Google Benchmark takes one filter: the variant's, else --filter; when both are set
    # the variant's is used for the run and --filter is applied when the table is printed.
    f=${vfilter:-$filter}
    run_bench "$name" "$dir" "$env" "$f" "$out/results/$name.json"
    for (( attempt = 1; attempt <= retries; ++attempt )); do
      f=$(dirty_filter "$name")
      [[ -z "$f" ]] && break
      echo "     $(tr -cd '|' <<<"$f" | wc -c | awk '{print $1 + 1}') benchmark(s) ran next to other processes: rerun $attempt" >&2
      run_bench "$name" "$dir" "$env" "$f" "$out/results/$name.retry$attempt.json"
    done
  done
fi

python3 - "$out/results" "$filter" "$only" "$reps" <<'PY'
import glob, json, os, re, sys
from statistics import median

results_dir, global_filter, only, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
order = ["avx2", "native", "native-blas", "native-serial", "native-noomp",
         "native-blas-skx", "native-passive", "native-blas-tuned"]
if only:
    order = [v for v in order if v in only.split(",")]

runs = {}  # variant -> list of JSON documents (first run, then reruns)
for name in order:
    docs = []
    for path in [os.path.join(results_dir, name + ".json")] + sorted(
            glob.glob(os.path.join(results_dir, name + ".retry*.json"))):
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, ValueError):
            pass
    if docs:
        runs[name] = docs
if not runs:
    sys.exit("no results under " + results_dir)

def clean_name(n):
    return re.sub(r"/(real_time|manual_time|iterations:\d+)", "", n)

def is_clean(b):
    return 0 <= b.get("other_cpus", 0) <= 0.1

# name -> variant -> list of per-repetition dicts
table, bench_order, errors = {}, [], {}
for variant, docs in runs.items():
    for data in docs:
        for b in data["benchmarks"]:
            if b.get("run_type") == "aggregate":
                continue
            n = clean_name(b.get("run_name", b["name"]))
            if global_filter and not re.search(global_filter, n):
                continue
            if n not in table:
                table[n] = {}
                bench_order.append(n)
            if b.get("error_occurred"):
                errors[(n, variant)] = b.get("error_message", "error")
                continue
            table[n].setdefault(variant, []).append(b)

variants = list(runs)

def pick(rows):
    """The clean repetitions if there are any (flag ''), else all of them (flag '*')."""
    good = [r for r in rows if is_clean(r)]
    return (good, "") if good else (rows, "*")

def med(rows, key):
    vals = [r[key] for r in rows if key in r]
    return median(vals) if vals else None

print("SGEMM, median of the clean repetitions (other processes kept <= 0.1 CPU busy): GFLOP/s")
print("(fraction of threads x the 1-core FP32 FMA peak, the peak being the widest FMA the CPU has).")
print("* = no clean repetition (median of all); ~ = clean repetitions differ by > 10%;")
print("skip = not supported by that build.\n")
for variant, docs in runs.items():
    c = docs[0]["context"]
    print(f"- {variant}: eigen_simd='{c.get('eigen_simd')}' eigen_use_blas={c.get('eigen_use_blas')} "
          f"openmp={c.get('openmp')} eigen_parallel='{c.get('eigen_parallel')}' "
          f"openblas='{c.get('openblas')}' ({len(docs) - 1} rerun(s))")
print()

def row(cells):
    print("| " + " | ".join(cells) + " |")

hdr = ["benchmark"] + variants
row(hdr); row(["---"] * len(hdr))
for n in bench_order:
    if n.startswith("repeat/"):
        continue
    cells = [n]
    for v in variants:
        rows = table[n].get(v)
        if not rows:
            cells.append("skip" if (n, v) in errors else "")
            continue
        rows, flag = pick(rows)
        g = med(rows, "GFLOP/s")
        rs = [r["GFLOP/s"] for r in rows if "GFLOP/s" in r]
        if not flag and len(rs) > 1 and (max(rs) - min(rs)) / max(rs) > 0.10:
            flag = "~"
        fr = med(rows, "frac_peak")
        cells.append(f"{g:.1f}" + (f" ({fr * 100:.0f}%)" if fr is not None else "") + flag)
    row(cells)

print("\nBitwise repeatability (repeat/: A B^T computed 5 more times per repetition, also with every")
print("operand moved by one float; =1T: equal to the 1-thread result; hash: FNV-1a of the result bits)\n")
row(hdr); row(["---"] * len(hdr))
for n in bench_order:
    if not n.startswith("repeat/"):
        continue
    cells = [n]
    for v in variants:
        rows = table[n].get(v)
        if not rows:
            cells.append("skip" if (n, v) in errors else "")
            continue
        ident = all(r["identical"] == 1 and r["align_identical"] == 1 for r in rows)
        hashes = sorted({int(r["hash"]) for r in rows})
        same1 = all(r["same_as_1thread"] == 1 for r in rows)
        cells.append(("repeatable" if ident else "NOT repeatable") + (", =1T" if same1 else ", !=1T") +
                     ", " + "/".join(f"{h:08x}" for h in hashes))
    row(cells)
PY
