#!/usr/bin/env bash
# Checks cmake/metal.cmake on Linux, where Apple's Metal compiler does not exist.
#
# A stand-in `xcrun` (written below) plays `xcrun -sdk macosx metal|metallib`: it checks the
# flags fastmetal passes (among them -mmacosx-version-min equal to the wheel's deployment
# target, pyproject.toml's MACOSX_DEPLOYMENT_TARGET: Apple's compiler ignores that
# environment variable, so the stand-in ignores it too), preprocesses each .metal the way Apple's compiler would
# (__METAL_VERSION__=300, the repository's include paths) and writes an ".air" that lists
# the kernel host names found in it; "metallib" concatenates them. A small CMake project
# then uses the functions of cmake/metal.cmake to build that metallib, embed it with
# metallib_embed.S into an executable, and the script checks:
#   1. the embedded bytes are exactly the metallib's (the .incbin and its symbols work);
#   2. the host names the Metal library would export are exactly the kernels of
#      kernels.json meant for Metal, the names the host code launches (CPU-only lane
#      variants stay out of the metallib);
#   3. editing a shared header rebuilds the .air files, the metallib and re-embeds it;
#   4. configuring the real project with -DFASTMETAL_METAL=ON fails with a clear message
#      when xcrun is absent, and with one naming macOS when xcrun exists but this is Linux;
#      with AUTO and no working Metal compiler it configures (CPU only) with a warning;
#   5. configured for macOS through a Darwin cross toolchain, the real project compiles the
#      .mm as Objective-C++ with ARC, links Metal/Foundation and builds the Mach-O objects.
# Needs cmake, a C compiler, python3 and clang (for preprocessing). Installs nothing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PYTHON=${PYTHON:-python3}
for tool in cmake "$PYTHON"; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check_metal_cmake: $tool not found" >&2; exit 2; }
done
CPP=""
for c in clang-16 clang-17 clang-18 clang-19 clang gcc; do
  if command -v "$c" >/dev/null 2>&1; then CPP=$c; break; fi
done
[[ -n $CPP ]] || { echo "check_metal_cmake: no C compiler found" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
pass() { echo "check_metal_cmake: ok    $*"; }
fail() { echo "check_metal_cmake: FAIL  $*" >&2; failed=1; }

# The deployment target the macOS wheels are tagged with.
deploy=$(sed -n 's/.*MACOSX_DEPLOYMENT_TARGET *= *"\([0-9.]*\)".*/\1/p' "$root/pyproject.toml" | head -n1)
[[ -n $deploy ]] || { echo "check_metal_cmake: no MACOSX_DEPLOYMENT_TARGET in pyproject.toml" >&2; exit 2; }

# ---------------------------------------------------------------- the stand-in xcrun
mkdir -p "$tmp/bin" "$tmp/metal_stdlib_stub"
: >"$tmp/metal_stdlib_stub/metal_stdlib"
cat >"$tmp/bin/xcrun" <<EOF
#!/usr/bin/env bash
# Stand-in for xcrun on Linux (tools/ci/check_metal_cmake.sh).
set -euo pipefail
echo "xcrun \$*" >>"$tmp/xcrun.log"
[[ \$1 == -sdk && \$2 == macosx ]] || { echo "xcrun stand-in: expected -sdk macosx" >&2; exit 1; }
tool=\$3; shift 3
case \$tool in
  metal)
    args=" \$* "
    if [[ \$args == *" -E "* ]]; then echo 300; exit 0; fi
    for want in -std=metal3.0 -fno-fast-math " -c " " -o "; do
      [[ \$args == *"\$want"* ]] || { echo "xcrun stand-in: metal without \$want" >&2; exit 1; }
    done
    # Apple's metal ignores MACOSX_DEPLOYMENT_TARGET: only the flag counts.
    [[ \$args == *" -mmacosx-version-min=$deploy "* ]] || { echo "xcrun stand-in: metal -c without -mmacosx-version-min=$deploy (the wheel's deployment target): \$args" >&2; exit 1; }
    incs=(); src=""; out=""
    while [[ \$# -gt 0 ]]; do
      case \$1 in
        -I) incs+=(-I "\$2"); shift 2 ;;
        -o) out=\$2; shift 2 ;;
        -c) src=\$2; shift 2 ;;
        *) shift ;;
      esac
    done
    pre=\$($CPP -E -P -x c++ -std=c++17 -D__METAL_VERSION__=300 -nostdinc -I "$tmp/metal_stdlib_stub" "\${incs[@]}" "\$src")
    {
      echo "AIR \$(basename "\$src")"
      # Template instances carry [[host_name("...")]]; plain kernels are found by name.
      "$PYTHON" -c '
import re, sys
text = sys.stdin.read()
for name in re.findall(r"host_name\(\"([^\"]*)\"\)", text):
    print(name)
for m in re.finditer(r"(template\s*<[^;{]*?>\s*)?\bkernel\s+void\s+(\w+)", text):
    if m.group(1) is None:
        print(m.group(2))
' <<<"\$pre"
      echo "# \$(md5sum <<<"\$pre" | cut -c1-32)"
    } >"\$out"
    ;;
  metallib)
    out=""; airs=()
    while [[ \$# -gt 0 ]]; do
      case \$1 in
        -o) out=\$2; shift 2 ;;
        *) airs+=("\$1"); shift ;;
      esac
    done
    cat "\${airs[@]}" >"\$out"
    ;;
  *) echo "xcrun stand-in: unknown tool \$tool" >&2; exit 1 ;;
