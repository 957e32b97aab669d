"""GPU benchmark: fastmetal's kernels on the GPU device against PyTorch (and CuPy where
installed) on the same device, in one process.

    python -m fastmetal bench gpu [--quick] [--only PART] [--json PATH]
    python -m fastmetal bench gpu --conv-sweep     (tuning: every conv2d GEMM tile, forced)
    python benchmarks/gpu.py ...

Runs on whichever GPU device fastmetal has (cuda, else metal) and exits with a message when
there is none. The elementwise rows are measured against the device-to-device copy bandwidth
taken in the same run (bytes read + bytes written, through PyTorch's copy, else fastmetal's
own), so "% copy" is comparable across machines. Each time is the median over batches of
calls, each batch closed by a device synchronisation, after warm-up calls: device work is
asynchronous and only a synchronisation tells when it is done.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import numpy as np

import fastmetal as fm

from ._timing import fmt_ratio, machine_summary, torch_or_none

GPU_DEVICES = ("cuda", "metal")
TORCH_DEVICE = {"cuda": "cuda", "metal": "mps"}
N_ELEMENTWISE = 2**26
CONV_LAYERS = [  # (name, N, C_in, C_out, H, W, kernel, padding)
    ("b64 32->64 3x3 26x26 (MNIST conv2)", 64, 32, 64, 26, 26, 3, 0),
    ("b32 64->64 3x3 56x56 pad 1 (ResNet-50 layer1 3x3)", 32, 64, 64, 56, 56, 3, 1),
    ("b32 256->256 3x3 14x14 pad 1 (ResNet-50 layer3 3x3)", 32, 256, 256, 14, 14, 3, 1),
    ("b32 128->128 3x3 28x28 pad 1 (ResNet-50 layer2 3x3)", 32, 128, 128, 28, 28, 3, 1),
    ("b32 256->64 1x1 56x56 (ResNet-50 layer1 reduce)", 32, 256, 64, 56, 56, 1, 0),
    ("b32 256->1024 1x1 14x14 (ResNet-50 layer3 expand)", 32, 256, 1024, 14, 14, 1, 0),
]
CONV_PASSES = ("fwd", "dgrad", "wgrad")


def gpu_time(fn: Callable[[], object], sync: Callable[[], None], budget_s: float = 0.25,
             min_batches: int = 7) -> float:
    """Median seconds per call of fn, timed in batches closed by sync()."""
    fn(); sync()  # warm-up: module load, allocation caches, autotuning
    t0 = time.perf_counter(); fn(); sync()
    once = max(time.perf_counter() - t0, 1e-6)
    per_batch = max(1, min(50, int(0.02 / once)))
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < min_batches or (time.perf_counter() < deadline and len(times) < 200):
        t0 = time.perf_counter()
        for _ in range(per_batch):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / per_batch)
    return statistics.median(times)


class Peers:
    """PyTorch and CuPy on fastmetal's device, where they are installed and see it."""

    def __init__(self, device: str):
        self.torch = torch_or_none()
        self.tdev = TORCH_DEVICE[device]
        if self.torch is not None:
            ok = (self.torch.cuda.is_available() if self.tdev == "cuda"
                  else self.torch.backends.mps.is_available())
            if not ok:
                self.torch = None
        if self.torch is not None:  # exact FP32 for conv2d, as fastmetal computes it
            self.torch.backends.cudnn.allow_tf32 = False
            self.torch.backends.cuda.matmul.allow_tf32 = False
        self.cupy = None
        if device == "cuda":
            try:
                import cupy  # noqa: PLC0415
                cupy.zeros(1)
                self.cupy = cupy
            except Exception:  # noqa: BLE001 - missing, or no usable CUDA for it
                self.cupy = None

    def tsync(self):
        if self.tdev == "cuda":
            self.torch.cuda.synchronize()
        else:
            self.torch.mps.synchronize()

    def to_torch(self, a: np.ndarray):
        return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.tdev)


def fm_sync(device):
    return lambda: fm.synchronize(device)


