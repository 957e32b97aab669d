#!/usr/bin/env python3
"""The strict MSL gate: finds on Linux what Apple's Metal compiler (or a Mac) would reject.

Every metal/*.metal file, with all its headers, is compiled by clang (the `libclang` wheel:
`pip install libclang`) as C++ for OpenCL 2021 (`-x clcpp -cl-std=clc++2021`), which
enforces address spaces the way MSL does, against tools/ci/msl_gate/metal_stdlib: a stand-in
that declares the library functions only in namespace metal and maps MSL's attributes and
address-space keywords. __METAL_VERSION__ is defined, so every FM_INSTANTIATE line
instantiates its template as the real metallib build does. An AST pass then checks what
that mode does not:

  metal-namespace     a metal_stdlib function called where namespace metal is not visible
  address-space       a pointer or reference converted across address spaces
  read-only-write     a write through `constant` (or another const) memory
  compile             any other compile error
  kernel-param        a kernel pointer/reference parameter without an address space
  threadgroup-scope   threadgroup memory declared outside a kernel's outermost scope
  program-scope-var   a program-scope variable that is not in the constant address space
  recursion           a function that can call itself (MSL has no call stack)
  double              double (Apple GPUs have no float64)
  threadgroup-size    more than 32 KiB of threadgroup memory in one kernel instance
  buffer-count        more than 31 buffer arguments, or an index past 30
  nan-undefined       min/max/clamp on floating point outside metal/fm_math.h: MSL leaves
                      them undefined for NaN (fm_math.h's uses are run against a CPU shim
                      that answers differently for NaN, tests/test_metal_gate.py)

and the portable subset's textual rules (tools/ci/msl_text_rules.py: no textures, swizzles,
fast::, long, early return before a barrier, ...), which the CPU and CUDA shims need.

Usage: check_msl.py [--metal-dir DIR] [--self-check] [--mutation-table]
Prints "file:line: [rule] message" per finding; exit 1 on findings, 2 when libclang is
missing. --self-check plants each kind of error into a copy of the real kernels and fails
if the gate accepts any; --mutation-table also asks the CPU shim build (g++) and
the textual rules alone about each mutation, for docs/macos.md.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parents[1]
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(REPO / "tools" / "gen"))  # msl_frontend, gen_kernels
import msl_frontend as fe  # noqa: E402
import msl_text_rules  # noqa: E402

STUB_DIR = TOOLS / "msl_gate"
MAX_THREADGROUP_BYTES = 32 * 1024
MAX_BUFFERS = 31
NAN_CHECKED_FILES = {"fm_math.h"}  # covered by the NaN-poisoned CPU shim test
ADDRESS_SPACES = ("__global", "__constant", "__local")  # device, constant, threadgroup
CLANG_ARGS = ["-x", "clcpp", "-cl-std=clc++2021", "-cl-no-stdinc", "-D__METAL_VERSION__=300",
              "-Wno-unknown-attributes", "-ferror-limit=0"]


def load_cindex():
    """clang.cindex, or None with the reason."""
    try:
        import clang.cindex as cindex
        cindex.Index.create()
        return cindex, ""
    except Exception as e:  # ImportError, or a wheel whose shared library does not load
        return None, f"libclang is not usable ({type(e).__name__}: {e}); pip install libclang"


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


def metal_function_names() -> set[str]:
    """Functions the stand-in declares in namespace metal (its part after "---- math")."""
    text = (STUB_DIR / "metal_stdlib").read_text()
    body = text[text.index("// ---- math"):]
    names = set(re.findall(r"\b(?:float|half|int|uint|long|bool|void|To|T)\s+(\w+)\s*\(", body))
    names |= set(re.findall(r"FM_GATE_MATH\d\((\w+)\)", body))
    return names - {"operator", "vec", "name"}


# ----------------------------------------------------------------------------- sources
def unsaved_sources(metal_dir: Path, gen_dir: Path, main: Path, extra: str) -> list[tuple[str, str]]:
    """The files clang reads, as the gate feeds them: the attributes of FM_INSTANTIATE's
    explicit instantiation dropped (MSL allows attributes there, C++ does not; the
    stand-in marks kernels at their definition), `extra` appended to the main file. Line
    structure is kept."""
    out = []
    for p in [*metal_dir.glob("*.metal"), *metal_dir.glob("*.h"), *gen_dir.glob("*.h")]:
        text = re.sub(r"\btemplate\s*\[\[\s*host_name\s*\([^)]*\)\s*\]\]\s*\[\[\s*kernel\s*\]\]",
                      "template", p.read_text())
        if p == main:
            text += extra
        out.append((str(p), text))
    return out


def threadgroup_asserts(text: str, instances: list[fe.Instance]) -> str:
    """static_asserts bounding each Metal instance's threadgroup memory (sizes after
    template substitution, evaluated by clang)."""
    decl_re = re.compile(r"\bthreadgroup\s+([\w:]+)\s+(\w+)((?:\s*\[[^\]]+\])+)\s*;")
    lines = ["\n// strict MSL gate: threadgroup memory per kernel instance"]
    for inst in instances:
        if "metal" not in inst.targets:
            continue
        k = inst.kernel
        decls = decl_re.findall(text, k.body_start, k.body_end)
        if not decls:
            continue
        args = fe.split_top_level(inst.template_args or "")
        subst = dict(zip(k.template_params, args))

        def sub(s: str, wrap: bool) -> str:  # a type argument must not be parenthesised
            return re.sub(r"\b\w+\b", lambda m: (f"({subst[m.group(0)]})" if wrap else
                                                  subst[m.group(0)]) if m.group(0) in subst
                          else m.group(0), s)
        size = " + ".join(f"sizeof({sub(t, False)}{sub(dims, True)})" for t, _, dims in decls)
        lines.append(f'static_assert({size} <= {MAX_THREADGROUP_BYTES}, '
                     f'"fm_msl_threadgroup_size:{inst.host_name}:{k.name}");')
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- AST pass
def _file(cursor) -> str | None:
    f = cursor.location.file
    return os.path.realpath(f.name) if f is not None else None


def _is_kernel(cursor, ck) -> bool:
    return any(c.kind == ck.ANNOTATE_ATTR and c.spelling == "fm_msl_kernel"
               for c in cursor.get_children())


class AstPass:
    def __init__(self, cindex, metal_dir: Path):
        self.ci = cindex
        self.ck = cindex.CursorKind
        self.metal_dir = os.path.realpath(metal_dir)
        self.findings: list[Finding] = []
        self.calls: dict[tuple, set[tuple]] = {}
        self.names: dict[tuple, tuple[str, int, str]] = {}

    def ours(self, cursor) -> bool:
        f = _file(cursor)
        return f is not None and os.path.dirname(f) == self.metal_dir

    def add(self, cursor, rule: str, message: str) -> None:
        self.findings.append(Finding(os.path.relpath(_file(cursor), REPO) if _file(cursor) else "?",
                                     cursor.location.line, rule, message))

    @staticmethod
    def key(cursor) -> tuple:
        c = cursor.canonical
        return (_file(c), c.location.line, c.location.column, c.spelling)

    def run(self, tu) -> None:
        for c in tu.cursor.get_children():
            self.visit(c, kernel=None, depth=0, func=None, scope="program")
        self.find_recursion()

    def visit(self, c, kernel, depth: int, func, scope: str) -> None:
        ck = self.ck
        if not self.ours(c) and c.kind != ck.NAMESPACE:
            return
        if c.kind in (ck.FUNCTION_DECL, ck.FUNCTION_TEMPLATE, ck.CXX_METHOD):
            if not c.is_definition():
                return
            is_kernel = _is_kernel(c, ck)
            key = self.key(c)
            self.names[key] = (os.path.relpath(_file(c), REPO), c.location.line, c.spelling)
            self.calls.setdefault(key, set())
            if is_kernel:
                self.check_kernel_params(c)
            for ch in c.get_children():
                if ch.kind == ck.COMPOUND_STMT:
                    self.visit_body(ch, c if is_kernel else None, 1, c)
            return
        if c.kind == ck.VAR_DECL and scope == "program":
            ts = c.type.spelling
            if "__local" in ts:
                self.add(c, "threadgroup-scope", f"threadgroup variable '{c.spelling}' at program "
                         "scope: declare it at a kernel's outermost scope or pass it in")
            elif "__constant" not in ts:
                self.add(c, "program-scope-var", f"program-scope variable '{c.spelling}' must be "
                         "`constant` (MSL has no mutable globals)")
        for ch in c.get_children():
            if c.kind in (ck.NAMESPACE, ck.STRUCT_DECL, ck.CLASS_DECL, ck.CLASS_TEMPLATE):
                self.visit(ch, kernel, depth, func, scope="program" if c.kind == ck.NAMESPACE else "member")

    def check_kernel_params(self, fn) -> None:
        tk = self.ci.TypeKind
        for p in fn.get_children():
            if p.kind != self.ck.PARM_DECL:
                continue
            t = p.type
            if t.kind in (tk.POINTER, tk.LVALUEREFERENCE, tk.RVALUEREFERENCE):
                pointee = t.get_pointee().spelling
                if not any(a in pointee for a in ADDRESS_SPACES):
                    self.add(p, "kernel-param", f"kernel '{fn.spelling}' parameter '{p.spelling}' "
                             "needs an address space (device, constant or threadgroup)")

    def visit_body(self, c, kernel, depth: int, func) -> None:
        ck = self.ck
        for ch in c.get_children():
            if ch.kind == ck.DECL_STMT:
                for v in ch.get_children():
                    if v.kind == ck.VAR_DECL and "__local" in v.type.spelling:
                        if kernel is None or depth != 1:
                            where = "a nested block of a kernel" if kernel is not None else \
                                f"function '{func.spelling}', which is not a kernel"
                            self.add(v, "threadgroup-scope", f"threadgroup variable '{v.spelling}' "
                                     f"in {where}: only a kernel's outermost scope may declare it")
            if ch.kind == ck.CALL_EXPR:
                self.check_call(ch, func)
            self.visit_body(ch, kernel, depth + (ch.kind == ck.COMPOUND_STMT), func)

    def check_call(self, call, func) -> None:
        ref = call.referenced
        if ref is None:
            return
        if self.ours(ref) or ref.kind == self.ck.FUNCTION_TEMPLATE:
            self.calls.setdefault(self.key(func), set()).add(self.key(ref))
        if ref.spelling in ("min", "max", "clamp") and ref.semantic_parent is not None and \
                ref.semantic_parent.spelling == "metal":
            fname = os.path.basename(_file(call) or "")
            args = list(call.get_arguments())
            tk = self.ci.TypeKind
            if args and args[0].type.get_canonical().kind in (tk.FLOAT, tk.HALF) \
                    and fname not in NAN_CHECKED_FILES:
                self.add(call, "nan-undefined", f"metal::{ref.spelling} on floating point is "
                         "undefined for NaN in MSL: use fmin/fmax or guard NaN explicitly "
                         "(and cover it by the NaN shim test, as fm_math.h)")

    def find_recursion(self) -> None:
        state: dict[tuple, int] = {}
        reported: set[tuple] = set()

        def dfs(k: tuple, stack: list[tuple]) -> None:
            state[k] = 1
            stack.append(k)
            for n in self.calls.get(k, ()):
                if state.get(n) == 1 and n in self.names and n not in reported:
                    cycle = stack[stack.index(n):]
                    reported.update(cycle)
                    path, line, name = self.names[n]
                    chain = " -> ".join(self.names[x][2] for x in cycle if x in self.names)
                    self.findings.append(Finding(path, line, "recursion",
                                                 f"'{name}' can call itself ({chain} -> {name}); "
                                                 "MSL functions cannot recurse"))
                elif state.get(n) is None:
                    dfs(n, stack)
            stack.pop()
            state[k] = 2

        for k in list(self.calls):
            if state.get(k) is None:
                dfs(k, [])


# ----------------------------------------------------------------------------- the gate
def classify(message: str, metal_names: set[str]) -> str:
    m = re.search(r"undeclared identifier '(\w+)'|no matching function for call to '(\w+)'", message)
    if m and (m.group(1) or m.group(2)) in metal_names:
        return "metal-namespace"
    if "read-only variable is not assignable" in message or "cannot assign to" in message:
        return "read-only-write"
    if "address space" in message or re.search(r"__(global|constant|local|private|generic)\b", message):
        return "address-space"
    return "compile"


def check_file(cindex, metal: Path, metal_dir: Path, gen_dir: Path) -> list[Finding]:
    findings: list[Finding] = []
    rel = lambda p: os.path.relpath(os.path.realpath(p), REPO)  # noqa: E731
    raw = metal.read_text()
    text = fe.blank_comments(raw)
    try:
        kernels = fe.parse_kernels(text, metal.name)
        expanded = fe.blank_comments(fe.expand_includes(metal, [metal_dir, gen_dir]))
        instances = fe.parse_instances(expanded, fe.parse_kernels(expanded, metal.name), metal.name)
    except fe.MslError as e:
        return [Finding(rel(metal), 1, "compile", str(e))]
    # Buffers: at most 31, indices 0..30, each once.
    for k in kernels.values():
        idx = [p.buffer for p in k.params if p.buffer is not None]
        if len(idx) > MAX_BUFFERS or any(i >= MAX_BUFFERS for i in idx) or len(set(idx)) != len(idx):
            findings.append(Finding(rel(metal), k.line, "buffer-count",
                                    f"kernel '{k.name}' binds buffers {sorted(idx)}: Metal has "
                                    f"{MAX_BUFFERS} buffer slots (0..{MAX_BUFFERS - 1}), each used once"))
    # Instances may sit in another file (elementwise_ops.h); bodies are this file's.
    local = [fe.Instance(i.host_name, kernels[i.kernel.name], i.template_args, i.targets)
             for i in instances if i.kernel.name in kernels]
    extra = threadgroup_asserts(text, local)
    extra_first_line = raw.count("\n") + 1
    index = cindex.Index.create()
    tu = index.parse(str(metal), args=[*CLANG_ARGS, "-I", str(STUB_DIR), "-I", str(metal_dir),
                                       "-I", str(gen_dir)],
                     unsaved_files=unsaved_sources(metal_dir, gen_dir, metal, extra))
    metal_names = metal_function_names()
    for d in tu.diagnostics:
        if d.severity < cindex.Diagnostic.Error:
            continue
        msg = d.spelling
        if "non-kernel function variable cannot be declared in local address space" in msg:
            continue  # kernels are plain functions here; the AST pass checks threadgroup scope
        path = d.location.file.name if d.location.file else str(metal)
        line = d.location.line
        m = re.search(r"fm_msl_threadgroup_size:(\w+):(\w+)", msg)
        if m and os.path.realpath(path) == os.path.realpath(metal) and line >= extra_first_line:
            k = kernels[m.group(2)]
            findings.append(Finding(rel(metal), k.line, "threadgroup-size",
                                    f"kernel instance '{m.group(1)}' declares more than "
                                    f"{MAX_THREADGROUP_BYTES} bytes of threadgroup memory"))
            continue
        findings.append(Finding(rel(path), line, classify(msg, metal_names), msg))
    ast = AstPass(cindex, metal_dir)
    ast.run(tu)
    findings += ast.findings
    # double: the keyword anywhere in the kernels or their headers, but where the Metal build
    # never sees it (without_discrete_only).
    for p in [metal, *sorted(metal_dir.glob("*.h"))]:
        t = without_discrete_only(fe.blank_comments(p.read_text(), strings=True))
        for m in re.finditer(r"\bdouble\b", t):
            findings.append(Finding(rel(p), fe.line_of(t, m.start()), "double",
                                    "double does not exist on Apple GPUs"))
    return findings


def without_discrete_only(text: str) -> str:
    """`text` with what the metallib build never compiles blanked (newlines kept, so line
    numbers stay): `#if FM_HAS_DOUBLE` blocks (FM_HAS_DOUBLE is 0 under __METAL_VERSION__,
    metal/fm_kernel.h) up to their #else/#endif, and the FM_INSTANTIATE_DISCRETE and
    FM_INSTANTIATE_CPU statements (which expand to static_assert there)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    text = re.sub(r"\bFM_INSTANTIATE_(?:DISCRETE|CPU)\s*\([^;]*\);", blank, text)
    out, depth, skipping = [], 0, False
    for line in text.split("\n"):
        directive = line.strip()
        if not skipping and re.match(r"#\s*if\s+FM_HAS_DOUBLE\b", directive):
            skipping, depth = True, 0
            out.append(" " * len(line))
            continue
        if skipping:
            if re.match(r"#\s*if", directive):
                depth += 1
            elif re.match(r"#\s*(endif|else|elif)", directive) and depth == 0:
                skipping = False
            elif re.match(r"#\s*endif", directive):
                depth -= 1
            out.append(" " * len(line) if skipping else line)
            continue
        out.append(line)
    return "\n".join(out)


