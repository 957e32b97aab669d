"""Fourier-series benchmark: 100,000 samples, K = 100, 1,000, 10,000 terms, then derivatives.

    python -m fastmetal bench fourier [--samples N] [--terms 100,1000,10000] [--plot PATH] [--markdown PATH]

Series: f(x) = a0/2 + sum_k a_k cos(k w x) + b_k sin(k w x), w = 2 pi / P, with x float32 drawn
over +-50 periods and random coefficients decaying like 1/k. Every implementation gets the same
float32 x; the float32 peers get float32 coefficients. Peers, all vectorised the same way
(phase matrix of a chunk of samples x K terms, cos/sin, matrix-vector products), chunked so
memory stays bounded (chunk sizes: see CHUNK_*):
  NumPy float32, NumPy float64 (also the reference), PyTorch CPU float32, MLX CPU float32.
fastmetal.fourier_series is one fused kernel without any (samples x K) temporary.

Printed per row: median wall time, speed-up vs NumPy float32 (numpy32 time / time), max abs
error and cosine similarity against the float64 reference. Then the derivative: the series on a
uniform grid differentiated numerically (fastmetal.derivative at accuracy 2/4/8,
fastmetal.gradient, numpy.gradient, torch.gradient) and analytically
(fourier_series(..., derivative=1) against NumPy float32 evaluating the derivative formula).
"""
from __future__ import annotations

import argparse
import datetime

import numpy as np

from ._timing import fmt_time, machine_summary, mlx_or_none, time_calls, torch_or_none

import fastmetal as fm

# Phase-matrix elements per chunk in the vectorised peers, each near its fastest measured
# on the 2-core test machine: NumPy gains ~2x from chunks that stay in L2, PyTorch loses from
# small ones (per-op threading overhead), MLX is flat. Memory stays bounded either way.
CHUNK_NUMPY = 1 << 17
CHUNK_TORCH = 1 << 22
CHUNK_MLX = 1 << 22


# ----------------------------------------------------------------------------- helpers
def median_time(fn, budget_s: float, min_repeats: int = 3, max_repeats: int = 50):
    """(median wall time, last result). A call slower than budget_s is timed once, its
    warm-up (the slow peers at K = 10,000 take tens of seconds per call)."""
    t = time_calls({"fn": fn}, budget_s, min_repeats, max_repeats, once_over_s=budget_s)["fn"]
    return t.median, t.result


def errors(got, ref):
    g = np.asarray(got, dtype=np.float64).ravel()
    r = np.asarray(ref, dtype=np.float64).ravel()
    cos = float(g @ r / (np.linalg.norm(g) * np.linalg.norm(r)))
    return float(np.max(np.abs(g - r))), cos


