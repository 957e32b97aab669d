"""Normalization and softmax, forward + backward, fastmetal against PyTorch on the CPU.

Each library runs in a process of its own (on a 2-core machine a second library's threads
and caches would skew the first's), timed by fastmetal.benchmarks._timing.time_calls
(median of interleaved repeats); the parent prints the medians and torch / fastmetal (above 1:
fastmetal is faster). Both through their public functions and autograd (forward, then
backward of a given gradient); --private times fastmetal's _core entries instead.

    python benchmarks/normalization.py [--budget 0.5] [--threads N] [--private]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = [
    ("layer_norm", (16, 64, 64)), ("layer_norm", (16, 64, 128)), ("layer_norm", (16, 64, 256)),
    ("rms_norm", (16, 64, 256)),
    ("softmax", (16, 64, 64)), ("softmax", (16, 64, 128)), ("softmax", (16, 64, 256)),
    ("log_softmax", (16, 64, 256)), ("softmax_dim1", (16, 64, 256)),
    ("batch_norm", (16, 64, 16, 16)), ("batch_norm", (32, 64, 32, 32)),
    ("batch_norm", (256, 512)), ("batch_norm_eval", (32, 64, 32, 32)),
    ("group_norm", (16, 64, 16, 16)),
]


def fastmetal_cases(budget, private=False):
    """Through the public functions and autograd (forward, then backward of a given
    gradient, as torch is timed); private=True: the _core entries directly (the kernels and
    bindings without the tape)."""
    import numpy as np

    import fastmetal as fm
    import fastmetal.nn.functional as F
    from fastmetal import _core
    from fastmetal.benchmarks._timing import time_calls
    fm.set_default_device("cpu")
    r = np.random.default_rng(0)
    out = {}
    for name, shape in CASES:
        x = fm.asarray(r.standard_normal(shape).astype(np.float32)).requires_grad_()
        g = fm.asarray(r.standard_normal(shape).astype(np.float32))
        C = shape[-1] if name in ("layer_norm", "rms_norm") else shape[1]
        w = fm.asarray(r.standard_normal(C).astype(np.float32)).requires_grad_()
        b = fm.asarray(r.standard_normal(C).astype(np.float32)).requires_grad_()
        rm, rv = fm.zeros(C), fm.ones(C)
        if name == "layer_norm":
            def f():
                return F.layer_norm(x, (C,), w, b)

            def p():
                y, m, s = _core._layer_norm(x, 1, w, b)
                return _core._layer_norm_backward(g, x, 1, w, m, s)
        elif name == "rms_norm":
            def f():
                return F.rms_norm(x, (C,), w, 1e-6)

            def p():
                y, s = _core._rms_norm(x, 1, w, 1e-6)
                return _core._rms_norm_backward(g, x, 1, w, s)
        elif name in ("softmax", "log_softmax", "softmax_dim1"):
            log = name == "log_softmax"
            dim = 1 if name == "softmax_dim1" else -1

            def f(log=log, dim=dim):
                return (fm.log_softmax if log else fm.softmax)(x, dim=dim)

            def p(log=log, dim=dim):
                return _core._softmax_backward(g, _core._softmax(x, dim, log), dim, log)
        elif name.startswith("batch_norm"):
            training = name == "batch_norm"

            def f(training=training):
                return F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)

            def p(training=training):
                y, m, s = _core._batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
                return _core._batch_norm_backward(g, x, w, m, s, training)
        else:
            def f():
                return F.group_norm(x, 32, w, b)

            def p():
                y, m, s = _core._group_norm(x, 32, w, b)
                return _core._group_norm_backward(g, x, 32, w, m, s)

        def fn(f=f):
            for t in (x, w, b):
                t.grad = None
            f().backward(g)
            return x.grad
        out[f"{name} {shape}"] = time_calls({"fn": p if private else fn}, budget)["fn"].median
    return out


def torch_cases(budget):
    import torch
    import torch.nn.functional as F

    from fastmetal.benchmarks._timing import time_calls
    torch.manual_seed(0)
    out = {}
    for name, shape in CASES:
        x = torch.randn(shape, requires_grad=True)
        g = torch.randn(shape)
        C = shape[-1] if name in ("layer_norm", "rms_norm") else shape[1]
        w = torch.randn(C, requires_grad=True)
        b = torch.randn(C, requires_grad=True)
        rm, rv = torch.zeros(C), torch.ones(C)
        if name == "layer_norm":
            def f():
                return F.layer_norm(x, (C,), w, b)
        elif name == "rms_norm":
            def f():
                return F.rms_norm(x, (C,), w, 1e-6)
        elif name == "softmax":
            def f():
                return torch.softmax(x, -1)
        elif name == "log_softmax":
            def f():
                return torch.log_softmax(x, -1)
        elif name == "softmax_dim1":
            def f():
                return torch.softmax(x, 1)
        elif name.startswith("batch_norm"):
            training = name == "batch_norm"

            def f(training=training):
                return F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)
        else:
            def f():
                return F.group_norm(x, 32, w, b)

        def fn(f=f):
            for t in (x, w, b):
                t.grad = None
            f().backward(g)
            return x.grad
        out[f"{name} {shape}"] = time_calls({"fn": fn}, budget)["fn"].median
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=0.5, help="seconds per case and library")
    p.add_argument("--threads", type=int, default=None, help="threads for both libraries")
    p.add_argument("--private", action="store_true", help="time fastmetal's _core entries")
    p.add_argument("--child", choices=["fastmetal", "torch"], help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        res = fastmetal_cases(a.budget, a.private) if a.child == "fastmetal" else \
            torch_cases(a.budget)
        print(json.dumps(res))
        return 0
    env = dict(os.environ)
    if a.threads:
        env.update(FASTMETAL_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    results = {}
    for lib in ("fastmetal", "torch"):
        cmd = [sys.executable, __file__, "--child", lib, "--budget", str(a.budget)]
        r = subprocess.run(cmd + (["--private"] if a.private else []), env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{lib}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
            results[lib] = {}
            continue
        results[lib] = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"{'case (forward + backward, float32)':44s} {'fastmetal ms':>12s} {'torch ms':>10s} "
          f"{'torch/fm':>9s}")
    for name, shape in CASES:
        k = f"{name} {shape}"
        f, t = results["fastmetal"].get(k), results["torch"].get(k)
        fs = f"{f * 1e3:12.3f}" if f else f"{'-':>12s}"
        ts = f"{t * 1e3:10.3f}" if t else f"{'-':>10s}"
        ratio = f"{t / f:9.2f}" if f and t else f"{'-':>9s}"
        print(f"{k:44s} {fs} {ts} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
