#!/usr/bin/env bash
# tools/gpu_check.sh: the CUDA backend on a real GPU, built here and run there (README.md, "On a GPU").
#
#   tools/gpu_check.sh prepare   here, no GPU needed: nvcc-compiles for sm_90 (-O2 -lineinfo) everything a device run
#                                needs into build-gpu/ (at most 48 MiB, checked): the unit tests written for every
#                                backend, one executable per small group of test files; the fast kernels against
#                                the portable path (test/nvcc/fast_kernels.cu); the sticky-fault program
#                                (test/nvcc/sticky_fault.cu); NCCL with one rank (test/nvcc/nccl_run.cu); the CUDA
#                                benchmarks (moonmoe_cuda_bench); kimi_k2_1t_cuda and hf_generate_cuda. The
#                                executables travel compressed (bin.tar.xz), with a compressed copy of the header-only
#                                dependencies (deps.tar.xz) for a fallback compile, the unity sources of the test
#                                groups (units/) and manifest.tsv (every binary: role, sources, libraries, how it is
#                                run; the commit and the flags). Objects stay in build-gpu-work/ (not carried), and a
#                                binary whose inputs did not change is not compiled again.
#   tools/gpu_check.sh prepare --check
#                                the same compile and link of every binary, as a check that they build (ctest's
#                                gpu.prepare runs it): host code at -O0 and ptxas at -O1 (a unit of four test files
#                                took 149 s at -O2, 80 s so), into the same build-gpu-work/ and build-gpu/units/,
#                                nothing packed or size-checked (its binaries are built again by a plain prepare).
#   tools/gpu_check.sh device    on the GPU machine, from the carried build-gpu/: compiles nothing unless a binary will
#                                not load (then a parallel fallback build of just that one with the device's nvcc);
#                                finds cuBLAS, cuDNN and NCCL in the CUDA tree or in the Python wheels; then runs, in
#                                order of value, each step in its own process under its own timeout, never stopping at
#                                a failure, and skips an optional step that would not end within the budget
#                                (BUDGET_S, default 330 s; ONLY=<regex> runs just the steps whose names match, for a
#                                rerun after a fix): the fast kernels; every test group (the <cuda> cases), a
#                                failing one rerun at once with CUDA_LAUNCH_BLOCKING=1 under compute-sanitizer memcheck
#                                (its failing cases only) so the kernel and source line are named; a kernel that
#                                faults with tensors alive; the model-level groups again with every fast kernel on;
#                                NCCL with one rank; the two examples; racecheck and synccheck on the attention
#                                kernels; the quick benchmarks beside PyTorch on the same GPU when torch is there.
#                                Writes at most 6 files to $OUT (else build-gpu/results/): summary.md first (one
#                                screen: device, driver, commit, each step's result and seconds), then tests.log,
#                                kernels.log, sanitizer.log, programs.log, bench.log. Exit status 0 when every step
#                                that ran passed.
#   tools/gpu_check.sh bench     on the GPU machine: the whole benchmark suite from the prepared moonmoe_cuda_bench
#                                (one process per family), PyTorch beside it when importable, then bench/gpu_targets.py.
#                                Writes $OUT (else build-gpu/results/bench/). FILTER=<regex> runs only the rows it
#                                matches (ours in one process, PyTorch's the same), MIN_TIME each row's seconds.
#
# Environment: CUDA_HOME (default /usr/local/cuda), ARCH (sm_90), JOBS (the core count), GPU_BUILD (build-gpu),
# BUDGET_S (330), ONLY, and per step kind the timeouts TIMEOUT_KERNELS, TIMEOUT_TESTS, TIMEOUT_SANITIZE, TIMEOUT_PROGRAM,
# TIMEOUT_BENCH (seconds). test/gpu_check/self_test.sh runs `device` here over planted failures (ctest
# gpu_check.device_self_test).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${GPU_BUILD:-$root/build-gpu}
work=${GPU_WORK:-$root/build-gpu-work}
# CUDA_HOME, else the toolkit of the nvcc on PATH, else /usr/local/cuda
cuda=${CUDA_HOME:-$(p=$(command -v nvcc 2>/dev/null) && dirname "$(dirname "$(readlink -f "$p")")" || echo /usr/local/cuda)}
arch=${ARCH:-sm_90}
# The one option, read here once: `prepare --check` compiles the same code faster, as a check only (header); a device
# run gets -O2
check_only=0
if [ "${1:-}" = prepare ] && [ $# -gt 1 ]; then
    { [ $# -eq 2 ] && [ "$2" = --check ]; } || { echo "usage: tools/gpu_check.sh prepare [--check]" >&2; exit 2; }
    check_only=1
fi
optimize=(-O2 -lineinfo)
[ $check_only = 0 ] || optimize=(-O0 -Xptxas -O1)
jobs=${JOBS:-$(nproc)}
limit_mib=48

die() { echo "gpu_check: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------------------------
# What is built: the manifest. One line per binary, tab-separated:
#   name  role  units (';'-separated paths relative to the repository root)  libraries  arguments of a run
# role: tests (a unity group of test/unit files, run with --test-case='*<cuda>*'), program (a test/nvcc program with
# its own main), bench (moonmoe_cuda_bench), example. The flags of each role are in unit_flags below: prepare and the
# device's fallback build compile the same lines the same way.
# ---------------------------------------------------------------------------------------------------------------

# The test files written once for every backend in two kinds, `kernels` (backend_*, tensor_*: the primitives) and
# `model` (the modules, models, optimizer and runtime, which the device run repeats with the fast kernels on), each
# cut into balanced groups of at most 5 files: a crash loses one group, and one unity translation unit per group
# compiles the shared headers once (the whole prepare at 2 jobs: ten groups of at most four
# took 746 s, 1351 s of CPU; these five 568 s, 1019 s).
test_groups() {
    local f stem
    for f in $(grep -l MOONMOE_TEST_BACKENDS "$root"/test/unit/*.cpp | sort); do
        stem=$(basename "$f" .cpp)
        case $stem in backend_*|tensor_*) echo "kernels $stem" ;; *) echo "model $stem" ;; esac
    done | awk '{ kind[NR] = $1; stem[NR] = $2; n[$1]++ }
                END { for (i = 1; i <= NR; i++) {
                          p = kind[i]; k = int((n[p] + 4) / 5); size = int((n[p] + k - 1) / k)
                          print p int((seen[p]++) / size) + 1, stem[i] } }'
}

# cudnn-frontend's headers (PyPI's nvidia-cudnn-frontend, which cmake/install_deps.sh installs), for the cuDNN
# attention engine (include/moonmoe/backend/cuda/cudnn.hpp): CUDNN_FRONTEND_INCLUDE, else the Python's packages.
cudnn_frontend_include() {
    local d
    for d in "${CUDNN_FRONTEND_INCLUDE:-}" \
             "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)/include"; do
        [ -n "$d" ] && [ -f "$d/cudnn_frontend.h" ] && { echo "$d"; return 0; }
    done
    return 1
}

# The engine's translation unit: a shared unit, compiled once per build and linked into every binary.
engine_unit=test/nvcc/cudnn_engine.cu

write_units_and_manifest() {
    local manifest=$1 g stem
    # with cudnn-frontend every binary links the cuDNN engine; without it the bf16 attention runs the portable path
    local engine="" cudnn=""
    if cudnn_frontend_include > /dev/null; then engine=";$engine_unit" cudnn=" -lcudnn -lnvrtc"; fi
    mkdir -p "$build/units"
    local -A members=()
    while read -r g stem; do members[$g]+="$stem "; done < <(test_groups)
    {
        printf '# name\trole\tunits\tlibraries\targuments\n'
        for g in $(printf '%s\n' "${!members[@]}" | sort); do
            local unit="build-gpu/units/tests_$g.cu"
            {
                echo "// tools/gpu_check.sh: the test group '$g', one translation unit (generated)"
                echo "#include \"../../test/support/doctest_main.cpp\""
                for stem in ${members[$g]}; do echo "#include \"../../test/unit/$stem.cpp\""; done
            } > "$build/units/tests_$g.cu.new"
            # rewritten only when it changes, so an unchanged group is not compiled again
            if cmp -s "$build/units/tests_$g.cu.new" "$build/units/tests_$g.cu"; then rm "$build/units/tests_$g.cu.new"
            else mv "$build/units/tests_$g.cu.new" "$build/units/tests_$g.cu"; fi
            printf 'tests_%s\ttests\t%s\t-lcublas -lcublasLt%s\t--test-case=*<cuda>*\n' "$g" "$unit$engine" "$cudnn"
        done
        printf 'fast_kernels\tprogram\ttest/nvcc/fast_kernels.cu%s\t-lcublas -lcublasLt%s\t\n' "$engine" "$cudnn"
        [ -f "$root/test/nvcc/sticky_fault.cu" ] &&
            printf 'sticky_fault\tprogram\ttest/nvcc/sticky_fault.cu\t-lcublas -lcublasLt\t\n'
        printf 'nccl_run\tprogram\ttest/nvcc/nccl_run.cu\t-lcublas -lcublasLt -lnccl\t\n'
        local benches
        benches=$(grep -l 'support/suite.hpp' "$root"/bench/*.cpp | sort | sed "s|^$root/||" | tr '\n' ';')
        printf 'moonmoe_cuda_bench\tbench\t%sbench/support/cuda_main.cpp%s\t-lcublas -lcublasLt%s BENCHMARK\t\n' \
            "$benches" "$engine" "$cudnn"
        printf 'kimi_k2_1t_cuda\texample\texamples/kimi_k2_1t.cpp%s\t-lcublas -lcublasLt%s\t--backend cuda --tokens 256\n' \
            "$engine" "$cudnn"
        printf 'hf_generate_cuda\texample\texamples/hf_generate.cpp%s\t-lcublas -lcublasLt%s\t--backend cuda test/data/tiny_k2 8 3 17 42 99 7 , 5 , 11 12 13\n' \
            "$engine" "$cudnn"
    } > "$manifest"
}

# nvcc flags of a unit of `role`. $deps is the header-only dependencies' root (Eigen, doctest, nlohmann, benchmark).
# Test binaries read test/ and write scratch/ relative to their working directory (the device runs them in a folder
# holding both), so the same binary runs wherever the tree lands.
unit_flags() {
    local role=$1
    local flags=(-std=c++20 "${optimize[@]}" "-arch=$arch" -x cu -diag-suppress=20012,20015 -I"$root/include"
                 -isystem "$deps/eigen3" -isystem "$deps")
    [ -n "${CCBIN:-}" ] && flags+=(-ccbin "$CCBIN")
    local fe
    fe=$(cudnn_frontend_include) && flags+=(-isystem "$fe")
    case $role in
        tests|program) flags+=(-DMOONMOE_TEST_CUDA -I"$root/test" '-DMOONMOE_TEST_SOURCE_DIR="test"'
                               '-DMOONMOE_TEST_BINARY_DIR="scratch"') ;;
        bench) flags+=(-DMOONMOE_BENCH_CUDA -DMOONMOE_BENCH_COMBINED) ;;
        example) ;;
    esac
    printf '%s\n' "${flags[@]}"
}

# The files a binary's units can depend on: the library and the test, bench and example support, the units, and
# the files a generated unity unit includes.
inputs_of() {
    local u
    echo "$root/include" "$root/test/support" "$root/bench/support" "$root/examples"
    for u in "$@"; do
        echo "$root/$u"
        [[ $u == build-gpu/units/* ]] && sed -n 's|^#include "\.\./\.\./\(.*\)"$|'"$root"'/\1|p' "$root/$u"
    done
}

# True when binary $1 is newer than every file it can depend on (FORCE=1: never).
up_to_date() {
    local out=$1
    shift
    [ -x "$out" ] && [ "${FORCE:-0}" != 1 ] &&
        [ -z "$(find $(inputs_of "$@") -newer "$out" -type f -print -quit 2>/dev/null)" ]
}

# Where unit $2 of binary $1 compiles to: the engine unit is shared by every binary.
object_of() {
    if [ "$2" = "$engine_unit" ]; then echo "$obj/shared/cudnn_engine.o"
    else echo "$obj/$1/$(basename "${2%.*}").o"
    fi
}

# build_binaries <manifest> <nvcc> [name...]: builds the named binaries of the manifest (every one when none is
# named) into $bin: first every unit of every binary that is not up to date, $jobs at a time (objects in
# $obj/<name>/), then the links. Returns non-zero if any failed, after building all the others.
build_binaries() {
    local manifest=$1 nvcc=$2
    shift 2
    local want=" $* " name role units libs args u o start=$SECONDS running=0 failed=0
    local -a todo=() srcs=() flags=()
    local -A compiled=()
    while IFS=$'\t' read -r name role units libs args; do
        [[ -z $name || $name == \#* ]] && continue
        [ -n "${want// /}" ] && [[ $want != *" $name "* ]] && continue
        IFS=';' read -r -a srcs <<< "$units"
        if up_to_date "$bin/$name" "${srcs[@]}"; then echo "gpu_check: $name is up to date"; continue; fi
        todo+=("$name"$'\t'"$role"$'\t'"$units"$'\t'"$libs")
        mkdir -p "$obj/$name"
        rm -f "$obj/$name"/*.failed
        mapfile -t flags < <(unit_flags "$role")
        for u in "${srcs[@]}"; do
            o=$(object_of "$name" "$u")
            [ -n "${compiled[$o]:-}" ] && continue  # the shared engine unit: once per build
            compiled[$o]=1
            mkdir -p "$(dirname "$o")"
            rm -f "$o.failed"
            { "$nvcc" "${flags[@]}" -c "$root/$u" -o "$o" < /dev/null || touch "$o.failed"; } &
            running=$((running + 1))
            if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
        done
    done < "$manifest"
    wait
    local line l so
    local -a objects link
    for line in "${todo[@]}"; do
        IFS=$'\t' read -r name role units libs <<< "$line"
        IFS=';' read -r -a srcs <<< "$units"
        objects=()
        local bad=""
        for u in "${srcs[@]}"; do
            o=$(object_of "$name" "$u")
            objects+=("$o")
            [ -e "$o.failed" ] && bad+=" $(basename "${u%.*}")"
        done
        if [ -n "$bad" ]; then
            echo "gpu_check: compiling $name failed ($bad )" >&2
            failed=1
            continue
        fi
        link=()
        for l in $libs; do
            if [ "$l" = BENCHMARK ]; then  # Google Benchmark's library travels in bin/lib, found through the rpath
                so=$(ls "$deps"/lib/libbenchmark.so.* 2>/dev/null | head -1)
                [ -n "$so" ] || { echo "gpu_check: no libbenchmark.so under $deps/lib" >&2; failed=1; continue 2; }
                link+=(-Xlinker "$so" -Xlinker -rpath -Xlinker '$ORIGIN/lib' -lpthread)
            else
                link+=("$l")
            fi
        done
        if "$nvcc" "-arch=$arch" ${CCBIN:+-ccbin "$CCBIN"} "${objects[@]}" "${link[@]}" -o "$bin/$name" < /dev/null; then
            echo "gpu_check: built $name ($role, ${#srcs[@]} unit(s))"
        else
            echo "gpu_check: linking $name failed" >&2
            failed=1
        fi
    done
    echo "gpu_check: ${#todo[@]} binaries compiled and linked in $((SECONDS - start)) s with $jobs jobs"
    return $failed
}

# ---------------------------------------------------------------------------------------------------------------
prepare() {
    local nvcc="$cuda/bin/nvcc"
    [ -x "$nvcc" ] || die "no nvcc at $nvcc (set CUDA_HOME)"
    deps="$work/deps" obj="$work/obj" bin="$work/bin"
    mkdir -p "$build" "$deps" "$obj" "$bin/lib"
    local d
    for d in /usr/include/eigen3 /usr/include/doctest /usr/include/nlohmann /usr/include/benchmark; do
        [ -d "$d" ] || die "$d is missing: bash cmake/install_deps.sh"
        [ -d "$deps/$(basename "$d")" ] || cp -r "$d" "$deps/"
    done
    # Google Benchmark is a library: its shared object travels beside the binaries, under its soname.
    local lib
    lib=$(ldconfig -p | sed -n 's|^[[:space:]]*\(libbenchmark\.so\.[^ ]*\) .*x86-64.* => \(.*\)$|\2|p' | head -1)
    [ -n "$lib" ] || die "no libbenchmark.so (libbenchmark-dev)"
    mkdir -p "$deps/lib"
    cp -L "$lib" "$deps/lib/$(basename "$lib")"
    cp -L "$lib" "$bin/lib/$(basename "$lib")"

    # Binaries built with other optimisation flags (prepare against prepare --check) are built again
    if [ "$(cat "$work/optimize" 2>/dev/null)" != "${optimize[*]}" ]; then
        find "$bin" -maxdepth 1 -type f -delete
        echo "${optimize[*]}" > "$work/optimize"
    fi
    local manifest="$build/manifest.tsv"
    write_units_and_manifest "$manifest.body"
    local start=$SECONDS name
    build_binaries "$manifest.body" "$nvcc" || { rm -f "$manifest.body"; die "the build failed (above)"; }
    if [ "$check_only" = 1 ]; then
        rm -f "$manifest.body"
        echo "gpu_check: every binary compiled and linked (--check: ${optimize[*]}, in $work; nothing to carry)"
        return 0
    fi

    # What travels: the binaries and the dependencies, compressed; the manifest says what is in them.
    local names
    names=$(awk -F'\t' '!/^#/ { print $1 }' "$manifest.body")
    tar -C "$bin" -cf - $names lib | xz -T"$jobs" -6 > "$build/bin.tar.xz"
    tar -C "$work" -cf - deps | xz -T"$jobs" -6 > "$build/deps.tar.xz"
    {
        echo "# build-gpu/: what tools/gpu_check.sh prepare built, for tools/gpu_check.sh device (README.md, \"On a GPU\")"
        echo "# commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes'), built $(date -u '+%F %T UTC')"
        echo "# $("$nvcc" --version | tail -1), $arch, flags: $(unit_flags tests | tr '\n' ' ')"
        echo "# bin.tar.xz: $(du -k "$build/bin.tar.xz" | cut -f1) KiB, the executables below and lib/$(basename "$lib")"
        echo "# deps.tar.xz: $(du -k "$build/deps.tar.xz" | cut -f1) KiB, Eigen, doctest, nlohmann-json and Google Benchmark headers (fallback builds)"
        echo "# units/: the test groups' translation units; test data is read from the tree's test/data"
        local fe
        if fe=$(cudnn_frontend_include); then
            echo "# cuDNN attention engine ($engine_unit): linked into every binary, cudnn-frontend headers $fe"
        else
            echo "# cuDNN attention engine: not linked (no cudnn-frontend headers: pip install nvidia-cudnn-frontend)"
        fi
        for name in $names; do echo "# $name: $(du -k "$bin/$name" | cut -f1) KiB uncompressed"; done
        cat "$manifest.body"
    } > "$manifest"
    rm -f "$manifest.body"
    local total
    total=$(du -sm "$build" | cut -f1)
    echo "gpu_check: prepared $build ($(du -sh "$build" | cut -f1), $(echo "$names" | wc -w) binaries) in $((SECONDS - start)) s"
    [ "$total" -le "$limit_mib" ] || die "$build is $total MiB, more than the $limit_mib MiB that may travel"
}

# ---------------------------------------------------------------------------------------------------------------
# device: results, steps, the summary
# ---------------------------------------------------------------------------------------------------------------
budget=${BUDGET_S:-330}
results=""
rows=()
any_failed=0

summary() {
    {
        echo "# GPU check, $(date -u '+%F %T UTC')"
        echo
        cat "$x/device.md" 2>/dev/null
        echo
        echo "| step | result | seconds | note |"
        echo "|---|---|---:|---|"
        printf '%s\n' "${rows[@]}"
        echo
        echo "Total $SECONDS s of a $budget s budget. Logs: tests.log, kernels.log, sanitizer.log, programs.log, bench.log."
    } > "$results/summary.md"
}

row() {  # step result seconds note
    rows+=("| $1 | $2 | $3 | $4 |")
    case $2 in pass|skipped*) ;; *) any_failed=1 ;; esac
    summary
    echo "==== [$(date '+%T')] $1: $2 (${3} s) $4"
}

# Runs "$@" under `timeout`, appending to log $1; sets step_rc, step_secs and step_result (pass, fail (exit N),
# timeout, crash (signal S)). Never exits the script.
run_step() {
    local log=$1 limit=$2
    shift 2
    local start=$SECONDS
    echo "==== [$(date '+%T')] $* (timeout ${limit} s)" >> "$log"
    timeout -k 10 "$limit" "$@" >> "$log" 2>&1 < /dev/null
    step_rc=$?
    step_secs=$((SECONDS - start))
    if [ $step_rc = 0 ]; then step_result=pass
    elif [ $step_rc = 124 ] || [ $step_rc = 137 ]; then step_result="timeout"
    elif [ $step_rc -gt 128 ]; then step_result="crash (signal $((step_rc - 128)))"
    else step_result="fail (exit $step_rc)"
    fi
    echo "==== exit $step_rc after ${step_secs} s" >> "$log"
}

# Whether to run a step of up to `limit` seconds, and for how long: sets step_limit to `limit`, or to what is left of
# the budget when that is less, so the run never outlasts the budget; a step left less than 30 s (or than `limit`,
# if smaller) is skipped and recorded as such. Steps whose names do not match ONLY (when set) are skipped silently.
fits() {
    local name=$1 limit=$2 left=$((budget - SECONDS))
    if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then return 1; fi
    step_limit=$(( limit < left ? limit : left ))
    if [ "$step_limit" -lt $(( limit < 30 ? limit : 30 )) ]; then
        row "$name" "skipped: budget" 0 "$left s of the $budget s budget left"
        return 1
    fi
}

find_sanitizer() {
    local c
    for c in "$(command -v compute-sanitizer 2>/dev/null)" "$cuda/bin/compute-sanitizer" \
             "$cuda/compute-sanitizer/compute-sanitizer" /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
        [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
    done
}

# cuBLAS, cuDNN (and the NVRTC its frontend calls) and NCCL: the CUDA tree first, then the Python wheels (PyTorch's nvidia-* packages).
find_libraries() {
    local dirs=() want lib d found
    local wheel_dirs
    wheel_dirs=$(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")])
for r in sorted(roots):
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu*", "lib")):
        print(d)
PY
)
    for want in libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcudnn.so.9 libnvrtc.so.13; do
        found=""
        for d in "$cuda/lib64" "$cuda/lib" "$cuda/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu /usr/local/lib \
                 $wheel_dirs; do
            if [ -e "$d/$want" ]; then found=$d; break; fi
        done
        if [ -n "$found" ]; then
            echo "- $want: $found"
            [[ " ${dirs[*]} " == *" $found "* ]] || dirs+=("$found")
        else
            echo "- $want: not found"
        fi
    done
    local joined
    joined=$(IFS=:; echo "${dirs[*]}")
    export LD_LIBRARY_PATH="$joined${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# The names of the test cases a doctest log reports as failed or crashed, as a --test-case filter (',' separates
# filters, so a ',' in a name becomes the one-character wildcard '?'). doctest prints a case's "TEST CASE:" header for
# its MESSAGEs too: a case counts only when its block (up to the next ===== line, doctest's or compute-sanitizer's)
# holds doctest's "ERROR:" (a failed check, an unexpected exception) or "FATAL ERROR:" (a crash), or when the log
# ends inside it (a process killed before doctest could say so).
failed_cases() {
    awk '/^=====/ { name = "" }
         /^TEST CASE:/ { name = $0; sub(/^TEST CASE: */, "", name); sub(/[[:space:]]*$/, "", name) }
         name != "" && /(^|: )(FATAL )?ERROR:/ { print name; name = "" }
         END { if (name != "") print name }' "$1" | sed 's/,/?/g' | sort -u | paste -sd, -
}

# A filter of failed cases (failed_cases) as a short note: the first two names, each cut to 60 characters, and how
# many more, so the summary stays one screen when a whole group fails.
brief_cases() {
    [ -z "$1" ] && return
    local -a all
    IFS=',' read -r -a all <<< "$1"
    local c sep=""
    for c in "${all[@]:0:2}"; do printf '%s%s' "$sep" "${c:0:60}$([ ${#c} -gt 60 ] && echo ...)"; sep="; "; done
    [ ${#all[@]} -gt 2 ] && printf ' (+%d more)' $((${#all[@]} - 2))
    return 0
}

# "12 passed, 1 failed" from a doctest log's summary line (empty when it printed none).
doctest_counts() {
    sed -n 's/^\[doctest\] test cases: *\([0-9]*\) *| *\([0-9]*\) passed *| *\([0-9]*\) failed.*/\2 passed, \3 failed/p' "$1" | tail -1
}

# run_group <group> <step name> <log to append to> [VAR=value...]: one test group's process (its manifest arguments,
# the variables in its environment) as a step; its own log is $group_log; a run in which no case ran fails.
run_group() {
    local g=$1 name=$2 dest=$3
    shift 3
    group_log="$x/$g.${#rows[@]}.log"
    : > "$group_log"
    run_step "$group_log" "$step_limit" env "$@" "$x/bin/$g" ${args_of[$g]}
    cat "$group_log" >> "$dest"
    local counts failed
    counts=$(doctest_counts "$group_log")
    failed=$(failed_cases "$group_log")
    [ "$step_result" = pass ] && [ "$counts" = "0 passed, 0 failed" ] && step_result="fail (no case ran)"
    failed=$(brief_cases "$failed")
    row "$name" "$step_result" "$step_secs" "${counts}${counts:+${failed:+; }}${failed:+failed: $failed}"
}

device() {
    [ -f "$build/manifest.tsv" ] || die "no $build/manifest.tsv: run 'tools/gpu_check.sh prepare' here and carry build-gpu"
    results=${OUT:-$build/results}
    mkdir -p "$results"
    rm -f "$results"/{summary.md,tests.log,kernels.log,sanitizer.log,programs.log,bench.log}
    local x=${GPU_RUN_DIR:-${TMPDIR:-/tmp}/moonmoe-gpu}
    rm -rf "$x"
    mkdir -p "$x/bin" "$x/run/scratch"
    ln -s "$root/test" "$x/run/test"
    # The device information comes first: whatever fails later, the summary says what ran where.
    local gpu=no
    {
        # the binaries' commit is prepare's (the manifest); the device's copy of the tree may report another HEAD
        echo "- binaries: $(sed -n 2p "$build/manifest.tsv" | sed 's/^# //') (tools/gpu_check.sh prepare); the tree they run against: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo 'no git here')"
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            gpu=yes
            echo "- device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1) (name, memory, driver)"
        else
            echo "- device: no GPU (nvidia-smi absent or failing): the GPU-only steps are skipped"
        fi
        [ -x "$cuda/bin/nvcc" ] && echo "- nvcc: $("$cuda/bin/nvcc" --version | tail -1)"
        find_libraries  # exports LD_LIBRARY_PATH: a { } group runs in this shell, not a subshell
    } > "$x/device.md"
    local sanitizer=""
    [ $gpu = yes ] && sanitizer=$(find_sanitizer)
    echo "- compute-sanitizer: ${sanitizer:-not used}" >> "$x/device.md"
    summary

    # Unpack; a binary that does not load (a library missing or of another version) is rebuilt here, in parallel.
    local start=$SECONDS
    tar -C "$x/bin" -xJf "$build/bin.tar.xz" 2>> "$results/programs.log" ||
        row "unpack" "fail" $((SECONDS - start)) "bin.tar.xz did not unpack"
    local -A role_of=() units_of=() libs_of=() args_of=()
    local names=() name role units libs args
    while IFS=$'\t' read -r name role units libs args; do
        [[ -z $name || $name == \#* ]] && continue
        names+=("$name"); role_of[$name]=$role; units_of[$name]=$units; libs_of[$name]=$libs; args_of[$name]=$args
    done < "$build/manifest.tsv"
    for name in "${names[@]}"; do
        local missing=""
        if [ ! -x "$x/bin/$name" ]; then missing="not in bin.tar.xz"
        else missing=$(ldd "$x/bin/$name" 2>/dev/null | awk '/not found/ { print $1 }' | paste -sd' ' -)
        fi
        [ -z "$missing" ] && continue
        local t0=$SECONDS
        if [ -x "$cuda/bin/nvcc" ]; then
            [ -d "$x/deps" ] || tar -C "$x" -xJf "$build/deps.tar.xz"
            (deps="$x/deps" obj="$x/obj" bin="$x/bin" FORCE=1 jobs=$(nproc) \
                build_binaries "$build/manifest.tsv" "$cuda/bin/nvcc" "$name") >> "$results/programs.log" 2>&1
            if [ $? = 0 ] && ! ldd "$x/bin/$name" | grep -q 'not found'; then
                row "rebuild $name" pass $((SECONDS - t0)) "did not load ($missing): rebuilt with this machine's nvcc"
            else
                row "rebuild $name" fail $((SECONDS - t0)) "did not load ($missing); the rebuild failed (programs.log)"
            fi
        else
            row "rebuild $name" fail 0 "did not load ($missing) and there is no nvcc here"
        fi
    done

    local t_kernels=${TIMEOUT_KERNELS:-120} t_tests=${TIMEOUT_TESTS:-150} t_san=${TIMEOUT_SANITIZE:-180}
    local t_prog=${TIMEOUT_PROGRAM:-120} t_bench=${TIMEOUT_BENCH:-150}
    cd "$x/run" || die "no $x/run"
    has() { [ -n "${role_of[$1]:-}" ]; }
    names_of_role() { local n; for n in "${names[@]}"; do [ "${role_of[$n]}" = "$1" ] && echo "$n"; done; }

    # 1. The fast kernels against the portable path.
    if has fast_kernels && fits "fast kernels vs portable" "$t_kernels"; then
        run_step "$results/kernels.log" "$step_limit" "$x/bin/fast_kernels"
        row "fast kernels vs portable" "$step_result" "$step_secs" "kernels.log"
    fi

    # 2. Every test group, its <cuda> cases, each its own process; a failure is rerun under memcheck at once.
    local g
    for g in $(names_of_role tests); do
        fits "tests: $g" "$t_tests" || continue
        run_group "$g" "tests: $g" "$results/tests.log"
        [ "$step_result" = pass ] && continue
        local cases
        cases=$(failed_cases "$group_log")
        if [ -z "$sanitizer" ]; then
            row "memcheck: $g" "skipped: no sanitizer" 0 ""
        elif fits "memcheck: $g" "$t_san"; then
            local log="$group_log.memcheck"
            : > "$log"
            run_step "$log" "$step_limit" env CUDA_LAUNCH_BLOCKING=1 "$sanitizer" --tool memcheck --error-exitcode 99 \
                --show-backtrace device "$x/bin/$g" "--test-case=${cases:-*<cuda>*}"
            cat "$log" >> "$results/sanitizer.log"
            # the sanitizer's first report names the access, the kernel and (with -lineinfo) the source line
            local named
            named=$(grep -m2 -E '^========= (Invalid|Program hit|Error|    at )' "$log" | sed 's/^========= *//' |
                    paste -sd' ' - | cut -c1-160)
            row "memcheck: $g" "$step_result" "$step_secs" "${named:-no report, see sanitizer.log}"
        fi
    done

    # 3. A kernel that faults while tensors are alive: the process must unwind and report, not terminate.
    if has sticky_fault && fits "sticky fault" "$t_prog"; then
        run_step "$results/kernels.log" "$step_limit" "$x/bin/sticky_fault"
        row "sticky fault" "$step_result" "$step_secs" "kernels.log"
    fi

    # 4. The model-level groups again with every fast kernel on.
    for g in $(names_of_role tests); do
        [[ $g == tests_model* ]] || continue
        fits "tests, fast kernels on: $g" "$t_tests" || continue
        run_group "$g" "tests, fast kernels on: $g" "$results/kernels.log" MOONMOE_CUDA_FAST_KERNELS=all
    done

    # 5. NCCL with one rank, then the examples.
    if has nccl_run && fits "nccl, one rank" "$t_prog"; then
        run_step "$results/programs.log" "$step_limit" "$x/bin/nccl_run"
        row "nccl, one rank" "$step_result" "$step_secs" "programs.log"
    fi
    for name in $(names_of_role example); do
        fits "example: $name" "$t_prog" || continue
        run_step "$results/programs.log" "$step_limit" "$x/bin/$name" ${args_of[$name]}
        row "example: $name" "$step_result" "$step_secs" "programs.log"
    done

    # 6. racecheck and synccheck on the attention kernels' shared-memory tiles.
    if has fast_kernels; then
        local tool
        for tool in racecheck synccheck; do
            if [ -z "$sanitizer" ]; then row "$tool: fast attention" "skipped: no sanitizer" 0 ""; continue; fi
            fits "$tool: fast attention" "$t_san" || continue
            run_step "$results/sanitizer.log" "$step_limit" "$sanitizer" --tool "$tool" --error-exitcode 99 \
                "$x/bin/fast_kernels" '--test-case=fast attention*'
            row "$tool: fast attention" "$step_result" "$step_secs" "sanitizer.log"
        done
    fi

    # 7. The quick benchmarks, and PyTorch's on the same GPU when it is importable.
    for name in $(names_of_role bench); do
        fits "bench: quick" "$t_bench" || continue
        local filter
        filter=$(quick_filter)
        run_step "$results/bench.log" "$step_limit" "$x/bin/$name" "--benchmark_filter=$filter" \
            "--benchmark_min_time=$(min_time_arg "$x/bin/$name" 0.1)" --benchmark_out="$x/moonmoe_cuda.json" \
            --benchmark_out_format=json
        row "bench: quick" "$step_result" "$step_secs" "bench.log"
        if [ $gpu = yes ] && python3 -c 'import torch, transformers; assert torch.cuda.is_available()' >/dev/null 2>&1; then
            if fits "bench: PyTorch quick" "$t_bench"; then
                run_step "$results/bench.log" "$step_limit" python3 "$root/bench/torch_suite.py" --device cuda \
                    --dtypes f32,bf16 --quick --min-time 0.1 --out "$x/torch_cuda.json"
                row "bench: PyTorch quick" "$step_result" "$step_secs" "bench.log"
            fi
        else
            row "bench: PyTorch quick" "skipped: no torch with CUDA" 0 ""
        fi
        if [ -s "$x/moonmoe_cuda.json" ]; then
            local torch_args=()
            [ -s "$x/torch_cuda.json" ] && torch_args=(--torch "$x/torch_cuda.json")
            python3 "$root/bench/gpu_targets.py" --ours "$x/moonmoe_cuda.json" "${torch_args[@]}" \
                --markdown "$x/targets.md" >> "$results/bench.log" 2>&1 && cat "$x/targets.md" >> "$results/bench.log"
        fi
    done

    summary
    echo "gpu_check: results in $results (summary.md first)"
    cat "$results/summary.md"
    return $any_failed
}

# Google Benchmark >= 1.8 wants a unit on --benchmark_min_time ("0.5s"), 1.7 a bare number.
min_time_arg() {
    if "$1" --benchmark_list_tests "--benchmark_min_time=${2}s" > /dev/null 2>&1; then echo "${2}s"; else echo "$2"; fi
}

# A bench file's `// bench-smoke-filter:` (its small shapes), without a leading '^'.
smoke_filter() {
    local smoke
    smoke=$(sed -n 's|^[[:space:]]*//[[:space:]]*bench-smoke-filter:[[:space:]]*\(.*[^[:space:]]\)[[:space:]]*$|\1|p' "$1" | head -1)
    echo "${smoke#^}"
}

# Every bench family's smoke filter, as one regex over the whole binary.
quick_filter() {
    local f prefix parts=()
    for f in $(grep -l 'support/suite.hpp' "$root"/bench/*.cpp | sort); do
        prefix=$(basename "$f" .cpp)
        [ "$prefix" = gemm ] && prefix='(gemm|syrk)'
        parts+=("^$prefix/.*$(smoke_filter "$f")")
    done
    (IFS='|'; echo "${parts[*]}")
}

# ---------------------------------------------------------------------------------------------------------------
bench() {
    [ -f "$build/bin.tar.xz" ] || die "no $build/bin.tar.xz: run 'tools/gpu_check.sh prepare' and carry build-gpu"
    local x=${GPU_RUN_DIR:-${TMPDIR:-/tmp}/moonmoe-gpu} out=${OUT:-$build/results/bench}
    mkdir -p "$x/bin" "$out/parts"
    tar -C "$x/bin" -xJf "$build/bin.tar.xz" moonmoe_cuda_bench lib || die "no moonmoe_cuda_bench in bin.tar.xz"
    find_libraries
    local min_time=${MIN_TIME:-0.5} f prefix families=()
    for f in $(grep -l 'support/suite.hpp' "$root"/bench/*.cpp | sort); do families+=("$(basename "$f" .cpp)"); done
    # FILTER=<regex>: just the rows it matches, ours in one process and PyTorch's (a targeted rerun)
    [ -n "${FILTER:-}" ] && families=(selected)
    for f in "${families[@]}"; do
        prefix=$f
        [ "$f" = gemm ] && prefix='(gemm|syrk)'
        local filter="^$prefix/"
        [ "${QUICK:-0}" = 1 ] && filter="^$prefix/.*$(smoke_filter "$root/bench/$f.cpp")"
        [ "$f" = selected ] && filter=$FILTER
        echo "==== [$(date '+%T')] moonmoe_cuda_bench --benchmark_filter='$filter'" >&2
        # a family that fails (out of memory, a CUDA error) is reported and left out; the others still run
        "$x/bin/moonmoe_cuda_bench" --benchmark_filter="$filter" \
            "--benchmark_min_time=$(min_time_arg "$x/bin/moonmoe_cuda_bench" "$min_time")" \
            --benchmark_out="$out/parts/$f.json" --benchmark_out_format=json ||
            { echo "gpu_check: family $f failed (exit $?)" | tee -a "$out/failed.txt" >&2; rm -f "$out/parts/$f.json"; }
    done
    python3 - "$out/moonmoe_cuda.json" "$out/parts" "${families[@]}" <<'PY'
import json, sys
out, parts, families = sys.argv[1], sys.argv[2], sys.argv[3:]
merged = {"context": None, "benchmarks": []}
for f in families:
    try:
        with open(f"{parts}/{f}.json") as fh:
            run = json.load(fh)
    except (OSError, ValueError):
        continue  # the family failed (said above)
    merged["context"] = merged["context"] or run["context"]
    for b in run["benchmarks"]:
        b["family"] = f
        merged["benchmarks"].append(b)
with open(out, "w") as fh:
    json.dump(merged, fh, indent=1)
PY
    local torch_json=()
    if python3 -c 'import torch, transformers; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        python3 "$root/bench/torch_suite.py" --device cuda --dtypes f32,bf16 --min-time "$min_time" \
            ${FILTER:+--filter "$FILTER"} --out "$out/torch_cuda.json" ||
            echo "gpu_check: bench/torch_suite.py failed (exit $?)" >&2
        [ -f "$out/torch_cuda.json" ] && torch_json=(--torch "$out/torch_cuda.json")
    fi
    python3 "$root/bench/gpu_targets.py" --ours "$out/moonmoe_cuda.json" "${torch_json[@]}" \
        --markdown "$out/targets.md" --json "$out/targets.json"
    cat "$out/targets.md"
}

case "${1:-}" in
    prepare) prepare ;;
    device) device ;;
    bench) bench ;;
    *) echo "usage: tools/gpu_check.sh prepare [--check] | device | bench" >&2; exit 2 ;;
esac
