#!/usr/bin/env bash
# tools/gpu_check.sh: builds and runs the CUDA backend's tests on a machine with an NVIDIA Hopper GPU (sm_90).
#
#   tools/gpu_check.sh stage   on a machine with the packages (Debian's Eigen, doctest, nlohmann-json): copies
#                              those header-only dependencies into build-gpu/deps, so the tree can travel to a GPU
#                              machine that has the CUDA toolkit but no package registry
#   tools/gpu_check.sh run     on the GPU machine: builds the unit tests written for every backend (test/unit/*.cpp naming MOONMOE_TEST_BACKENDS) with nvcc
#                              into one doctest binary (the same tests the emulated build runs, now on the real
#                              backend: every primitive against double loops, the transformers goldens, greedy
#                              decoding, MuonClip steps against the CPU), runs it, then runs a short part of it under
#                              compute-sanitizer (memcheck); then builds and runs test/nvcc/fast_kernels.cu (the
#                              fast kernels against the portable path) and sanitizes it (memcheck, racecheck).
#                              Writes build-gpu/results/{tests,fast_kernels,sanitizer,device}.txt.
#
# Environment: CUDA_HOME (default /usr/local/cuda), ARCH (default sm_90), JOBS (default: the core count).
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
}

case "${1:-}" in
    stage) stage ;;
    run) run ;;
    *) echo "usage: tools/gpu_check.sh stage | run" >&2; exit 2 ;;
esac
