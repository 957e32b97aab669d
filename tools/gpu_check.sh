#!/usr/bin/env bash
# Build fastmetal with the CUDA backend on a machine with an NVIDIA GPU and check it: the GPU
# tests, then every kernel family under compute-sanitizer's memcheck, racecheck and synccheck
# (racecheck is what proves the threadgroup/barrier logic of the .metal kernels on real
# hardware). Needs nvcc, pybind11, scikit-build-core, pytest and compute-sanitizer.
#
#   tools/gpu_check.sh [cuda-arch]      (default: native)
set -uo pipefail
cd "$(dirname "$0")/.."
arch=${1:-native}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
python3 -m pip install --no-build-isolation --no-deps -q . -Ccmake.define.FASTMETAL_CUDA=ON \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" -Cbuild-dir=/tmp/fastmetal-cuda-build || exit 1
status=0
python3 -m pytest tests/test_cuda.py -q -p no:cacheprovider -o addopts= -W ignore::DeprecationWarning || status=1
python3 tools/gpu_kernel_tour.py --device cuda || status=1
for tool in memcheck racecheck synccheck initcheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 9 python3 tools/gpu_kernel_tour.py --device cuda \
    > "/tmp/sanitizer-$tool.log" 2>&1
  rc=$?
  grep -E "SUMMARY|ALL OK|FAILURES|BAD" "/tmp/sanitizer-$tool.log" | tail -5
  [[ $rc -eq 0 ]] || status=1
done
exit $status
