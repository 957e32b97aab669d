"""Property-based search (hypothesis) over every public function's inputs: shapes with zero
and huge extents, zero and negative strides, dtypes, read-only flags, NumPy or fastmetal
arrays, out=. Each function's search runs in a child process (property_fuzz_child.py), so a
crash is a test failure that names the case, not a lost run.

FASTMETAL_FUZZ_EXAMPLES sets the examples per function (default 60; e.g. 2000 for a long run).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastmetal as fm

CHILD = Path(__file__).with_name("property_fuzz_child.py")
EXAMPLES = int(os.environ.get("FASTMETAL_FUZZ_EXAMPLES", "60"))
FUNCTIONS = [n for n in fm.__all__ if n not in ("__version__", "Array", "nn", "devices",
                                                 "default_device", "set_default_device",
                                                 "synchronize")]


def test_every_public_function_is_searched():
    assert {"asarray", "conv2d", "conv2d_backward", "gradient", "derivative", "fourier_series",
            "sigmoid", "add", "zeros"} <= set(FUNCTIONS)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_property_search_in_a_child_process(device, name):
    env = {**os.environ, "FASTMETAL_DEVICE": device}
    r = subprocess.run([sys.executable, str(CHILD), name, str(EXAMPLES)], capture_output=True,
                       text=True, timeout=600, cwd=CHILD.parent, env=env)
    cases = [line for line in r.stdout.splitlines() if line.startswith("CASE")]
    if r.returncode < 0:
        pytest.fail(f"{name}: the child process died of signal {-r.returncode} on "
                    f"{cases[-1] if cases else 'its first case'}\n{r.stderr[-3000:]}")
    assert r.returncode == 0, f"{name}: last case {cases[-1] if cases else None}\n{r.stderr[-5000:]}"
    assert r.stdout.rstrip().endswith(f"DONE {name}")
    assert len(cases) >= EXAMPLES // 2