def cupy_time(cp, key, xh, yh, bx, brow):
    """CuPy's time for one elementwise case (None where CuPy has no such op): its own
    kernels (cupyx's erf for gelu, several launches), as a user would write them."""
    cx, cy = cp.asarray(xh), cp.asarray(yh)
    cb, cr = cp.asarray(bx), cp.asarray(brow)
    fns = {"copy": lambda: cx.copy(), "sigmoid": lambda: 1 / (1 + cp.exp(-cx)),
           "exp": lambda: cp.exp(cx), "relu": lambda: cp.maximum(cx, 0), "add": lambda: cx + cy, "mul": lambda: cx * cy,
           "badd": lambda: cb + cr}
    try:
        from cupyx.scipy.special import erf  # noqa: PLC0415
        fns["gelu"] = lambda: 0.5 * cx * (1 + erf(cx * 0.7071067811865476))
        fns["gelu"]()
    except Exception:  # noqa: BLE001 - no cupyx.scipy, or no erf for this dtype
        fns.pop("gelu", None)
    if key not in fns:
        return None
    return gpu_time(fns[key], cp.cuda.Stream.null.synchronize)


def elementwise_rows(device, peers, n, rows, dtypes):
    rng = np.random.default_rng(0)
    fsync = fm_sync(device)
    for dt in dtypes:
        itemsize = np.dtype(dt).itemsize
        xh = rng.standard_normal(n).astype(dt)
        yh = rng.standard_normal(n).astype(dt)
        x, y = fm.asarray(xh, device=device), fm.asarray(yh, device=device)
        copy_s = None
        if peers.torch is not None:
            tx, ty = peers.to_torch(xh), peers.to_torch(yh)
            dst = peers.torch.empty_like(tx)
            copy_s = gpu_time(lambda: dst.copy_(tx), peers.tsync)
            copy_src = "torch copy_"
        else:
            copy_s = gpu_time(lambda: x.copy(), fsync)
            copy_src = "fastmetal copy"
        copy_bw = 2 * n * itemsize / copy_s
        rows.append(dict(workload=f"device-to-device copy, 2^{n.bit_length() - 1} {dt}",
                         fastmetal_ms=None, peer_ms=copy_s * 1e3, bandwidth_TBps=copy_bw / 1e12,
                         note=f"reference bandwidth ({copy_src})"))
        m = int(np.sqrt(n))
        bx = rng.standard_normal((m, m)).astype(dt)
        brow = rng.standard_normal((1, m)).astype(dt)
        fbx, fbrow = fm.asarray(bx, device=device), fm.asarray(brow, device=device)
        cases = [("copy", 1, lambda: fm.copy(x), "copy"),
                 ("sigmoid", 1, lambda: fm.sigmoid(x), "sigmoid"),
                 ("exp", 1, lambda: fm.exp(x), "exp"),
                 ("gelu", 1, lambda: fm.gelu(x), "gelu"),
                 ("relu", 1, lambda: fm.relu(x), "relu"),
                 ("add", 2, lambda: fm.add(x, y), "add"),
                 ("multiply", 2, lambda: fm.multiply(x, y), "mul"),
                 (f"add, ({m}, {m}) + (1, {m})", 2, lambda: fm.add(fbx, fbrow), "badd")]
        for name, operands, ours, key in cases:
            t_ours = gpu_time(ours, fsync)
            bytes_moved = (operands + 1) * n * itemsize if key != "badd" else (2 * m * m + m) * itemsize
            t_torch = t_cupy = None
            if peers.torch is not None:
                F = peers.torch.nn.functional
                tb, tr = peers.to_torch(bx), peers.to_torch(brow)
                tfn = {"copy": lambda: tx.clone(), "sigmoid": lambda: peers.torch.sigmoid(tx), "exp": lambda: peers.torch.exp(tx),
                       "gelu": lambda: F.gelu(tx), "relu": lambda: peers.torch.relu(tx),
                       "add": lambda: tx + ty, "mul": lambda: tx * ty, "badd": lambda: tb + tr}[key]
                t_torch = gpu_time(tfn, peers.tsync)
            if peers.cupy is not None:
                t_cupy = cupy_time(peers.cupy, key, xh, yh, bx, brow)
            bw = bytes_moved / t_ours
            size = f"2^{n.bit_length() - 1}" if key != "badd" else ""
            rows.append(dict(workload=f"{name}{', ' + size if size else ''} {dt}",
                             fastmetal_ms=t_ours * 1e3,
                             peer_ms=None if t_torch is None else t_torch * 1e3,
                             cupy_ms=None if t_cupy is None else t_cupy * 1e3,
                             bandwidth_TBps=bw / 1e12, pct_copy=100 * bw / copy_bw))
        del x, y, fbx, fbrow
        fm.synchronize(device)


