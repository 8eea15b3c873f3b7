#!/usr/bin/env bash
# fuzz/run.sh: builds moonmoe's libFuzzer targets with ASan + UBSan and runs each one for a bounded time.
#
#   bash fuzz/run.sh [SECONDS] [TARGET...]
#
# SECONDS per target (default 600); TARGETs among safetensors, hf_config, index, checkpoint (default all, one after
# the other). The first three feed raw bytes to a parser; checkpoint decodes its input as edits of a valid checkpoint
# directory (fuzz/checkpoint.cpp), so its mutations reach the loader's semantic checks behind the parsers.
# CI runs `bash fuzz/run.sh 60`. Needs Clang >= 18 with libFuzzer (bash cmake/install_deps.sh --fuzz installs
# clang-19, libclang-rt-19-dev and llvm-19 on Debian 12); MOONMOE_FUZZ_CXX picks another compiler, MOONMOE_FUZZ_BUILD the
# build tree (default build-fuzz), MOONMOE_FUZZ_JOBS the build's parallel jobs (default 2).
#
# Each target starts from its committed seeds, fuzz/corpus/<target> (never written), and grows a working corpus in
# <build tree>/corpus/<target>, kept between runs. A crash, sanitizer report, undocumented exception, timeout
# (10 s per input), leak or memory bomb (over 2 GiB) stops that target and leaves its input under
# fuzz/findings/<target>/; the script then exits with status 1 after the other targets ran. To reproduce one:
#   build-fuzz/fuzz/fuzz_<target> fuzz/findings/<target>/crash-<sha1>
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds=${1:-600}
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: bash fuzz/run.sh [SECONDS per target] [safetensors|hf_config|index|checkpoint ...]" >&2
  exit 2
fi
shift $(($# > 0 ? 1 : 0))
targets=("$@")
all_targets=(safetensors hf_config index checkpoint)
((${#targets[@]})) || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  [[ -f "fuzz/$t.cpp" ]] || { echo "fuzz/run.sh: no target '$t' (fuzz/$t.cpp)" >&2; exit 2; }
done
build=${MOONMOE_FUZZ_BUILD:-build-fuzz}

cxx=${MOONMOE_FUZZ_CXX:-}
if [[ -z "$cxx" ]]; then
  for candidate in clang++-19 clang++-20 clang++-18 clang++; do
    command -v "$candidate" >/dev/null || continue
    version=$("$candidate" -dumpversion 2>/dev/null || true)
    if [[ "${version%%.*}" =~ ^[0-9]+$ ]] && ((${version%%.*} >= 18)); then
      cxx=$candidate
      break
    fi
  done
fi
if [[ -z "$cxx" ]]; then
  echo "fuzz/run.sh: no Clang >= 18 found; run: bash cmake/install_deps.sh --fuzz (or set MOONMOE_FUZZ_CXX)" >&2
  exit 1
fi

echo "fuzz/run.sh: building ${targets[*]} with $cxx ($("$cxx" -dumpversion)) in $build"
# Without OpenMP: the targets run single-threaded, and Clang would need libomp-19-dev for it (fuzz/CMakeLists.txt).
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOONMOE_BUILD_FUZZERS=ON \
  -DMOONMOE_BUILD_TESTS=OFF -DMOONMOE_BUILD_EXAMPLES=OFF -DMOONMOE_BUILD_BENCHMARKS=OFF \
  -DMOONMOE_WITH_OPENMP=OFF >/dev/null
# With every target asked for, build `all` (the tree holds only them): make builds named targets one at a time.
if ((${#targets[@]} == ${#all_targets[@]})); then
  cmake --build "$build" -j "${MOONMOE_FUZZ_JOBS:-2}"
else
  cmake --build "$build" -j "${MOONMOE_FUZZ_JOBS:-2}" --target "${targets[@]/#/fuzz_}"
fi

export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
# Stack traces with function names and lines: the symbolizer beside the compiler (Debian: package llvm-19), else
# one on PATH.
for symbolizer in "$(dirname "$(readlink -f "$(command -v "$cxx")")")/llvm-symbolizer" \
                  "$(command -v llvm-symbolizer || true)"; do
  if [[ -x "$symbolizer" && -z "${ASAN_SYMBOLIZER_PATH:-}" ]]; then export ASAN_SYMBOLIZER_PATH=$symbolizer; fi
done
# A number from libFuzzer's last status line ("#N DONE cov: C ft: F corp: K/... exec/s: E ...").
field() { grep -oE "$1: [0-9]+" <<<"$done_line" | grep -oE '[0-9]+$' || echo '?'; }
failed=()
summary=()
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "$build/logs" "fuzz/findings/$t"
  log="$build/logs/$t.log"
  echo "fuzz/run.sh: fuzz_$t for $seconds s (log: $log)"
  status=0
  "$build/fuzz/fuzz_$t" "$build/corpus/$t" "fuzz/corpus/$t" -dict="fuzz/dict/$t.dict" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="fuzz/findings/$t/" -print_final_stats=1 >"$log" 2>&1 || status=$?
  rmdir "fuzz/findings/$t" 2>/dev/null || true  # only findings are left behind
  if ((status != 0)); then
    echo "fuzz/run.sh: fuzz_$t FOUND A PROBLEM (exit status $status); the end of its log:"
    tail -n 60 "$log"
    failed+=("$t")
    summary+=("$(printf '%-12s finding: %s' "$t" "$(grep -o 'Test unit written to .*' "$log" | tail -n 1)")")
    continue
  fi
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1)
  execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  summary+=("$(printf '%-12s %10s execs %7s exec/s  cov %5s  ft %6s  corpus %5s' "$t" "$execs" \
    "$(field exec/s)" "$(field cov)" "$(field ft)" "$(field corp)")")
done

rmdir fuzz/findings 2>/dev/null || true
echo "fuzz/run.sh: $seconds s per target"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz/run.sh: findings in ${failed[*]}: reproducers under fuzz/findings/" >&2
  exit 1
fi
