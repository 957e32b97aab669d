"""Tuning: the conv2d weight gradient of MNIST conv2 and the ResNet-50 3x3 layers under the
algorithms x tiles x split counts that compete for it, forced through the host's hooks
(FASTMETAL_CONV_ALGO, FASTMETAL_CONV_TILE, FASTMETAL_CONV_SPLITS), against torch on the same
GPU; the host's own choice first. Needs a CUDA build of fastmetal and torch with CUDA.

    python tools/sweeps/conv_wgrad_sweep.py
"""
import os
import numpy as np
import fastmetal as fm
from fastmetal.benchmarks.gpu import CONV_LAYERS, ConvLayer, Peers, gpu_time, fm_sync

device = "cuda"
peers = Peers(device)
fsync = fm_sync(device)
rng = np.random.default_rng(2)
F4_CELLS = [("winograd4", t, s) for t in ("64x128", "64x64") for s in ("", "1", "2", "3", "4", "6")]
plan = {
    CONV_LAYERS[0]: [("gemm", t, s) for t in ("64x128", "64x64") for s in ("", "88", "128")]
                    + [("winograd4", t, s) for t in ("64x64", "32x64") for s in ("", "8", "16", "32")],
    CONV_LAYERS[1]: F4_CELLS + [("winograd4", "64x64", s) for s in ("8", "14", "20")],
    CONV_LAYERS[2]: F4_CELLS + [("winograd4", "128x128", s) for s in ("2", "3")],
    CONV_LAYERS[3]: F4_CELLS + [("winograd4", t, s) for t in ("64x128", "64x64") for s in ("7", "10")],
}
for layer, cells in plan.items():
    L = ConvLayer(device, peers, layer, rng)
    tt = gpu_time(L.theirs["wgrad"], peers.tsync, budget_s=0.3)
    os.environ.pop("FASTMETAL_CONV_ALGO", None)
    t0 = gpu_time(L.ours["wgrad"], fsync, budget_s=0.3)
    print(f"{L.name}: torch {tt*1e3:.4f} ms; host choice {t0*1e3:.4f} ms ({tt/t0:.2f}x)", flush=True)
    res = []
    for algo, tile, sp in cells:
        os.environ["FASTMETAL_CONV_ALGO"] = algo
        os.environ["FASTMETAL_CONV_TILE"] = tile
        os.environ["FASTMETAL_CONV_SPLITS"] = sp
        t = gpu_time(L.ours["wgrad"], fsync, budget_s=0.1)
        res.append((t, algo, tile, sp or "auto"))
    for k in ("FASTMETAL_CONV_ALGO", "FASTMETAL_CONV_TILE", "FASTMETAL_CONV_SPLITS"):
        os.environ.pop(k, None)
    res.sort()
    for t, algo, tile, sp in res[:12]:
        print(f"  {algo:10s} {tile:8s} splits {sp:5s} {t*1e3:.4f} ms  {tt/t:.2f}x", flush=True)
    print("  all:", ", ".join(f"{a}/{ti}/{s}:{tt/t:.2f}" for t, a, ti, s in res), flush=True)
    del L
    fm.synchronize(device)
