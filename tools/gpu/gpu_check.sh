#!/usr/bin/env bash
# Build fastmetal with the CUDA backend on a machine with an NVIDIA GPU and check it: the whole
# test suite on cuda (every device-parametrised test on the GPU, the CUDA-specific and CPU-only
# files, and the build test with a statically linked libstdc++), then every kernel family
# under compute-sanitizer's memcheck, racecheck, synccheck and initcheck (racecheck is what
# proves the threadgroup/barrier logic of the .metal kernels on real hardware). Needs nvcc,
# cmake, pybind11, scikit-build-core, pytest, hypothesis, psutil and compute-sanitizer.
#
#   tools/gpu/gpu_check.sh [cuda-arch]      (default: native; CXX picks the host compiler)
#   FASTMETAL_BUILD_TESTS=0 tools/gpu/gpu_check.sh    skips the static-libstdc++ build test
set -uo pipefail
cd "$(dirname "$0")/../.."
arch=${1:-native}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
python3 -m pip install --no-build-isolation --no-deps -q . -Ccmake.define.FASTMETAL_CUDA=ON \
  -Ccmake.define.CMAKE_CUDA_ARCHITECTURES="$arch" -Cbuild-dir=/tmp/fastmetal-cuda-build || exit 1
python3 -c 'import fastmetal, sys; sys.exit(0 if "cuda" in fastmetal.devices() else
                                            "fastmetal sees no CUDA device")' || exit 1
status=0
echo "== the whole suite on cuda"
FASTMETAL_BUILD_TESTS=${FASTMETAL_BUILD_TESTS:-1} python3 -m pytest tests -q -p no:cacheprovider \
  --device cuda || status=1
python3 tools/gpu/gpu_kernel_tour.py --device cuda || status=1
for tool in memcheck racecheck synccheck initcheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool "$tool" --error-exitcode 9 python3 tools/gpu/gpu_kernel_tour.py --device cuda \
    > "/tmp/sanitizer-$tool.log" 2>&1
  rc=$?
  grep -E "SUMMARY|ALL OK|FAILURES|BAD" "/tmp/sanitizer-$tool.log" | tail -5
  [[ $rc -eq 0 ]] || status=1
done
exit $status
