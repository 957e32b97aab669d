"""`python -m fastmetal bench gpt`, `bench lstm` and `bench attention --memory` run end to end
(tiny sizes): each library in its own process, from the same weights (the first losses
agree), on the device under test; with --compile, fastmetal.compile's rows too."""
from __future__ import annotations

import math

import pytest

from fastmetal.benchmarks import attention, gpt, lstm
from helpers import torch


def test_bench_gpt_runs_both_libraries_from_the_same_weights(device, capsys):
    if device not in ("cpu", "cuda"):
        pytest.skip("bench gpt compares with PyTorch on cpu or cuda")
    results = gpt.main(["--device", device, "--steps", "2", "--batches", "2", "--layers", "1",
                        "--d-model", "32", "--heads", "2", "--context", "16", "--batch", "4",
                        "--vocab", "11", "--threads", "1"] + ([] if torch else ["--no-torch"]))
    out = capsys.readouterr().out
    assert "each library in its own process" in out and "fastmetal speed-up" in out
    assert results[0]["name"].startswith("fastmetal")
    assert math.isclose(results[0]["first_loss"], math.log(11), rel_tol=0.05)  # N(0, .02) init
    if len(results) > 1:  # PyTorch there (with CUDA, for cuda)
        assert results[1]["name"].startswith("PyTorch")
        assert math.isclose(results[0]["first_loss"], results[1]["first_loss"], rel_tol=1e-5)
        assert math.isclose(results[0]["last_loss"], results[1]["last_loss"], rel_tol=1e-3)


def test_bench_attention_memory_rows_run_in_their_own_processes(capsys):
    attention._print_memory("cpu", 256, 2, torch is not None)
    out = capsys.readouterr().out
    assert "each library in its own process" in out and "failed" not in out, out
    assert "fastmetal" in out and "host peak RSS" in out
    if torch is not None:
        assert "torch" in out.split("fastmetal", 1)[1]


def test_bench_gpt_compile_row_replays_the_same_losses(device, capsys):
    """--compile: fastmetal.compile's worker (it fails where the step would run eagerly) gives
    the eager worker's losses, bit for bit (the same kernels in the same order)."""
    if device not in ("cpu", "cuda"):
        pytest.skip("bench gpt runs on cpu or cuda")
    results = gpt.main(["--device", device, "--steps", "3", "--batches", "2", "--layers", "1",
                        "--d-model", "32", "--heads", "2", "--context", "16", "--batch", "4",
                        "--vocab", "11", "--threads", "1", "--no-torch", "--compile"])
    assert [r["name"].split()[0] for r in results] == ["fastmetal", "fastmetal.compile"]
    assert results[1]["first_loss"] == results[0]["first_loss"]
    assert results[1]["last_loss"] == results[0]["last_loss"]
    assert "fastmetal.compile speed-up" in capsys.readouterr().out


def test_bench_lstm_compile_row(device, capsys):
    if device not in ("cpu", "cuda"):
        pytest.skip("bench lstm runs on cpu or cuda")
    results = lstm.main(["--device", device, "--hidden", "8", "--seq", "4", "--batch", "2",
                         "--steps", "2", "--warmup", "3", "--rounds", "1", "--threads", "1",
                         "--no-torch", "--compile"])
    assert list(results) == ["fastmetal", "fastmetal.compile"]
    assert all(t is not None and t > 0 for t in results.values()), results
    assert "fastmetal.compile's time" in capsys.readouterr().out
