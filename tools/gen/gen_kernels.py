#!/usr/bin/env python3
"""Generate everything that is derived from the .metal kernels and the op table.

    gen_kernels.py --metal-dir metal --out-dir build/gen [--cuda]

Writes into --out-dir:
  elementwise_ops.h        MSL: one functor per op of elementwise_ops.tbl + FM_INSTANTIATE
                           lines for every (layout, dtype, op)
  cpu_entries_<stem>.cpp   C++: a launch entry per kernel instance of metal/<stem>.metal,
                           compiled once per CPU ISA (the ISA namespace comes from -DFM_CPU_ISA)
  kernel_stems.h           X-list of the stems, for the backends' kernel tables
  cuda_entries_<stem>.cu   CUDA: a __global__ wrapper per kernel instance (with --cuda)
  kernels.json             manifest: host name -> buffer indices, builtins, mode

The kernels are read by the project's one MSL front end (tools/gen/msl_frontend.py); this file
has one emitter per target (CPU entries, CUDA wrappers, manifest). Instances made with
FM_INSTANTIATE_CPU get CPU entries only (no CUDA wrapper; the metallib leaves them out too);
FM_INSTANTIATE_DISCRETE get CPU and CUDA entries (the metallib leaves them out). Instances of
double (float64) get their CPU entries in the base ISA's copy only, which registers them into
every ISA's table (is_base_isa_only).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from msl_frontend import BUILTINS, Instance, MslError, parse_metal  # noqa: E402

DTYPES = {"float32": "float", "float16": "half"}
UNARY_LAYOUTS = ("v", "w", "r", "s", "g")
BINARY_LAYOUTS = ("v", "w", "sv", "vs", "r", "rw", "s", "g")
# float64: every op computed in double (its double operator()), for the layouts that take one
# element at a time (the 16-byte-chunk ones, w and rw, are float32/float16 only: the host
# never picks them for float64). FM_INSTANTIATE_DISCRETE: CPU and CUDA, not the metallib.
F64_UNARY_LAYOUTS = ("v", "r", "s", "g")
F64_BINARY_LAYOUTS = ("v", "sv", "vs", "r", "s", "g")

# ----------------------------------------------------------------------------- op table
@dataclass
class Op:
    name: str
    arity: int
    msl: str
    numpy: str
    grad: str
    doc: str


def read_op_table(path: Path) -> list[Op]:
    ops = []
    for lineno, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        cols = [c.strip() for c in line.split(" | ")]
        if len(cols) != 6:
            sys.exit(f"{path}:{lineno}: expected 6 columns separated by ' | ' (name, args, msl, "
                     f"numpy, grad, doc), got {len(cols)}")
        name, args, msl, numpy_ref, grad, doc = cols
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            sys.exit(f"{path}:{lineno}: bad op name {name!r}")
        arity = {"x": 1, "x, y": 2}.get(args)
        if arity is None:
            sys.exit(f"{path}:{lineno}: args must be 'x' or 'x, y', got {args!r}")
        ops.append(Op(name, arity, msl, numpy_ref, grad, doc))
    names = [o.name for o in ops]
    if len(set(names)) != len(names):
        sys.exit(f"{path}: duplicate op names")
    return ops


def f16_helpers(math_header: Path) -> set[str]:
    """Helpers of fm_math.h with a float16-result variant: fm_NAME with an fm_NAME_f16."""
    names = set(re.findall(r"\bFM_FUNC\s+float\s+(fm_\w+)_f16\s*\(", math_header.read_text()))
    return names


def f16_expression(msl: str, helpers: set[str]) -> str:
    """The op's expression for float16 results: each helper that has one takes its _f16 form."""
    return re.sub(r"\b(fm_\w+)(\s*\()",
                  lambda m: f"{m.group(1)}_f16{m.group(2)}" if m.group(1) in helpers else m.group(0), msl)


def f64_helpers(math64_header: Path) -> set[str]:
    """Helpers with a double overload in fm_math64.h."""
    return set(re.findall(r"\bFM_FUNC\s+(?:double|bool)\s+(fm_\w+)\s*\(", math64_header.read_text()))


