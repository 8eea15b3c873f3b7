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
#                      builds, and a compile next to a 2-thread GEMM halves it. The table
#                      reports the CPU time other processes took during each run.
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

if (( run )); then
  for v in "${variants[@]}"; do
    IFS='|' read -r name dir flags blas omp env vfilter <<<"$v"
    selected "$name" || continue
    args=("--benchmark_repetitions=$reps" "--benchmark_min_time=$min_time"
          --benchmark_format=json "--benchmark_out=$out/results/$name.json"
          --benchmark_out_format=json)
    # Google Benchmark takes one filter: the variant's, else --filter; when both are set
    # the variant's is used for the run and --filter is applied when the table is printed.
    if [[ -n "$vfilter" ]]; then
      args+=("--benchmark_filter=$vfilter")
    elif [[ -n "$filter" ]]; then
      args+=("--benchmark_filter=$filter")
    fi
    wait_until_idle
    echo "==== run $name ($(uptime | sed 's/.*load average/load average/'))" >&2
    b0=$(busy_jiffies); t0=$(date +%s.%N)
    TIMEFORMAT='%U %S'
    { time env $env "$out/$dir/bench/bench_gemm_backends" "${args[@]}" \
        >/dev/null 2>"$out/results/$name.stderr"; } 2>"$out/results/$name.time"
    b1=$(busy_jiffies); t1=$(date +%s.%N)
    read -r user sys <"$out/results/$name.time"
    python3 -c 'import json, sys; t0, t1, u, s, b, hz = map(float, sys.argv[2:]); json.dump({"wall_s": t1 - t0, "bench_cpu_s": u + s, "other_cpu_s": max(0.0, b / hz - u - s)}, open(sys.argv[1], "w"))' \
      "$out/results/$name.meta.json" "$t0" "$t1" "$user" "$sys" "$((b1 - b0))" "$hz"
  done
fi

python3 - "$out/results" "$filter" <<'PY'
import json, os, re, sys
from statistics import median

results_dir, global_filter = sys.argv[1], sys.argv[2]
order = ["avx2", "native", "native-blas", "native-serial", "native-noomp",
         "native-blas-skx", "native-passive"]
runs = {}
for name in order:
    path = os.path.join(results_dir, name + ".json")
    if os.path.exists(path):
        with open(path) as f:
            runs[name] = json.load(f)
if not runs:
    sys.exit("no results under " + results_dir)

def clean(n):
    return re.sub(r"/(real_time|iterations:\d+)", "", n)

# name -> variant -> list of per-repetition dicts
table, bench_order, errors = {}, [], {}
for variant, data in runs.items():
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        n = clean(b.get("run_name", b["name"]))
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

def med(rows, key):
    vals = [r[key] for r in rows if key in r]
    return median(vals) if vals else None

print("# SGEMM, median of repetitions: GFLOP/s (fraction of", end=" ")
print("threads x 1-core FP32 FMA peak, the peak being the widest FMA the CPU has)\n")
for variant, data in runs.items():
    c = data["context"]
    meta_path = os.path.join(results_dir, variant + ".meta.json")
    busy = ""
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            m = json.load(f)
        busy = f"other processes used {m['other_cpu_s']:.1f} CPU-s during the {m['wall_s']:.0f} s run; "
    print(f"- {variant}: {busy}eigen_simd='{c.get('eigen_simd')}' "
          f"eigen_use_blas={c.get('eigen_use_blas')} openmp={c.get('openmp')} "
          f"eigen_parallel='{c.get('eigen_parallel')}' openblas='{c.get('openblas')}'")
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
        g = med(rows, "GFLOP/s")
        fr = med(rows, "frac_peak")
        cells.append(f"{g:.1f}" + (f" ({fr * 100:.0f}%)" if fr is not None else ""))
    row(cells)

print("\n# Bitwise repeatability (repeat/: A B^T, 5 repeats per repetition; hash = FNV-1a of the result bits)\n")
hdr = ["benchmark"] + variants
row(hdr); row(["---"] * len(hdr))
for n in bench_order:
    if not n.startswith("repeat/"):
        continue
    cells = [n]
    for v in variants:
        rows = table[n].get(v)
        if not rows:
            cells.append("")
            continue
        ident = all(r["identical"] == 1 and r["align_identical"] == 1 for r in rows)
        hashes = sorted({int(r["hash"]) for r in rows})
        same1 = all(r["same_as_1thread"] == 1 for r in rows)
        cells.append(("repeatable" if ident else "NOT repeatable") +
                     (", =1T" if same1 else ", !=1T") +
                     " hash " + "/".join(f"{h:08x}" for h in hashes))
    row(cells)
PY
