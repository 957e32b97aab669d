"""Matrix products: fastmetal against NumPy (OpenBLAS) and PyTorch on the CPU, and against
cuBLAS (PyTorch, TF32 off: exact FP32) on a GPU device, TFLOP/s and ratios in one run.

    python -m fastmetal bench matmul [--device cpu|cuda|metal] [--quick] [--budget S]
    python -m fastmetal bench matmul --sweep      (GPU tuning: every tile and split, forced)
    python benchmarks/reduce_matmul.py ...        (the CPU part, with the reductions)

Cases: square products (GPU: n = 256 ... 8192; CPU: 1024), 4096x1024 @ 1024^2, batched
products, and the dense layers of the MNIST and VAE examples (64x9216 -> 128, 128x784 ->
400, 128x400 -> 20) with the two products of their backward pass: grad_input = grad @ W and
grad_weight = grad^T @ x (a transposed operand). `--reductions` adds the sum / max / argmax
rows of the former benchmarks/reduce_matmul.py (CPU). ratio = peer time / fastmetal time
(above 1: fastmetal is faster). CPU times: medians of repeats, each library in its own block
after a rest (see cpu_time; NumPy in, NumPy out for fastmetal; torch.from_numpy for torch). GPU times: medians over batches of calls
closed by a device synchronisation, after warm-up (gpu.gpu_time).
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Callable

import numpy as np

import fastmetal as fm

from .gpu import Peers, gpu_time
from ._timing import fmt_time, machine_summary, time_calls, torch_or_none

SQUARE_GPU = (256, 512, 1024, 2048, 4096, 8192)
# (name, M, K, N): the layers' forward products (x @ W^T, W given as (N, K)).
LAYERS = [("MNIST fc1 64x9216->128", 64, 9216, 128), ("VAE fc1 128x784->400", 128, 784, 400),
          ("VAE fc2 128x400->20", 128, 400, 20)]


def cases(device: str, quick: bool, sweep: bool = False):
    """(name, flop count, {what: (a, b, a_transposed, b_transposed)}) rows: products C = op(A)
    @ op(B) from row-major host arrays, op = transpose where flagged (a view, no copy)."""
    r = np.random.default_rng(0)

    def f32(*s):
        return r.standard_normal(s).astype(np.float32)
    rows = []
    squares = SQUARE_GPU if device != "cpu" else (1024,)
    if quick:
        squares = tuple(n for n in squares if n <= (4096 if sweep else 2048))
    for n in squares:
        rows.append((f"matmul {n}^2", 2 * n**3, (f32(n, n), f32(n, n), False, False)))
    if not quick or device == "cpu":
        rows.append(("matmul 4096x1024 @ 1024^2", 2 * 4096 * 1024**2,
                     (f32(4096, 1024), f32(1024, 1024), False, False)))
    if device != "cpu":
        rows.append(("batched 64 x 256^2", 2 * 64 * 256**3, (f32(64, 256, 256), f32(64, 256, 256), False, False)))
        rows.append(("batched 8 x 1024^2", 2 * 8 * 1024**3, (f32(8, 1024, 1024), f32(8, 1024, 1024), False, False)))
    for name, m, k, n in LAYERS:
        x, w, gy = f32(m, k), f32(n, k), f32(m, n)
        rows.append((f"{name} fwd x@W^T", 2 * m * k * n, (x, w, False, True)))
        rows.append((f"{name} grad_in g@W", 2 * m * k * n, (gy, w, False, False)))
        rows.append((f"{name} grad_w g^T@x", 2 * m * k * n, (gy, x, True, False)))
    return rows


def op_view(a, t):
    return a.T if t else a  # the transposed operands are 2-D


# ----------------------------------------------------------------------------- CPU
def openblas_core() -> str | None:
    """The kernels NumPy's OpenBLAS runs (e.g. SkylakeX, Haswell), or None where not found.
    OpenBLAS picks them from the CPU, not from FASTMETAL_CPU_ISA: compare the AVX2 variant
    against its AVX2 kernels with OPENBLAS_CORETYPE=Haswell set before Python starts."""
    import ctypes
    import glob
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for sym in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename",
                    "openblas_get_corename64_", "openblas_get_corename"):
            fn = getattr(lib, sym, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def cpu_rows(ns, torch):
    fm.set_default_device("cpu")  # NumPy in, NumPy out runs on the default device
    print(f"{'case':38} {'fastmetal':>18} {'numpy':>18} {'torch':>18}  np/fm torch/fm")
    out = []
    for name, flops, (a, b, ta, tb) in cases("cpu", ns.quick):
        A, B = op_view(a, ta), op_view(b, tb)
        fns = {"fm": lambda A=A, B=B: fm.matmul(A, B), "np": lambda A=A, B=B: A @ B}
        if torch is not None:
            tA, tB = op_view(torch.from_numpy(a), ta), op_view(torch.from_numpy(b), tb)
            fns["torch"] = lambda tA=tA, tB=tB: tA @ tB
        if "fwd" in name:  # the layer itself: linear with bias
            w, bias = b, np.zeros(b.shape[0], np.float32) + 0.5
            fns = {"fm": lambda a=a, w=w, bias=bias: fm.linear(a, w, bias),
                   "np": lambda a=a, w=w, bias=bias: a @ w.T + bias}
            if torch is not None:
                tx, tw, tbias = (torch.from_numpy(v) for v in (a, w, bias))
                fns["torch"] = lambda tx=tx, tw=tw, tbias=tbias: torch.nn.functional.linear(tx, tw, tbias)
            name = name.replace("x@W^T", "linear+bias")
        out.append(report(name, flops, cpu_time(fns, ns)))
    return out


def cpu_time(fns, ns):
    """{library: Timing}. --interleave: time_calls' interleaved rounds. By default each
    library is timed in its own block after a rest: on a few pinned cores, the worker threads
    a library leaves spinning after its call (OpenBLAS's, OpenMP's in torch, fastmetal's
    pool) would otherwise run beside the next library's call and slow it down (seen on the
    device machine's Xeon, taskset -c 0,1: torch's and NumPy's times for the 128x400x20
    layer took 33 us in one run and 3.3 ms in another with the calls interleaved)."""
    if ns.interleave:
        return time_calls(fns, budget_s=ns.budget)
    out = {}
    for k, f in fns.items():
        time.sleep(0.3)
        out.update({k: time_calls({k: f}, budget_s=ns.budget)[k]})
    return out


def report(name, flops, t):
    fm_t = t["fm"].median

    def cell(k):
        if k not in t:
            return f"{'-':>18}"
        return f"{fmt_time(t[k].median):>9} {flops / t[k].median / 1e9:7.1f}G"
    ratios = "  ".join(f"{t[k].median / fm_t:5.2f}" if k in t else "    -" for k in ("np", "torch"))
    print(f"{name:38} {cell('fm')} {cell('np')} {cell('torch')}  {ratios}")
    return {"case": name, "flops": flops, **{k: v.median for k, v in t.items()}}


def reduction_rows(ns, torch):
    """The reductions of the former benchmarks/reduce_matmul.py (GB/s in the G column)."""
    r = np.random.default_rng(0)
    v = r.standard_normal(2**24).astype(np.float32)
    m = r.standard_normal((4096, 4096)).astype(np.float32)
    t = torch.from_numpy if torch is not None else None
    rows = [("sum 2^24", v.nbytes, lambda: fm.sum(v), lambda: np.sum(v), "sum", v, ()),
            ("max 2^24", v.nbytes, lambda: fm.max(v), lambda: np.max(v), "max", v, ()),
            ("argmax 2^24", v.nbytes, lambda: fm.argmax(v), lambda: np.argmax(v), "argmax", v, ()),
            ("sum axis 0 of 4096^2 (GB/s)", m.nbytes, lambda: fm.sum(m, axis=0),
             lambda: np.sum(m, axis=0), "sum", m, (0,))]
    for name, nbytes, f_fm, f_np, tname, arr, args in rows:
        fns = {"fm": f_fm, "np": f_np}
        if t is not None:
            tv = t(arr)
            fns["torch"] = lambda tv=tv, tname=tname, args=args: getattr(tv, tname)(*args)
        report(name, nbytes, cpu_time(fns, ns))


# ----------------------------------------------------------------------------- GPU
def gpu_rows(ns, device, torch):
    peers = Peers(device)
    sync = lambda: fm.synchronize(device)  # noqa: E731
    print(f"{'case':38} {'fastmetal':>18} {'cuBLAS (torch)':>18}  ratio   rel.err fm / torch")
    out = []
    for name, flops, (a, b, ta, tb) in cases(device, ns.quick):
        da, db = fm.asarray(a, device=device), fm.asarray(b, device=device)
        A, B = op_view(da, ta), op_view(db, tb)
        t_fm = gpu_time(lambda: fm.matmul(A, B), sync, budget_s=ns.budget)
        row = {"case": name, "flops": flops, "fm": t_fm}
        err = ""
        if peers.torch is not None:
            tA, tB = op_view(peers.to_torch(a), ta), op_view(peers.to_torch(b), tb)
            row["torch"] = gpu_time(lambda: tA @ tB, peers.tsync, budget_s=ns.budget)
            if flops <= 2 * 2048**3:  # error against float64 (host), both libraries
                want = np.matmul(op_view(a.astype(np.float64), ta), op_view(b.astype(np.float64), tb))
                norm = np.linalg.norm(want)
                e_fm = np.linalg.norm(fm.matmul(A, B).numpy() - want) / norm
                e_t = np.linalg.norm((tA @ tB).cpu().numpy() - want) / norm
                err = f"{e_fm:.1e} / {e_t:.1e}"
        tc = f"{fmt_time(row['torch']):>9} {flops / row['torch'] / 1e12:6.1f}T" if "torch" in row else f"{'-':>17}"
        ratio = f"{row['torch'] / t_fm:5.2f}" if "torch" in row else "    -"
        print(f"{name:38} {fmt_time(t_fm):>9} {flops / t_fm / 1e12:6.1f}T  {tc}  {ratio}   {err}",
              flush=True)
        out.append(row)
    return out


def sweep(ns, device):
    """Tuning: every tile shape and split count forced (FASTMETAL_MATMUL_TILE / _SPLITS)."""
    sync = lambda: fm.synchronize(device)  # noqa: E731
    tiles = [t for t in ns.tiles.split(",") if t]
    splits = ns.splits.split(",")  # '' = the host's choice
    print(f"{'case':38} " + " ".join(f"{t + '/' + (s or 'auto'):>12}" for t in tiles for s in splits))
    for name, flops, (a, b, ta, tb) in cases(device, ns.quick, sweep=True):
        A = op_view(fm.asarray(a, device=device), ta)
        B = op_view(fm.asarray(b, device=device), tb)
        cells = []
        for tile in tiles:
            for s in splits:
                os.environ["FASTMETAL_MATMUL_TILE"] = tile
                os.environ["FASTMETAL_MATMUL_SPLITS"] = s
                try:
                    t = gpu_time(lambda: fm.matmul(A, B), sync, budget_s=ns.budget / 4, min_batches=3)
                    cells.append(f"{flops / t / 1e12:11.1f}T")
                except RuntimeError:  # a tile without this operand layout
                    cells.append(f"{'-':>12}")
        os.environ.pop("FASTMETAL_MATMUL_TILE")
        os.environ.pop("FASTMETAL_MATMUL_SPLITS")
        print(f"{name:38} " + " ".join(cells), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench matmul", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", help="cpu, cuda or metal (default: the GPU if any, and the cpu)")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds per library and case")
    ap.add_argument("--quick", action="store_true", help="skip the largest products")
    ap.add_argument("--reductions", action="store_true", help="CPU: also the reduction rows")
    ap.add_argument("--interleave", action="store_true",
                    help="CPU: time the libraries in interleaved rounds (default: in blocks)")
    ap.add_argument("--sweep", action="store_true", help="GPU tuning: every tile and split")
    ap.add_argument("--splits", default=",1,2,4,16", help="with --sweep: split counts ('' = the host's)")
    ap.add_argument("--tiles", default="128x128,64x128,64x64,32x64",
                    help="with --sweep: tiles to force")
    ns = ap.parse_args(argv)
    torch = torch_or_none()
    gpus = [d for d in ("cuda", "metal") if d in fm.devices()]
    devices = [ns.device] if ns.device else gpus + ["cpu"]
    print(machine_summary())
    for device in devices:
        if device not in fm.devices():
            print(f"\nmatmul benchmark on {device} skipped: fastmetal sees no such device "
                  f"(devices: {fm.devices()})")
            continue
        print(f"\nmatmul on {device}" + (f", CPU ISA {fm._core._cpu_isa()}, "
                                         f"{fm._core._num_threads()} threads" if device == "cpu" else ""))
        if device == "cpu":
            core = openblas_core()
            if core is not None:
                print(f"numpy: OpenBLAS {core} kernels (OPENBLAS_CORETYPE="
                      f"{os.environ.get('OPENBLAS_CORETYPE', '')!r})")
            if torch is not None:
                print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
            cpu_rows(ns, torch)
            if ns.reductions:
                reduction_rows(ns, torch)
        elif ns.sweep:
            sweep(ns, device)
        else:
            if torch is not None and device == "cuda" and torch.cuda.is_available():
                print(f"peer: torch {torch.__version__} cuBLAS on {torch.cuda.get_device_name()}, "
                      "TF32 off")
            gpu_rows(ns, device, torch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
