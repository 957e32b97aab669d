"""A Fourier series and its derivative over 10^9 samples: a dask.array whose blocks fastmetal
computes, on a dask.distributed cluster of worker processes.

    f(x)  = a0/2 + sum_k a_k cos(k w x) + b_k sin(k w x),   w = 2 pi / period
    f'(x) = sum_k k w (b_k cos(k w x) - a_k sin(k w x))

Each block of samples is made where it is computed (from its position: nothing is shipped
but the coefficients), reduced modulo the period in float64 (fastmetal.fourier_series takes
float32 x: reduced, 10^6 samples per period stay distinct) and handed to fastmetal, which
computes f and f' on the worker's device. Two checks:

  * every sample: Parseval's identity over the whole periods sampled, mean(f^2) =
    (a0/2)^2 + sum (a_k^2 + b_k^2) / 2 and mean(f'^2) = sum (k w)^2 (a_k^2 + b_k^2) / 2;
  * a sample of blocks (first, middle, last), every --check-stride-th value of each against
    the series summed by NumPy in float64.

Needs `pip install "fastmetal[dask]"`. By default a LocalCluster of --workers processes on
this machine, each using its share of the cores; `--scheduler ADDRESS` runs the same code on
an existing cluster (docs/dask.md says how, and where a GPU per worker fits).

    python examples/dask_fourier.py [--samples 1e9] [--terms 32] [--workers 2]
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import time
from typing import Any

import numpy as np
import numpy.typing as npt

Floats = npt.NDArray[np.float32]
Doubles = npt.NDArray[np.float64]

PERIOD = 1.0


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default."""


def dask_module(name: str) -> Any:
    """A dask module, imported when used (dask is optional; mypy sees Any: dask has no stubs)."""
    return importlib.import_module(name)


def coefficients(terms: int, seed: int = 0) -> tuple[Floats, Floats]:
    """a_k, b_k for k = 0..terms, decaying like 1/k^2 (a smooth signal)."""
    rng = np.random.default_rng(seed)
    k = np.arange(terms + 1)
    a = (rng.standard_normal(terms + 1) / (1 + k) ** 2).astype(np.float32)
    b = (rng.standard_normal(terms + 1) / (1 + k) ** 2).astype(np.float32)
    return a, b


def block_x(start: int, stop: int, dx: float) -> Floats:
    """Samples start..stop-1 of x_i = i dx, reduced modulo the period in float64, as float32."""
    x = np.arange(start, stop, dtype=np.float64) * dx
    return np.fmod(x, PERIOD).astype(np.float32)


def fastmetal_block(block_info: dict[Any, Any], *, dx: float, a: Floats, b: Floats,
                    derivative: int) -> Floats:
    """One block of f (derivative=0) or f' (1), computed by fastmetal where the task runs
    (dask passes block_info, which says where the block lies in the whole array)."""
    import fastmetal as fm
    start, stop = block_info[None]["array-location"][0]
    result: Floats = fm.fourier_series(block_x(start, stop, dx), a, b, period=PERIOD,
                                       derivative=derivative)
    return result


def numpy_series(x: Floats, a: Floats, b: Floats) -> tuple[Doubles, Doubles]:
    """f and f' at x, summed term by term by NumPy in float64: the reference."""
    w = 2 * math.pi / PERIOD
    x64 = x.astype(np.float64)
    f = np.full(x.shape, a[0] / 2, np.float64)
    df = np.zeros(x.shape, np.float64)
    for k in range(1, len(a)):
        c, s = np.cos(k * w * x64), np.sin(k * w * x64)
        f += a[k] * c + b[k] * s
        df += k * w * (b[k] * c - a[k] * s)
    return f, df


def parseval(a: Floats, b: Floats) -> tuple[float, float]:
    """mean(f^2) and mean(f'^2) over whole periods, from the coefficients."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    kw = np.arange(len(a)) * 2 * math.pi / PERIOD
    power = (a64[1:] ** 2 + b64[1:] ** 2) / 2
    return float((a64[0] / 2) ** 2 + power.sum()), float((kw[1:] ** 2 * power).sum())


def start_cluster(workers: int) -> Any:
    """A LocalCluster of worker processes, one thread each; each worker's fastmetal gets its
    share of the cores (FASTMETAL_NUM_THREADS is read when fastmetal is imported there)."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    return dask_module("dask.distributed").LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
        env={"FASTMETAL_NUM_THREADS": str(threads)})


