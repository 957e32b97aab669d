"""An LSTM training step: fastmetal vs PyTorch, each library timed in its own process.

    python -m fastmetal bench lstm [--device cpu|cuda] [--threads N] [--steps 20] [--rounds 3]
                                   [--hidden 256] [--seq 64] [--batch 32] [--layers 2]
                                   [--compile]

One step: ``nn.LSTM(hidden, hidden, num_layers)`` forward over a (seq, batch, hidden) input,
a linear head, mean squared error against a fixed target, ``backward()``, SGD (lr 0.01).
Each library runs in a fresh subprocess (so neither's thread pool or allocator sits beside
the other's), on the same device and number of threads (``FASTMETAL_NUM_THREADS``,
``torch.set_num_threads``); after warm-up steps, the median of ``--steps`` timed steps (the
device synchronised after each); ``--rounds`` pairs of processes alternate and the median
over rounds is reported. Ratio = PyTorch time / fastmetal time (> 1: fastmetal faster).

``--compile`` adds the step under ``fastmetal.compile`` (traced once, replayed without Python
per op; input and target are its arguments) and PyTorch's under ``torch.compile`` (default
mode and ``mode="reduce-overhead"``: CUDA graphs), each in its own processes too, and the
ratio of each row to the compiled fastmetal step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

import fastmetal as fm
from fastmetal.benchmarks._timing import fmt_ratio, fmt_time, machine_summary, torch_or_none


def _data(ns):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ns.seq, ns.batch, ns.hidden)).astype(np.float32)
    y = rng.standard_normal((ns.seq, ns.batch, ns.hidden)).astype(np.float32)
    return x, y


# The processes of a run: (library, how its step runs); --compile adds the last three.
CHILDREN = {"fastmetal": ("fastmetal", None), "torch": ("torch", None),
            "fastmetal.compile": ("fastmetal", "compile"),
            "torch.compile": ("torch", "default"),
            "torch.compile(reduce-overhead)": ("torch", "reduce-overhead")}


def _run_fastmetal(ns, mode=None) -> list:
    fm.set_default_device(ns.device)
    x, y = _data(ns)
    x, y = fm.asarray(x), fm.asarray(y)
    lstm = fm.nn.LSTM(ns.hidden, ns.hidden, ns.layers, seed=0)
    head = fm.nn.Linear(ns.hidden, ns.hidden, seed=1)
    params = list(lstm.parameters()) + list(head.parameters())
    opt = fm.optim.SGD(params, lr=0.01)
    mse = fm.nn.MSELoss()

    def train(x, y):
        out, _ = lstm(x)
        loss = mse(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    run = fm.compile(train) if mode == "compile" else train
    if mode == "compile":  # a compiled row that ran eagerly would mislead: fail instead
        warnings.simplefilter("error", fm.CompileWarning)

    def step():
        run(x, y)
        fm.synchronize()
    return _timed(step, ns)


def _run_torch(ns, mode=None) -> list:
    torch = torch_or_none()
    if torch is None:
        raise SystemExit("PyTorch is not installed")
    torch.set_num_threads(ns.threads)
    dev = torch.device(ns.device)
    x, y = (torch.tensor(a, device=dev) for a in _data(ns))
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(ns.hidden, ns.hidden, ns.layers).to(dev)
    head = torch.nn.Linear(ns.hidden, ns.hidden).to(dev)
    opt = torch.optim.SGD(list(lstm.parameters()) + list(head.parameters()), lr=0.01)
    mse = torch.nn.MSELoss()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def train(x, y):
        out, _ = lstm(x)
        loss = mse(head(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    run = train if mode is None else torch.compile(
        train, mode=None if mode == "default" else mode)

    def step():
        run(x, y)
        sync()
    return _timed(step, ns)  # torch.compile compiles in the untimed warm-up steps


def _timed(step, ns) -> list:
    for _ in range(ns.warmup):
        step()
    times = []
    for _ in range(ns.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _child(ns) -> int:
    lib, mode = CHILDREN[ns.child]
    times = (_run_fastmetal if lib == "fastmetal" else _run_torch)(ns, mode)
    print(json.dumps({"times": times}))
    return 0


def _spawn(lib, ns, argv):
    env = dict(os.environ, FASTMETAL_NUM_THREADS=str(ns.threads), OMP_NUM_THREADS=str(ns.threads))
    cmd = [sys.executable, "-m", "fastmetal.benchmarks.lstm", "--child", lib, *argv]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["?"]
        return None, f"{lib} failed: {tail[0]}"
    return json.loads(r.stdout.strip().splitlines()[-1])["times"], None


def _parser():
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench lstm",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both libraries)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each library")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--hidden", type=int, default=256, help="input and hidden size")
    ap.add_argument("--seq", type=int, default=64, help="sequence length")
    ap.add_argument("--batch", type=int, default=32, help="batch size")
    ap.add_argument("--layers", type=int, default=2, help="LSTM layers")
    ap.add_argument("--rounds", type=int, default=3, help="alternating process pairs")
    ap.add_argument("--compile", action="store_true",
                    help="also time fastmetal.compile(step), and PyTorch's torch.compile(step) "
                         "and torch.compile(step, mode='reduce-overhead') (CUDA graphs)")
    ap.add_argument("--no-torch", action="store_true", help="fastmetal only")
    ap.add_argument("--child", choices=tuple(CHILDREN), help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    """Runs the benchmark; returns {row: median seconds a step, None where it failed} (a
    child process: 0)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = _parser().parse_args(argv)
    if ns.child:
        return _child(ns)
    print(machine_summary())
    print(f"\nnn.LSTM training step: {ns.layers} layers, hidden {ns.hidden}, sequence {ns.seq}, "
          f"batch {ns.batch}, SGD; device {ns.device}, {ns.threads} threads; each library in "
          f"its own process; median of {ns.steps} steps, median over {ns.rounds} rounds")
    # Rounds alternate the two processes, so that load from elsewhere on a shared machine
    # falls on both alike; each round's median, then the median over rounds.
    names = [n for n in CHILDREN if (ns.compile or "compile" not in n)
             and not (ns.no_torch and CHILDREN[n][0] == "torch")]
    per_round: dict = {name: [] for name in names}
    for _ in range(ns.rounds):
        for lib in per_round:
            times, err = _spawn(lib, ns, argv)
            if err:
                print(f"  {err}")
            elif times:
                per_round[lib].append(statistics.median(times))
    results = {lib: statistics.median(v) if v else None for lib, v in per_round.items()}
    ours, theirs = results["fastmetal"], results.get("torch")
    compiled = results.get("fastmetal.compile")
    for lib, v in per_round.items():
        rounds = ", ".join(fmt_time(t) for t in v)
        vs = f"  {fmt_ratio(results[lib], compiled)} fastmetal.compile's time" if compiled else ""
        print(f"{lib:>30} {fmt_time(results[lib]):>10}{vs}  (rounds: {rounds})")
    if ours and theirs:
        print(f"{'ratio':>30} {fmt_ratio(theirs, ours):>10}  (torch / fastmetal; > 1: fastmetal "
              "faster)")
    if compiled and theirs:
        print(f"{'ratio, compiled':>30} {fmt_ratio(theirs, compiled):>10}  (torch / "
              "fastmetal.compile)")
    return results


if __name__ == "__main__":
    main()
