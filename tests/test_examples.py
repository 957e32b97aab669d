"""The examples a user copies must keep working."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
from conftest import REPO


def load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_small_cnn_learns_the_stripes_task(capsys):
    accuracy = load("train_small_cnn").main(["--steps", "120"])
    assert accuracy > 0.9, capsys.readouterr().out


def test_fourier_then_differentiate_is_accurate():
    analytic_error = load("fourier_then_differentiate").main(["--terms", "200", "--samples", "20000"])
    assert analytic_error < 1e-4


@pytest.mark.parametrize("name", ["train_small_cnn", "fourier_then_differentiate", "mnist",
                                  "dask_fourier"])
def test_example_help_shows_every_default(name):
    """`--help` of each example names every option's default (ArgumentDefaultsHelpFormatter
    shows it only for options with a help text: an option without one would lose it)."""
    r = subprocess.run([sys.executable, str(REPO / "examples" / f"{name}.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    options = re.findall(r"^  (--[\w-]+)", out, re.MULTILINE)
    assert len(options) >= 2
    blocks = re.split(r"^  (?=--)", out.split("options:", 1)[1], flags=re.MULTILINE)[1:]
    for block in blocks:
        if not block.startswith("--help"):
            assert "(default: " in " ".join(block.split()), f"{name}: {block!r}"


def test_dask_fourier_runs_small_on_a_local_cluster():
    """examples/dask_fourier.py on 3 * 10^6 samples (blocks of 700,000: a short last one) on
    two worker processes: both checks inside it pass (it asserts them) and every block ran."""
    pytest.importorskip("dask.distributed", reason="dask is optional: pip install fastmetal[dask]")
    result = load("dask_fourier").main(["--samples", "3e6", "--chunk", "700000", "--terms", "16",
                                        "--check-stride", "50"])
    assert result["blocks"] == 5 and result["checked"] == [0, 2, 4]
    assert max(result["errors"].values()) < 1e-4 and len(result["errors"]) == 2 + 2 * 3
