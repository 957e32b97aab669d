"""Reductions and matrix products: fastmetal vs NumPy vs torch (CPU), medians, one run.

    python benchmarks/reduce_matmul.py [--budget 1.0] [--quick]

Cases: sum / max / argmax of 2^24 float32, sum over axis 0 of (4096, 4096), matmul
1024 x 1024 @ 1024 x 1024 and 4096 x 1024 @ 1024 x 1024, and the MNIST dense layer
linear(64 x 9216, 128 x 9216). Inputs are NumPy arrays (NumPy in, NumPy out for fastmetal;
zero-copy torch.from_numpy for torch). The libraries are timed in interleaved rounds and
each time is the median of those rounds (the machine may be shared and noisy).
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

import fastmetal as fm
from fastmetal.benchmarks._timing import machine_summary, median_time, torch_or_none


def cases(quick: bool):
    r = np.random.default_rng(0)
    v = r.standard_normal(2**24).astype(np.float32)
    m = r.standard_normal((4096, 4096)).astype(np.float32)
    a1, b1 = (r.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))
    a4 = r.standard_normal((4096, 1024)).astype(np.float32)
    x, w, bias = (r.standard_normal(s).astype(np.float32) for s in ((64, 9216), (128, 9216), (128,)))
    torch = torch_or_none()
    t = torch.from_numpy if torch else None
    out = [
        ("sum 2^24", 2**24 * 4 / 1e9, "GB/s", lambda: fm.sum(v), lambda: np.sum(v),
         (lambda tv=t(v) if t else None: tv.sum()) if t else None),
        ("max 2^24", 2**24 * 4 / 1e9, "GB/s", lambda: fm.max(v), lambda: np.max(v),
         (lambda tv=t(v) if t else None: tv.max()) if t else None),
        ("argmax 2^24", 2**24 * 4 / 1e9, "GB/s", lambda: fm.argmax(v), lambda: np.argmax(v),
         (lambda tv=t(v) if t else None: tv.argmax()) if t else None),
        ("sum axis 0 of 4096^2", m.size * 4 / 1e9, "GB/s", lambda: fm.sum(m, axis=0),
         lambda: np.sum(m, axis=0), (lambda tm=t(m) if t else None: tm.sum(0)) if t else None),
        ("matmul 1024^2", 2 * 1024**3 / 1e9, "GFLOP/s", lambda: fm.matmul(a1, b1),
         lambda: a1 @ b1, (lambda ta=t(a1) if t else None, tb=t(b1) if t else None: ta @ tb) if t else None),
        ("linear 64x9216 -> 128", 2 * 64 * 9216 * 128 / 1e9, "GFLOP/s",
         lambda: fm.linear(x, w, bias), lambda: x @ w.T + bias,
         (lambda tx=t(x) if t else None, tw=t(w) if t else None, tb=t(bias) if t else None:
          torch.nn.functional.linear(tx, tw, tb)) if t else None),
    ]
    if not quick:
        out.insert(5, ("matmul 4096x1024 @ 1024^2", 2 * 4096 * 1024**2 / 1e9, "GFLOP/s",
                       lambda: fm.matmul(a4, b1), lambda: a4 @ b1,
                       (lambda ta=t(a4) if t else None, tb=t(b1) if t else None: ta @ tb) if t else None))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=1.0, help="seconds per library and case")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--quick", action="store_true", help="skip the 4096-row matmul")
    args = p.parse_args()
    print(machine_summary())
    print(f"{'case':28} {'fastmetal':>16} {'numpy':>16} {'torch':>16}  np/fm  torch/fm")
    for name, work, unit, f_fm, f_np, f_torch in cases(args.quick):
        times: dict[str, list[float]] = {"fm": [], "np": [], "torch": []}
        for _ in range(args.rounds):
            times["fm"].append(median_time(f_fm, budget_s=args.budget / args.rounds, min_repeats=3))
            times["np"].append(median_time(f_np, budget_s=args.budget / args.rounds, min_repeats=3))
            if f_torch:
                times["torch"].append(median_time(f_torch, budget_s=args.budget / args.rounds,
                                                  min_repeats=3))
        med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        cell = {k: f"{med[k] * 1e3:8.2f} ms {work / med[k]:5.1f}" for k in med}
        print(f"{name:28} {cell['fm']:>16} {cell['np']:>16} {cell['torch']:>16}  "
              f"{med['np'] / med['fm']:5.2f}  {med['torch'] / med['fm']:7.2f}   ({unit})")


if __name__ == "__main__":
    main()
