#!/usr/bin/env bash
# test/gpu_check/self_test.sh [EMULATED_TESTS_BINARY]: `tools/gpu_check.sh device` run here, without a GPU, over a
# build-gpu/ of planted binaries: a group that passes (the emulated CUDA backend's real tests when their binary is
# given, else a stand-in), one that fails, one that crashes (SIGSEGV, as a faulting kernel ends a process), one that
# hangs, and a program that will not load (a library missing). The device script must go through every step anyway:
# the hung group is stopped by its timeout, the unloadable program is rebuilt with nvcc from its manifest line and
# run, every later log is written, each step's result is in summary.md, the GPU-only steps say they were skipped,
# at most 6 files are written, and the exit status says something failed. A second run with a tiny budget must skip
# the optional steps and still write its summary. ctest: gpu_check.device_self_test.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
emulated=${1:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
expect() {  # expect <description> <command...>
    local what=$1
    shift
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; failures=$((failures + 1)); fi
}

# The planted binaries: each a stand-in script that behaves as the case it plants (plant <name> <body>).
bin="$tmp/bin"
mkdir -p "$bin/lib" "$tmp/build-gpu" "$tmp/deps-root/deps"
plant() { printf '#!/usr/bin/env bash\n%s\n' "$2" > "$bin/$1"; chmod +x "$bin/$1"; }
plant fast_kernels 'echo "[doctest] test cases: 3 | 3 passed | 0 failed"; exit 0'
if [ -n "$emulated" ]; then
    plant tests_model_pass "exec \"$emulated\" --test-case='*random*<cuda>*' \"\$@\""
else
    plant tests_model_pass 'echo "[doctest] test cases: 2 | 2 passed | 0 failed"; exit 0'
fi
plant tests_model_fail 'echo "fast kernels: ${MOONMOE_CUDA_FAST_KERNELS:-off}"; printf "===\nplanted.cpp:1:\nTEST CASE:  planted failure, with a comma<cuda>\n\nplanted.cpp:2: ERROR: CHECK( 1 == 2 ) is NOT correct!\n"; echo "[doctest] test cases: 2 | 1 passed | 1 failed"; exit 1'
plant tests_kernels_crash 'printf "TEST CASE:  planted crash<cuda>\n"; kill -SEGV $$'
plant tests_model_hang 'echo "planted hang"; exec sleep 600'
plant sticky_fault 'echo "ok   planted sticky fault"; exit 0'
plant kimi_k2_1t_cuda 'echo "planted example $*"; exit 0'
plant moonmoe_cuda_bench 'for a; do case $a in --benchmark_out=*) echo "{\"context\": {}, \"benchmarks\": []}" > "${a#--benchmark_out=}";; esac; done; echo "planted bench"; exit 0'
# A real executable that needs a library that is gone: the device script must rebuild it.
printf 'int planted_symbol() { return 0; }\n' > "$tmp/lib.cpp"
printf 'int planted_symbol();\nint main() { return planted_symbol(); }\n' > "$tmp/main.cpp"
g++ -shared -fPIC -o "$tmp/libplanted_gone.so" "$tmp/lib.cpp" &&
    g++ "$tmp/main.cpp" -L"$tmp" -lplanted_gone -o "$bin/nccl_run" || { echo "FAIL could not build the planted program"; exit 1; }
rm "$tmp/libplanted_gone.so"
tar -C "$bin" -cJf "$tmp/build-gpu/bin.tar.xz" .
tar -C "$tmp/deps-root" -cJf "$tmp/build-gpu/deps.tar.xz" deps
{
    printf '# planted by test/gpu_check/self_test.sh\n# commit planted\n'
    printf 'fast_kernels\tprogram\ttest/nvcc/fast_kernels.cu\t-lcublas\t\n'
    for g in tests_model_pass tests_model_fail tests_kernels_crash tests_model_hang; do printf '%s\ttests\tnone.cu\t-lcublas\t\n' "$g"; done
    printf 'sticky_fault\tprogram\tnone.cu\t-lcublas\t\n'
    printf 'nccl_run\tprogram\ttest/gpu_check/planted_program.cu\t\t\n'
    printf 'kimi_k2_1t_cuda\texample\tnone.cu\t-lcublas\t--tokens 4\n'
    printf 'moonmoe_cuda_bench\tbench\tnone.cu\t-lcublas\t\n'
} > "$tmp/build-gpu/manifest.tsv"

run_device() {  # run_device <out dir> [VAR=value...]
    local out=$1
    shift
    mkdir -p "$out"
    env -u LD_LIBRARY_PATH PATH="$PATH" GPU_BUILD="$tmp/build-gpu" GPU_RUN_DIR="$tmp/run" OUT="$out" \
        TIMEOUT_TESTS=20 TIMEOUT_PROGRAM=120 "$@" bash "$root/tools/gpu_check.sh" device > "$out.console" 2>&1
}

out="$tmp/out"
start=$SECONDS
run_device "$out"
rc=$?
echo "device run: exit $rc after $((SECONDS - start)) s; its summary:"
cat "$out/summary.md"
s="$out/summary.md"
row() { grep -qF "| $1 | $2 |" "$s"; }
expect "the exit status says something failed" test "$rc" -ne 0
expect "summary.md names the device" grep -q '^- device: no GPU' "$s"
expect "fast kernels: pass" row "fast kernels vs portable" pass
expect "the passing group passes" row "tests: tests_model_pass" pass
expect "the failing group fails with its exit status" row "tests: tests_model_fail" "fail (exit 1)"
expect "the crashing group is reported as a crash" row "tests: tests_kernels_crash" "crash (signal 11)"
expect "the hung group is stopped by its timeout" row "tests: tests_model_hang" timeout
expect "the failing group's row names its failed case" \
    grep -qF "| tests: tests_model_fail | fail (exit 1) | 0 | 1 passed, 1 failed; failed: planted failure? with a comma<cuda> |" "$s"
expect "its memcheck rerun is skipped here (no sanitizer)" row "memcheck: tests_model_fail" "skipped: no sanitizer"
expect "the crashed group's failed case is named too" grep -qF "failed: planted crash<cuda>" "$s"
expect "the unloadable program was rebuilt with nvcc" row "rebuild nccl_run" pass
expect "and then run" row "nccl, one rank" pass
expect "the program's output is in programs.log" grep -q 'planted program rebuilt and run' "$out/programs.log"
expect "the step after the hang ran (sticky fault)" row "sticky fault" pass
expect "the fast-kernel reruns ran for the model-level groups" row "tests, fast kernels on: tests_model_pass" pass
expect "and not for the kernels' groups" bash -c "! grep -q 'fast kernels on: tests_kernels' '$s'"
expect "the test groups ran without the fast kernels" grep -q 'fast kernels: off' "$out/tests.log"
expect "and again with every fast kernel on" grep -q 'fast kernels: all' "$out/kernels.log"
expect "the example ran with its arguments" grep -q 'planted example --tokens 4' "$out/programs.log"
expect "racecheck is skipped without a sanitizer" row "racecheck: fast attention" "skipped: no sanitizer"
expect "the quick benchmarks ran" row "bench: quick" pass
expect "PyTorch's side is skipped without a GPU" row "bench: PyTorch quick" "skipped: no torch with CUDA"
expect "tests.log holds every group's output, the hung one's too" \
    bash -c "grep -q 'planted failure' '$out/tests.log' && grep -q 'planted crash' '$out/tests.log' && grep -q 'planted hang' '$out/tests.log'"
if [ -n "$emulated" ]; then
    expect "the emulated tests really ran" grep -qE '^\[doctest\] test cases: +[1-9][0-9]* \| +[1-9]' "$out/tests.log"
fi
expect "at most 6 files in OUT" test "$(find "$out" -type f | wc -l)" -le 6
expect "summary.md is first and fits a screen (at most 40 lines)" test "$(wc -l < "$s")" -le 40

# A budget too small for the optional steps: they are skipped, the summary is still written.
out2="$tmp/out2"
run_device "$out2" BUDGET_S=15
expect "with a 15 s budget the test groups are skipped" grep -qF "| tests: tests_model_pass | skipped: budget |" "$out2/summary.md"
expect "and the summary is complete" grep -q '^Total ' "$out2/summary.md"

echo "gpu_check self test: $failures failure(s)"
[ "$failures" = 0 ]
