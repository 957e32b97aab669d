"""The CPU kernels' hot loops are vectorised on every instruction set the build produces.

Reads machine code (tools/check_vectorised.py), never timings. Without a needed tool
(g++/objdump for x86-64, the ziglang wheel for arm64) the test skips with the reason,
unless FASTMETAL_REQUIRE_GATES=1 (CI), where a skip would hide a regression: then it fails.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "check_vectorised.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("check_vectorised", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("check_vectorised", mod)
    spec.loader.exec_module(mod)
    return mod


cv = load_tool()


def run_or_skip(isas, plants=None):
    try:
        return cv.run(isas, plants)
    except cv.ToolMissing as e:
        if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
            pytest.fail(f"vectorisation check needs {e} (FASTMETAL_REQUIRE_GATES=1)")
        pytest.skip(f"vectorisation check needs {e}")


@pytest.mark.parametrize("isa", cv.ALL_ISAS)
def test_hot_loops_are_vectorised(isa):
    if isa not in cv.built_isas():
        pytest.skip(f"a build on this machine produces no {isa} variant")
    failures, counts = run_or_skip([isa])
    assert failures == [], "\n".join(failures)
    n_ops = sum(1 for line in (TOOL.parent.parent / "metal" / "elementwise_ops.tbl").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    # every float32 contiguous op entry, plus 2 Fourier and 10 stencil lane-loop kernels
    assert counts[isa] == n_ops + 12


# Constructs that keep a loop scalar: a libm call (as tanh, sin, log and pow were), and
# an integer division (no vector instruction on x86 or NEON), which leaves no call behind.
PLANTS = ["metal::tanh(x)",
          "x * float(metal::as_type<uint32_t>(x) / ((metal::as_type<uint32_t>(x) >> 20) + 1u))"]


def test_check_catches_a_planted_scalar_loop():
    isas = cv.built_isas()
    failures, counts = run_or_skip(isas, PLANTS)
    for isa in isas:
        assert counts[isa] > 20
        mine = sorted(f for f in failures if f.startswith(f"{isa}:"))
        assert len(mine) == 2, failures
        assert mine[0].startswith(f"{isa}: entry_unary_v_planted_0_float32 calls libm (tanhf)")
        assert mine[1].startswith(f"{isa}: entry_unary_v_planted_1_float32 has no packed float")
    assert len(failures) == 2 * len(isas), failures  # the real ops still pass beside them
