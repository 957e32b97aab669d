#!/usr/bin/env python3
"""The Linux gate for fastmetal's Objective-C++ (csrc/backend/metal/*.mm).

No Mac and no system clang: libclang (the `libclang` wheel) type-checks every .mm as
Objective-C++ with ARC against declaration-only stubs of the Foundation / Metal / dispatch
API it uses (tools/ci/objc_stubs/, signatures copied from Apple's SDK). Under ARC a misspelled
selector, a wrong argument type or a nullable value passed where Metal wants nonnull is an
error; every warning in our own files counts as one (-Werror). It also checks that the
header the rest of the project sees is plain C++ and that the backend registers itself with
the registry (FM_REGISTER_BACKEND: without it a Mac build would list no 'metal' device). Then it proves it has teeth: copies of the source with such
mistakes must fail, the unmodified copy must pass.

    tools/ci/check_objc.py [--quick]     (--quick: the sources only, no self-check)

Exit 0: all good; 1: a check failed; 2: libclang (or the compiler's own headers) missing.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OBJC_FLAGS = ["-x", "objective-c++", "-std=c++17", "-fobjc-arc", "-fobjc-runtime=macosx",
              "-fblocks", "-Wno-nullability-completeness", "-Wall", "-Wextra",
              "-Wnullable-to-nonnull-conversion", "-Wobjc-method-access"]

# (name, text in metal_backend.mm, replacement): each must be rejected.
TEETH = [
    ("misspelled-selector", "waitUntilCompleted]", "waitUntilComplete]"),
    ("wrong-argument-type", "threadsPerThreadgroup:group]", "threadsPerThreadgroup:256]"),
    ("wrong-protocol-type", "setBuffer:block offset", "setBuffer:p.state offset"),
    ("nullable-to-nonnull", "newFunctionWithName:ns_name]",
     "newFunctionWithName:[NSString stringWithUTF8String:kernel.c_str()]]"),
    ("unknown-selector", "dispatchThreads:MTLSizeMake", "dispatchThread:MTLSizeMake"),
    ("icb-selector", "[command setBarrier]", "[command setBarriers]"),
]


def compiler_headers() -> str | None:
    """The compiler's own headers (stddef.h, ...), which the libclang wheel does not ship:
    the `ziglang` wheel's copy of clang's, else the system C compiler's."""
    try:
        import ziglang
        d = Path(ziglang.__file__).parent / "lib" / "include"
        if (d / "stddef.h").exists():
            return str(d)
    except ImportError:
        pass
    for cc in ("cc", "gcc", "clang"):
        if shutil.which(cc):
            out = subprocess.run([cc, "-print-file-name=include"], capture_output=True, text=True)
            if out.returncode == 0 and Path(out.stdout.strip(), "stddef.h").exists():
                return out.stdout.strip()
    return None


def load():
    """(cindex, include flags) or (None, reason)."""
    try:
        import clang.cindex as cindex
        cindex.Index.create()
    except Exception as e:
        return None, f"libclang is not usable ({type(e).__name__}: {e}); pip install libclang"
    headers = compiler_headers()
    if headers is None:
        return None, "no compiler headers (stddef.h) found; pip install ziglang"
    return cindex, ["-isystem", headers]


def parse(cindex, path: Path, args: list[str]):
    # The preamble (every #include) is kept, so re-parsing a mutated copy is quick.
    opts = (cindex.TranslationUnit.PARSE_PRECOMPILED_PREAMBLE
            | 0x100)  # CXTranslationUnit_CreatePreambleOnFirstParse
    return cindex.Index.create().parse(str(path), args=args, options=opts)


def diagnostics(cindex, path: Path, args: list[str], root: Path, tu=None) -> list[str]:
    """Errors anywhere, and warnings in the project's own files (-Werror for our code)."""
    tu = tu if tu is not None else parse(cindex, path, args)
    out = []
    for d in tu.diagnostics:
        f = d.location.file.name if d.location.file else ""
        ours = os.path.realpath(f).startswith(str(root.resolve()) + os.sep) if f else True
        if d.severity >= cindex.Diagnostic.Error or (d.severity == cindex.Diagnostic.Warning and ours):
            out.append(f"{os.path.relpath(f, root) if f else path.name}:{d.location.line}: {d.spelling}")
    return out


def run(root: Path, quick: bool, log=print, sources_only: bool = False) -> int:
    cindex, extra = load()
    if cindex is None:
        log(f"check_objc: {extra}")
        return 2
    failed = False

    def result(ok: bool, what: str, detail: list[str] = ()) -> None:
        nonlocal failed
        log(f"check_objc: {'ok   ' if ok else 'FAIL '} {what}")
        for line in list(detail)[:10]:
            log(f"    {line}")
        failed |= not ok

    inc = ["-I", str(root / "tools/ci/objc_stubs"), "-I", str(root / "csrc"), "-I", str(root / "csrc/backend")]
    sources = sorted((root / "csrc/backend/metal").glob("*.mm"))
    if not sources:
        result(False, "no csrc/backend/metal/*.mm to check")
        return 1
    # 1. Every Objective-C++ source against the stubs.
    units = {}
    for mm in sources:
        units[mm] = parse(cindex, mm, OBJC_FLAGS + extra + inc)
        errs = diagnostics(cindex, mm, [], root, units[mm])
        result(not errs, str(mm.relative_to(root)), errs)
    if sources_only:
        return 1 if failed else 0
    # 2. The header the rest of the project sees is plain C++; the backend registers itself.
    cxx = ["-x", "c++", "-std=c++17", "-Wall", *extra, "-I", str(root / "csrc")]
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cpp"
        probe.write_text('#include "backend/metal/metal_backend.h"\n')
        errs = diagnostics(cindex, probe, cxx, root)
        result(not errs, "metal_backend.h is plain C++", errs)
    registers = [mm for mm in sources
                 if re.search(r'^FM_REGISTER_BACKEND\("metal",', mm.read_text(), re.MULTILINE)]
    result(len(registers) == 1, "the Metal backend registers itself (FM_REGISTER_BACKEND(\"metal\", ...))",
           [f"found in {len(registers)} of the .mm files, expected exactly 1"] if len(registers) != 1 else [])
    if quick:
        log("check_objc: FAILED" if failed else "check_objc: quick checks passed")
        return 1 if failed else 0
    # 3. Teeth: each mutation must be rejected; the unmutated copy passes (checked above).
    target = root / "csrc/backend/metal/metal_backend.mm"
    source = target.read_text()
    tu = units[target] if target in units else parse(cindex, target, OBJC_FLAGS + extra + inc)
    for name, old, new in TEETH:
        if old not in source:
            result(False, f"teeth/{name}: the mutation does not apply (source changed?)")
            continue
        tu.reparse(unsaved_files=[(str(target), source.replace(old, new, 1))])
        errs = diagnostics(cindex, target, [], root, tu)
        if errs:
            log(f"check_objc: ok    teeth/{name} rejected: {errs[0].split(': ', 1)[1]}")
        else:
            result(False, f"teeth/{name}: the gate accepted it")
    log("check_objc: FAILED" if failed else "check_objc: all checks passed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the sources only, no self-check")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    return run(ns.root, ns.quick or os.environ.get("FM_CHECK_OBJC_QUICK") == "1")


if __name__ == "__main__":
    sys.exit(main())
