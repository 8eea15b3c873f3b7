#!/usr/bin/env bash
# tools/gpu_check.sh: builds and runs the CUDA backend's tests on a machine with an NVIDIA Hopper GPU (sm_90).
#
#   tools/gpu_check.sh stage   on a machine with the packages (Debian's Eigen, doctest, nlohmann-json): copies
#                              those header-only dependencies into build-gpu/deps, so the tree can travel to a GPU
#                              machine that has the CUDA toolkit but no package registry
#   tools/gpu_check.sh run     on the GPU machine: builds the unit tests written for every backend (the
#                              test/unit/*.cpp that name MOONMOE_TEST_BACKENDS) with nvcc into one doctest binary (the same tests the emulated build runs, now on the real
#                              backend: every primitive against double loops, the transformers goldens, greedy
#                              decoding, MuonClip steps against the CPU), runs it, then runs a short part of it under
#                              compute-sanitizer (memcheck); then builds and runs test/nvcc/fast_kernels.cu (the
#                              fast kernels against the portable path) and sanitizes it (memcheck, racecheck).
#                              Then test/nvcc/nccl_run.cu: NCCL with one rank (every collective, and the parallel
#                              runtime's training over it against one process).
#                              Writes build-gpu/results/{tests,fast_kernels,sanitizer,nccl,device}.txt.
#   tools/gpu_check.sh bench   on the GPU machine: builds moonmoe_cuda_bench (every family of bench/SUITE.md on the
#                              CUDA backend, one nvcc object per bench/<family>.cpp) and runs it, one process per
#                              family; then PyTorch on the same GPU (bench/torch_suite.py --device cuda, f32 with TF32
#                              off and bf16) when torch with CUDA and transformers import, else it says so and runs
#                              ours alone; then bench/gpu_targets.py. Writes build-gpu/results/bench/: moonmoe_cuda.json,
#                              torch_cuda.json, targets.json, targets.md (every row, and issue 11's targets as ratios of
#                              this run), build.txt (the nvcc compile times).
#
# Environment: CUDA_HOME (default /usr/local/cuda), ARCH (default sm_90), JOBS (default: the core count);
# for bench: QUICK=1 (only the small shapes, each bench file's bench-smoke-filter), MIN_TIME (default 0.5 s).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build-gpu"
deps="$out/deps"
cuda=${CUDA_HOME:-/usr/local/cuda}
arch=${ARCH:-sm_90}

stage() {
    mkdir -p "$deps"
    for d in /usr/include/eigen3 /usr/include/doctest /usr/include/nlohmann; do
        [ -d "$d" ] || { echo "gpu_check: $d is missing; install libeigen3-dev doctest-dev nlohmann-json3-dev" >&2; exit 1; }
        cp -r "$d" "$deps/"
    done
    # For `bench`: Google Benchmark is a library, not headers only, so its shared object travels too, under its soname.
    local lib
    lib=$(ldconfig -p | sed -n 's|^[[:space:]]*\(libbenchmark\.so\.[^ ]*\) .*x86-64.* => \(.*\)$|\2|p' | head -1)
    if [ -d /usr/include/benchmark ] && [ -n "$lib" ]; then
        cp -r /usr/include/benchmark "$deps/"
        mkdir -p "$deps/lib"
        cp -L "$lib" "$deps/lib/$(basename "$lib")"
    else
        echo "gpu_check: no Google Benchmark here (libbenchmark-dev): 'run' will work, 'bench' will not" >&2
    fi
    echo "gpu_check: dependencies staged in $deps ($(du -sh "$deps" | cut -f1)); carry build-gpu/deps with the tree"
}

