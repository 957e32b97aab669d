"""The CPU kernels' hot loops are vectorised on every instruction set the build produces.

Reads machine code (tools/ci/check_vectorised.py), never timings. Without a needed tool
(g++/objdump for x86-64, the ziglang wheel for arm64) the test skips with the reason,
unless FASTMETAL_REQUIRE_GATES=1 (CI), where a skip would hide a regression: then it fails.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "ci" / "check_vectorised.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("check_vectorised", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_vectorised", mod)
    spec.loader.exec_module(mod)
    return mod


cv = load_tool()


def run_or_skip(isas, plants=None, cxx=None):
    try:
        return cv.run(isas, plants, cxx=cxx)
    except cv.ToolMissing as e:
        if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
            pytest.fail(f"vectorisation check needs {e} (FASTMETAL_REQUIRE_GATES=1)")
        pytest.skip(f"vectorisation check needs {e}")


def zig_clang_or_skip() -> list[str]:
    if not set(cv.X86_ISAS) & set(cv.built_isas()):
        pytest.skip("no x86-64 variant is built on this machine")
    try:
        import ziglang  # noqa: F401
    except ImportError:
        if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
            pytest.fail("the clang check needs the ziglang wheel (FASTMETAL_REQUIRE_GATES=1)")
        pytest.skip("the clang check needs the ziglang wheel")
    return [sys.executable, "-m", "ziglang", "c++", "-target", "x86_64-linux-gnu", "-g0"]


def gcc_or_skip() -> str:
    """$CXX (else g++) where it is GCC; the test skips otherwise."""
    gxx = os.environ.get("CXX", "g++")
    if shutil.which(gxx) is None or "Free Software Foundation" not in subprocess.run(
            [gxx, "--version"], capture_output=True, text=True).stdout:
        pytest.skip(f"{gxx} is not GCC")
    return gxx


# Constructs that keep a loop scalar: a libm call (as tanh, sin, log and pow were), and
# a loop of data-dependent trip count inside the element's work, which leaves no call
# behind. (An integer division no longer serves: under `omp simd` clang vectorises the
# loop around a per-lane division.)
PLANTS = ["metal::tanh(x)",
          "[&] { float r = x; for (uint32_t i = 0u; i < (metal::as_type<uint32_t>(x) & 255u); ++i) "
          "r = r * 0.5f; return r; }()"]


@pytest.fixture(scope="module")
def checked_with_plants():
    """One check of every ISA built here, on the op table with PLANTS added: the planted
    entries must fail, every real one must pass. One run serves both tests below (it was
    one per ISA plus one with the plants: every entry compiled twice). Planting appends two
    ops to a copy of the table; each entry is its own function, so the real entries compile
    to the same code as without them."""
    return run_or_skip(cv.built_isas(), PLANTS)


@pytest.mark.parametrize("isa", cv.ALL_ISAS)
def test_hot_loops_are_vectorised(isa, request):
    if isa not in cv.built_isas():
        pytest.skip(f"a build on this machine produces no {isa} variant")
    failures, counts = request.getfixturevalue("checked_with_plants")
    real = [f for f in failures if f.startswith(f"{isa}:") and "_planted_" not in f]
    assert real == [], "\n".join(real)
    assert counts[isa] == len(expected_entries()) + len(PLANTS), counts


@functools.lru_cache(maxsize=None)
def expected_entries() -> tuple[str, ...]:
    """Every entry the generator makes that must vectorise; each op of the table has its
    contiguous float32 entry among them (the count follows the table)."""
    names = cv.expected_entries()
    table = (REPO / "metal" / "elementwise_ops.tbl").read_text().splitlines()
    ops = [[c.strip() for c in line.split(" | ")] for line in table if line.strip() and not line.startswith("#")]
    for name, args, *_ in ops:
        kind = "binary" if "," in args else "unary"
        assert f"{kind}_v_{name}_float32" in names, (name, names)
    assert len(names) > len(ops)  # and the numerics kernels' lane loops
    return tuple(names)


# Synthetic instruction lists for the move rule (x86 AT&T as objdump prints it; arm64).
SCALAR_MOVE = ["15a0:\tvmovss (%rcx,%rdi,1),%xmm0", "15a5:\tvmovss %xmm0,(%rsi,%rdi,1)"]
PACKED_MOVE = ["1619:\tvmovups (%r14,%rax,1),%ymm2", "1622:\tvmovups %ymm2,(%rdi,%rax,1)"]


def test_move_rule_is_precise():
    """Full-width packed loads and stores count only for ops with no arithmetic, only at the
    ISA's width, and only both together; the table's move-only ops are exactly copy."""
    assert cv.move_only_ops(REPO / "metal") == {"copy"}
    assert cv.judge("avx2", PACKED_MOVE, moves=True) is None
    assert cv.judge("avx2", SCALAR_MOVE, moves=True) is not None
    assert cv.judge("avx2", PACKED_MOVE, moves=False) is not None      # arithmetic op: not enough
    assert cv.judge("avx512", PACKED_MOVE, moves=True) is not None     # ymm is not zmm's width
    assert cv.judge("avx2", PACKED_MOVE[:1], moves=True) is not None   # a load alone
    assert cv.judge("avx2", PACKED_MOVE + ["1630:\tcall 1635 <x+0x5>", "1631: R_X86_64_PLT32\ttanhf-0x4"],
                    moves=True) is not None
    assert cv.judge("arm64", ["ldp q0, q1, [x3, #-16]", "stp q0, q1, [x2, #-16]"], moves=True) is None
    assert cv.judge("arm64", ["ldr s0, [x3]", "str s0, [x2]"], moves=True) is not None


def test_check_catches_a_planted_scalar_loop(checked_with_plants):
    isas = cv.built_isas()
    failures, counts = checked_with_plants
    for isa in isas:
        assert counts[isa] == len(expected_entries()) + len(PLANTS) > 20
        mine = sorted(f for f in failures if f.startswith(f"{isa}:"))
        assert len(mine) == 2, failures
        assert mine[0].startswith(f"{isa}: entry_unary_v_planted_0_float32 calls libm (tanhf)")
        assert mine[1].startswith(f"{isa}: entry_unary_v_planted_1_float32 has no packed float")
    assert len(failures) == 2 * len(isas), failures  # the real ops still pass beside them


def test_vectorised_when_gcc_if_converts_less():
    """GCC 13 left the selects of pow and softplus as branches: its jump threading merged
    them into PHIs of more arguments than if-conversion takes (4). The grid loop's `omp simd`
    lifts that limit; with the limit at 2, far below any GCC's, the loops must still be
    vectorised, so a GCC that threads more cannot bring scalar loops back."""
    if not set(cv.X86_ISAS) & set(cv.built_isas()):
        pytest.skip("no x86-64 variant is built on this machine")
    gxx = gcc_or_skip()
    failures, counts = run_or_skip(["avx2"], cxx=[gxx, "--param", "max-tree-if-conversion-phi-args=2"])
    assert failures == [], "\n".join(failures)
    assert counts["avx2"] == len(expected_entries())


def test_vectorised_under_clang_for_x86():
    """A second compiler: the clang of the ziglang wheel (with its libc++, as on a Mac)
    compiles the x86-64 variants and vectorises them too."""
    failures, counts = run_or_skip(["base", "avx2"], cxx=zig_clang_or_skip())
    assert failures == [], "\n".join(failures)
    assert counts == {"base": len(expected_entries()), "avx2": len(expected_entries())}


def test_avx512_exp_scales_with_vscalefps_under_clang():
    """clang 22 and later make the shim's ldexp one vscalefps: the exp and sigmoid loops of
    the avx512 variant must contain it (the check requires it once the shim turns it on)."""
    clang = zig_clang_or_skip()
    flags = cv.cmake_flags()
    with tempfile.TemporaryDirectory() as tmp:
        on = cv.shim_vector_ldexp("avx512", REPO / "metal", flags, Path(tmp), clang)
        off = cv.shim_vector_ldexp("avx2", REPO / "metal", flags, Path(tmp), clang)
    version = subprocess.run(clang + ["--version"], capture_output=True, text=True).stdout
    major = int(version.split("clang version ")[1].split(".")[0])
    assert on == (major >= 22) and not off, (version, on, off)
    failures, counts = run_or_skip(["avx512"], cxx=clang)
    assert failures == [], "\n".join(failures)
    assert counts == {"avx512": len(expected_entries())}


def test_missing_vscalefps_or_a_libm_ldexp_is_reported():
    """Where the shim turns vscalefps on, an exp loop without it fails the check, and a
    compiler that calls libm's ldexpf per element instead (GCC 12, made to take the shim's
    ldexp path) fails as a libm call."""
    loop = ["1192:\tvcvtdq2ps %zmm28,%zmm14", "1198:\tvfmadd213ps %zmm31,%zmm14,%zmm17",
            "119e:\tvmovups %zmm14,(%rcx,%r15,4)"]
    assert cv.judge("avx512", loop + ["1198:\tvscalefps %zmm14,%zmm17,%zmm14"], need="vscalefps") is None
    assert "no vscalefps" in cv.judge("avx512", loop, need="vscalefps")
    assert "no vscalefps" in cv.judge("avx512", loop + ["1198:\tvscalefps %ymm14,%ymm17,%ymm14"],
                                      need="vscalefps")
    assert cv.judge("avx512", loop) is None
    if "avx512" not in cv.built_isas():
        pytest.skip("a build on this machine produces no avx512 variant")
    gxx = gcc_or_skip()
    version = subprocess.run([gxx, "-dumpversion"], capture_output=True, text=True).stdout.strip()
    if version.split(".")[0] != "12":
        pytest.skip(f"GCC {version}: only GCC 12 is known to call ldexpf per element")
    failures, _ = run_or_skip(["avx512"], cxx=[gxx, "-DFM_SHIM_VECTOR_LDEXP=1"])
    assert "avx512: entry_unary_v_exp_float32 calls libm (ldexpf) in its loop" in failures, failures
    assert "avx512: entry_unary_v_sigmoid_float32 calls libm (ldexpf) in its loop" in failures, failures
