#!/usr/bin/env bash
# The Linux gate for fastmetal's Objective-C++ (csrc/backend/metal/*.mm).
#
# No Mac is needed: clang type-checks every .mm as Objective-C++ with ARC against
# declaration-only stubs of the Foundation / Metal / dispatch API it uses
# (tools/objc_stubs/, copied from Apple's SDK signatures). Under ARC a misspelled selector,
# a wrong argument type or a nullable value passed where Metal wants nonnull is an error.
# The script then proves it has teeth: copies of the source with such mistakes must fail.
#
#   tools/check_objc.sh            (CLANGXX=clang++-17 tools/check_objc.sh to pick a compiler;
#                                   FM_CHECK_OBJC_QUICK=1 checks the sources only)
#
# Installs nothing. Exit 0: all good; 1: a check failed; 2: no clang++ found.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

if [[ -z "${CLANGXX:-}" ]]; then
  for c in clang++-16 clang++-17 clang++-18 clang++-19 clang++-20 clang++; do
    if command -v "$c" >/dev/null 2>&1; then CLANGXX=$c; break; fi
  done
fi
if [[ -z "${CLANGXX:-}" ]] || ! command -v "$CLANGXX" >/dev/null 2>&1; then
  echo "check_objc: no clang++ found; install one (Debian: apt-get install -y clang-16)" >&2
  exit 2
fi

# -Werror: every warning the stubs make possible (incompatible protocol types, nullable to
# nonnull, unknown selectors) fails the gate.
FLAGS=(-x objective-c++ -std=c++17 -fobjc-arc -fobjc-runtime=macosx -fblocks -fsyntax-only
       -Wno-nullability-completeness -Wall -Wextra -Werror
       -Wnullable-to-nonnull-conversion -Wobjc-method-access
       -I tools/objc_stubs -I csrc -I csrc/backend)

failed=0
pass() { echo "check_objc: ok    $*"; }
fail() { echo "check_objc: FAIL  $*" >&2; failed=1; }