def generate(metal_dir: Path, gen_dir: Path) -> None:
    import gen_kernels
    gen_dir.mkdir(parents=True, exist_ok=True)
    ops = gen_kernels.read_op_table(metal_dir / "elementwise_ops.tbl")
    (gen_dir / "elementwise_ops.h").write_text(gen_kernels.elementwise_header(ops))


def run_gate(metal_dir: Path, cindex=None, only: list[str] | None = None) -> list[Finding]:
    """Findings for every .metal file of metal_dir (or those named in `only`)."""
    if cindex is None:
        cindex, why = load_cindex()
        if cindex is None:
            raise RuntimeError(why)
    with tempfile.TemporaryDirectory() as tmp:
        gen_dir = Path(tmp)
        generate(metal_dir, gen_dir)
        findings: list[Finding] = []
        for metal in sorted(metal_dir.glob("*.metal")):
            if only is not None and metal.name not in only:
                continue
            findings += check_file(cindex, metal, metal_dir, gen_dir)
    # The textual rules, each place once (both passes have threadgroup-scope).
    seen = {(f.path, f.line, f.rule) for f in findings}
    findings += [f for f in text_findings(metal_dir, only) if (f.path, f.line, f.rule) not in seen]
    return sorted(set(findings), key=lambda f: (f.path, f.line, f.rule, f.message))