class ConvLayer:
    """One layer's inputs on fastmetal's device and (where available) PyTorch's, and a
    callable per pass for each."""

    def __init__(self, device, peers, layer, rng):
        name, N, ci, co, H, W, k, pad = layer
        self.name, self.pad = name, pad
        xh = rng.standard_normal((N, ci, H, W)).astype(np.float32)
        wh = (rng.standard_normal((co, ci, k, k)) / np.sqrt(k * k * ci)).astype(np.float32)
        bh = rng.standard_normal(co).astype(np.float32)
        ho, wo = H + 2 * pad - k + 1, W + 2 * pad - k + 1
        goh = rng.standard_normal((N, co, ho, wo)).astype(np.float32)
        self.flops = 2.0 * N * co * ho * wo * ci * k * k  # per pass
        x, w, b, go = (fm.asarray(a, device=device) for a in (xh, wh, bh, goh))
        self.ours = {
            "fwd": lambda: fm.conv2d(x, w, b, padding=pad),
            "dgrad": lambda: fm.conv2d_backward(go, x, w, padding=pad, needs=("input",)),
            "wgrad": lambda: fm.conv2d_backward(go, x, w, padding=pad, needs=("weight",)),
            "fwd+bwd": lambda: (fm.conv2d(x, w, b, padding=pad),
                                fm.conv2d_backward(go, x, w, padding=pad)),
        }
        self.theirs = {}
        if peers.torch is not None:
            torch = peers.torch
            tx, tw, tb, tgo = (peers.to_torch(a) for a in (xh, wh, bh, goh))
            F = torch.nn.functional
            bwd = torch.ops.aten.convolution_backward

            def grads(mask):
                return bwd(tgo, tx, tw, [co], [1, 1], [pad, pad], [1, 1], False, [0, 0], 1, mask)
            self.theirs = {
                "fwd": lambda: F.conv2d(tx, tw, tb, padding=pad),
                "dgrad": lambda: grads([True, False, False]),
                "wgrad": lambda: grads([False, True, False]),
                "fwd+bwd": lambda: (F.conv2d(tx, tw, tb, padding=pad),
                                    grads([True, True, True])),
            }


def autotuned_time(peers, fn):
    """Seconds per call of a torch conv pass with cudnn.benchmark on (cuDNN times its
    algorithms on the first call of a shape and keeps the fastest), or None without torch
    on cuda. The table's torch column is cuDNN's default heuristic choice, which differs
    from run to run on some shapes; this is the best cuDNN has."""
    if fn is None or peers.tdev != "cuda":
        return None
    cudnn = peers.torch.backends.cudnn
    saved = cudnn.benchmark
    cudnn.benchmark = True
    try:
        return gpu_time(fn, peers.tsync)
    finally:
        cudnn.benchmark = saved


def conv_note(ours_s, tuned_s, forced):
    """A conv row's note: cuDNN's autotuned time (and torch / ours for it), the forced
    algorithms' times; None when there is neither."""
    notes = []
    if tuned_s is not None:
        notes.append(f"cuDNN autotuned {tuned_s * 1e3:.3f} ms ({tuned_s / ours_s:.2f}x)")
    if forced:
        notes.append("forced: " + ", ".join(forced))
    return "; ".join(notes) or None


