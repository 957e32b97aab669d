#!/usr/bin/env bash
# One GPU-machine call for the matmul work: build with CUDA, the matmul tests
# on cuda and cpu, `bench matmul` on cuda (and --sweep of every tile and split), then the
# CPU part pinned to two cores (taskset -c 0,1) on AVX-512 and AVX2. Logs go to $OUT.
#   tools/gpu/matmul_gpu_bench.sh [parts...]     parts: build test bench sweep sass cpu (default: all),
#                                            buildcpu (CPU-only build, for cpu alone)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
parts=${*:-build test bench sweep sass cpu}
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=16
has() { [[ " $parts " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
if has build; then
  stamp build
  python3 -m pip install --no-build-isolation --no-deps -q . -Ccmake.define.FASTMETAL_CUDA=ON \
    -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 -Cbuild-dir=/tmp/fm-build > "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
fi
if has buildcpu; then  # the CPU alone (base and AVX-512 kernels): for a CPU-only re-measure
  stamp buildcpu
  python3 -m pip install --no-build-isolation --no-deps -q . -Ccmake.define.FASTMETAL_CUDA=OFF \
    "-Ccmake.define.FASTMETAL_CPU_ISAS=base;avx512" -Cbuild-dir=/tmp/fm-build-cpu \
    > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
fi
cd /tmp  # the installed package, not the checkout's python/ folder
nvidia-smi -L; lscpu | grep "Model name"
if has test; then
  stamp test
  python3 -m pytest "$OLDPWD/tests/test_matmul.py" "$OLDPWD/tests/test_nn_linear.py" -q -x -p no:cacheprovider \
    --device cuda --device cpu 2>&1 | tail -5
fi
if has bench; then
  stamp bench
  python3 -m fastmetal bench matmul --device cuda 2>&1 | tee "$OUT/bench_cuda.txt"
fi
if has sweep; then
  stamp sweep
  python3 -m fastmetal bench matmul --device cuda --sweep --quick ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep_cuda.txt"
fi
if has sass; then  # the matmul kernels' machine code, for reading here
  obj=$(find /tmp/fm-build -name 'cuda_entries_matmul.cu.o' | head -1)
  cuobjdump -sass "$obj" | gzip > "$OUT/matmul_sass.txt.gz"
fi
if has cpu; then
  for isa in ${CPU_ISAS:-avx512 avx2}; do
    stamp "cpu $isa"
    FASTMETAL_CPU_ISA=$isa FASTMETAL_NUM_THREADS=2 OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 \
      MKL_NUM_THREADS=2 taskset -c 0,1 python3 -m fastmetal bench matmul --device cpu \
      2>&1 | tee "$OUT/bench_cpu_$isa.txt"
  done
fi
stamp done
