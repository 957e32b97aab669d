"""`python -m fastmetal`, the README's main command, runs and its checks pass."""
from __future__ import annotations

import subprocess
import sys


def test_main_job_checks_every_headline_op():
    r = subprocess.run([sys.executable, "-m", "fastmetal"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for op in ("sigmoid", "broadcast add", "fourier_series", "conv2d"):
        assert f"  {op}" in r.stdout
    assert "BAD  fastmetal" not in r.stdout  # the header names BAD; no timed line says it
    # What "ok" means, that times are medians, and each side's threads on every timed line.
    assert "ok: max |error| / max |float64 result| < 1e-04" in r.stdout
    assert "medians of repeated calls" in r.stdout
    assert "threads: fastmetal's CPU backend " in r.stdout and "NumPy's ufuncs 1" in r.stdout
    timed = [line for line in r.stdout.splitlines() if " ok " in line]
    assert len(timed) == 4 and all(" thread" in line for line in timed), timed


def test_bench_lists_its_benchmarks():
    r = subprocess.run([sys.executable, "-m", "fastmetal", "bench", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "elementwise" in r.stdout and "conv2d" in r.stdout
    assert "matmul" in r.stdout


def test_info_says_why_each_missing_backend_is_missing():
    import fastmetal as fm
    problems = fm._core._device_problems()
    missing = {"metal", "cuda"} - set(fm.devices())
    # One line per missing backend, naming it first; none for the available ones.
    assert sorted(p.split(":")[0] for p in problems) == sorted(missing)
    assert all(p.strip() and "\n" not in p and len(p.split(": ", 1)[1]) > 10 for p in problems)
    if sys.platform != "darwin":
        assert any(p.startswith("metal: not built") for p in problems)
    r = subprocess.run([sys.executable, "-m", "fastmetal", "info"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("devices: ") for line in lines)
    # docs/API.md and --help: `info` lists and checks nothing (the plain command checks).
    assert any(line.startswith("machine: ") for line in lines) and "headline" not in r.stdout
    assert [line for line in lines if line.startswith("unavailable: ")] == \
        [f"unavailable: {p}" for p in problems]