# ----------------------------------------------------------------------------- peers
def numpy_series(x, a, b, period, dtype, m=0):
    """Vectorised, chunked evaluation of the m-th derivative in `dtype`."""
    x = np.asarray(x, dtype)
    K = len(a) - 1
    kw = np.arange(1, K + 1, dtype=dtype) * dtype(2 * np.pi / period)
    a = np.asarray(a, dtype)
    b = np.asarray(b, dtype)
    ca, cb = a[1:] * kw**m, b[1:] * kw**m
    ca, cb = [(ca, cb), (cb, -ca), (-ca, -cb), (-cb, ca)][m % 4]
    out = np.empty(x.shape, dtype)
    chunk = max(1, CHUNK_NUMPY // max(K, 1))
    c0 = a[0] / dtype(2) if m == 0 else dtype(0)
    for i in range(0, len(x), chunk):
        ph = np.outer(x[i:i + chunk], kw)
        out[i:i + chunk] = np.cos(ph) @ ca + np.sin(ph) @ cb + c0
    return out


def torch_series(torch, x, a, b, period):
    K = len(a) - 1
    kw = torch.arange(1, K + 1, dtype=torch.float32) * float(2 * np.pi / period)
    ca, cb = torch.from_numpy(a[1:].astype(np.float32)), torch.from_numpy(b[1:].astype(np.float32))
    tx = torch.from_numpy(x)
    out = torch.empty_like(tx)
    chunk = max(1, CHUNK_TORCH // max(K, 1))
    for i in range(0, len(x), chunk):
        ph = torch.outer(tx[i:i + chunk], kw)
        out[i:i + chunk] = torch.cos(ph) @ ca + torch.sin(ph) @ cb + float(a[0]) / 2
    return out.numpy()


def mlx_series(mx, x, a, b, period):
    K = len(a) - 1
    kw = mx.arange(1, K + 1, dtype=mx.float32) * float(2 * np.pi / period)
    ca, cb = mx.array(a[1:].astype(np.float32)), mx.array(b[1:].astype(np.float32))
    mxx = mx.array(x)
    chunk = max(1, CHUNK_MLX // max(K, 1))
    parts = []
    for i in range(0, len(x), chunk):
        ph = mx.outer(mxx[i:i + chunk], kw)
        part = mx.cos(ph) @ ca + mx.sin(ph) @ cb + float(a[0]) / 2
        mx.eval(part)  # bounded memory: one chunk's phase matrix at a time
        parts.append(part)
    out = mx.concatenate(parts)
    mx.eval(out)
    return np.array(out)


# ----------------------------------------------------------------------------- runs
def run_series(samples, terms, budget, rng):
    torch, mx = torch_or_none(), mlx_or_none()
    period = 2 * np.pi
    rows = []
    for K in terms:
        x = (rng.uniform(-50, 50, samples) * period).astype(np.float32)
        k = np.arange(K + 1, dtype=np.float64)
        a = rng.standard_normal(K + 1) / (1 + k)
        b = rng.standard_normal(K + 1) / (1 + k)
        impls = {
            "fastmetal": lambda: fm.fourier_series(x, a, b, period=period),
            "numpy float32": lambda: numpy_series(x, a, b, period, np.float32),
            "numpy float64": lambda: numpy_series(x, a, b, period, np.float64),
        }
        if torch is not None:
            impls["torch cpu float32"] = lambda: torch_series(torch, x, a, b, period)
        if mx is not None:
            impls["mlx cpu float32"] = lambda: mlx_series(mx, x, a, b, period)
        res, outs = {}, {}
        for name, fn in impls.items():
            t, outs[name] = median_time(fn, budget)
            res[name] = t
        ref = outs["numpy float64"]
        res = {name: (t, *errors(outs[name], ref)) for name, t in res.items()}
        t32 = res["numpy float32"][0]
        for name, (t, err, cos) in res.items():
            rows.append({"K": K, "impl": name, "time": t, "speedup": t32 / t, "err": err, "cos": cos})
            yield rows[-1]


def run_derivative(samples, K, budget, rng):
    """Derivative of a K-term series sampled on a uniform grid of `samples` points."""
    torch = torch_or_none()
    period = 2 * np.pi
    x64 = np.linspace(-2 * period, 2 * period, samples)
    x = x64.astype(np.float32)
    h = float(x64[1] - x64[0])
    k = np.arange(K + 1, dtype=np.float64)
    a = rng.standard_normal(K + 1) / (1 + k) ** 2  # 1/k^2: a derivative of moderate size
    b = rng.standard_normal(K + 1) / (1 + k) ** 2
    y = fm.fourier_series(x, a, b, period=period)
    y64 = y.astype(np.float64)
    ref = numpy_series(x.astype(np.float64), a, b, period, np.float64, m=1)
    impls = {}
    for acc in (2, 4, 8):
        impls[f"fastmetal.derivative acc={acc}"] = (lambda acc=acc: fm.derivative(y, dx=h, accuracy=acc))
    impls["fastmetal.gradient"] = lambda: fm.gradient(y, h)
    impls["numpy.gradient float32"] = lambda: np.gradient(y, h)
    impls["numpy.gradient float64"] = lambda: np.gradient(y64, h)
    if torch is not None:
        ty = torch.from_numpy(y)
        impls["torch.gradient float32"] = lambda: torch.gradient(ty, spacing=h)[0].numpy()
    impls["fastmetal analytic (derivative=1)"] = lambda: fm.fourier_series(x, a, b, period=period,
                                                                            derivative=1)
    impls["numpy float32 analytic"] = lambda: numpy_series(x, a, b, period, np.float32, m=1)
    rows = []
    for name, fn in impls.items():
        t, out = median_time(fn, budget)
        err, cos = errors(out, ref)
        rows.append({"impl": name, "time": t, "err": err, "cos": cos})
    # numerical methods against numpy.gradient float32, analytic ones against NumPy float32
    t_num = next(r["time"] for r in rows if r["impl"] == "numpy.gradient float32")
    t_ana = next(r["time"] for r in rows if r["impl"] == "numpy float32 analytic")
    for r in rows:
        r["baseline"] = "numpy float32 analytic" if "analytic" in r["impl"] else "numpy.gradient float32"
        r["speedup"] = (t_ana if "analytic" in r["impl"] else t_num) / r["time"]
    return rows, h


def plot(rows, path):
    try:
        import matplotlib
    except ImportError:
        print(f"# --plot {path}: matplotlib is not installed (pip install 'fastmetal[bench]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.2))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        rs = [r for r in rows if r["impl"] == impl]
        Ks = [r["K"] for r in rs]
        ax_t.loglog(Ks, [r["time"] for r in rs], "o-", label=impl)
        if impl != "numpy float64":  # the reference itself
            ax_e.loglog(Ks, [max(r["err"], 1e-12) for r in rs], "o-", label=impl)
    ax_t.set(xlabel="terms K", ylabel="time per call (s)", title="Fourier series, 100k samples")
    ax_e.set(xlabel="terms K", ylabel="max abs error vs float64", title="accuracy (x over +-50 periods)")
    for ax in (ax_t, ax_e):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench fourier", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--terms", default="100,1000,10000", help="comma-separated K values")
    ap.add_argument("--derivative-terms", type=int, default=100,
                    help="K of the series differentiated in the second table")
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--plot", help="write a PNG of time and error against K here")
    ap.add_argument("--markdown", help="also write the tables as Markdown here")
    ns = ap.parse_args(argv)
    terms = [int(t) for t in ns.terms.split(",")]
    rng = np.random.default_rng(0)
    head = [f"# Fourier series benchmark, {datetime.date.today()}", f"# {machine_summary()}",
            f"# {ns.samples} float32 samples over +-50 periods; median wall time per call; "
            "speed-up = NumPy float32 time / time; errors vs NumPy float64"]
    print("\n".join(head))
    md = ["| K | implementation | time | speed-up vs NumPy f32 | max abs error | cosine similarity |",
          "|---:|---|---:|---:|---:|---:|"]
    print(f"{'K':>6}  {'implementation':<20} {'time':>10} {'vs np32':>8} {'max err':>10} {'cos sim':>18}")
    rows = []
    for r in run_series(ns.samples, terms, ns.budget, rng):
        rows.append(r)
        print(f"{r['K']:>6}  {r['impl']:<20} {fmt_time(r['time']):>10} {r['speedup']:>7.1f}x "
              f"{r['err']:>10.2e} {r['cos']:>18.15f}", flush=True)
        md.append(f"| {r['K']} | {r['impl']} | {fmt_time(r['time'])} | {r['speedup']:.1f}x | "
                  f"{r['err']:.2e} | {r['cos']:.15f} |")
    drows, h = run_derivative(ns.samples, ns.derivative_terms, ns.budget, rng)
    title = (f"# derivative of a K={ns.derivative_terms} series on a uniform grid of {ns.samples} "
             f"points (h={h:.3g}); errors vs the analytic float64 derivative; "
             "speed-up vs numpy.gradient float32 (numerical) or NumPy float32 analytic formula")
    print("\n" + title)
    print(f"{'implementation':<34} {'time':>10} {'speed-up':>9} {'max err':>10} {'cos sim':>18}")
    md += ["", title.lstrip("# "), "",
           "| implementation | time | speed-up (see above) | max abs error | cosine similarity |",
           "|---|---:|---:|---:|---:|"]
    for r in drows:
        print(f"{r['impl']:<34} {fmt_time(r['time']):>10} {r['speedup']:>8.1f}x "
              f"{r['err']:>10.2e} {r['cos']:>18.15f}")
        md.append(f"| {r['impl']} | {fmt_time(r['time'])} | {r['speedup']:.1f}x | "
                  f"{r['err']:.2e} | {r['cos']:.15f} |")
    if ns.plot:
        plot(rows, ns.plot)
        print(f"\nplot written to {ns.plot}")
    if ns.markdown:
        with open(ns.markdown, "w") as f:
            f.write("\n".join(["\n".join(h.lstrip("# ") for h in head), ""] + md) + "\n")
    return {"series": rows, "derivative": drows}


if __name__ == "__main__":
    main()
