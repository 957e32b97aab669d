"""`python -m fastmetal`, the README's main command, runs and its checks pass."""
from __future__ import annotations

import subprocess
import sys


def test_main_job_checks_every_headline_op():
    r = subprocess.run([sys.executable, "-m", "fastmetal"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for op in ("sigmoid", "broadcast add", "fourier_series", "conv2d"):
        assert f"  {op}" in r.stdout
    assert "BAD" not in r.stdout


def test_bench_lists_its_benchmarks():
    r = subprocess.run([sys.executable, "-m", "fastmetal", "bench", "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "elementwise" in r.stdout and "conv2d" in r.stdout