FLOAT_LITERAL_RE = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)[fF]\b")


def f64_expression(op: Op, helpers: set[str] | None) -> str:
    """The op's expression computed in double: float literals lose their f suffix (1e-12f
    would be 1e-12 rounded to float) and the type float becomes double; every fm_ helper
    must have a double overload in fm_math64.h (else the float one would be called
    silently, through a conversion)."""
    expr = re.sub(r"\bfloat\b", "double", FLOAT_LITERAL_RE.sub(r"\1", op.msl))
    if re.search(r"\bhalf\b", expr):
        sys.exit(f"elementwise_ops.tbl: {op.name}: the expression names half; its double form "
                 f"cannot be derived: {op.msl!r}")
    if helpers is not None:
        missing = sorted(set(re.findall(r"\b(fm_\w+)\s*\(", expr)) - helpers)
        if missing:
            sys.exit(f"elementwise_ops.tbl: {op.name} calls {', '.join(missing)}, which have no "
                     "double overload in metal/fm_math64.h (add one there)")
    return expr


def elementwise_header(ops: list[Op], helpers: set[str] = frozenset(),
                       helpers64: set[str] | None = None) -> str:
    out = ["// Generated by tools/gen/gen_kernels.py from metal/elementwise_ops.tbl. Do not edit.",
           "// operator() gives a float32 result; f16() the same op for a result stored as half",
           "// (the _f16 variants of fm_math.h helpers, where there are any); where the target has",
           "// double, operator()<double> computes the op in double (fm_math64.h's helpers).",
           "#pragma once",
           "#if FM_HAS_DOUBLE",
           '#include "fm_math64.h"',
           "#endif", ""]
    for op in ops:
        params = "float x" if op.arity == 1 else "float x, float y"
        params64 = "D x" if op.arity == 1 else "D x, D y"
        out.append(f"struct Op_{op.name} {{")
        out.append(f"  FM_FUNC float operator()({params}) const {{ return {op.msl}; }}")
        out.append(f"  FM_FUNC float f16({params}) const {{ return {f16_expression(op.msl, helpers)}; }}")
        # A template (D = double): its body compiles only where a float64 instance uses it,
        # so an expression with no double form (bit tricks on a float) fails there alone.
        out.append("#if FM_HAS_DOUBLE")
        out.append("  template <typename D>")
        out.append(f"  FM_FUNC D operator()({params64}) const {{ return {f64_expression(op, helpers64)}; }}")
        out.append("#endif")
        out.append("};")
    out.append("")
    for op in ops:
        layouts = UNARY_LAYOUTS if op.arity == 1 else BINARY_LAYOUTS
        prefix = "unary" if op.arity == 1 else "binary"
        for layout in layouts:
            for dname, mtype in DTYPES.items():
                host = f"{prefix}_{layout}_{op.name}_{dname}"
                out.append(f'FM_INSTANTIATE("{host}", {prefix}_{layout}, {mtype}, Op_{op.name});')
        for layout in F64_UNARY_LAYOUTS if op.arity == 1 else F64_BINARY_LAYOUTS:
            host = f"{prefix}_{layout}_{op.name}_float64"
            out.append(f'FM_INSTANTIATE_DISCRETE("{host}", {prefix}_{layout}, double, Op_{op.name});')
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- CPU entries
def is_base_isa_only(inst: Instance) -> bool:
    """float64 instances: compiled in the base ISA's copy only, and registered from there into
    every ISA's table. Their work is libm calls (which no ISA vectorises) or memory-bound
    loops, so the avx2/avx512 copies would only cost build time (two thirds of it)."""
    return re.search(r"\bdouble\b", inst.template_args or "") is not None


