#!/usr/bin/env bash
# Builds the CPU-only extension with -fsanitize=address,undefined (kernels at -O0, host code at
# -O1: see CMakeLists.txt, FASTMETAL_KERNEL_OPT and FASTMETAL_HOST_OPT; instrumented at -O1
# the generated elementwise entries alone took 233 s to compile, at -O0 59 s) into build/asan (its own
# build dir, so the normal build is untouched) and runs a focused part of the suite against
# it: the tests that feed bad, huge, strided and read-only inputs to every public function.
# Any ASan report or UBSan runtime error fails the run. Usage: tools/ci/sanitize.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=build/asan-site
mkdir -p build
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-sanitize=vptr -fno-omit-frame-pointer"
# Without build isolation (so that the build dir is reused), the build backend must be in
# this environment: pyproject.toml's [build-system] requires, read from there.
python - <<'PY' > build/asan-requires.txt
try:
    import tomllib
except ImportError:  # Python < 3.11: pip vendors the same parser
    from pip._vendor import tomli as tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))
PY
python -m pip install -q -r build/asan-requires.txt
python -m pip install -q --no-build-isolation --no-deps --upgrade --target "$SITE" \
  -Cbuild-dir=build/asan -Ccmake.define.FASTMETAL_CUDA=OFF -Ccmake.define.FASTMETAL_METAL=OFF \
  -Ccmake.define.FASTMETAL_CPU_ISAS=base -Ccmake.define.FASTMETAL_KERNEL_OPT=-O0 \
  -Ccmake.define.FASTMETAL_HOST_OPT=-O1 \
  "-Ccmake.define.CMAKE_CXX_FLAGS=$FLAGS" "-Ccmake.define.CMAKE_SHARED_LINKER_FLAGS=$FLAGS" .
LIBASAN=$(${CXX:-c++} -print-file-name=libasan.so)
LIBSTDCXX=$(${CXX:-c++} -print-file-name=libstdc++.so)
# The interpreter itself is not instrumented: preload the runtime (and libstdc++, which
# Python does not link, so that ASan can intercept __cxa_throw). Leaks of Python objects at
# exit are not ours to judge; huge requests must fail as they do without ASan (the tests
# expect MemoryError), not abort.
export LD_PRELOAD="$LIBASAN $LIBSTDCXX" \
       ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1 \
       UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 PYTHONPATH="$PWD/$SITE"
python -c "import fastmetal, sys; assert fastmetal.__file__.startswith('$PWD/$SITE'), fastmetal.__file__"
export FASTMETAL_FUZZ_EXAMPLES=${FASTMETAL_FUZZ_EXAMPLES:-12}  # instrumented code is slower; the main suite ran 60
if [ $# -eq 0 ]; then
  set -- tests/test_first_hour.py tests/test_bad_input_fuzz.py tests/test_property_fuzz.py \
         tests/test_arrays.py tests/test_conv2d_errors.py
fi
# --capture=sys: a sanitizer report is written to fd 2 by the dying process; fd-level capture
# would swallow it.
python -m pytest -q -p no:cacheprovider --capture=sys "$@"
