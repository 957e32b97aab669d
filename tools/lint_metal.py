#!/usr/bin/env python3
"""Check metal/*.metal and metal/*.h against fastmetal's portable MSL subset.

The same kernel source must compile as MSL (Apple's compiler), as C++ (CPU shim) and as
CUDA (nvcc shim). This lint enforces the rules of ARCHITECTURE.md that the shims rely on:

  threadgroup-scope    `threadgroup` memory only as arrays declared at kernel scope
  threadgroup-param    no [[threadgroup(n)]] kernel parameters
  texture              no textures or samplers
  early-return         no `return` before a barrier in a kernel that has barriers
  int-width            integers of fixed width (no long, size_t, ptrdiff_t)
  double               no double (Apple GPUs have no float64)
  swizzle              no swizzles beyond single components (.xy, .zyx, .rgba ...)
  fast-math            no fast:: math (the library builds with -fno-fast-math)
  constant-pointer     arrays passed as `constant T*` buffers: use `device const T*` (the
                       constant address space wants stricter buffer-offset alignment on some
                       Macs, and user arrays can start anywhere); `constant Args&` is fine

Usage: lint_metal.py [PATHS...]   (default: the metal/ directory beside tools/)
Exit status 1 and one line per finding ("file:line: [rule] message") on violations.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from msl_frontend import KERNEL_RE, SYNC_RE, blank_comments, line_of, matching  # noqa: E402

RULES = {
    "texture": (re.compile(r"\b(texture[123]d\w*|texturecube\w*|sampler)\b"), "textures and samplers are not portable"),
    "threadgroup-param": (re.compile(r"\[\[\s*threadgroup\s*\(\s*\d+\s*\)\s*\]\]"), "[[threadgroup(n)]] parameters are not portable; declare threadgroup arrays at kernel scope"),
    "int-width": (re.compile(r"\b(long|size_t|ptrdiff_t|unsigned\s+long)\b"), "use fixed-width integers (int32_t, int64_t, uint ...)"),
    "double": (re.compile(r"\bdouble\b"), "double does not exist on Apple GPUs"),
    "swizzle": (re.compile(r"\.\s*(?:[xyzw]{2,4}|[rgba]{2,4})\b(?!\s*\()"), "swizzles are outside the portable subset; use .x/.y/.z/.w"),
    "fast-math": (re.compile(r"\bfast::"), "fast:: math is not allowed (builds use -fno-fast-math)"),
    "constant-pointer": (re.compile(r"\bconstant\s+[\w:<>]+\s*\*\s*\w+\s*\[\[\s*buffer"),
                         "pass arrays as `device const T*`, not `constant T*`"),
}

def kernel_bodies(text: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of every kernel body (offsets of its braces)."""
    out = []
    for m in KERNEL_RE.finditer(text):
        start = text.index("{", matching(text, m.end() - 1, "(", ")"))
        out.append((m.group(3), start, matching(text, start, "{", "}")))
    return out


def lint_text(path: str, raw: str) -> list[str]:
    text = blank_comments(raw, strings=True)
    findings = []
    for rule, (pattern, msg) in RULES.items():
        for m in pattern.finditer(text):
            findings.append(f"{path}:{line_of(text, m.start())}: [{rule}] {msg}")

    bodies = kernel_bodies(text)
    # threadgroup declarations: only directly inside a kernel body (brace depth 1), as arrays.
    for m in re.finditer(r"\bthreadgroup\b(?!_)", text):
        inside = [(s, e) for _, s, e in bodies if s < m.start() < e]
        stmt_end = text.find(";", m.start())
        stmt = text[m.start(): stmt_end if stmt_end >= 0 else len(text)]
        ok = False
        if inside:
            s, _ = inside[0]
            depth = text.count("{", s, m.start()) - text.count("}", s, m.start())
            ok = depth == 1 and "[" in stmt and "(" not in stmt
        if not ok and not re.match(r"threadgroup\s*\)", stmt):
            findings.append(f"{path}:{line_of(text, m.start())}: [threadgroup-scope] "
                            "threadgroup memory must be an array declared at kernel scope")

    for name, s, e in bodies:
        body = text[s:e]
        barriers = [b.start() for b in SYNC_RE.finditer(body)]
        if not barriers:
            continue
        for r in re.finditer(r"\breturn\b", body):
            if r.start() < barriers[-1]:
                findings.append(f"{path}:{line_of(text, s + r.start())}: [early-return] "
                                f"kernel {name} returns before a barrier: threads that left "
                                "would never reach it (guard the work instead)")
    return findings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    roots = [Path(p) for p in argv] or [Path(__file__).resolve().parent.parent / "metal"]
    files = []
    for root in roots:
        if root.is_dir():
            files += sorted(p for p in root.iterdir() if p.suffix in (".metal", ".h"))
        else:
            files.append(root)
    findings = []
    for f in files:
        findings += lint_text(str(f), f.read_text())
    for line in findings:
        print(line)
    if not files:
        print("lint_metal: no files found", file=sys.stderr)
        return 2
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
