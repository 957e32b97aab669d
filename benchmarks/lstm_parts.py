"""Where the CPU LSTM training step of `python -m fastmetal bench lstm` spends its time, part
by part, for fastmetal and for PyTorch, each library in its own process, the same threads.

    python benchmarks/lstm_parts.py [--threads 2] [--repeats 15] [--hidden 256] [--seq 64]
                                    [--batch 32]

Rows (milliseconds, medians of interleaved repeats): the whole step (2-layer nn.LSTM, a
linear head, MSE, backward, SGD), its forward, one layer's input projection (x @ W_ih^T +
b_ih over the whole sequence), one layer's time loop forward and backward (fastmetal's
private lstm_layer ops; PyTorch has no such entry and shows '-'), the per-step products
h @ W_hh^T (32 x 256 @ 256 x 1024) and dg @ W_hh (32 x 1024 @ 1024 x 256) over the sequence,
each as one call per step (fm.matmul / torch.matmul) and, for fastmetal, as the layers run
them (W_hh packed once: the private _matmul_repeated), and W_hh's gradient (one product over
all steps). The gate kernels' share is the loop minus its products. FASTMETAL_CPU_ISA picks
fastmetal's instruction set (base, avx2, avx512; default: the best the CPU has).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from parts_common import median_ms, run_children


def _fastmetal(ns) -> dict:
    import fastmetal as fm
    from fastmetal import _core
    T, B, H = ns.seq, ns.batch, ns.hidden
    rng = np.random.default_rng(0)
    f32 = np.float32
    x = fm.asarray(rng.standard_normal((T, B, H)).astype(f32))
    target = fm.asarray(rng.standard_normal((T, B, H)).astype(f32))
    w_ih = fm.asarray((rng.standard_normal((4 * H, H)) * 0.06).astype(f32))
    w_hh = fm.asarray((rng.standard_normal((4 * H, H)) * 0.06).astype(f32))
    b = fm.asarray(np.zeros(4 * H, f32))
    h0 = fm.asarray(np.zeros((B, H), f32))
    xg = fm.linear(x, w_ih, b)
    y, gates = _core._lstm_layer(xg, h0, h0, w_hh, b, False)
    grad = fm.asarray(rng.standard_normal(tuple(y.shape)).astype(f32))
    dxg, _, _ = _core._lstm_layer_backward(grad, y, gates, w_hh, False)
    hs = y[0, :T]
    w_t = w_hh.T
    out_f = fm.empty((B, 4 * H))
    out_b = fm.empty((B, H))

    def fwd_calls():
        for t in range(T):
            fm.matmul(hs[t], w_t, out=out_f)

    def bwd_calls():
        for t in range(T):
            fm.matmul(dxg[t], w_hh, out=out_b)

    lstm = fm.nn.LSTM(H, H, 2, seed=0)
    head = fm.nn.Linear(H, H, seed=1)
    opt = fm.optim.SGD(list(lstm.parameters()) + list(head.parameters()), lr=0.01)
    mse = fm.nn.MSELoss()

    def forward():
        return mse(head(lstm(x)[0]), target)

    def step():
        loss = forward()
        opt.zero_grad()
        loss.backward()
        opt.step()

    r = median_ms({
        "step": step, "step forward": forward,
        "input projection": lambda: fm.linear(x, w_ih, b),
        "layer loop forward": lambda: _core._lstm_layer(xg, h0, h0, w_hh, b, False),
        "layer loop backward": lambda: _core._lstm_layer_backward(grad, y, gates, w_hh, False),
        "h @ W_hh^T x T, one call each": fwd_calls,
        "h @ W_hh^T x T, W_hh packed once": lambda: _core._matmul_repeated(hs, w_hh, True),
        "dg @ W_hh x T, one call each": bwd_calls,
        "dg @ W_hh x T, W_hh packed once": lambda: _core._matmul_repeated(dxg, w_hh, False),
        "dW_hh (one product)": lambda: fm.matmul(dxg.reshape(-1, 4 * H).T, hs.reshape(-1, H)),
    }, ns.repeats)
    r["gates forward (loop - products)"] = (r["layer loop forward"]
                                            - r["h @ W_hh^T x T, W_hh packed once"])
    r["gates backward (loop - products)"] = (r["layer loop backward"]
                                             - r["dg @ W_hh x T, W_hh packed once"])
    r["isa"] = _core._cpu_isa()
    return r


def _torch(ns) -> dict:
    import torch
    torch.set_num_threads(ns.threads)
    T, B, H = ns.seq, ns.batch, ns.hidden
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, B, H, generator=g)
    target = torch.randn(T, B, H, generator=g)
    w = torch.randn(4 * H, H, generator=g) * 0.06
    b = torch.zeros(4 * H)
    hs = torch.randn(T, B, H, generator=g)
    dxg = torch.randn(T, B, 4 * H, generator=g)
    out_f = torch.empty(B, 4 * H)
    out_b = torch.empty(B, H)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(H, H, 2)
    head = torch.nn.Linear(H, H)
    opt = torch.optim.SGD(list(lstm.parameters()) + list(head.parameters()), lr=0.01)
    mse = torch.nn.MSELoss()

    def forward():
        return mse(head(lstm(x)[0]), target)

    def step():
        loss = forward()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def fwd_calls():
        for t in range(T):
            torch.matmul(hs[t], w.T, out=out_f)

    def bwd_calls():
        for t in range(T):
            torch.matmul(dxg[t], w, out=out_b)

    return median_ms({
        "step": step, "step forward": forward,
        "input projection": lambda: torch.nn.functional.linear(x, w, b),
        "h @ W_hh^T x T, one call each": fwd_calls,
        "dg @ W_hh x T, one call each": bwd_calls,
        "dW_hh (one product)": lambda: dxg.reshape(-1, 4 * H).T @ hs.reshape(-1, H),
    }, ns.repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--child", choices=("fastmetal", "torch"), help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = ap.parse_args(argv)
    if ns.child:
        print(json.dumps((_fastmetal if ns.child == "fastmetal" else _torch)(ns)))
        return 0
    res = run_children(__file__, argv, ns.threads)
    fmr, tr = res["fastmetal"], res["torch"]
    print(f"LSTM step parts, hidden {ns.hidden}, sequence {ns.seq}, batch {ns.batch}, "
          f"{ns.threads} threads, fastmetal ISA {fmr.get('isa', '?')} (ms, medians of "
          f"{ns.repeats})")
    print(f"{'':42}{'fastmetal':>11}{'torch':>11}")
    for k in [k for k in fmr if k != "isa"]:
        t = tr.get(k)
        print(f"{k:42}{fmr[k]:11.3f}{'-' if t is None else format(t, '.3f'):>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
