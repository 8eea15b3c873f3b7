#!/usr/bin/env bash
# Runs the benchmark suite of bench/SUITE.md and writes one JSON file of every result.
#
#   bash bench/run_suite.sh [--quick] [--threads N] [--min-time SECONDS] [--out FILE] [--family NAME]...
#
#   --quick      only the small shapes (each file's `bench-smoke-filter`), about a minute
#   --threads    threads on our side (and recorded for bench/compare.py); default: the library's
#                (moonmoe::default_threads(): the CPUs of the affinity mask, within the cgroup CPU quota)
#   --min-time   Google Benchmark's minimum time per benchmark (default 0.5; long ones run once)
#   --out        default bench/results/moonmoe.json
#   --family     run only these families (gemm rmsnorm rope mla router moe layer ns muon qk_clip adamw)
#
# Builds the release preset's benchmark targets first (installing dependencies when missing). Each family runs
# as its own process under /usr/bin/time -v; its peak resident memory is added to each of its rows as
# `process_peak_rss_MiB`. The full suite takes about 20 minutes on 2 cores and needs about 11 GiB of memory
# (the MoE and decoder-layer families hold 24 full-width experts with their gradients).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

families_all=(gemm rmsnorm rope mla router moe layer ns muon qk_clip adamw)
families=()
quick=0
threads=
min_time=0.5
out=bench/results/moonmoe.json
while (( $# )); do
  case $1 in
    --quick) quick=1 ;;
    --threads) threads=$2; shift ;;
    --min-time) min_time=$2; shift ;;
    --out) out=$2; shift ;;
    --family) families+=("$2"); shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "run_suite.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
(( ${#families[@]} )) || families=("${families_all[@]}")
for f in "${families[@]}"; do
  [[ -f bench/$f.cpp ]] || { echo "run_suite.sh: no family '$f' (bench/$f.cpp); families: ${families_all[*]}" >&2; exit 2; }
done

bash cmake/install_deps.sh >/dev/null
cmake --preset release >/dev/null
targets=()
for f in "${families[@]}"; do targets+=("bench_$f"); done
cmake --build --preset release -j2 --target "${targets[@]}"

# benchmark >= 1.8 wants a unit on --benchmark_min_time
min_time_arg=${min_time}s
if ! "build/bench/bench_${families[0]}" --benchmark_list_tests --benchmark_min_time="$min_time_arg" >/dev/null 2>&1; then
  min_time_arg=$min_time
fi

parts=$(mktemp -d)
trap 'rm -rf "$parts"' EXIT
mkdir -p "$(dirname "$out")"
if [[ -n $threads ]]; then export MOONMOE_BENCH_THREADS=$threads; else unset MOONMOE_BENCH_THREADS; fi
for f in "${families[@]}"; do
  args=(--benchmark_min_time="$min_time_arg" --benchmark_out="$parts/$f.json" --benchmark_out_format=json)
  if (( quick )); then
    filter=$(sed -n 's|^[[:space:]]*//[[:space:]]*bench-smoke-filter:[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$|\1|p' "bench/$f.cpp" | head -1)
    [[ -n $filter ]] && args+=(--benchmark_filter="$filter")
  fi
  echo "==== [$(date '+%T')] bench_$f (threads ${threads:-default})" >&2
  /usr/bin/time -v -o "$parts/$f.time" "build/bench/bench_$f" "${args[@]}"
done

python3 - "$out" "$parts" "${families[@]}" <<'PY'
import json, re, sys
out, parts, families = sys.argv[1], sys.argv[2], sys.argv[3:]
merged = {"context": None, "benchmarks": []}
for f in families:
    with open(f"{parts}/{f}.json") as fh:
        run = json.load(fh)
    with open(f"{parts}/{f}.time") as fh:
        rss_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", fh.read()).group(1))
    merged["context"] = merged["context"] or run["context"]
    for b in run["benchmarks"]:
        b["family"] = f
        b["process_peak_rss_MiB"] = round(rss_kib / 1024, 1)
        merged["benchmarks"].append(b)
with open(out, "w") as fh:
    json.dump(merged, fh, indent=1)
print(f"run_suite.sh: {len(merged['benchmarks'])} results in {out}", file=sys.stderr)
PY