def text_findings(metal_dir: Path, only: list[str] | None = None) -> list[Finding]:
    """The portable subset's textual rules (msl_text_rules) over metal_dir's .metal and .h
    files (or the files named in `only`); needs no compiler."""
    findings = []
    for p in sorted(metal_dir.iterdir()):
        if p.suffix not in (".metal", ".h") or (only is not None and p.name not in only):
            continue
        rel = os.path.relpath(os.path.realpath(p), REPO)
        for line in msl_text_rules.lint_text(rel, p.read_text()):
            where, rule_message = line.split(": [", 1)
            rule, message = rule_message.split("] ", 1)
            findings.append(Finding(rel, int(where.rsplit(":", 1)[1]), rule, message))
    return findings


# ----------------------------------------------------------------------------- teeth
@dataclass(frozen=True)
class Mutation:
    name: str        # what is planted
    file: str        # the real file it goes into (a copy of it)
    old: str         # text replaced (must occur in the file)
    new: str
    rule: str        # the gate rule that must report it


# Each kind of error a Mac would reject, planted into a copy of a real kernel.
MUTATIONS = [
    Mutation("unqualified pointer in a kernel signature", "conv2d.metal",
             "kernel void conv2d_sum_splits(device const float* ws",
             "kernel void conv2d_sum_splits(const float* ws", "kernel-param"),
    Mutation("device pointer assigned to a thread pointer", "conv2d.metal",
             "    device const float* xc = x + (n * a.C_in + c0 + ci) * a.H * a.W;",
             "    thread const float* xc = x + (n * a.C_in + c0 + ci) * a.H * a.W;", "address-space"),
    Mutation("threadgroup variable in a helper function", "conv_gemm.h",
             "FM_FUNC Tap make_tap(int32_t base, int32_t h, int32_t w) {\n",
             "FM_FUNC Tap make_tap(int32_t base, int32_t h, int32_t w) {\n"
             "  threadgroup float scratch[4];\n", "threadgroup-scope"),
    Mutation("threadgroup variable in a nested block of a kernel", "conv_gemm.h",
             "  for (uint32_t c = tid; c < uint32_t(BN); c += T) {\n",
             "  for (uint32_t c = tid; c < uint32_t(BN); c += T) {\n    threadgroup float scratch[4];\n",
             "threadgroup-scope"),
    Mutation("mutable program-scope variable", "conv_gemm.h",
             "struct Tap {", "int32_t fm_launch_count = 0;\nstruct Tap {", "program-scope-var"),
    Mutation("write through a constant reference", "conv2d.metal",
             "  if (i < n) out[i] = sum_slices(ws, n, splits, i);\n",
             "  splits = 1;\n  if (i < n) out[i] = sum_slices(ws, n, splits, i);\n", "read-only-write"),
    Mutation("recursion", "conv_gemm.h",
             "struct Tap {",
             "FM_FUNC int32_t fm_depth(int32_t n) { return n > 0 ? fm_depth(n - 1) + 1 : 0; }\n"
             "struct Tap {", "recursion"),
    Mutation("metal:: function called without its namespace", "fm_math.h",
             "  return metal::select(metal::select(x, lo, x < lo), hi, x > hi);",
             "  return select(metal::select(x, lo, x < lo), hi, x > hi);", "metal-namespace"),
    Mutation("double", "conv2d.metal",
             "  float sum = 0.0f;\n  for (int32_t i = begin", "  double sum = 0.0;\n  for (int32_t i = begin", "double"),
    Mutation("double in the #else branch of #if FM_HAS_DOUBLE", "elementwise.metal",
             "template <typename Op>\nFM_FUNC double fm_result(Op op, double x, double y) { return op(x, y); }\n",
             "template <typename Op>\nFM_FUNC double fm_result(Op op, double x, double y) { return op(x, y); }\n"
             "#else\nFM_FUNC double fm_twice(double x) { return 2.0 * x; }\n", "double"),
    Mutation("more than 32 KiB of threadgroup memory", "conv2d.metal",
             "threadgroup float partial[kReduceSlots];",
             "threadgroup float partial[kReduceSlots * 9];", "threadgroup-size"),
    Mutation("more than 31 buffer arguments", "conv2d.metal",
             "                                  constant uint32_t& flags [[buffer(5)]],\n"
             "                                  uint3 gid",
             "                                  constant uint32_t& flags [[buffer(5)]],\n"
             + "".join(f"                                  device float* extra{i} [[buffer({6 + i})]],\n"
                       for i in range(26))
             + "                                  uint3 gid", "buffer-count"),
    Mutation("min/max on floats outside fm_math.h (undefined for NaN)", "conv2d.metal",
             "  if ((flags & FM_CONV_BIAS) != 0u) acc += bias[co];\n",
             "  if ((flags & FM_CONV_BIAS) != 0u) acc += bias[co];\n  acc = max(acc, -1e30f);\n", "nan-undefined"),
]


