#!/usr/bin/env python3
"""Check that the CPU kernels' hot loops are vectorised, for every instruction set built.

Deterministic: it reads machine code, never a timing. For each ISA it generates the kernel
entries with tools/gen/gen_kernels.py (as the build does), compiles the entries that must be
vectorised with the build's own flags (parsed from CMakeLists.txt: FM_KERNEL_FLAGS and
FM_ISA_FLAGS_<isa>), and inspects each entry function's instructions:

  x86-64 (base, avx2, avx512)   g++ -c, then `objdump -dr`
  arm64                         the clang inside the `ziglang` wheel,
                                `-target aarch64-linux-gnu -S` (its assembly)

An entry passes when it has at least one packed floating-point arithmetic instruction of
the ISA's full vector width (xmm for base, ymm for avx2, zmm for avx512, v.4s for arm64)
and calls no libm function. An op with no arithmetic at all (its MSL expression is one of
its arguments, as `copy`) has none to find: it passes instead with a full-width packed
load AND a full-width packed store (x86 [v]movups/movaps/movdqu*/movdqa* on that register
width; arm64 ldr/ldp/ld1 and str/stp/st1 on q or v.4s registers), and no libm call. An op
computed on the floats' bits (BIT_ENTRIES: nextafter) may show packed integer compares and
adds instead of float arithmetic. Checked entries: every contiguous float32 elementwise entry
(entry_unary_v_*_float32, entry_binary_v_*_float32) and the numerics kernels' lane-loop
variants (fourier_series_l16/l64, stencil_interior_*_l16_*).

Where the CPU shim turns MSL's ldexp into one instruction for the compiler and ISA at hand
(it defines FM_SHIM_VECTOR_LDEXP: clang 22 and later on AVX-512), the exp-based entries
(SCALEF_ENTRIES) must also contain a full-width vscalefps: the scale step of fm_math.h's
exps is that instruction, not a libm ldexpf call and not the portable form.

Usage: check_vectorised.py [--isa NAME ...] [--plant 'EXPR' ...] [--keep DIR] [--cxx CMD]
  --plant EXPR   add an op `planted_<i>` computing the MSL expression EXPR (unary, in x) to a
                 copy of the op table: the self-test that a loop the compiler cannot
                 vectorise is reported.
  --cxx CMD      the x86-64 compiler (default $CXX, else g++): run the check under another
                 GCC or under clang, e.g. --cxx 'python3 -m ziglang c++ -target x86_64-linux-gnu'.
Exit status 0 when every entry passes, 1 with one line per failure, 3 when a tool is
missing (the message says which).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
X86_ISAS = ("base", "avx2", "avx512")
ALL_ISAS = X86_ISAS + ("arm64",)

# Packed single-precision arithmetic (not moves or shuffles), and the register it needs.
X86_PACKED = re.compile(
    r"^v?(add|sub|mul|div|min|max|sqrt|rcp14|rsqrt14|rcp|rsqrt|and|andn|or|xor|cmp[a-z]*|"
    r"blendv|blendm|round|rndscale|fn?m(add|sub)(132|213|231)|getexp|scalef)ps$"
    # AVX-512's bitwise ternary logic on whole registers (copysign's and/or of sign bits)
    r"|^vpternlog[dq]$")
X86_WIDTH = {"base": "%xmm", "avx2": "%ymm", "avx512": "%zmm"}
ARM_PACKED = re.compile(
    r"^\s*(fadd|fsub|fmul|fdiv|fmla|fmls|fmax|fmin|fmaxnm|fminnm|fsqrt|fabs|fneg|fcm[a-z]+|"
    r"frint[a-z]|fcvt[a-z]+|scvtf|ucvtf)\s+v\d+\.4s"
    # bitwise selects on whole vectors (copysign: the sign bit of one lane into another)
    r"|^\s*(bif|bit|bsl)\s+v\d+\.16b")
# Entries whose work is integer arithmetic on the floats' bits (nextafter: compares and +-1 on
# the bit patterns, so subnormals stay exact): packed integer compares and adds at the ISA's
# full width count as their vector work (GCC picks float-domain blends for the selects,
# clang integer ones).
BIT_ENTRIES = ("binary_v_nextafter_float32",)
X86_PACKED_INT = re.compile(r"^v?p(add|sub|cmpgt|cmpeq|min[su]|max[su])[bwdq]$")
ARM_PACKED_INT = re.compile(r"^\s*(add|sub|cmgt|cmge|cmeq|cmhi|cmhs)\s+v\d+\.4s")
LIBM = re.compile(r"\b(sin|cos|tan|exp|exp2|expm1|log|log2|log10|log1p|pow|tanh|sinh|cosh|"
                  r"atan|atan2|asin|acos|erf|erfc|fma|rint|nearbyint|round|floor|ceil|trunc|"
                  r"sqrt|fmod|cbrt|hypot|ldexp|scalbn)f?\b")
# Entries whose loop scales by 2^n with the shim's ldexp where it is one instruction
# (fm_exp, and fm_exp_nonpos in sigmoid), and that instruction per ISA.
SCALEF_ENTRIES = ("unary_v_exp_float32", "unary_v_sigmoid_float32")
SCALEF_INSTR = {"avx512": "vscalefps"}
ENTRY_NAME = re.compile(r"entry_([a-z0-9_]+)")
# Full-width packed moves, for the ops that only move data.
X86_MOVE = re.compile(r"^v?(movups|movaps|movdqu|movdqa|movdqu(8|16|32|64)|movdqa(32|64))$")
ARM_LOAD = re.compile(r"^\s*(ldr|ldur|ldp|ldnp)\s+q\d+|^\s*ld1\s+\{\s*v\d+\.4s")
ARM_STORE = re.compile(r"^\s*(str|stur|stp|stnp)\s+q\d+|^\s*st1\s+\{\s*v\d+\.4s")


def move_only_ops(metal: Path) -> set[str]:
    """Ops of the table whose MSL expression is just one of their arguments (no arithmetic)."""
    ops = set()
    for line in (metal / "elementwise_ops.tbl").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        cols = [c.strip() for c in line.split(" | ")]
        args = [a.strip() for a in cols[1].split(",")]
        if cols[2] in args:
            ops.add(cols[0])
    return ops


def moves_only(entry: str, move_ops: set[str]) -> bool:
    m = re.fullmatch(r"(?:unary|binary)_v_([a-z0-9_]+)_float32", entry)
    return m is not None and m.group(1) in move_ops


def wanted(entry: str) -> bool:
    """The entries whose loop must be vectorised."""
    return (re.fullmatch(r"(unary|binary)_v_[a-z0-9_]+_float32", entry) is not None
            or re.fullmatch(r"fourier_series_l(16|64)", entry) is not None
            or re.fullmatch(r"stencil_interior_[0-9]+(pp)?_l16_(axis|inner)", entry) is not None)


class ToolMissing(Exception):
    pass


def cmake_flags() -> dict[str, list[str]]:
    """FM_KERNEL_FLAGS and FM_ISA_FLAGS_<isa> as CMakeLists.txt sets them."""
    text = (ROOT / "CMakeLists.txt").read_text()
    flags = {}
    for name, value in re.findall(r"set\((FM_KERNEL_FLAGS|FM_ISA_FLAGS_\w+)\s+([^)]*)\)", text):
        flags[name] = [t for t in value.split() if not t.startswith('"')]
    if "FM_KERNEL_FLAGS" not in flags:
        raise RuntimeError("CMakeLists.txt sets no FM_KERNEL_FLAGS")
    return flags


def generate(workdir: Path, plants: list[str]) -> Path:
    """Run the generator (on a copy of metal/ with the planted ops planted_0, planted_1, ...
    if any); returns its out dir."""
    metal = ROOT / "metal"
    if plants:
        metal = workdir / "metal"
        shutil.copytree(ROOT / "metal", metal)
        with open(metal / "elementwise_ops.tbl", "a") as f:
            for i, expr in enumerate(plants):
                f.write(f"planted_{i}    | x    | {expr} | x | - | Planted by check_vectorised.py.\n")
    out = workdir / "gen"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "gen" / "gen_kernels.py"), "--metal-dir",
                        str(metal), "--out-dir", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"gen_kernels.py failed:\n{r.stderr[-3000:]}")
    return out


def reduced_source(gen: Path, stem: str) -> str | None:
    """The generated entry file of `stem` with only the wanted entries (and a use of each)."""
    text = (gen / f"cpu_entries_{stem}.cpp").read_text()
    head, sep, rest = text.partition("namespace {\n")
    if not sep:
        raise RuntimeError(f"unexpected layout of cpu_entries_{stem}.cpp")
    blocks = re.findall(r"^void entry_([a-z0-9_]+)\(.*?^}\n", rest, flags=re.M | re.S)
    bodies = re.findall(r"(^void entry_[a-z0-9_]+\(.*?^}\n)", rest, flags=re.M | re.S)
    keep = [(n, b) for n, b in zip(blocks, bodies) if wanted(n)]
    if not keep:
        return None
    uses = ", ".join(f"(void*)&entry_{n}" for n, _ in keep)
    return (head + sep + "".join(b for _, b in keep) + "}  // namespace\n"
            f"void* volatile fm_vectorised_check_keep[] = {{{uses}}};\n"
            "}  // namespace fm::cpu::FM_CPU_ISA\n")


def include_flags(gen: Path, metal: Path) -> list[str]:
    return [f"-I{metal / 'compat' / 'cpu'}", f"-I{metal}", f"-I{gen}",
            f"-I{ROOT / 'csrc' / 'backend' / 'cpu'}", f"-I{ROOT / 'csrc'}"]


def compiler_for(isa: str, cxx: list[str] | None = None) -> list[str]:
    """The compiler command for `isa`: for x86-64 `cxx` if given, else $CXX, else g++."""
    if isa == "arm64":
        try:
            import ziglang  # noqa: F401
        except ImportError:
            raise ToolMissing("the ziglang wheel (pip install ziglang) to cross-compile arm64")
        return [sys.executable, "-m", "ziglang", "c++", "-target", "aarch64-linux-gnu", "-g0"]
    cmd = cxx or shlex.split(os.environ.get("CXX", "g++"))
    if shutil.which(cmd[0]) is None:
        raise ToolMissing(f"a C++ compiler ({cmd[0]})")
    if shutil.which("objdump") is None:
        raise ToolMissing("objdump (binutils) to disassemble the x86-64 objects")
    return cmd


def functions_x86(obj: Path) -> dict[str, list[str]]:
    """Symbol -> its instruction lines (relocations included), from `objdump -dr`."""
    out = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", str(obj)], check=True,
                         capture_output=True, text=True).stdout
    funcs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            current = funcs.setdefault(m.group(1), [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return funcs


def functions_asm(asm: Path) -> dict[str, list[str]]:
    """Symbol -> its instruction lines, from compiler assembly (-S)."""
    funcs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in asm.read_text(errors="replace").splitlines():
        m = re.match(r"^([A-Za-z_$][\w.$]*):", line)
        if m:
            current = funcs.setdefault(m.group(1), [])
        elif current is not None and line.startswith("\t") and not line.lstrip().startswith("."):
            current.append(line.strip())
    return funcs


def callees(instrs: list[str]) -> set[str]:
    """Symbols a function calls or jumps to (x86 call/jmp with <sym> or a relocation; arm64 bl/b)."""
    out = set()
    for ins in instrs:
        m = re.search(r"\b(?:call|jmp)\w*\s+[0-9a-f]+ <([^>+]+)", ins) or re.match(r"bl?\s+([A-Za-z_]\w*)$", ins)
        if m:
            out.add(m.group(1))
        m = re.search(r"R_X86_64_(?:PLT|PC)32\s+([^-+\s]+)", ins)
        if m:
            out.add(m.group(1))
    return out


def entry_code(funcs: dict[str, list[str]], symbol: str) -> list[str]:
    """The entry's instructions plus those of every function of the same file it calls
    (a kernel too big to inline stays a function of its own)."""
    seen, todo, code = {symbol}, [symbol], []
    while todo:
        instrs = funcs[todo.pop()]
        code += instrs
        for c in callees(instrs):
            if c in funcs and c not in seen:
                seen.add(c)
                todo.append(c)
    return code


def judge(isa: str, instrs: list[str], moves: bool = False, need: str | None = None,
          bits: bool = False) -> str | None:
    """None when the function is vectorised for `isa`, else why not. `moves`: the op has no
    arithmetic, so full-width packed loads and stores are the evidence instead. `need`: an
    x86 mnemonic that must also appear at the ISA's full width. `bits`: the op computes on
    the bit patterns (BIT_ENTRIES), so packed integer arithmetic counts too."""
    calls = []
    packed = 0
    loads = stores = 0
    needed = 0
    for ins in instrs:
        if isa == "arm64":
            if ARM_PACKED.match(ins) or (bits and ARM_PACKED_INT.match(ins)):
                packed += 1
            loads += bool(ARM_LOAD.match(ins))
            stores += bool(ARM_STORE.match(ins))
            m = re.match(r"b(l)?\s+(\w+)", ins)
            if m and LIBM.fullmatch(m.group(2)):
                calls.append(m.group(2))
        else:
            if "R_X86_64_PLT32" in ins or "R_X86_64_PC32" in ins:
                target = ins.split()[-1].split("-")[0].split("+")[0]
                if LIBM.fullmatch(target):
                    calls.append(target)
                continue
            parts = ins.split(None, 2)
            if len(parts) >= 3 and X86_WIDTH[isa] in parts[2] and (
                    X86_PACKED.match(parts[1]) or (bits and X86_PACKED_INT.match(parts[1]))):
                packed += 1
            if need and len(parts) >= 3 and parts[1] == need and X86_WIDTH[isa] in parts[2]:
                needed += 1
            if len(parts) >= 3 and X86_MOVE.match(parts[1]) and "(" in parts[2]:
                # AT&T order: a store is `reg,mem`, a load `mem,reg`.
                if parts[2].startswith(X86_WIDTH[isa]):
                    stores += 1
                elif parts[2].rsplit(",", 1)[-1].startswith(X86_WIDTH[isa]):
                    loads += 1
    if calls:
        return f"calls libm ({', '.join(sorted(set(calls)))}) in its loop"
    if moves:
        if loads == 0 or stores == 0:
            width = "q / v.4s" if isa == "arm64" else X86_WIDTH[isa]
            return f"moves data without full-width packed loads and stores on {width} registers (scalar loop)"
        return None
    if packed == 0:
        width = "v.4s" if isa == "arm64" else X86_WIDTH[isa]
        return f"has no packed float arithmetic on {width} registers (scalar loop)"
    if need and needed == 0:
        return f"has no {need} on {X86_WIDTH[isa]} registers (the shim's FM_SHIM_VECTOR_LDEXP is on)"
    return None


def kernel_compiler(isa: str, flags: dict[str, list[str]], cxx: list[str] | None = None) -> list[str]:
    """The compiler command with the flags the build gives `isa`'s kernels (CMake's)."""
    isa_flags = [] if isa == "arm64" else flags.get(f"FM_ISA_FLAGS_{isa}", [])
    return compiler_for(isa, cxx) + ["-std=gnu++17"] + flags["FM_KERNEL_FLAGS"] + isa_flags


def shim_vector_ldexp(isa: str, metal: Path, flags: dict[str, list[str]], work: Path,
                      cxx: list[str] | None = None) -> bool:
    """Whether the CPU shim, under this compiler and ISA's flags, has ldexp as one vector
    instruction (defines FM_SHIM_VECTOR_LDEXP), as the kernels are compiled."""
    if isa not in SCALEF_INSTR:
        return False
    probe = work / f"ldexp_probe_{isa}.cpp"
    probe.write_text('#include "metal_stdlib"\n')
    cmd = (kernel_compiler(isa, flags, cxx) + [f"-I{metal / 'compat' / 'cpu'}",
           f"-I{ROOT / 'csrc' / 'backend' / 'cpu'}", f"-I{ROOT / 'csrc'}", "-E", "-dM", str(probe)])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"preprocessing the CPU shim for {isa} failed:\n{r.stderr[-3000:]}")
    return re.search(r"^#define FM_SHIM_VECTOR_LDEXP\b", r.stdout, flags=re.M) is not None


def check_isa(isa: str, gen: Path, metal: Path, flags: dict[str, list[str]], work: Path,
              stems: list[str], cxx: list[str] | None = None) -> tuple[list[str], int]:
    """Failures for one ISA, and how many entries were checked."""
    cc = kernel_compiler(isa, flags, cxx)
    need = SCALEF_INSTR[isa] if shim_vector_ldexp(isa, metal, flags, work, cxx) else None
    failures: list[str] = []
    checked = 0
    move_ops = move_only_ops(metal)
    for stem in stems:
        src_text = reduced_source(gen, stem)
        if src_text is None:
            continue
        src = work / f"{stem}_{isa}.cpp"
        src.write_text(src_text)
        out = work / (f"{stem}_{isa}.s" if isa == "arm64" else f"{stem}_{isa}.o")
        mode = ["-S"] if isa == "arm64" else ["-c"]
        cmd = (cc + [f"-DFM_CPU_ISA={isa}"] + include_flags(gen, metal) + mode + [str(src), "-o", str(out)])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling {src.name} for {isa} failed:\n{r.stderr[-3000:]}")
        funcs = functions_asm(out) if isa == "arm64" else functions_x86(out)
        for symbol in sorted(funcs):
            e = ENTRY_NAME.search(symbol)
            name = e.group(1) if e else ""
            if not wanted(name):
                continue
            checked += 1
            why = judge(isa, entry_code(funcs, symbol), moves_only(name, move_ops),
                        need if name in SCALEF_ENTRIES else None, name in BIT_ENTRIES)
            if why:
                failures.append(f"{isa}: entry_{name} {why}")
    return failures, checked


def run(isas: list[str], plants: list[str] | None = None, keep: Path | None = None,
        cxx: list[str] | None = None) -> tuple[list[str], dict[str, int]]:
    """(failures, entries checked per ISA). Raises ToolMissing when a compiler or objdump is.
    `cxx`: the x86-64 compiler command (default $CXX, else g++)."""
    plants = plants or []
    flags = cmake_flags()
    tmp = tempfile.mkdtemp(prefix="fm_vec_") if keep is None else str(keep)
    work = Path(tmp)
    work.mkdir(parents=True, exist_ok=True)
    try:
        gen = generate(work, plants)
        metal = work / "metal" if plants else ROOT / "metal"
        stems = ["elementwise", "numerics"]
        for isa in isas:
            compiler_for(isa, cxx)  # fail early, before compiling anything
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda i: check_isa(i, gen, metal, flags, work, stems, cxx), isas))
        failures = [f for fs, _ in results for f in fs]
        counts = {isa: n for isa, (_, n) in zip(isas, results)}
        return failures, counts
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def expected_entries(plants: list[str] | None = None) -> list[str]:
    """The wanted entries the generator produces (what run() must check, per ISA)."""
    with tempfile.TemporaryDirectory(prefix="fm_vec_") as tmp:
        gen = generate(Path(tmp), plants or [])
        names = []
        for src in sorted(gen.glob("cpu_entries_*.cpp")):
            names += [n for n in re.findall(r"^void entry_([a-z0-9_]+)\(", src.read_text(), flags=re.M)
                      if wanted(n)]
        return sorted(set(names))


def built_isas() -> list[str]:
    """The ISAs a build on this kind of machine produces (CMakeLists.txt), plus arm64."""
    import platform
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    return list(X86_ISAS if x86 else ()) + ["arm64"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isa", action="append", choices=ALL_ISAS)
    ap.add_argument("--plant", action="append")
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--cxx", help="x86-64 compiler command, e.g. 'g++-13' or "
                    "'python -m ziglang c++ -target x86_64-linux-gnu' (default: $CXX, else g++)")
    args = ap.parse_args(argv)
    try:
        failures, counts = run(args.isa or built_isas(), args.plant, args.keep,
                              shlex.split(args.cxx) if args.cxx else None)
    except ToolMissing as e:
        print(f"check_vectorised: missing {e}", file=sys.stderr)
        return 3
    for f in failures:
        print(f)
    print("checked " + ", ".join(f"{isa}: {n} entries" for isa, n in counts.items()),
          file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
