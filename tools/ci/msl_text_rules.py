"""The portable-subset rules of tools/ci/check_msl.py that need no compiler: textual checks
of metal/*.metal and metal/*.h for what the CPU and CUDA shims rely on (ARCHITECTURE.md):

  threadgroup-scope    `threadgroup` memory only as arrays declared at kernel scope (the
                       strict gate's AST pass also reports those outside kernel scope;
                       check_msl reports a line once)
  threadgroup-param    no [[threadgroup(n)]] kernel parameters
  texture              no textures or samplers
  early-return         no `return` before a barrier in a kernel that has barriers
  int-width            integers of fixed width (no long, size_t, ptrdiff_t)
  swizzle              no swizzles beyond single components (.xy, .zyx, .rgba ...)
  fast-math            no fast:: math (the library builds with -fno-fast-math)
  constant-pointer     arrays passed as `constant T*` buffers: use `device const T*` (the
                       constant address space wants stricter buffer-offset alignment on some
                       Macs, and user arrays can start anywhere); `constant Args&` is fine

(double is the strict gate's own rule.) A library of check_msl.py, not a command.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gen"))
from msl_frontend import KERNEL_RE, SYNC_RE, blank_comments, line_of, matching  # noqa: E402

RULES = {
    "texture": (re.compile(r"\b(texture[123]d\w*|texturecube\w*|sampler)\b"), "textures and samplers are not portable"),
    "threadgroup-param": (re.compile(r"\[\[\s*threadgroup\s*\(\s*\d+\s*\)\s*\]\]"), "[[threadgroup(n)]] parameters are not portable; declare threadgroup arrays at kernel scope"),
    "int-width": (re.compile(r"\b(long|size_t|ptrdiff_t|unsigned\s+long)\b"), "use fixed-width integers (int32_t, int64_t, uint ...)"),
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
    """One "path:line: [rule] message" line per finding in the source text `raw`."""
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
