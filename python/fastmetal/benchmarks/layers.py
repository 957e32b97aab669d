"""Small vision and sequence layers, fastmetal against PyTorch on the same device kind (the
CPU unless ``--device`` says otherwise), through autograd as a training step runs them:

* ``embedding``: ``F.embedding`` of (16, 64) int64 ids into a 65 x 64 table, forward and
  backward (the weight's gradient: fastmetal's deterministic scatter-add) with an upstream
  gradient of the output's shape, the table's ``.grad`` cleared each call;
* ``conv_transpose2d``: a DCGAN generator layer, (16, 128, 8, 8) -> (16, 64, 16, 16), 4x4
  kernel, stride 2, padding 1, with bias; forward, and forward + backward (input, weight and
  bias gradients);
* ``avg_pool2d`` / ``upsample``: (16, 64, 32, 32) average-pooled 2x2, and nearest-upsampled
  2x, forward + backward.

Times are medians of interleaved calls (``_timing.time_calls``), device synchronised.

    python -m fastmetal bench layers [--device cpu] [--budget 1.0] [--threads N] [--cases ...]
"""
from __future__ import annotations

import argparse
import datetime
import os

import numpy as np

import fastmetal as fm
from fastmetal.nn import functional as F

from ._timing import fmt_ratio, fmt_time, machine_summary, time_calls, torch_or_none

CASES = ("embedding", "conv_transpose2d", "avg_pool2d", "upsample")


def _embedding(r, device, torch):
    ids = r.integers(0, 65, (16, 64))
    w = r.standard_normal((65, 64)).astype(np.float32)
    g = r.standard_normal((16, 64, 64)).astype(np.float32)
    W = fm.asarray(w, device=device).requires_grad_()
    I, G = fm.asarray(ids, dtype="int64", device=device), fm.asarray(g, device=device)

    def ours():
        W.grad = None
        F.embedding(I, W).backward(G)
        fm.synchronize()
        return W.grad

    theirs = None
    if torch is not None:
        tw = torch.tensor(w, requires_grad=True)
        ti, tg = torch.tensor(ids), torch.tensor(g)

        def theirs():
            tw.grad = None
            torch.nn.functional.embedding(ti, tw).backward(tg)
            return tw.grad
    return {"embedding (16, 64) ids -> 65x64, fwd+bwd": (ours, theirs)}


def _conv_transpose2d(r, device, torch):
    x = r.standard_normal((16, 128, 8, 8)).astype(np.float32)
    w = (r.standard_normal((128, 64, 4, 4)) * 0.05).astype(np.float32)
    b = r.standard_normal(64).astype(np.float32)
    g = r.standard_normal((16, 64, 16, 16)).astype(np.float32)
    X, W, B = (fm.asarray(v, device=device).requires_grad_() for v in (x, w, b))
    G = fm.asarray(g, device=device)
    kw = dict(stride=2, padding=1)

    def fwd():
        with fm.no_grad():
            y = F.conv_transpose2d(X, W, B, **kw)
        fm.synchronize()
        return y

    def fwd_bwd():
        X.grad = W.grad = B.grad = None
        F.conv_transpose2d(X, W, B, **kw).backward(G)
        fm.synchronize()
        return W.grad

    t_fwd = t_fwd_bwd = None
    if torch is not None:
        tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (x, w, b))
        tg = torch.tensor(g)

        def t_fwd():
            with torch.no_grad():
                return torch.nn.functional.conv_transpose2d(tx, tw, tb, **kw)

        def t_fwd_bwd():
            tx.grad = tw.grad = tb.grad = None
            torch.nn.functional.conv_transpose2d(tx, tw, tb, **kw).backward(tg)
            return tw.grad
    name = "conv_transpose2d (16,128,8,8)->(16,64,16,16) 4x4 s2 p1"
    return {f"{name} fwd": (fwd, t_fwd), f"{name} fwd+bwd": (fwd_bwd, t_fwd_bwd)}


def _resampling(r, device, torch, case):
    x = r.standard_normal((16, 64, 32, 32)).astype(np.float32)
    X = fm.asarray(x, device=device).requires_grad_()
    ours_fn = (lambda t: F.avg_pool2d(t, 2)) if case == "avg_pool2d" else \
        (lambda t: F.interpolate(t, scale_factor=2))
    G = fm.asarray(r.standard_normal(ours_fn(np.zeros_like(x)).shape).astype(np.float32),
                   device=device)

    def ours():
        X.grad = None
        ours_fn(X).backward(G)
        fm.synchronize()
        return X.grad

    theirs = None
    if torch is not None:
        tf = torch.nn.functional
        theirs_fn = (lambda t: tf.avg_pool2d(t, 2)) if case == "avg_pool2d" else \
            (lambda t: tf.interpolate(t, scale_factor=2))
        tx, tg = torch.tensor(x, requires_grad=True), torch.tensor(G.numpy())

        def theirs():
            tx.grad = None
            theirs_fn(tx).backward(tg)
            return tx.grad
    what = "avg_pool2d 2x2" if case == "avg_pool2d" else "nearest upsample 2x"
    return {f"{what} (16,64,32,32) fwd+bwd": (ours, theirs)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench layers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated, of %(default)s")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--device", help="fastmetal device (default: fastmetal's default device)")
    ap.add_argument("--threads", type=int,
                    help="threads for fastmetal (FASTMETAL_NUM_THREADS; effective if its pool has "
                         "not started yet) and torch (set_num_threads); default: their own")
    ns = ap.parse_args(argv)
    if ns.threads is not None:
        os.environ["FASTMETAL_NUM_THREADS"] = str(ns.threads)
        torch = torch_or_none()
        if torch is not None:
            torch.set_num_threads(ns.threads)
    cases = [c for c in ns.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            ap.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")
    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"device {device!r} is not available; have {fm.devices()}")
    torch = torch_or_none()
    print(f"# layers benchmark, {datetime.date.today()}\n# {machine_summary()}")
    print(f"# fastmetal on {device}; torch on the CPU" if torch is not None else
          "# torch is not installed: fastmetal only")
    print(f"{'case':<62} {'fastmetal':>10} {'torch':>10} {'torch/fm':>9}")
    r = np.random.default_rng(0)
    for case in cases:
        if case == "embedding":
            rows = _embedding(r, device, torch)
        elif case == "conv_transpose2d":
            rows = _conv_transpose2d(r, device, torch)
        else:
            rows = _resampling(r, device, torch, case)
        for name, (ours, theirs) in rows.items():
            fns = {"fm": ours} if theirs is None else {"fm": ours, "torch": theirs}
            t = time_calls(fns, budget_s=ns.budget)
            peer = t["torch"].median if "torch" in t else None
            print(f"{name:<62} {fmt_time(t['fm'].median):>10} {fmt_time(peer):>10} "
                  f"{fmt_ratio(peer, t['fm'].median):>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