def conv_rows(device, peers, rows, layers):
    """One row per layer and pass with the host's choice of algorithm; on 3x3 layers (where
    Winograd applies) the note also gives both algorithms forced (FASTMETAL_CONV_ALGO), the
    measurement behind the host's choice."""
    import os  # noqa: PLC0415
    rng = np.random.default_rng(1)
    fsync = fm_sync(device)
    saved = os.environ.get("FASTMETAL_CONV_ALGO")
    for layer in layers:
        L = ConvLayer(device, peers, layer, rng)
        for part in (*CONV_PASSES, "fwd+bwd"):
            flops = L.flops * (3 if part == "fwd+bwd" else 1)
            t = gpu_time(L.ours[part], fsync)
            tt = gpu_time(L.theirs[part], peers.tsync) if part in L.theirs else None
            tuned = autotuned_time(peers, L.theirs.get(part))
            forced = []
            if layer[6] == 3 and part in CONV_PASSES:
                try:
                    for algo in ("gemm", "winograd", "winograd4"):
                        os.environ["FASTMETAL_CONV_ALGO"] = algo
                        forced.append(f"{algo} {gpu_time(L.ours[part], fsync) * 1e3:.3f} ms")
                finally:
                    if saved is None:
                        os.environ.pop("FASTMETAL_CONV_ALGO", None)
                    else:
                        os.environ["FASTMETAL_CONV_ALGO"] = saved
            rows.append(dict(workload=f"conv2d {part}, {L.name}", fastmetal_ms=t * 1e3,
                             peer_ms=None if tt is None else tt * 1e3, TFLOPs=flops / t / 1e12,
                             peer_TFLOPs=None if tt is None else flops / tt / 1e12,
                             note=conv_note(t, tuned, forced)))
        del L
        fm.synchronize(device)


def conv_sweep(device, peers, layers, tiles=("128x128", "64x128", "64x64", "32x64"),
               splits=()):
    """Tuning: every GEMM tile (and split count of the gradients) on every layer and pass,
    through the host's FASTMETAL_CONV_TILE / FASTMETAL_CONV_SPLITS hooks."""
    import os  # noqa: PLC0415
    rng = np.random.default_rng(2)
    fsync = fm_sync(device)
    print("| layer | pass | " + " | ".join(["auto", *tiles]) + " | torch |")
    print("| --- | --- |" + " --- |" * (len(tiles) + 2))
    for layer in layers:
        L = ConvLayer(device, peers, layer, rng)
        for part in CONV_PASSES:
            cells = []
            for tile in ("", *tiles):
                os.environ["FASTMETAL_CONV_TILE"] = tile
                cells.append(f"{L.flops / gpu_time(L.ours[part], fsync, budget_s=0.1) / 1e12:.1f}")
            os.environ["FASTMETAL_CONV_TILE"] = ""
            tt = gpu_time(L.theirs[part], peers.tsync, budget_s=0.1) if part in L.theirs else None
            cells.append("" if tt is None else f"{L.flops / tt / 1e12:.1f}")
            print(f"| {L.name} | {part} | " + " | ".join(cells) + " |", flush=True)
        # Split counts: the weight gradient's (every layer) and the input gradient's (where
        # it takes the implicit GEMM: the 1x1 layers).
        for part in ("wgrad", "dgrad") if splits else ():
            if part == "dgrad" and layer[6] != 1:
                continue
            cells = []
            for tile in ("", "128x128", "64x128", "64x64"):
                for sp in splits:
                    os.environ["FASTMETAL_CONV_TILE"] = tile
                    os.environ["FASTMETAL_CONV_SPLITS"] = sp
                    t = gpu_time(L.ours[part], fsync, budget_s=0.1)
                    cells.append(f"{tile or 'auto'}/{sp or 'auto'}: {L.flops / t / 1e12:.1f}")
            os.environ["FASTMETAL_CONV_TILE"] = os.environ["FASTMETAL_CONV_SPLITS"] = ""
            print(f"  {part} splits, {L.name}: " + ", ".join(cells), flush=True)
        del L
        fm.synchronize(device)