def cpu_entries(stem: str, instances: list[Instance]) -> str:
    base_only = [inst for inst in instances if is_base_isa_only(inst)]
    instances = [inst for inst in instances if not is_base_isa_only(inst)]
    out = [
        f"// Generated by tools/gen/gen_kernels.py from metal/{stem}.metal. Do not edit.",
        "// Compiled once per CPU ISA; FM_CPU_ISA names the namespace of this copy.",
        '#include "fm_cpu_prelude.h"',
        f'#include "{stem}.metal"',
        '#include "fm_end.h"',
        '#include "fm_cpu_entry.h"',
        "",
        "namespace fm::cpu::FM_CPU_ISA {",
        "namespace {",
    ]
    out += cpu_entry_functions(instances)
    out.append("}  // namespace")
    out.append("")
    if base_only:
        # The float64 instances: entries and their registration in the base copy only.
        out.append("#if FM_CPU_ISA_IS_BASE(FM_CPU_ISA)")
        out.append("namespace {")
        out += cpu_entry_functions(base_only)
        out.append("}  // namespace")
        out.append(f"void register_{stem}_base_only(::fm::cpu::KernelTable& table) {{")
        out += cpu_registrations(base_only)
        out.append("}")
        out.append("#endif")
        out.append("}  // namespace fm::cpu::FM_CPU_ISA")
        out.append("namespace fm::cpu::base {")
        out.append(f"void register_{stem}_base_only(::fm::cpu::KernelTable& table);")
        out.append("}  // namespace fm::cpu::base")
        out.append("namespace fm::cpu::FM_CPU_ISA {")
    out.append(f"void register_{stem}(::fm::cpu::KernelTable& table) {{")
    out += cpu_registrations(instances)
    if base_only:
        out.append(f"  ::fm::cpu::base::register_{stem}_base_only(table);")
    out.append("}")
    out.append("}  // namespace fm::cpu::FM_CPU_ISA")
    return "\n".join(out) + "\n"


def cpu_registrations(instances: list[Instance]) -> list[str]:
    return [f'  table.add("{inst.host_name}", &entry_{inst.host_name}, ::fm::cpu::Mode::{inst.mode}, '
            f'{written_buffers(inst)}u);'
            for inst in instances]


def cpu_entry_functions(instances: list[Instance]) -> list[str]:
    out = []
    for inst in instances:
        args = []
        for i, p in enumerate(inst.kernel.params):
            if p.buffer is not None:
                args.append(f"::fm::cpu::arg<F, {i}>(a[{p.buffer}])")
            elif inst.mode == "grid":
                src = "pos" if p.builtin == "thread_position_in_grid" else "L.grid"
                args.append(f"::fm::cpu::builtin<F, {i}>({src})")
            else:
                args.append(f"::fm::cpu::builtin<F, {i}>(t.{BUILTINS[p.builtin]})")
        call = f"{inst.call}({', '.join(args)})"
        out.append(f"void entry_{inst.host_name}(const ::fm::cpu::Launch& L, void* const* a) {{")
        out.append(f"  using F = decltype(&{inst.call});")
        if inst.mode == "grid":
            out.append(f"  ::fm::cpu::run_grid(L, [&](::fm::cpu::uvec3 pos) {{ {call}; }});")
        elif inst.mode == "groups":
            out.append(f"  ::fm::cpu::run_groups(L, [&](const ::fm::cpu::ThreadIds& t) {{ {call}; }});")
        else:
            out.append(f"  ::fm::cpu::run_emulated(L, [&](const ::fm::cpu::ThreadIds& t) {{ {call}; }});")
        out.append("}")
    return out


# ----------------------------------------------------------------------------- CUDA entries
def is_constant_block(p) -> bool:
    """A `constant T&` argument block (small host data that may travel inside the launch
    parameters), as opposed to a `device` buffer (always a pointer to device memory)."""
    return p.decl.lstrip().startswith("constant")


def is_read_only(p) -> bool:
    """A `device const T*` buffer: the kernel cannot write through it (the compiler refuses)."""
    return re.match(r"(device\s+const|const\s+device)\b", p.decl.lstrip()) is not None


def written_buffers(inst: Instance) -> int:
    """Bit i set where [[buffer(i)]] is device memory the kernel may write: the buffers not
    declared const (fastmetal.compile's replay orders launches by what they write,
    csrc/backend/capture_order.h)."""
    return sum(1 << p.buffer for p in inst.kernel.params
               if p.buffer is not None and not is_constant_block(p) and not is_read_only(p))