run() {
    [ -d "$deps/eigen3" ] || { echo "gpu_check: run 'tools/gpu_check.sh stage' first (no $deps/eigen3)" >&2; exit 1; }
    local nvcc="$cuda/bin/nvcc" obj="$out/obj" results="$out/results"
    mkdir -p "$obj" "$results"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$results/device.txt"
    "$nvcc" --version | tail -2 >> "$results/device.txt"
    cat "$results/device.txt"
    # -diag-suppress: Eigen's headers (the CPU backend, compiled in the same binary) warn under nvcc about
    # defaulted __host__ __device__ constructors and constexpr host calls; they are never called on the device.
    local flags=(-std=c++20 -O2 "-arch=$arch" -x cu -diag-suppress=20012,20015 -DMOONMOE_TEST_CUDA -I"$root/include" -I"$root/test"
                 -isystem "$deps/eigen3" -isystem "$deps"
                 "-DMOONMOE_TEST_SOURCE_DIR=\"$root/test\"" "-DMOONMOE_TEST_BINARY_DIR=\"$obj\"")
    # The files written once for every backend, as test/CMakeLists.txt picks them for the emulated build.
    local sources=($(grep -l MOONMOE_TEST_BACKENDS "$root"/test/unit/*.cpp))
    local objects=() pids=()
    "$nvcc" "${flags[@]}" -c "$root/test/support/doctest_main.cpp" -o "$obj/doctest_main.o"
    for s in "${sources[@]}"; do
        local o="$obj/$(basename "$s" .cpp).o"
        objects+=("$o")
        "$nvcc" "${flags[@]}" -c "$s" -o "$o" &
        pids+=($!)
        if [ ${#pids[@]} -ge "${JOBS:-$(nproc)}" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
    done
    for p in "${pids[@]}"; do wait "$p"; done
    "$nvcc" "-arch=$arch" "$obj/doctest_main.o" "${objects[@]}" -lcublas -o "$obj/cuda_tests"
    (cd "$obj" && ./cuda_tests --duration=true) 2>&1 | tee "$results/tests.txt"
    "$cuda/bin/compute-sanitizer" --tool memcheck --error-exitcode 1 "$obj/cuda_tests" \
        --test-case='*greedy decoding*,*dispatch*,*rmsnorm*' 2>&1 | tail -20 | tee "$results/sanitizer.txt"
    # The fast kernels (backend/cuda/fast/) against the portable path: test/nvcc/fast_kernels.cu, a program of its
    # own (it switches the kernels on and off itself), run, then under memcheck, and racecheck for the attention
    # kernels' shared-memory tiles. Writes build-gpu/results/fast_kernels.txt (the largest differences).
    "$nvcc" "${flags[@]}" -c "$root/test/nvcc/fast_kernels.cu" -o "$obj/fast_kernels.o"
    "$nvcc" "-arch=$arch" "$obj/fast_kernels.o" -lcublas -o "$obj/fast_kernels"
    "$obj/fast_kernels" 2>&1 | tee "$results/fast_kernels.txt"
    "$cuda/bin/compute-sanitizer" --tool memcheck --error-exitcode 1 "$obj/fast_kernels" 2>&1 | tail -20 \
        | tee -a "$results/sanitizer.txt"
    "$cuda/bin/compute-sanitizer" --tool racecheck --error-exitcode 1 "$obj/fast_kernels" --test-case='fast attention*' \
        2>&1 | tail -20 | tee -a "$results/sanitizer.txt"
    # NCCL and the parallel runtime on it (test/nvcc/nccl_run.cu): one rank on this GPU, every collective, then
    # Parallel<1, 1, 1> training through Pipeline and DistributedOptimizer over NCCL against one process.
    # Writes build-gpu/results/nccl.txt.
    if [ -e "$cuda/include/nccl.h" ] || [ -e /usr/include/nccl.h ]; then
        "$nvcc" "${flags[@]}" -c "$root/test/nvcc/nccl_run.cu" -o "$obj/nccl_run.o"
        "$nvcc" "-arch=$arch" "$obj/nccl_run.o" -lcublas -lnccl -o "$obj/nccl_run"
        "$obj/nccl_run" 2>&1 | tee "$results/nccl.txt"
    else
        echo "gpu_check: no nccl.h under $cuda/include or /usr/include: NCCL not run" | tee "$results/nccl.txt"
    fi
}

# The benchmarks (bench/SUITE.md, "On the GPU"): ours, PyTorch's when it is here, the targets.
bench() {
    [ -d "$deps/eigen3" ] && [ -d "$deps/benchmark" ] && [ -d "$deps/lib" ] ||
        { echo "gpu_check: run 'tools/gpu_check.sh stage' first (no $deps/eigen3, $deps/benchmark or $deps/lib)" >&2; exit 1; }
    local nvcc="$cuda/bin/nvcc" obj="$out/bench-obj" results="$out/results/bench"
    rm -rf "$results"
    mkdir -p "$obj" "$results/parts"
    local flags=(-std=c++20 -O2 "-arch=$arch" -x cu -diag-suppress=20012,20015 -DMOONMOE_BENCH_CUDA
                 -DMOONMOE_BENCH_COMBINED -I"$root/include" -isystem "$deps/eigen3" -isystem "$deps")
    # Every file of the suite (the ones built on bench/support/suite.hpp), one object each, and the shared main().
    local families=($(grep -l 'support/suite.hpp' "$root"/bench/*.cpp | xargs -n1 basename | sed 's/\.cpp$//'))
    local start=$SECONDS objects=("$obj/cuda_main.o") pids=()
    "$nvcc" "${flags[@]}" -c "$root/bench/support/cuda_main.cpp" -o "$obj/cuda_main.o"
    for f in "${families[@]}"; do
        objects+=("$obj/$f.o")
        "$nvcc" "${flags[@]}" -c "$root/bench/$f.cpp" -o "$obj/$f.o" &
        pids+=($!)
        if [ ${#pids[@]} -ge "${JOBS:-$(nproc)}" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
    done
    for p in "${pids[@]}"; do wait "$p"; done
    local lib
    lib=$(ls "$deps"/lib/libbenchmark.so.* | head -1)
    "$nvcc" "-arch=$arch" "${objects[@]}" -lcublas -Xlinker "$lib" -Xlinker -rpath -Xlinker "$deps/lib" -lpthread \
        -o "$obj/moonmoe_cuda_bench"
    echo "moonmoe_cuda_bench: ${#families[@]} families compiled and linked by nvcc in $((SECONDS - start)) s" \
         "with ${JOBS:-$(nproc)} jobs" | tee "$results/build.txt"

    # benchmark >= 1.8 wants a unit on --benchmark_min_time, 1.7 a bare number
    local min_time=${MIN_TIME:-0.5}
    "$obj/moonmoe_cuda_bench" --benchmark_list_tests --benchmark_min_time="${min_time}s" >/dev/null 2>&1 &&
        min_time="${min_time}s"
    local f prefix filter smoke
    for f in "${families[@]}"; do
        prefix=$f
        [ "$f" = gemm ] && prefix='(gemm|syrk)'  # gemm.cpp also times SYRK
        filter="^$prefix/"
        if [ "${QUICK:-0}" = 1 ]; then
            smoke=$(sed -n 's|^[[:space:]]*//[[:space:]]*bench-smoke-filter:[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$|\1|p' \
                    "$root/bench/$f.cpp" | head -1)
            filter="^$prefix/.*$smoke"
        fi
        echo "==== [$(date '+%T')] moonmoe_cuda_bench --benchmark_filter='$filter'" >&2
        # a family that fails (out of memory, a CUDA error) is reported and left out; the others still run
        "$obj/moonmoe_cuda_bench" --benchmark_filter="$filter" --benchmark_min_time="$min_time" \
            --benchmark_out="$results/parts/$f.json" --benchmark_out_format=json ||
            { echo "gpu_check: family $f failed (exit $?); left out of moonmoe_cuda.json" | tee -a "$results/failed.txt" >&2
              rm -f "$results/parts/$f.json"; }
    done
    python3 - "$results/moonmoe_cuda.json" "$results/parts" "${families[@]}" <<'PY'
import json, sys
out, parts, families = sys.argv[1], sys.argv[2], sys.argv[3:]
merged = {"context": None, "benchmarks": []}
for f in families:
    try:
        with open(f"{parts}/{f}.json") as fh:
            run = json.load(fh)
    except (OSError, ValueError):
        continue  # the family failed (gpu_check said so)
    merged["context"] = merged["context"] or run["context"]
    for b in run["benchmarks"]:
        b["family"] = f
        merged["benchmarks"].append(b)
with open(out, "w") as fh:
    json.dump(merged, fh, indent=1)
PY

    local torch_json=()
    if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        python3 "$root/bench/torch_suite.py" --device cuda --dtypes f32,bf16 --min-time "${MIN_TIME:-0.5}" \
            $([ "${QUICK:-0}" = 1 ] && echo --quick) --out "$results/torch_cuda.json" ||
            echo "gpu_check: bench/torch_suite.py --device cuda failed (exit $?)" | tee -a "$results/failed.txt" >&2
        [ -f "$results/torch_cuda.json" ] && torch_json=(--torch "$results/torch_cuda.json")
    else
        echo "gpu_check: PyTorch with CUDA (and transformers) is not importable on this machine: no PyTorch side," \
             "ours alone (the PyTorch targets read 'not measured')" | tee "$results/torch_absent.txt" >&2
    fi
    python3 "$root/bench/gpu_targets.py" --ours "$results/moonmoe_cuda.json" "${torch_json[@]}" \
        --markdown "$results/targets.md" --json "$results/targets.json"
    cat "$results/targets.md"
}

case "${1:-}" in
    stage) stage ;;
    run) run ;;
    bench) bench ;;
    *) echo "usage: tools/gpu_check.sh stage | run | bench" >&2; exit 2 ;;
esac
