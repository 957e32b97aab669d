"""Elementwise benchmark: sigmoid, exp and broadcast add on 2**10 .. 2**24 float32 elements.

fastmetal (NumPy in, NumPy out) against NumPy (sigmoid as 1/(1+np.exp(-x))), PyTorch CPU
(torch.sigmoid, torch.exp, torch.add on zero-copy tensors) and MLX CPU (mx.sigmoid ...,
inputs converted beforehand, timed with mx.eval). Ratios are peer time / fastmetal time.
"""
from __future__ import annotations

import argparse
import datetime
import json

import numpy as np

import fastmetal as fm

from ._timing import fmt_ratio, fmt_time, machine_summary, median_time, mlx_or_none, torch_or_none

PEERS = ("numpy", "torch", "mlx")


def cases(n: int, rng: np.random.Generator):
    """(name, fastmetal fn, {peer: fn}) for one size."""
    x = rng.standard_normal(n).astype(np.float32)
    cols = min(n, 1024)
    m = x.reshape(n // cols, cols)
    row = rng.standard_normal(cols).astype(np.float32)
    torch, mx = torch_or_none(), mlx_or_none()
    out = {}
    peers = {"sigmoid": {"numpy": lambda: 1 / (1 + np.exp(-x))},
             "exp": {"numpy": lambda: np.exp(x)},
             "add (broadcast)": {"numpy": lambda: m + row}}
    if torch is not None:
        tx, tm, tr = torch.from_numpy(x), torch.from_numpy(m), torch.from_numpy(row)
        peers["sigmoid"]["torch"] = lambda: torch.sigmoid(tx)
        peers["exp"]["torch"] = lambda: torch.exp(tx)
        peers["add (broadcast)"]["torch"] = lambda: torch.add(tm, tr)
    if mx is not None:
        mxx, mxm, mxr = mx.array(x), mx.array(m), mx.array(row)
        mx.eval(mxx, mxm, mxr)
        peers["sigmoid"]["mlx"] = lambda: mx.eval(mx.sigmoid(mxx))
        peers["exp"]["mlx"] = lambda: mx.eval(mx.exp(mxx))
        peers["add (broadcast)"]["mlx"] = lambda: mx.eval(mx.add(mxm, mxr))
    out["sigmoid"] = (lambda: fm.sigmoid(x), peers["sigmoid"])
    out["exp"] = (lambda: fm.exp(x), peers["exp"])
    out["add (broadcast)"] = (lambda: fm.add(m, row), peers["add (broadcast)"])
    return out


def run(exponents, budget_s: float):
    rng = np.random.default_rng(0)
    rows = []
    for e in exponents:
        n = 2**e
        for name, (ours, peers) in cases(n, rng).items():
            t = median_time(ours, budget_s)
            row = {"op": name, "n": n, "fastmetal": t}
            for p in PEERS:
                row[p] = median_time(peers[p], budget_s) if p in peers else None
            rows.append(row)
            yield row


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench elementwise", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10,12,14,16,18,20,22,24",
                    help="comma-separated exponents: n = 2**e elements (default %(default)s)")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per measurement")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ns = ap.parse_args(argv)
    exps = [int(s) for s in ns.sizes.split(",")]
    print(f"# elementwise benchmark, {datetime.date.today()}\n# {machine_summary()}")
    print("# median wall time per call; ratio = peer time / fastmetal time (>1: fastmetal faster)")
    header = f"{'op':<16}{'n':>6} {'fastmetal':>11} {'numpy':>11} {'torch':>11} {'mlx':>11}  {'vs numpy':>9} {'vs torch':>9} {'vs mlx':>9}"
    print(header)
    rows = []
    for r in run(exps, ns.budget):
        rows.append(r)
        print(f"{r['op']:<16}{'2^' + str(int(np.log2(r['n']))):>6} {fmt_time(r['fastmetal']):>11} "
              f"{fmt_time(r['numpy']):>11} {fmt_time(r['torch']):>11} {fmt_time(r['mlx']):>11}  "
              f"{fmt_ratio(r['numpy'], r['fastmetal']):>9} {fmt_ratio(r['torch'], r['fastmetal']):>9} "
              f"{fmt_ratio(r['mlx'], r['fastmetal']):>9}", flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"machine": machine_summary(), "date": str(datetime.date.today()), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
