"""The one MSL front end: reads metal/*.metal the way every tool of the project needs it.

Used by tools/gen/gen_kernels.py (CPU entries, CUDA wrappers, manifest), tools/ci/msl_text_rules.py
(portable-subset rules) and tools/ci/check_msl.py (strict gate). It parses kernels from their
signatures: `kernel void name(params)`, optionally preceded by `template <...>`; each
parameter carries `[[buffer(n)]]` or a builtin attribute such as
`[[thread_position_in_grid]]`. Instances come from FM_INSTANTIATE (every target) and
FM_INSTANTIATE_CPU (CPU-only variants, e.g. lane-vectorised ones, kept out of the metallib) and
FM_INSTANTIATE_DISCRETE (CPU and CUDA: variants over Apple's threadgroup memory limit).

Offsets and line numbers refer to the comment-blanked text, which keeps the line
structure of the file, so findings can name the file and line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# builtin attribute -> field of the generated entries' ThreadIds
BUILTINS = {
    "thread_position_in_grid": "grid_pos",
    "threads_per_grid": "grid_size",
    "thread_position_in_threadgroup": "local_pos",
    "threadgroup_position_in_grid": "group_pos",
    "threads_per_threadgroup": "group_size",
    "threadgroups_per_grid": "num_groups",
    "thread_index_in_threadgroup": "local_index",
    "thread_index_in_simdgroup": "simd_lane",
    "simdgroup_index_in_threadgroup": "simd_group",
    "threads_per_simdgroup": "simd_width",
}
GRID_ONLY = {"thread_position_in_grid", "threads_per_grid"}
ALL_TARGETS = frozenset({"metal", "cpu", "cuda"})
# Anything that makes threads of a group wait for each other: needs the emulator on the CPU.
SYNC_RE = re.compile(r"\b(threadgroup_barrier|simdgroup_barrier|simd_\w+|quad_\w+)\s*\(")
KERNEL_RE = re.compile(r"(template\s*<([^>]*)>\s*)?\bkernel\s+void\s+(\w+)\s*\(")
INSTANTIATE_RE = re.compile(
    r'FM_INSTANTIATE(_CPU|_DISCRETE)?\(\s*"([^"]+)"\s*,\s*(\w+)\s*(?:,([^;]*))?\)\s*;')
# Which backends get an instance, by the macro's suffix (metal/fm_kernel.h says why).
SUFFIX_TARGETS = {None: None, "_CPU": frozenset({"cpu"}), "_DISCRETE": frozenset({"cpu", "cuda"})}


class MslError(Exception):
    """A kernel source the front end cannot read (the message names file and kernel)."""


@dataclass
class Param:
    name: str
    buffer: int | None = None
    builtin: str | None = None
    decl: str = ""  # the declaration before the attribute, e.g. "device const T* x"


@dataclass
class KernelDef:
    name: str
    is_template: bool
    params: list[Param]
    synchronizes: bool
    template_params: list[str] = field(default_factory=list)  # names, in order
    line: int = 0
    body_start: int = 0  # offsets of the braces of the body in the parsed text
    body_end: int = 0


@dataclass
class Instance:
    host_name: str
    kernel: KernelDef
    template_args: str | None
    targets: frozenset = ALL_TARGETS

    @property
    def call(self) -> str:
        return f"{self.kernel.name}<{self.template_args}>" if self.template_args else self.kernel.name

    @property
    def mode(self) -> str:
        if self.kernel.synchronizes:
            return "emulated"
        used = {p.builtin for p in self.kernel.params if p.builtin}
        return "grid" if used <= GRID_ONLY else "groups"


# ----------------------------------------------------------------------------- text
def blank_comments(text: str, strings: bool = False) -> str:
    """Comments (and string literals if `strings`) replaced by spaces, lines kept."""
    def blank(m: re.Match) -> str:
        if m.group(0).startswith('"') and not strings:
            return m.group(0)
        return re.sub(r"[^\n]", " ", m.group(0))
    # One pass, so a "//" inside a string or a quote inside a comment is not misread.
    return re.sub(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', blank, text, flags=re.S)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise MslError(f"unbalanced {open_ch}{close_ch}")


def split_top_level(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([<{":
            depth += 1
        elif ch in ")]>}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def expand_includes(path: Path, search: list[Path], seen: set[Path] | None = None) -> str:
    """The file with its quoted includes inlined (each once), as the compiler sees it."""
    seen = set() if seen is None else seen
    text = path.read_text()

    def repl(m: re.Match) -> str:
        for d in [path.parent, *search]:
            cand = (d / m.group(1)).resolve()
            if cand.exists():
                if cand in seen:
                    return ""
                seen.add(cand)
                return expand_includes(cand, search, seen)
        return ""

    return re.sub(r'#include\s+"([^"]+)"', repl, text)


# ----------------------------------------------------------------------------- kernels
def parse_param(text: str, where: str) -> Param:
    m = re.search(r"\[\[\s*(\w+)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]", text)
    if not m:
        raise MslError(f"{where}: kernel parameter without an attribute: {text!r}")
    decl = text[: m.start()].strip()
    name_m = re.search(r"(\w+)\s*$", decl)
    if not name_m:
        raise MslError(f"{where}: cannot find the parameter name in {text!r}")
    attr, index = m.group(1), m.group(2)
    if attr == "buffer":
        return Param(name_m.group(1), buffer=int(index), decl=decl)
    if attr not in BUILTINS:
        raise MslError(f"{where}: unsupported kernel attribute [[{attr}]] (supported: buffer, "
                       + ", ".join(sorted(BUILTINS)) + ")")
    return Param(name_m.group(1), builtin=attr, decl=decl)


def template_param_names(header: str | None) -> list[str]:
    if not header:
        return []
    return [re.search(r"(\w+)\s*(?:=.*)?$", p).group(1) for p in split_top_level(header)]


def parse_kernels(text: str, where: str) -> dict[str, KernelDef]:
    """Every `kernel void` definition of comment-blanked `text`."""
    kernels: dict[str, KernelDef] = {}
    for m in KERNEL_RE.finditer(text):
        name = m.group(3)
        open_paren = m.end() - 1
        close_paren = matching(text, open_paren, "(", ")")
        params = [parse_param(p, f"{where}:{name}")
                  for p in split_top_level(text[open_paren + 1: close_paren])]
        body_start = text.index("{", close_paren)
        body_end = matching(text, body_start, "{", "}")
        kernels[name] = KernelDef(
            name, m.group(1) is not None, params,
            bool(SYNC_RE.search(text, body_start, body_end)),
            template_param_names(m.group(2)), line_of(text, m.start(3)), body_start, body_end)
    return kernels


def parse_instances(text: str, kernels: dict[str, KernelDef], where: str) -> list[Instance]:
    instances = []
    for m in INSTANTIATE_RE.finditer(text):
        suffix, host, func, targs = m.group(1), m.group(2), m.group(3), (m.group(4) or "").strip()
        if func not in kernels:
            raise MslError(f"{where}: FM_INSTANTIATE names unknown kernel {func!r}")
        instances.append(Instance(host, kernels[func], targs or None,
                                  SUFFIX_TARGETS[suffix] or ALL_TARGETS))
    for k in kernels.values():
        if not k.is_template:
            instances.append(Instance(k.name, k, None))
    hosts = [i.host_name for i in instances]
    dup = {h for h in hosts if hosts.count(h) > 1}
    if dup:
        raise MslError(f"{where}: duplicate host names {sorted(dup)}")
    return instances


def parse_metal(path: Path, search: list[Path]) -> list[Instance]:
    """The kernel instances of one .metal file, its includes (generated ones too) inlined."""
    text = blank_comments(expand_includes(path, search))
    return parse_instances(text, parse_kernels(text, path.name), path.name)