def fourier_row(device, peers, rows):
    t = np.linspace(-20, 20, 100_000).astype(np.float32)
    k = np.arange(1000)
    a = (1.0 / (1 + k)).astype(np.float32)
    b = (0.5 / (1 + k)).astype(np.float32)
    tt = t.astype(np.float64)
    kk = np.arange(1, 1000, dtype=np.float64)
    ref = a[0] / 2 + np.cos(np.outer(tt, kk)) @ a[1:].astype(np.float64) \
        + np.sin(np.outer(tt, kk)) @ b[1:].astype(np.float64)
    ft, fa, fb = (fm.asarray(v, device=device) for v in (t, a, b))
    t_ours = gpu_time(lambda: fm.fourier_series(ft, fa, fb), fm_sync(device))
    err = float(np.max(np.abs(np.asarray(fm.fourier_series(ft, fa, fb).numpy(), np.float64) - ref)))
    t_peer = peer_err = None
    if peers.torch is not None:
        torch = peers.torch
        tt_, ta, tb_ = peers.to_torch(t), peers.to_torch(a), peers.to_torch(b)
        kt = torch.arange(1, 1000, device=peers.tdev, dtype=torch.float32)

        def tfs():
            ph = tt_[:, None] * kt[None, :]
            return ta[0] / 2 + torch.cos(ph) @ ta[1:] + torch.sin(ph) @ tb_[1:]
        t_peer = gpu_time(tfs, peers.tsync)
        peer_err = float(np.max(np.abs(tfs().cpu().numpy().astype(np.float64) - ref)))
    rows.append(dict(workload="fourier_series K=1000 on 10^5", fastmetal_ms=t_ours * 1e3,
                     peer_ms=None if t_peer is None else t_peer * 1e3,
                     note=f"max error {err:.1e}" + ("" if peer_err is None else f" (torch {peer_err:.1e})")))


def print_table(rows):
    print("| workload | fastmetal | torch | ratio | CuPy | notes |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ours = "" if r.get("fastmetal_ms") is None else f"{r['fastmetal_ms']:.3f} ms"
        peer = "" if r.get("peer_ms") is None else f"{r['peer_ms']:.3f} ms"
        ratio = ("" if r.get("fastmetal_ms") is None or r.get("peer_ms") is None
                 else fmt_ratio(r["peer_ms"], r["fastmetal_ms"]))
        cupy = "" if r.get("cupy_ms") is None else f"{r['cupy_ms']:.3f} ms"
        notes = []
        if r.get("bandwidth_TBps") is not None:
            notes.append(f"{r['bandwidth_TBps']:.2f} TB/s")
        if r.get("pct_copy") is not None:
            notes.append(f"{r['pct_copy']:.0f}% of copy")
        if r.get("TFLOPs") is not None:
            notes.append(f"{r['TFLOPs']:.1f} TFLOP/s"
                         + ("" if r.get("peer_TFLOPs") is None else f" (torch {r['peer_TFLOPs']:.1f})"))
        if r.get("note"):
            notes.append(r["note"])
        print(f"| {r['workload']} | {ours} | {peer} | {ratio} | {cupy} | {'; '.join(notes)} |")


def device_name(device, peers):
    if peers.torch is not None and peers.tdev == "cuda":
        return peers.torch.cuda.get_device_name(0)
    return device


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2^22 elements, one conv layer")
    ap.add_argument("--only", choices=("elementwise", "conv2d", "fourier"), action="append",
                    help="run only these parts (repeatable)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--conv-sweep", action="store_true",
                    help="tuning: TFLOP/s of every conv2d GEMM tile and split count, then exit")
    ap.add_argument("--conv-splits", default="",
                    help="with --conv-sweep: gradient split counts to try, e.g. 1,2,4,8")
    ns = ap.parse_args(argv)
    device = next((d for d in GPU_DEVICES if d in fm.devices()), None)
    if device is None:
        print(f"GPU benchmark skipped: fastmetal sees no GPU device (devices: {fm.devices()})")
        return 0
    peers = Peers(device)
    print(f"fastmetal GPU benchmark on {device}: {device_name(device, peers)}; host "
          f"{machine_summary()}")
    print(f"peers: torch {'(' + peers.tdev + ')' if peers.torch is not None else 'not available'}, "
          f"CuPy {'yes' if peers.cupy is not None else 'not available'}\n")
    if ns.conv_sweep:
        conv_sweep(device, peers, CONV_LAYERS,
                   splits=tuple(s for s in ns.conv_splits.split(",") if s))
        return 0
    parts = ns.only or ["elementwise", "conv2d", "fourier"]
    rows: list[dict] = []
    if "elementwise" in parts:
        elementwise_rows(device, peers, 2**22 if ns.quick else N_ELEMENTWISE, rows,
                         ("float32", "float16"))
    if "conv2d" in parts:
        conv_rows(device, peers, rows, CONV_LAYERS[:1] if ns.quick else CONV_LAYERS)
    if "fourier" in parts:
        fourier_row(device, peers, rows)
    print_table(rows)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(dict(device=device, name=device_name(device, peers), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