esac
EOF
chmod +x "$tmp/bin/xcrun"

# ---------------------------------------------------------------- a project using metal.cmake
cp -r "$root/metal" "$tmp/metal"   # a copy: step 3 edits it
mkdir -p "$tmp/proj"
cat >"$tmp/proj/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.18)
project(fm_metal_cmake_check LANGUAGES C)
find_package(Python COMPONENTS Interpreter REQUIRED)
set(FM_METAL_DIR "$tmp/metal")
file(GLOB FM_METAL_SOURCES \${FM_METAL_DIR}/*.metal)
file(GLOB FM_METAL_HEADERS \${FM_METAL_DIR}/*.h)
set(FM_GEN_DIR \${CMAKE_BINARY_DIR}/generated)
add_custom_command(
  OUTPUT \${FM_GEN_DIR}/generated.stamp
  BYPRODUCTS \${FM_GEN_DIR}/elementwise_ops.h \${FM_GEN_DIR}/kernels.json
  COMMAND \${Python_EXECUTABLE} "$root/tools/gen/gen_kernels.py" --metal-dir \${FM_METAL_DIR} --out-dir \${FM_GEN_DIR}
  COMMAND \${CMAKE_COMMAND} -E touch \${FM_GEN_DIR}/generated.stamp
  DEPENDS "$root/tools/gen/gen_kernels.py" \${FM_METAL_SOURCES} \${FM_METAL_HEADERS} \${FM_METAL_DIR}/elementwise_ops.tbl)
add_custom_target(fm_generated DEPENDS \${FM_GEN_DIR}/generated.stamp)

set(FM_METAL_FUNCTIONS_ONLY ON)
include("$root/cmake/metal.cmake")
enable_language(ASM)
fm_find_metal_toolchain()
fm_add_metallib(fm_metallib \${CMAKE_BINARY_DIR}/metal/fastmetal.metallib
  SOURCES \${FM_METAL_SOURCES} HEADERS \${FM_METAL_HEADERS}
  INCLUDE_DIRS \${FM_METAL_DIR} \${FM_GEN_DIR}
  DEPENDS \${FM_GEN_DIR}/generated.stamp)
add_dependencies(fm_metallib fm_generated)
add_executable(embed_check main.c)
fm_embed_metallib(embed_check \${CMAKE_BINARY_DIR}/metal/fastmetal.metallib fm_metallib)
EOF
cat >"$tmp/proj/main.c" <<'EOF'
#include <stdio.h>
extern const unsigned char fastmetal_metallib_start[];
extern const unsigned char fastmetal_metallib_end[];
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  FILE* f = fopen(argv[1], "wb");
  if (!f) return 3;
  size_t n = (size_t)(fastmetal_metallib_end - fastmetal_metallib_start);
  if (fwrite(fastmetal_metallib_start, 1, n, f) != n) return 4;
  return fclose(f) == 0 ? 0 : 5;
}
EOF

build="$tmp/build"
export PATH="$tmp/bin:$PATH"
generator=()
if command -v ninja >/dev/null 2>&1 && [[ ${FM_CHECK_GENERATOR:-} != make ]]; then generator=(-G Ninja); fi
if cmake -S "$tmp/proj" -B "$build" "${generator[@]}" -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
     >"$tmp/configure.log" 2>&1 && cmake --build "$build" >"$tmp/build.log" 2>&1; then
  pass "metallib built and embedded through cmake/metal.cmake (${generator[*]:-default generator})"
else
  fail "configure/build of the check project"; cat "$tmp/configure.log" "$tmp/build.log" >&2 || true
  exit 1
fi

# 1. The embedded bytes are the metallib.
"$build/embed_check" "$tmp/embedded.bin"
if cmp -s "$tmp/embedded.bin" "$build/metal/fastmetal.metallib"; then
  pass "embedded bytes == fastmetal.metallib ($(wc -c <"$tmp/embedded.bin") bytes)"
else
  fail "embedded bytes differ from fastmetal.metallib"
fi

# 2. Host names in the Metal library == kernels of the manifest the host launches by.
if "$PYTHON" - "$build/metal/fastmetal.metallib" "$build/generated/kernels.json" <<'EOF'
import json, sys
lib = [l.strip() for l in open(sys.argv[1]) if l.strip() and not l.startswith(("AIR ", "# "))]
manifest = {k for k, v in json.load(open(sys.argv[2])).items() if "metal" in v.get("targets", ["metal"])}
dupes = sorted({n for n in lib if lib.count(n) > 1})
missing, extra = sorted(manifest - set(lib)), sorted(set(lib) - manifest)
print(f"check_metal_cmake:       {len(set(lib))} Metal host names, {len(manifest)} manifest kernels")
if dupes or missing or extra:
    print("duplicates:", dupes[:10], "missing from Metal:", missing[:10], "not in manifest:", extra[:10])
    sys.exit(1)
EOF
then
  pass "Metal host names == kernels.json (Metal targets)"
else
  fail "Metal host names differ from kernels.json"
fi

# 3. Editing a shared header rebuilds the .air files and re-embeds the metallib.
echo "inline int fm_check_metal_cmake_edit() { return 1; }" >>"$tmp/metal/fm_math.h"
before=$(grep -c ' metal ' "$tmp/xcrun.log" || true)
cmake --build "$build" >>"$tmp/build.log" 2>&1
after=$(grep -c ' metal ' "$tmp/xcrun.log" || true)
"$build/embed_check" "$tmp/embedded2.bin"
if [[ $after -gt $before ]] && ! cmp -s "$tmp/embedded.bin" "$tmp/embedded2.bin" &&
   cmp -s "$tmp/embedded2.bin" "$build/metal/fastmetal.metallib"; then
  pass "header edit -> .air rebuilt, metallib re-embedded"
else
  fail "header edit did not propagate into the embedded metallib (metal runs $before -> $after)"
fi
# ...and a second build with nothing changed does nothing.
before=$(wc -l <"$tmp/xcrun.log")
cmake --build "$build" >>"$tmp/build.log" 2>&1
if [[ $(wc -l <"$tmp/xcrun.log") -eq $before ]]; then pass "no-op rebuild runs no Metal tool"; else fail "no-op rebuild ran Metal tools again"; fi

# 4. The real project with FASTMETAL_METAL=ON on Linux fails with a clear message.
pybind_dir=$("$PYTHON" -m pybind11 --cmakedir 2>/dev/null || true)
if [[ -z $pybind_dir ]]; then
  echo "check_metal_cmake: skip  real-project configure (pybind11 not importable by $PYTHON)"
else
  configure_real() {
    cmake -S "$root" -B "$tmp/real-$1" -DFASTMETAL_METAL=ON -DFASTMETAL_CUDA=OFF \
      -Dpybind11_DIR="$pybind_dir" -DPython_EXECUTABLE="$(command -v "$PYTHON")" >"$tmp/real-$1.log" 2>&1
  }
  reached() {  # the configure got as far as cmake/metal.cmake (Python/pybind11 were found)
    grep -q "fastmetal: FASTMETAL_METAL=ON" "$tmp/real-$1.log" || {
      echo "check_metal_cmake: skip  real-project configure ($1) stopped before cmake/metal.cmake:"
      grep -m3 -i "error" "$tmp/real-$1.log" | sed 's/^/    /'
      return 1
    }
  }
  if PATH=$(echo "$PATH" | tr ':' '\n' | grep -v "^$tmp/bin\$" | paste -sd:) configure_real noxcrun; then
    fail "FASTMETAL_METAL=ON without xcrun configured successfully"
  elif ! reached noxcrun; then
    :
  elif grep -q "xcrun. was not found" "$tmp/real-noxcrun.log" && grep -q "FASTMETAL_METAL=OFF" "$tmp/real-noxcrun.log"; then
    pass "FASTMETAL_METAL=ON without xcrun: clear configure error"
  elif command -v xcrun >/dev/null 2>&1; then
    echo "check_metal_cmake: skip  no-xcrun case (a real xcrun is on PATH)"
  else
    fail "FASTMETAL_METAL=ON without xcrun: unexpected output"; tail -n 20 "$tmp/real-noxcrun.log" >&2
  fi
  if configure_real linux; then
    fail "FASTMETAL_METAL=ON on Linux configured successfully"
  elif ! reached linux; then
    :
  elif grep -q "needs macOS" "$tmp/real-linux.log"; then
    pass "FASTMETAL_METAL=ON with xcrun but not macOS: clear configure error"
  else
    fail "FASTMETAL_METAL=ON on Linux: unexpected output"; tail -n 20 "$tmp/real-linux.log" >&2
  fi
  # AUTO where the Metal compiler does not work: a warning, and a CPU-only configure.
  mkdir -p "$tmp/badbin"
  printf '#!/bin/sh\necho "xcrun: error: unable to find utility metal" >&2\nexit 72\n' >"$tmp/badbin/xcrun"
  chmod +x "$tmp/badbin/xcrun"
  cat >"$tmp/auto.cmake" <<EOF2
set(APPLE 1)
EOF2
  if PATH="$tmp/badbin:$(echo "$PATH" | tr ':' '\n' | grep -v "^$tmp/bin\$" | paste -sd:)" \
       cmake -S "$root" -B "$tmp/real-auto" -DFASTMETAL_METAL=AUTO -DFASTMETAL_CUDA=OFF \
       -DCMAKE_PROJECT_INCLUDE="$tmp/auto.cmake" -Dpybind11_DIR="$pybind_dir" \
       -DPython_EXECUTABLE="$(command -v "$PYTHON")" >"$tmp/real-auto.log" 2>&1; then
    if grep -q "building WITHOUT the Metal backend" "$tmp/real-auto.log" &&
       grep -q "MetalToolchain" "$tmp/real-auto.log"; then
      pass "FASTMETAL_METAL=AUTO without a working Metal compiler: CPU-only configure, warning names the fix"
    else
      fail "FASTMETAL_METAL=AUTO without a Metal compiler: no clear warning"; tail -n 20 "$tmp/real-auto.log" >&2
    fi
  else
    fail "FASTMETAL_METAL=AUTO without a Metal compiler failed to configure"; tail -n 20 "$tmp/real-auto.log" >&2
  fi
fi

# 5. The real project configured for macOS (a Darwin cross toolchain: clang targeting
#    x86_64-apple-macos13, the stand-in xcrun): the APPLE branch of cmake/metal.cmake runs
#    as on a Mac. Checks the rules CMake writes for the .mm, the embed object and the link,
#    then builds the metallib chain, the Mach-O embed object and the Objective-C++ object
#    (Linux libstdc++ standing in for libc++, stubs for the SDK). Linking needs Apple's ld.
CLANG_C=""
for c in clang-16 clang-17 clang-18 clang-19 clang; do
  if command -v "$c" >/dev/null 2>&1; then CLANG_C=$c; break; fi
done
CLANG_CXX=${CLANG_C/clang/clang++}
gxx_inc=$(ls -d /usr/include/c++/[0-9]* 2>/dev/null | sort -V | tail -n1 || true)
multi=/usr/include/$(uname -m)-linux-gnu
NM=$(command -v llvm-nm-16 || command -v llvm-nm || true)
if [[ -z $pybind_dir || -z $CLANG_C || $(uname -m) != x86_64 || -z $gxx_inc || -z $NM ]] ||
   ! command -v ninja >/dev/null 2>&1 || ! command -v "$CLANG_CXX" >/dev/null 2>&1; then
  echo "check_metal_cmake: skip  Darwin cross-configure (needs x86-64, clang, ninja, llvm-nm, pybind11)"
else
  {
    echo "set(CMAKE_SYSTEM_NAME Darwin)"
    echo "set(CMAKE_SYSTEM_PROCESSOR x86_64)"
    for lang in C CXX OBJCXX ASM; do echo "set(CMAKE_${lang}_COMPILER_TARGET x86_64-apple-macos13)"; done
    echo "set(CMAKE_C_COMPILER $CLANG_C)"
    echo "set(CMAKE_ASM_COMPILER $CLANG_C)"
    echo "set(CMAKE_CXX_COMPILER $CLANG_CXX)"
    echo "set(CMAKE_OBJCXX_COMPILER $CLANG_CXX)"
    echo "set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)"
    echo "set(CMAKE_INSTALL_NAME_TOOL /bin/true)"
    echo "set(CMAKE_OSX_DEPLOYMENT_TARGET 13.0)"
  } >"$tmp/darwin.cmake"
  resdir=$("$CLANG_CXX" -print-resource-dir)
  objcxx_flags="-U__nonnull -D_GNU_SOURCE -nostdinc++ -nostdlibinc -isystem $gxx_inc"
  objcxx_flags+=" -isystem $multi/c++/$(basename "$gxx_inc") -isystem $resdir/include -isystem $multi"
  objcxx_flags+=" -isystem /usr/include -I$root/tools/ci/objc_stubs -Wno-nullability-completeness"
  dbuild="$tmp/darwin-build"
  py_inc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if cmake -S "$root" -B "$dbuild" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$tmp/darwin.cmake" \
       -DFASTMETAL_CUDA=OFF -Dpybind11_DIR="$pybind_dir" -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
       -DPython_INCLUDE_DIR="$py_inc" -DCMAKE_OBJCXX_FLAGS="$objcxx_flags" \
       >"$tmp/darwin-configure.log" 2>&1; then
    pass "real project configures for macOS (the APPLE branch of cmake/metal.cmake)"
    mm_obj=CMakeFiles/_core.dir/csrc/backend/metal/metal_backend.mm.o
    embed_obj=CMakeFiles/_core.dir/metal/metallib_embed.S.o
    mm_rule=$(grep -A6 "^build $mm_obj:" "$dbuild/build.ninja" || true)
    embed_rule=$(grep "^build $embed_obj:" "$dbuild/build.ninja" || true)
    if [[ $mm_rule == *OBJCXX_COMPILER* && $mm_rule == *-fobjc-arc* && $mm_rule == *-DFASTMETAL_HAVE_METAL* ]]; then
      pass ".mm compiled as OBJCXX with -fobjc-arc and FASTMETAL_HAVE_METAL"
    else
      fail ".mm compile rule: $mm_rule"
    fi
    if [[ $embed_rule == *ASM_COMPILER* && $embed_rule == *"| metal/fastmetal.metallib"* ]]; then
      pass "embed object assembled as ASM, re-made when the metallib changes"
    else
      fail "embed rule: $embed_rule"
    fi
    if grep -q -- "-framework Metal  *-framework Foundation  *-framework CoreGraphics" "$dbuild/build.ninja"; then
      pass "_core links -framework Metal -framework Foundation -framework CoreGraphics"
    else
      fail "framework link flags missing"
    fi
    if ninja -C "$dbuild" "$embed_obj" "$mm_obj" >"$tmp/darwin-build.log" 2>&1; then
      embed_syms=$("$NM" --defined-only -j "$dbuild/$embed_obj" | grep fastmetal_metallib | sort)
      mm_needs=$("$NM" -u -j "$dbuild/$mm_obj" | grep fastmetal_metallib | sort)
      if [[ -n $mm_needs && $embed_syms == "$mm_needs" ]]; then
        pass "Mach-O objects from the real build: the .mm needs exactly what the .S defines"
      else
        fail "embed symbols '$embed_syms' vs needed '$mm_needs'"
      fi
    else
      fail "building the Darwin objects"; tail -n 20 "$tmp/darwin-build.log" >&2
    fi
  else
    fail "configuring the real project for macOS"; tail -n 20 "$tmp/darwin-configure.log" >&2
  fi
fi

if [[ $failed -ne 0 ]]; then echo "check_metal_cmake: FAILED" >&2; exit 1; fi
echo "check_metal_cmake: all checks passed"