shopt -s nullglob
sources=(csrc/backend/metal/*.mm)
if [[ ${#sources[@]} -eq 0 ]]; then
  fail "no csrc/backend/metal/*.mm to check"
  exit 1
fi

echo "check_objc: using $("$CLANGXX" --version | head -n1)"

# 1. Every Objective-C++ source against the stubs.
for f in "${sources[@]}"; do
  if "$CLANGXX" "${FLAGS[@]}" "$f"; then pass "$f"; else fail "$f"; fi
done

# 2. The header the rest of the project sees is plain C++, and registry.cpp compiles with
#    the Metal backend switched on.
if echo '#include "backend/metal/metal_backend.h"' |
     "$CLANGXX" -x c++ -std=c++17 -fsyntax-only -Wall -Werror -I csrc -; then
  pass "metal_backend.h is plain C++"
else
  fail "metal_backend.h is not plain C++"
fi
if "$CLANGXX" -x c++ -std=c++17 -fsyntax-only -Wall -Werror -DFASTMETAL_HAVE_METAL -I csrc \
     csrc/backend/registry.cpp; then
  pass "registry.cpp with FASTMETAL_HAVE_METAL"
else
  fail "registry.cpp with FASTMETAL_HAVE_METAL"
fi

if [[ ${FM_CHECK_OBJC_QUICK:-0} == 1 ]]; then  # steps 1-2 only (tests of the gate itself)
  if [[ $failed -ne 0 ]]; then echo "check_objc: FAILED" >&2; exit 1; fi
  echo "check_objc: quick checks passed"
  exit 0
fi

# 3. Teeth. Each mutation below must make the gate fail; the unmutated copy in the same
#    place must pass (so a failure is the mutation's doing, not the copy's location).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
target=csrc/backend/metal/metal_backend.mm
# Quoted includes of the copy resolve through -I csrc/backend/metal.
COPY_FLAGS=("${FLAGS[@]}" -I csrc/backend/metal)

check_copy() {  # name sed-expression expect(pass|fail)
  local name=$1 expr=$2 expect=$3 copy="$tmp/$1.mm"
  sed -e "$expr" "$target" >"$copy"
  if [[ $expect == fail ]] && cmp -s "$target" "$copy"; then
    fail "teeth/$name: the mutation did not apply (source changed?)"
    return
  fi
  local out rc=0
  out=$("$CLANGXX" "${COPY_FLAGS[@]}" "$copy" 2>&1) || rc=$?
  if [[ $expect == pass && $rc -eq 0 ]]; then
    pass "teeth/$name compiles"
  elif [[ $expect == fail && $rc -ne 0 ]]; then
    pass "teeth/$name rejected: $(grep -m1 'error:' <<<"$out" | sed 's/^[^ ]* //')"
  else
    fail "teeth/$name: expected the gate to $expect (exit $rc)"
    echo "$out" | head -n 20 >&2
  fi
}

check_copy control 's/^//' pass
# (a) a misspelled selector
check_copy misspelled-selector 's/waitUntilCompleted\]/waitUntilComplete]/' fail
# (b) a wrong argument type: an integer where Metal wants an MTLSize
check_copy wrong-argument-type 's/threadsPerThreadgroup:group\]/threadsPerThreadgroup:256]/' fail
# (b') a wrong object type: a pipeline where Metal wants an id<MTLBuffer>
check_copy wrong-protocol-type 's/setBuffer:block offset/setBuffer:p.state offset/' fail
# (c) a nullable value where Metal wants nonnull
check_copy nullable-to-nonnull \
  's/newFunctionWithName:ns_name\]/newFunctionWithName:[NSString stringWithUTF8String:kernel.c_str()]]/' fail
# (d) a selector Metal does not have (dispatch by threadgroups count misnamed)
check_copy unknown-selector 's/dispatchThreads:MTLSizeMake/dispatchThread:MTLSizeMake/' fail

# 4. Apple's ABI. Compile the backend into a Mach-O object for x86_64-apple-macos13 (ARC,
#    blocks and @try lowered as on a Mac; Linux's libstdc++ stands in for libc++, hence
#    -D_GNU_SOURCE and -U__nonnull, a Darwin-predefined macro glibc defines itself), assemble
#    metallib_embed.S for both Mac architectures, and check that they meet: the object needs
#    exactly the symbols the assembly defines, and the symbols span the embedded bytes.
gxx_inc=$(ls -d /usr/include/c++/[0-9]* 2>/dev/null | sort -V | tail -n1 || true)
multi=/usr/include/$(uname -m)-linux-gnu
NM=$(command -v llvm-nm-16 || command -v llvm-nm || true)
CLANG_C=${CLANGXX/clang++/clang}
resdir=$("$CLANGXX" -print-resource-dir 2>/dev/null || true)
if [[ $(uname -m) == x86_64 && -n $gxx_inc && -d $multi/c++/$(basename "$gxx_inc") && -n $NM &&
      -d $resdir/include ]] && command -v "$CLANG_C" >/dev/null 2>&1; then
  obj="$tmp/metal_backend.o"
  if "$CLANGXX" -target x86_64-apple-macos13 -U__nonnull -D_GNU_SOURCE -x objective-c++ -std=c++17 \
       -fobjc-arc -fblocks -fobjc-exceptions -fexceptions -O2 -c -nostdinc++ -nostdlibinc \
       -isystem "$gxx_inc" -isystem "$multi/c++/$(basename "$gxx_inc")" -isystem "$resdir/include" \
       -isystem "$multi" -isystem /usr/include -Wno-nullability-completeness \
       -I tools/objc_stubs -I csrc -I csrc/backend "$target" -o "$obj"; then
    undefined=$("$NM" -u -j "$obj" | sort -u)
    missing=""
    for sym in _fastmetal_metallib_start _fastmetal_metallib_end _MTLCreateSystemDefaultDevice \
               _dispatch_data_create _objc_autoreleasePoolPush _objc_msgSend; do
      grep -qx "$sym" <<<"$undefined" || missing+=" $sym"
    done
    if [[ -z $missing ]]; then pass "Mach-O x86_64 object (ARC codegen), needs the embed symbols"
    else fail "Mach-O object lacks expected references:$missing"; fi
  else
    fail "Mach-O x86_64 compile of $target"
  fi
  printf 'fastmetal embed check \x00\x01\xff' >"$tmp/lib.metallib"
  size=$(wc -c <"$tmp/lib.metallib")
  sed "s#@FM_METALLIB@#$tmp/lib.metallib#" csrc/backend/metal/metallib_embed.S.in >"$tmp/embed.S"
  for arch in arm64 x86_64; do
    if "$CLANG_C" -target "$arch-apple-macos13" -c "$tmp/embed.S" -o "$tmp/embed-$arch.o"; then
      syms=$("$NM" --defined-only "$tmp/embed-$arch.o")
      start=$(awk '$3 == "_fastmetal_metallib_start" { print $1 }' <<<"$syms")
      end=$(awk '$3 == "_fastmetal_metallib_end" { print $1 }' <<<"$syms")
      span=missing
      [[ -n $start && -n $end ]] && span=$((16#$end - 16#$start))
      if [[ $span == "$size" ]]; then pass "metallib_embed.S on $arch-apple-macos13: symbols span $size bytes"
      else fail "metallib_embed.S on $arch-apple-macos13: span '$span', want $size"; fi
    else
      fail "assembling metallib_embed.S for $arch-apple-macos13"
    fi
  done
else
  echo "check_objc: skip  Mach-O checks (need x86-64 Linux with libstdc++ headers, llvm-nm, clang)"
fi

if [[ $failed -ne 0 ]]; then
  echo "check_objc: FAILED" >&2
  exit 1
fi
echo "check_objc: all checks passed"
