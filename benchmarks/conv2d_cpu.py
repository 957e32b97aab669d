"""Times the CPU conv2d algorithms (fastmetal._core private hooks) against PyTorch CPU
(oneDNN) on MNIST and ResNet layers: forward, backward-input, backward-weight (+bias),
medians of repeats measured in one run, printed as ratios (torch time / fastmetal time,
so > 1 means fastmetal is faster)."""
import argparse
import platform
import statistics
import time

import numpy as np

import fastmetal._core as core

LAYERS = [
    # name, N, C_in, C_out, H, k, pad
    ("mnist conv1 1->32 3x3 28x28 b64", 64, 1, 32, 28, 3, 0),
    ("mnist conv2 32->64 3x3 26x26 b64", 64, 32, 64, 26, 3, 0),
    ("resnet 64->64 3x3 p1 56x56 b32", 32, 64, 64, 56, 3, 1),
]


def median_time(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    import torch

    F = torch.nn.functional
    threads = core._cpu_threads() if hasattr(core, "_cpu_threads") else None
    torch.set_num_threads(torch.get_num_threads())
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__} "
          f"threads {torch.get_num_threads()}, fastmetal isa {core._cpu_isa()}")
    rng = np.random.default_rng(0)
    rows = []
    for name, N, Ci, Co, H, k, p in LAYERS:
        x = rng.standard_normal((N, Ci, H, H), dtype=np.float32)
        w = rng.standard_normal((Co, Ci, k, k), dtype=np.float32)
        b = rng.standard_normal(Co, dtype=np.float32)
        Ho = H + 2 * p - k + 1
        gy = rng.standard_normal((N, Co, Ho, Ho), dtype=np.float32)
        xt, wt, bt, gyt = map(torch.from_numpy, (x, w, b, gy))
        flops = 2.0 * N * Co * Ci * k * k * Ho * Ho
        cases = {
            "forward": (
                lambda: core._conv2d_cpu_forward(x, w, b, 1, 1, p, p, 1, 1, 1, Ho, Ho),
                lambda: F.conv2d(xt, wt, bt, padding=p),
            ),
            "backward_input": (
                lambda: core._conv2d_cpu_backward_input(gy, w, H, H, 1, 1, p, p, 1, 1, 1),
                lambda: torch.ops.aten.convolution_backward(
                    gyt, xt, wt, [Co], [1, 1], [p, p], [1, 1], False, [0, 0], 1,
                    [True, False, False]),
            ),
            "backward_weight+bias": (
                lambda: (core._conv2d_cpu_backward_weight(gy, x, k, k, 1, 1, p, p, 1, 1, 1),
                         core._conv2d_cpu_backward_bias(gy)),
                lambda: torch.ops.aten.convolution_backward(
                    gyt, xt, wt, [Co], [1, 1], [p, p], [1, 1], False, [0, 0], 1,
                    [False, True, True]),
            ),
        }
        for case, (fm_fn, t_fn) in cases.items():
            # Interleave the two so that machine noise hits both alike.
            tf, tt = [], []
            for _ in range(3):
                tf.append(median_time(fm_fn, args.repeats // 3 + 1))
                tt.append(median_time(t_fn, args.repeats // 3 + 1))
            tf, tt = min(tf), min(tt)
            rows.append((name, case, tf, tt, flops))
            print(f"{name:36s} {case:22s} fastmetal {tf*1e3:8.2f} ms ({flops/tf/1e9:5.0f} GF/s)  "
                  f"torch {tt*1e3:8.2f} ms ({flops/tt/1e9:5.0f} GF/s)  ratio {tt/tf:5.2f}x",
                  flush=True)
    # Forward + backward (all three) per layer.
    for name in dict.fromkeys(r[0] for r in rows):
        tf = sum(r[2] for r in rows if r[0] == name)
        tt = sum(r[3] for r in rows if r[0] == name)
        print(f"{name:36s} {'fwd+bwd total':22s} fastmetal {tf*1e3:8.2f} ms  torch {tt*1e3:8.2f} ms"
              f"  ratio {tt/tf:5.2f}x")
    a = np.random.default_rng(1).standard_normal((2048, 2048), dtype=np.float32)
    at = torch.from_numpy(a)
    tm = median_time(lambda: at @ at, 7)
    print(f"reference: torch 2048^3 matmul {2*2048**3/tm/1e9:.0f} GF/s")


if __name__ == "__main__":
    main()