def copy_metal(metal_dir: Path, dst: Path) -> Path:
    shutil.copytree(metal_dir, dst, ignore=shutil.ignore_patterns("compat"))
    return dst


def plant(metal_copy: Path, m: Mutation) -> None:
    p = metal_copy / m.file
    text = p.read_text()
    if text.count(m.old) != 1:
        raise RuntimeError(f"mutation '{m.name}': the text to replace no longer occurs once in "
                           f"metal/{m.file}; update MUTATIONS")
    p.write_text(text.replace(m.old, m.new))


def includers(metal_dir: Path, header: str) -> list[str]:
    """The .metal files of metal_dir that include `header`, directly or through headers."""
    includes = {p.name: {Path(i).name for i in re.findall(r'^\s*#\s*include\s+"([^"]+)"',
                                                          p.read_text(), flags=re.M)}
                for p in metal_dir.iterdir() if p.suffix in (".metal", ".h")}
    reach = {header}
    while True:
        more = {name for name, inc in includes.items() if inc & reach} - reach
        if not more:
            break
        reach |= more
    found = sorted(n for n in reach if n.endswith(".metal"))
    if not found:
        raise RuntimeError(f"no kernel file of {metal_dir} includes {header}")
    return found


def self_check(metal_dir: Path, cindex) -> list[str]:
    """Problems with the gate's teeth ([] when every planted error is reported)."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        control = run_gate(copy_metal(metal_dir, Path(tmp) / "control"), cindex)
        if control:
            problems.append("the unmodified copy has findings: " + "; ".join(map(str, control)))
        for i, m in enumerate(MUTATIONS):
            copy = copy_metal(metal_dir, Path(tmp) / f"m{i}")
            plant(copy, m)
            # A header's error can only show in the kernel files that include it: parsing
            # the others (a clang parse each) could not report it.
            found = run_gate(copy, cindex, only=[m.file] if m.file.endswith(".metal") else
                             [m.file] + includers(copy, m.file))
            if not any(f.rule == m.rule for f in found):
                problems.append(f"planted '{m.name}' was not reported as [{m.rule}]; got: "
                                + ("; ".join(map(str, found)) or "nothing"))
    return problems


# ----------------------------------------------------------------------------- the table
def shim_build_rejects(metal_copy: Path, m: Mutation) -> bool:
    """Does the CPU build (g++ through metal/compat/cpu) reject the mutated file?"""
    import gen_kernels
    stem = Path(m.file).stem if m.file.endswith(".metal") else "elementwise"
    with tempfile.TemporaryDirectory() as gen:
        gen_dir = Path(gen)
        generate(metal_copy, gen_dir)
        instances = gen_kernels.parse_metal(metal_copy / f"{stem}.metal", [metal_copy, gen_dir])
        (gen_dir / "entries.cpp").write_text(gen_kernels.cpu_entries(stem, instances))
        cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-fsyntax-only", "-DFM_CPU_ISA=base",
               "-I", str(REPO / "metal/compat/cpu"), "-I", str(metal_copy), "-I", str(gen_dir),
               "-I", str(REPO / "csrc/backend/cpu"), "-I", str(REPO / "csrc"),
               str(gen_dir / "entries.cpp")]
        return subprocess.run(cmd, capture_output=True).returncode != 0


def mutation_table(metal_dir: Path, cindex) -> str:
    rows = ["| planted error | CPU shim build | textual rules | strict gate |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for i, m in enumerate(MUTATIONS):
            copy = copy_metal(metal_dir, Path(tmp) / f"m{i}")
            plant(copy, m)
            shim = shim_build_rejects(copy, m)
            lint = bool(msl_text_rules.lint_text(m.file, (copy / m.file).read_text()))
            gate = [f.rule for f in run_gate(copy, cindex)]
            rows.append(f"| {m.name} | {'rejected' if shim else 'accepted'} | "
                        f"{'rejected' if lint else 'accepted'} | "
                        f"{'rejected [' + m.rule + ']' if m.rule in gate else 'ACCEPTED'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metal-dir", type=Path, default=REPO / "metal")
    ap.add_argument("--self-check", action="store_true")
    ap.add_argument("--mutation-table", action="store_true")
    ns = ap.parse_args(argv)
    cindex, why = load_cindex()
    if cindex is None:
        print(f"check_msl: {why}", file=sys.stderr)
        return 2
    findings = run_gate(ns.metal_dir, cindex)
    for f in findings:
        print(f)
    rc = 1 if findings else 0
    if ns.self_check:
        for p in self_check(ns.metal_dir, cindex):
            print(f"check_msl: self-check: {p}", file=sys.stderr)
            rc = 1
    if ns.mutation_table:
        print(mutation_table(ns.metal_dir, cindex))
    return rc


if __name__ == "__main__":
    sys.exit(main())
