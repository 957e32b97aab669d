"""The examples a user copies must keep working."""
from __future__ import annotations

import importlib.util

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
