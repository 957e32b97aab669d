"""A Fourier series and its derivative over 10^9 samples: a dask.array whose blocks fastmetal
computes, on a dask.distributed cluster of worker processes.

    f(x)  = a0/2 + sum_k a_k cos(k w x) + b_k sin(k w x),   w = 2 pi / period
    f'(x) = sum_k k w (b_k cos(k w x) - a_k sin(k w x))

The samples are x_i = (i mod P) period / P, P = 10^6 samples per period (the whole range
sampled in one period when it is not a multiple of 10^6): reduced to one period by integer
arithmetic, so float32 x, which fastmetal.fourier_series takes, keeps them distinct. Each
block of the (2, samples) array [f, f'] makes its x where it is computed (from its position:
nothing is shipped but the coefficients) and fastmetal computes both rows on the worker's
device. Two checks:

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


def per_period(samples: int) -> int:
    """Samples per period: 10^6, or all of them in one period if that does not divide."""
    return 1_000_000 if samples % 1_000_000 == 0 else samples


def block_x(start: int, stop: int, spp: int) -> Floats:
    """Samples start..stop-1 of x_i = (i mod spp) * period / spp, in float32."""
    i = np.arange(start, stop, dtype=np.int64) % spp  # < 2^24 here: exact in float32
    return i.astype(np.float32) * np.float32(PERIOD / spp)


def fastmetal_block(block_info: dict[Any, Any], *, spp: int, a: Floats, b: Floats) -> Floats:
    """One block of [f, f'] (shape (2, n)), computed by fastmetal where the task runs (dask
    passes block_info, which says where the block lies in the whole array)."""
    import fastmetal as fm
    start, stop = block_info[None]["array-location"][1]
    x = block_x(start, stop, spp)
    out = np.empty((2, stop - start), np.float32)
    out[0] = fm.fourier_series(x, a, b, period=PERIOD)
    out[1] = fm.fourier_series(x, a, b, period=PERIOD, derivative=1)
    return out


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
    spp = per_period(samples)
    sizes = (chunk,) * (samples // chunk) + ((samples % chunk,) if samples % chunk else ())
    both = da.map_blocks(fastmetal_block, chunks=((2,), sizes), meta=np.empty((0, 0), np.float32),
                         spp=spp, a=a, b=b)
    f, df = both[0], both[1]
    n_blocks = both.numblocks[1]
    checked = sorted({0, n_blocks // 2, n_blocks - 1})
    starts = np.cumsum((0,) + sizes)
    # Squares in float32 (a relative error of 1e-7 each), summed in float64.
    mean_f2 = (f * f).mean(dtype=np.float64)
    mean_df2 = (df * df).mean(dtype=np.float64)
    sampled = [both.blocks[0, i][:, ::check_stride] for i in checked]
    t0 = time.perf_counter()
    mf2, mdf2, got = dask.compute(mean_f2, mean_df2, sampled)
    seconds = time.perf_counter() - t0

    want_f2, want_df2 = parseval(a, b)
    errors: dict[str, float] = {"parseval f": abs(mf2 - want_f2) / want_f2,
                                "parseval f'": abs(mdf2 - want_df2) / want_df2}
    for i, (gf, gdf) in zip(checked, got):
        x = block_x(int(starts[i]), int(starts[i + 1]), spp)[::check_stride]
        rf, rdf = numpy_series(x, a, b)
        errors[f"block {i} f"] = float(np.max(np.abs(gf - rf)) / np.max(np.abs(rf)))
        errors[f"block {i} f'"] = float(np.max(np.abs(gdf - rdf)) / np.max(np.abs(rdf)))
    return {"seconds": seconds, "blocks": n_blocks, "checked": checked, "errors": errors,
            "checked_values": sum(g.size for g in got)}


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
