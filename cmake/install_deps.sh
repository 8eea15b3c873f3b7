#!/usr/bin/env bash
# Installs the Debian packages moonmoe's build, tests, examples and benchmarks need.
# A quick no-op (no apt-get update) when they are all installed already.
# --fuzz adds what fuzz/run.sh needs: Clang 19, its runtime libraries (libFuzzer, ASan, UBSan) and
# llvm-symbolizer (stack traces with names and lines).
# --clang adds Clang 19 with its OpenMP runtime, to build and test with clang++-19 (Debian 12's default clang 14
# cannot compile moonmoe: README.md, "Supported compilers").
set -euo pipefail

packages=(
  cmake g++ make
  libeigen3-dev nlohmann-json3-dev
  doctest-dev libbenchmark-dev
  libopenblas-dev libopenmpi-dev openmpi-bin
  libdnnl-dev ocl-icd-opencl-dev  # Debian's oneDNN CMake package finds OpenCL (its GPU runtime) as it loads
  libcairo2-dev pkgconf           # the examples' plots (examples/support/plot.hpp), found through pkg-config
  clang-format-19                 # tools/format.sh: the style of .clang-format (ctest format.check)
  time
)
case "${1:-}" in
  "") ;;
  --fuzz) packages+=(clang-19 libclang-rt-19-dev llvm-19) ;;
  --clang) packages+=(clang-19 libomp-19-dev) ;;
  *) echo "usage: bash cmake/install_deps.sh [--fuzz | --clang]" >&2; exit 2 ;;
esac

# cudnn-frontend's C++ headers (PyPI's nvidia-cudnn-frontend, header-only; no dependencies needed for them), for the
# cuDNN attention engine of the CUDA backend (include/moonmoe/backend/cuda/cudnn.hpp) that tools/gpu_check.sh prepare
# compiles: where nvcc is installed and they are not. Without them the GPU binaries run the portable attention.
cudnn_frontend() {
  command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  command -v python3 >/dev/null 2>&1 || return 0
  local site
  site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null) || return 0
  [ -f "$site/include/cudnn_frontend.h" ] && return 0
  echo "install_deps.sh: installing nvidia-cudnn-frontend (pip, headers only)"
  python3 -m pip install -q --no-deps nvidia-cudnn-frontend ||
    echo "install_deps.sh: nvidia-cudnn-frontend could not be installed; the GPU binaries will not link the cuDNN engine" >&2
}
cudnn_frontend

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install_deps.sh: not a Debian/Ubuntu system (no dpkg-query); install these yourself:" >&2
  echo "  ${packages[*]}" >&2
  exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if (( ${#missing[@]} == 0 )); then
  echo "install_deps.sh: all ${#packages[@]} packages already installed"
  exit 0
fi

if (( EUID == 0 )); then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "install_deps.sh: need root or sudo to install: ${missing[*]}" >&2
  exit 1
fi

echo "install_deps.sh: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps.sh: installed ${missing[*]}"
