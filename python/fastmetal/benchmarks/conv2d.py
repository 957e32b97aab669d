"""conv2d benchmark: forward and forward+backward of three CNN layers, float32, NCHW.

    python -m fastmetal bench conv2d [--cases mnist1,mnist2,resnet] [--budget 1.0] [--threads N]
                                [--device cpu|metal|cuda] [--json FILE]
    python -m fastmetal bench conv2d [...]

On a GPU device (--device cuda / metal) fastmetal runs the MSL kernels on fastmetal.Arrays
already on the device and torch runs on CUDA where fastmetal does (MLX is left out).

Layers: the MNIST network's two convolutions (batch 64: 1->32 3x3 on 28x28, 32->64 3x3 on
26x26) and a ResNet-style layer (batch 32, 64->64 3x3, padding 1, on 56x56), each with bias.
Peers, measured in the same run:

  torch   torch.nn.functional.conv2d on zero-copy tensors (torch.from_numpy); forward+backward
          is the forward plus y.backward(grad) through autograd.
  mlx     mlx.core.conv2d on the CPU device. MLX is channels-last: "mlx" times it on arrays
          already in NHWC / (C_out, kH, kW, C_in) (its best case); "mlx+T" adds the
          NCHW <-> NHWC transposes of input and output inside the timed graph, i.e. the
          same NCHW-in/NCHW-out contract fastmetal and torch follow. Forward+backward uses
          mx.vjp.

fastmetal: fastmetal.conv2d / conv2d_backward on NumPy arrays (NumPy in, NumPy out). The
backward computes what a training step needs: weight and bias gradients, plus the input
gradient except for the first layer (its input is data), for every library alike.
Times are medians of repeats, the libraries timed in interleaved rounds (the machine is
shared and noisy); ratio = peer / fastmetal
(> 1: fastmetal faster).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os

import numpy as np

import fastmetal as fm

from ._timing import fmt_ratio, fmt_time, machine_summary, mlx_or_none, time_calls, torch_or_none

CASES = {
    # name: (input shape, weight shape, padding, input gradient needed)
    "mnist1": ((64, 1, 28, 28), (32, 1, 3, 3), 0, False),
    "mnist2": ((64, 32, 26, 26), (64, 32, 3, 3), 0, True),
    "resnet": ((32, 64, 56, 56), (64, 64, 3, 3), 1, True),
}
PEERS = ("torch", "mlx", "mlx+T")


def median_times(fns, budget_s=1.0, min_rounds=3, max_rounds=100):
    """{name: median wall time of fn()}: interleaved rounds, about budget_s per function."""
    timed = time_calls(fns, budget_s, min_rounds, max_rounds)
    return {name: t.median for name, t in timed.items()}


def build(case, rng, device="cpu"):
    """{mode: {library: fn}} for one layer; mode is "fwd" or "fwd+bwd".

    On the cpu device fastmetal gets NumPy arrays (NumPy in, NumPy out). On a GPU device it
    gets fastmetal.Arrays already on the device (no host copies timed), and the torch peer
    runs on CUDA when fastmetal's device is cuda (torch CPU otherwise); MLX only on cpu.
    """
    xshape, wshape, padding, input_grad = CASES[case]
    x = rng.standard_normal(xshape).astype(np.float32)
    w = (rng.standard_normal(wshape) / np.sqrt(np.prod(wshape[1:]))).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    y = fm.conv2d(x, w, b, padding=padding)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    needs = ("input", "weight", "bias") if input_grad else ("weight", "bias")
    fwd, both = {}, {}

    fx, fw, fb, fgy = x, w, b, gy
    if device != "cpu":
        fx, fw, fb, fgy = (fm.asarray(a, device=device) for a in (x, w, b, gy))
    # Each call returns once its results are complete (conv2d synchronizes its device).
    fwd["fastmetal"] = lambda: fm.conv2d(fx, fw, fb, padding=padding)

    def fm_both():
        fm.conv2d(fx, fw, fb, padding=padding)
        return fm.conv2d_backward(fgy, fx, fw, padding=padding, needs=needs)
    both["fastmetal"] = fm_both

    torch = torch_or_none()
    if torch is not None:
        F = torch.nn.functional
        tx, tw, tb, tgy = (torch.from_numpy(a) for a in (x, w, b, gy))
        on_gpu = device == "cuda" and torch.cuda.is_available()
        if on_gpu:
            tx, tw, tb, tgy = (t.cuda() for t in (tx, tw, tb, tgy))
        sync = torch.cuda.synchronize if on_gpu else (lambda: None)

        def torch_fwd():
            out = F.conv2d(tx, tw, tb, padding=padding)
            sync()
            return out
        fwd["torch"] = torch_fwd

        def torch_both():
            xx = tx.detach().requires_grad_(input_grad)
            ww = tw.detach().requires_grad_(True)
            bb = tb.detach().requires_grad_(True)
            F.conv2d(xx, ww, bb, padding=padding).backward(tgy)
            sync()
            return ww.grad
        both["torch"] = torch_both

    if device != "cpu":
        return {"fwd": fwd, "fwd+bwd": both}
    mx = mlx_or_none()
    if mx is not None:
        # Channels-last copies, made once (MLX's native layout).
        mx_x = mx.array(np.ascontiguousarray(x.transpose(0, 2, 3, 1)))
        mx_w = mx.array(np.ascontiguousarray(w.transpose(0, 2, 3, 1)))
        mx_b = mx.array(b)
        mx_gy = mx.array(np.ascontiguousarray(gy.transpose(0, 2, 3, 1)))
        # NCHW arrays for the "+T" variant, which transposes inside the graph.
        mc_x, mc_w, mc_gy = mx.array(x), mx.array(w), mx.array(gy)
        mx.eval(mx_x, mx_w, mx_b, mx_gy, mc_x, mc_w, mc_gy)

        def nhwc(xx, ww, bb):
            return mx.conv2d(xx, ww, padding=padding) + bb

        def nchw(xx, ww, bb):
            out = mx.conv2d(mx.transpose(xx, (0, 2, 3, 1)), mx.transpose(ww, (0, 2, 3, 1)),
                            padding=padding) + bb
            return mx.transpose(out, (0, 3, 1, 2))

        fwd["mlx"] = lambda: mx.eval(nhwc(mx_x, mx_w, mx_b))
        fwd["mlx+T"] = lambda: mx.eval(nchw(mc_x, mc_w, mx_b))

        def vjp(f, xx, ww, cot):
            if input_grad:
                out, grads = mx.vjp(lambda a, c, d: f(a, c, d), [xx, ww, mx_b], [cot])
            else:
                out, grads = mx.vjp(lambda c, d: f(xx, c, d), [ww, mx_b], [cot])
            mx.eval(out, *grads)
        both["mlx"] = lambda: vjp(nhwc, mx_x, mx_w, mx_gy)
        both["mlx+T"] = lambda: vjp(nchw, mc_x, mc_w, mc_gy)
    return {"fwd": fwd, "fwd+bwd": both}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench conv2d", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES),
                    help="comma-separated layers out of %(default)s")
    ap.add_argument("--modes", default="fwd,fwd+bwd", help="fwd, fwd+bwd or both (default)")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--device", help="fastmetal device (default: fastmetal's default device)")
    ap.add_argument("--threads", type=int,
                    help="threads for fastmetal (FASTMETAL_NUM_THREADS; effective if its pool has "
                         "not started yet) and torch (set_num_threads); default: their own")
    ap.add_argument("--json", help="also write the results to this JSON file")
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
    modes = [m for m in ns.modes.split(",") if m]
    for m in modes:
        if m not in ("fwd", "fwd+bwd"):
            ap.error(f"unknown mode {m!r}")

    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"device {device!r} is not available; have {fm.devices()}")
    print(f"# conv2d benchmark, {datetime.date.today()}\n# {machine_summary()}")
    if device != "cpu":
        print(f"# fastmetal on {device} with fastmetal.Array inputs already there; torch on "
              f"{'cuda' if device == 'cuda' else 'cpu'}; no MLX")
    print("# median wall time per call; ratio = peer time / fastmetal time (>1: fastmetal faster)")
    print("# mlx: NHWC arrays prepared in advance; mlx+T: NCHW in/out with transposes in the graph")
    print(f"{'layer':<8}{'mode':<9}{'fastmetal':>11}{'torch':>11}{'mlx':>11}{'mlx+T':>11}"
          f"{'vs torch':>10}{'vs mlx':>9}{'vs mlx+T':>10}")
    rng = np.random.default_rng(0)
    rows = []
    for case in cases:
        fns = build(case, rng, device)
        for mode in modes:
            row = {"layer": case, "mode": mode, "device": device, "shape": [list(CASES[case][0]), list(CASES[case][1])],
                   "padding": CASES[case][2]}
            measured = median_times(fns[mode], ns.budget)
            for lib in ("fastmetal", *PEERS):
                row[lib] = measured.get(lib)
            rows.append(row)
            print(f"{case:<8}{mode:<9}{fmt_time(row['fastmetal']):>11}{fmt_time(row['torch']):>11}"
                  f"{fmt_time(row['mlx']):>11}{fmt_time(row['mlx+T']):>11}"
                  f"{fmt_ratio(row['torch'], row['fastmetal']):>10}"
                  f"{fmt_ratio(row['mlx'], row['fastmetal']):>9}"
                  f"{fmt_ratio(row['mlx+T'], row['fastmetal']):>10}", flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"machine": machine_summary(), "date": str(datetime.date.today()),
                       "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
