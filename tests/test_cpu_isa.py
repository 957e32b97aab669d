"""The CPU kernels are compiled once per instruction set: every variant must be right."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import fastmetal as fm

pytestmark = pytest.mark.cpu_only  # per-ISA variants exist on the cpu backend only

CHECK = r"""
import numpy as np, fastmetal as fm, fastmetal._core as core
from fastmetal.ops.optable import OPS
from fastmetal.ops.elementwise import FUNCTIONS as OP
from references import numpy_reference
assert core._cpu_isa() == "{isa}", core._cpu_isa()
rng = np.random.default_rng(5)
x = (rng.standard_normal(5000) * 10).astype(np.float32)
y = (rng.random(5000) * 3 + 0.1).astype(np.float32)
COMPARISONS = ("less", "less_equal", "greater", "greater_equal", "equal", "not_equal")
for spec in [s for s in OPS if s.public]:  # internal kernels: test_elementwise.py
    args = (x,) if spec.arity == 1 else (y, x / 4)
    got = OP[spec.name](*args).astype(np.float64)
    with np.errstate(all="ignore"):
        ref = numpy_reference(spec, *(a.astype(np.float64) for a in args)).astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-37, equal_nan=True, err_msg=spec.name)
    h = OP[spec.name](*(a.astype(np.float16) for a in args))
    assert h.dtype == (np.bool_ if spec.name in COMPARISONS else np.float16), spec.name
print("ok")
"""


def supported_isas():
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ["base"]
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    isas = ["base"]
    if " avx2" in flags and " fma" in flags:
        isas.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags and " avx512vl" in flags:
        isas.append("avx512")
    return isas


@pytest.mark.parametrize("isa", ["base", "avx2", "avx512"])
def test_each_isa_variant_computes_the_same_ops(isa):
    if isa not in supported_isas():
        pytest.skip(f"this CPU cannot run the {isa} variant")
    tests_dir = os.path.dirname(__file__)
    env = {**os.environ, "FASTMETAL_CPU_ISA": isa, "FASTMETAL_DEVICE": "cpu",
           "PYTHONPATH": tests_dir + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", CHECK.replace("{isa}", isa)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.mark.skipif(bool(os.environ.get("FASTMETAL_CPU_ISA")),
                    reason="FASTMETAL_CPU_ISA is set: this run checks another ISA, not the default")
def test_best_isa_is_chosen_by_default():
    assert fm._core._cpu_isa() == supported_isas()[-1]
