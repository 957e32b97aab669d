"""Times the CPU conv2d algorithms (fastmetal._core private hooks) against PyTorch CPU
(oneDNN) in one run: forward, backward-input, backward-weight (+bias), on the MNIST and
ResNet layers the library targets (plus a few extra shapes with --extra).

Two clocks, because the machine is shared and noisy:
  wall  median of repeats (best of a few interleaved rounds, so noise hits both alike)
  cpu   process CPU time (all threads) of the fastest repeat: the work done, unaffected by
        other processes taking the cores (torch's OpenMP threads may spin, which counts).
ratio = torch time / fastmetal time, so > 1 means fastmetal is faster.

  python benchmarks/conv2d_cpu.py [--repeats 15] [--rounds 3] [--extra] [--threads N]

--threads N runs both libraries on N threads (FASTMETAL_NUM_THREADS, torch.set_num_threads);
on a loaded machine, --threads 1 is the least noisy comparison.
"""
import argparse
import datetime
import os
import platform
import time

import numpy as np

core = None  # fastmetal._core, imported after FASTMETAL_NUM_THREADS is set

LAYERS = [
    # name, N, C_in, C_out, H, k, stride, pad, groups
    ("mnist conv1 1->32 3x3 28x28 b64", 64, 1, 32, 28, 3, 1, 0, 1),
    ("mnist conv2 32->64 3x3 26x26 b64", 64, 32, 64, 26, 3, 1, 0, 1),
    ("resnet 64->64 3x3 p1 56x56 b32", 32, 64, 64, 56, 3, 1, 1, 1),
]
EXTRA = [
    ("resnet 64->64 3x3 p1 56x56 b1", 1, 64, 64, 56, 3, 1, 1, 1),
    ("resnet 64->128 3x3 s2 p1 56x56 b32", 32, 64, 128, 56, 3, 2, 1, 1),
    ("1x1 64->256 56x56 b32", 32, 64, 256, 56, 1, 1, 0, 1),
    ("depthwise 64 3x3 p1 56x56 b32", 32, 64, 64, 56, 3, 1, 1, 64),
]


def measure(fn, repeats):
    """(median wall time, least CPU time) of `repeats` calls after a warm-up."""
    from fastmetal.benchmarks._timing import time_calls  # after FASTMETAL_NUM_THREADS is set

    t = time_calls({"fn": fn}, budget_s=0.0, min_rounds=repeats, max_rounds=repeats)["fn"]
    return t.median, t.cpu


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", action="store_true",
                    help="also time strided, 1x1, depthwise, batch 1")
    ap.add_argument("--threads", type=int, default=0, help="threads for both (default: all)")
    args = ap.parse_args()
    global core
    if args.threads:
        os.environ["FASTMETAL_NUM_THREADS"] = str(args.threads)
    import fastmetal._core as core_module
    import torch

    core = core_module
    if args.threads:
        torch.set_num_threads(args.threads)

    F = torch.nn.functional
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {cpu_model()}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}")
    print(f"# torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"fastmetal isa {core._cpu_isa()}")
    rng = np.random.default_rng(0)
    rows = []
    for name, N, Ci, Co, H, k, s, p, g in LAYERS + (EXTRA if args.extra else []):
        x = rng.standard_normal((N, Ci, H, H), dtype=np.float32)
        w = rng.standard_normal((Co, Ci // g, k, k), dtype=np.float32)
        b = rng.standard_normal(Co, dtype=np.float32)
        Ho = (H + 2 * p - k) // s + 1
        gy = rng.standard_normal((N, Co, Ho, Ho), dtype=np.float32)
        xt, wt, bt, gyt = map(torch.from_numpy, (x, w, b, gy))
        flops = 2.0 * N * Co * (Ci // g) * k * k * Ho * Ho
        conv_bw = torch.ops.aten.convolution_backward
        cases = {
            "forward": (
                lambda: core._conv2d_cpu_forward(x, w, b, s, s, p, p, 1, 1, g, Ho, Ho),
                lambda: F.conv2d(xt, wt, bt, stride=s, padding=p, groups=g),
            ),
            "backward_input": (
                lambda: core._conv2d_cpu_backward_input(gy, w, H, H, s, s, p, p, 1, 1, g),
                lambda: conv_bw(gyt, xt, wt, [Co], [s, s], [p, p], [1, 1], False, [0, 0], g,
                                [True, False, False]),
            ),
            "backward_weight+bias": (
                lambda: (core._conv2d_cpu_backward_weight(gy, x, k, k, s, s, p, p, 1, 1, g),
                         core._conv2d_cpu_backward_bias(gy)),
                lambda: conv_bw(gyt, xt, wt, [Co], [s, s], [p, p], [1, 1], False, [0, 0], g,
                                [False, True, True]),
            ),
        }
        for case, (fm_fn, t_fn) in cases.items():
            fm_w, fm_c, t_w, t_c = [], [], [], []
            per = max(3, args.repeats // args.rounds)
            for _ in range(args.rounds):  # interleaved
                w1, c1 = measure(fm_fn, per)
                w2, c2 = measure(t_fn, per)
                fm_w.append(w1), fm_c.append(c1), t_w.append(w2), t_c.append(c2)
            r = (name, case, min(fm_w), min(t_w), min(fm_c), min(t_c), flops)
            rows.append(r)
            print(f"{name:36s} {case:21s} wall fm {r[2]*1e3:8.2f} ms torch {r[3]*1e3:8.2f} ms "
                  f"ratio {r[3]/r[2]:5.2f}x | cpu fm {r[4]*1e3:8.2f} ms ({flops/r[4]/1e9:4.0f} GF/s) "
                  f"torch {r[5]*1e3:8.2f} ms ratio {r[5]/r[4]:5.2f}x", flush=True)
    for name in dict.fromkeys(r[0] for r in rows):
        sel = [r for r in rows if r[0] == name]
        fw, tw = sum(r[2] for r in sel), sum(r[3] for r in sel)
        fc, tc = sum(r[4] for r in sel), sum(r[5] for r in sel)
        print(f"{name:36s} {'fwd+bwd (all three)':21s} wall fm {fw*1e3:8.2f} ms torch {tw*1e3:8.2f} ms "
              f"ratio {tw/fw:5.2f}x | cpu fm {fc*1e3:8.2f} ms torch {tc*1e3:8.2f} ms ratio {tc/fc:5.2f}x")
    for th in (1, torch.get_num_threads()):
        prev = torch.get_num_threads()
        torch.set_num_threads(th)
        a = torch.from_numpy(rng.standard_normal((2048, 2048), dtype=np.float32))
        wt_, ct_ = measure(lambda: a @ a, 7)
        torch.set_num_threads(prev)
        print(f"# peak reference: torch 2048^3 sgemm, {th} thread(s): {2*2048**3/wt_/1e9:.0f} GF/s wall, "
              f"{2*2048**3/ct_/1e9:.0f} GF per cpu-second")


if __name__ == "__main__":
    main()
