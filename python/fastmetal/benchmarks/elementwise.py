"""Elementwise benchmark: sigmoid, exp, gelu and broadcast add on 2**10 .. 2**24 float32
elements, once per CPU instruction set this machine can run (FASTMETAL_CPU_ISA=base, avx2,
avx512; each in a child process, since the ISA is chosen when fastmetal loads).

fastmetal (NumPy in, NumPy out) against NumPy (sigmoid as 1/(1+np.exp(-x)); NumPy has no
erf, so no gelu), PyTorch CPU (torch.sigmoid, torch.exp, torch.nn.functional.gelu, torch.add on
zero-copy tensors, torch's thread count set to fastmetal's) and MLX CPU (inputs converted
beforehand, timed with mx.eval). `copy` is np.copyto of the same input into a preallocated
output: the memory-traffic floor of a unary op. Ratios are peer time / fastmetal time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

import fastmetal as fm

from ._timing import fmt_ratio, fmt_time, machine_summary, mlx_or_none, torch_or_none

PEERS = ("numpy", "torch", "mlx", "copy")


def cases(n: int, rng: np.random.Generator):
    """{name: (fastmetal fn, {peer: fn})} for one size."""
    x = rng.standard_normal(n).astype(np.float32)
    cols = min(n, 1024)
    m = x.reshape(n // cols, cols)
    row = rng.standard_normal(cols).astype(np.float32)
    dst = np.empty_like(x)
    torch, mx = torch_or_none(), mlx_or_none()
    copy = lambda: np.copyto(dst, x)  # noqa: E731
    peers = {"sigmoid": {"numpy": lambda: 1 / (1 + np.exp(-x)), "copy": copy},
             "exp": {"numpy": lambda: np.exp(x), "copy": copy},
             "gelu": {"copy": copy},
             "add (broadcast)": {"numpy": lambda: m + row}}
    if torch is not None:
        tx, tm, tr = torch.from_numpy(x), torch.from_numpy(m), torch.from_numpy(row)
        peers["sigmoid"]["torch"] = lambda: torch.sigmoid(tx)
        peers["exp"]["torch"] = lambda: torch.exp(tx)
        peers["gelu"]["torch"] = lambda: torch.nn.functional.gelu(tx)
        peers["add (broadcast)"]["torch"] = lambda: torch.add(tm, tr)
    if mx is not None:
        mxx, mxm, mxr = mx.array(x), mx.array(m), mx.array(row)
        mx.eval(mxx, mxm, mxr)
        peers["sigmoid"]["mlx"] = lambda: mx.eval(mx.sigmoid(mxx))
        peers["exp"]["mlx"] = lambda: mx.eval(mx.exp(mxx))
        peers["gelu"]["mlx"] = lambda: mx.eval(mx.nn.gelu(mxx)) if hasattr(mx, "nn") else None
        peers["add (broadcast)"]["mlx"] = lambda: mx.eval(mx.add(mxm, mxr))
    return {"sigmoid": (lambda: fm.sigmoid(x), peers["sigmoid"]),
            "exp": (lambda: fm.exp(x), peers["exp"]),
            "gelu": (lambda: fm.gelu(x), peers["gelu"]),
            "add (broadcast)": (lambda: fm.add(m, row), peers["add (broadcast)"])}


def block_medians(fns: dict, budget_s: float, settle_s: float = 0.003, block_s: float = 0.005,
                  max_rounds: int = 100) -> dict:
    """{name: median seconds per call}, timed in interleaved rounds so that load from other
    processes falls on each alike. Each round gives each function a block of calls: first
    untimed ones for settle_s (on a 2-core machine the previous library's pool threads
    still spin-wait for work for a while and take a core from this one's workers), then
    timed ones for block_s (at least 3)."""
    times = {k: [] for k in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < 3 or (rounds < max_rounds and time.perf_counter() - start < budget_s * len(fns)):
        for k, f in fns.items():
            t_end = time.perf_counter() + settle_s
            f()
            while time.perf_counter() < t_end:
                f()
            t_end = time.perf_counter() + block_s
            for i in range(1 << 30):
                t0 = time.perf_counter()
                f()
                t1 = time.perf_counter()
                times[k].append(t1 - t0)
                if i >= 2 and t1 >= t_end:
                    break
        rounds += 1
    return {k: statistics.median(v) for k, v in times.items()}


def runnable_isas() -> list[str]:
    """The CPU variants this machine can run, as fastmetal's dispatcher decides."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [fm._core._cpu_isa()]
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return [fm._core._cpu_isa()]
    isas = ["base"]
    if " avx2" in flags and " fma" in flags:
        isas.append("avx2")
    if " avx512f" in flags and " avx512bw" in flags and " avx512vl" in flags:
        isas.append("avx512")
    return isas


def run(exponents, budget_s: float):
    torch = torch_or_none()
    if torch is not None:  # same number of threads as fastmetal: a like-for-like comparison
        torch.set_num_threads(fm._core._num_threads())
    rng = np.random.default_rng(0)
    for e in exponents:
        n = 2**e
        for name, (ours, peers) in cases(n, rng).items():
            fns = {"fastmetal": ours, **{p: peers[p] for p in PEERS if p in peers}}
            times = block_medians(fns, budget_s)
            row = {"isa": fm._core._cpu_isa(), "op": name, "n": n}
            for k in ("fastmetal",) + PEERS:
                row[k] = times.get(k)
            yield row


def run_isa_child(isa: str, sizes: str, budget: float):
    """Rows measured by a child process with FASTMETAL_CPU_ISA=isa (one JSON row a line)."""
    env = {**os.environ, "FASTMETAL_CPU_ISA": isa}
    cmd = [sys.executable, "-m", "fastmetal.benchmarks.elementwise", "--child", "--sizes", sizes,
           "--budget", str(budget)]
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if line.startswith("{"):
                yield json.loads(line)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child for FASTMETAL_CPU_ISA={isa} failed ({proc.returncode})")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench elementwise", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    fm.set_default_device("cpu")  # the CPU kernels, also on a machine with a GPU
    ap.add_argument("--sizes", default="10,12,14,16,18,20,22,24",
                    help="comma-separated exponents: n = 2**e elements (default %(default)s)")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per measurement")
    ap.add_argument("--isa", help="comma-separated CPU variants (default: every one this CPU runs)")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    exps = [int(s) for s in ns.sizes.split(",")]
    if ns.child:  # one ISA, machine-readable rows for the parent
        for r in run(exps, ns.budget):
            print(json.dumps(r), flush=True)
        return []
    isas = ns.isa.split(",") if ns.isa else runnable_isas()
    print(f"# elementwise benchmark, {datetime.date.today()}\n# {machine_summary()}")
    print("# median wall time per call; ratio = peer time / fastmetal time (>1: fastmetal faster);"
          " copy = np.copyto, the memory floor")
    header = (f"{'isa':<7}{'op':<16}{'n':>5} {'fastmetal':>10} {'numpy':>10} {'torch':>10} {'mlx':>10} "
              f"{'copy':>10} {'vs numpy':>9} {'vs torch':>9} {'vs mlx':>7} {'vs copy':>8}")
    print(header)
    rows = []
    for isa in isas:
        for r in run_isa_child(isa, ns.sizes, ns.budget):
            rows.append(r)
            print(f"{r['isa']:<7}{r['op']:<16}{'2^' + str(int(np.log2(r['n']))):>5} "
                  f"{fmt_time(r['fastmetal']):>10} {fmt_time(r['numpy']):>10} {fmt_time(r['torch']):>10} "
                  f"{fmt_time(r['mlx']):>10} {fmt_time(r['copy']):>10} "
                  f"{fmt_ratio(r['numpy'], r['fastmetal']):>9} {fmt_ratio(r['torch'], r['fastmetal']):>9} "
                  f"{fmt_ratio(r['mlx'], r['fastmetal']):>7} {fmt_ratio(r['copy'], r['fastmetal']):>8}",
                  flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"machine": machine_summary(), "date": str(datetime.date.today()), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