def cuda_entries(stem: str, instances: list[Instance]) -> str:
    out = [
        f"// Generated by tools/gen/gen_kernels.py from metal/{stem}.metal. Do not edit.",
        '#include "fm_cuda_prelude.h"',
        f'#include "{stem}.metal"',
        '#include "fm_end.h"',
        '#include "fm_cuda_entry.h"',
        "",
        "namespace fm::cuda_kernels {",
    ]
    instances = [inst for inst in instances if "cuda" in inst.targets]
    for inst in instances:
        args = []
        for i, p in enumerate(inst.kernel.params):
            if p.buffer is not None and not is_constant_block(p):
                # Device memory: always a pointer. Read straight from the launch parameters
                # (not through arg_ptr's select, whose generic pointer made ptxas keep more
                # live values and spill twice as much in the conv GEMMs).
                args.append(f"::fm::cudak::arg<F, {i}>(a.ptr[{p.buffer}])")
            elif p.buffer is not None:
                args.append(f"::fm::cudak::arg<F, {i}>(::fm::cudak::arg_ptr(a, {p.buffer}))")
            else:
                args.append(f"::fm::cudak::builtin<F, {i}>(t.{BUILTINS[p.builtin]})")
        out.append(f"__global__ void k_{inst.host_name}(const __grid_constant__ ::fm::cudak::Args a, "
                   "::fm::cudak::Dims d) {")
        out.append(f"  using F = decltype(&{inst.call});")
        out.append("  const ::fm::cudak::ThreadIds t = ::fm::cudak::thread_ids(d);")
        if inst.mode != "emulated" and not inst.kernel.synchronizes:
            out.append("  if (!t.in_grid) return;")
        out.append(f"  {inst.call}({', '.join(args)});")
        out.append("}")
    out.append("")
    out.append(f"void register_{stem}(::fm::cudak::KernelTable& table) {{")
    for inst in instances:
        sync = "true" if inst.kernel.synchronizes else "false"
        inline_ok = sum(1 << p.buffer for p in inst.kernel.params
                        if p.buffer is not None and is_constant_block(p))
        out.append(f'  table.add("{inst.host_name}", (const void*)&k_{inst.host_name}, {sync}, '
                   f'{inline_ok}u, {written_buffers(inst)}u);')
    out.append("}")
    out.append("}  // namespace fm::cuda_kernels")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- main
def write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metal-dir", type=Path, required=True)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--cuda", action="store_true")
    ns = ap.parse_args()
    out_dir: Path = ns.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    ops = read_op_table(ns.metal_dir / "elementwise_ops.tbl")
    write_if_changed(out_dir / "elementwise_ops.h",
                     elementwise_header(ops, f16_helpers(ns.metal_dir / "fm_math.h"),
                                        f64_helpers(ns.metal_dir / "fm_math64.h")))

    manifest = {}
    stems = []
    for metal in sorted(ns.metal_dir.glob("*.metal")):
        stem = metal.stem
        try:
            instances = parse_metal(metal, [ns.metal_dir, out_dir])
        except MslError as e:
            sys.exit(str(e))
        stems.append(stem)
        write_if_changed(out_dir / f"cpu_entries_{stem}.cpp", cpu_entries(stem, instances))
        if ns.cuda:
            write_if_changed(out_dir / f"cuda_entries_{stem}.cu", cuda_entries(stem, instances))
        for inst in instances:
            manifest[inst.host_name] = {
                "file": metal.name,
                "function": inst.call,
                "mode": inst.mode,
                "targets": sorted(inst.targets),
                "buffers": {p.name: p.buffer for p in inst.kernel.params if p.buffer is not None},
                "builtins": {p.name: p.builtin for p in inst.kernel.params if p.builtin},
                "written": sorted(p.buffer for p in inst.kernel.params if p.buffer is not None
                                  and (written_buffers(inst) >> p.buffer) & 1),
            }
    write_if_changed(out_dir / "kernel_stems.h",
                     "// Generated by tools/gen/gen_kernels.py: one X(stem) per metal/*.metal file.\n"
                     "#define FM_KERNEL_STEMS(X)" + "".join(f" X({s})" for s in stems) + "\n")
    write_if_changed(out_dir / "kernels.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