def run(samples: int, terms: int, chunk: int, check_stride: int) -> dict[str, Any]:
    """Builds f and f' as dask arrays and computes, in one pass over the blocks on the
    current dask client, the Parseval means and the sampled blocks; returns the time and the
    errors of both checks."""
    dask, da = dask_module("dask"), dask_module("dask.array")
    a, b = coefficients(terms)
    periods = max(1, samples // 1_000_000)  # whole periods, 10^6 samples each (fewer if small)
    dx = periods * PERIOD / samples
    sizes = (chunk,) * (samples // chunk) + ((samples % chunk,) if samples % chunk else ())
    f, df = (da.map_blocks(fastmetal_block, chunks=(sizes,), meta=np.empty(0, np.float32),
                           dx=dx, a=a, b=b, derivative=m) for m in (0, 1))
    n_blocks = f.numblocks[0]
    checked = sorted({0, n_blocks // 2, n_blocks - 1})
    starts = np.cumsum((0,) + sizes)
    mean_f2 = (f.astype(np.float64) ** 2).mean()
    mean_df2 = (df.astype(np.float64) ** 2).mean()
    samples_f = [f.blocks[i][::check_stride] for i in checked]
    samples_df = [df.blocks[i][::check_stride] for i in checked]
    t0 = time.perf_counter()
    mf2, mdf2, got_f, got_df = dask.compute(mean_f2, mean_df2, samples_f, samples_df)
    seconds = time.perf_counter() - t0

    want_f2, want_df2 = parseval(a, b)
    errors: dict[str, float] = {"parseval f": abs(mf2 - want_f2) / want_f2,
                                "parseval f'": abs(mdf2 - want_df2) / want_df2}
    for i, gf, gdf in zip(checked, got_f, got_df):
        x = block_x(int(starts[i]), int(starts[i + 1]), dx)[::check_stride]
        rf, rdf = numpy_series(x, a, b)
        errors[f"block {i} f"] = float(np.max(np.abs(gf - rf)) / np.max(np.abs(rf)))
        errors[f"block {i} f'"] = float(np.max(np.abs(gdf - rdf)) / np.max(np.abs(rdf)))
    return {"seconds": seconds, "blocks": n_blocks, "checked": checked, "errors": errors,
            "checked_values": sum(len(g) for g in got_f) * 2}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--samples", type=float, default=1e9, help="samples of f (and of f')")
    ap.add_argument("--terms", type=int, default=32, help="Fourier terms K (harmonics 0..K)")
    ap.add_argument("--chunk", type=int, default=1 << 24, help="samples per block (one task)")
    ap.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    ap.add_argument("--scheduler", default=None, metavar="ADDRESS",
                    help="an existing cluster's scheduler (tcp://host:8786) instead of a "
                         "LocalCluster")
    ap.add_argument("--check-stride", type=int, default=1000,
                    help="every this many values of each checked block are compared with NumPy")
    ns = ap.parse_args(argv)
    samples = int(ns.samples)
    if samples < 1 or ns.chunk < 1:
        ap.error(f"--samples and --chunk: expected >= 1, got {samples} and {ns.chunk}")

    cluster = None if ns.scheduler else start_cluster(ns.workers)
    with dask_module("dask.distributed").Client(ns.scheduler or cluster) as client:
        info = client.scheduler_info()["workers"]
        where = f"scheduler {ns.scheduler}" if ns.scheduler else "LocalCluster, processes"
        print(f"{len(info)} dask workers ({where}); f and f' of a {ns.terms}-term Fourier "
              f"series on {samples:,} samples in blocks of {ns.chunk:,}")
        result = run(samples, ns.terms, ns.chunk, ns.check_stride)
    if cluster is not None:
        cluster.close()
    for name, err in result["errors"].items():
        print(f"  {name:<16} rel err {err:.1e}")
    rate = samples / result["seconds"]
    print(f"{samples:,} samples (f and f', {result['blocks']} blocks) in "
          f"{result['seconds']:.2f} s: {rate / 1e6:,.1f} M samples/s "
          f"({2 * rate * ns.terms / 1e9:,.2f} G terms/s); {result['checked_values']:,} values "
          f"of blocks {result['checked']} checked against NumPy")
    bad = {k: v for k, v in result["errors"].items() if not v < 1e-4}
    if bad:
        raise SystemExit(f"dask_fourier: relative errors above 1e-4: {bad}")
    return result


if __name__ == "__main__":
    main()
