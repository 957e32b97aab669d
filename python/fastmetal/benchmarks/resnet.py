"""ResNet-20 training steps and BatchNorm2d passes, fastmetal against PyTorch.

The network of examples/resnet.py (``fastmetal.models.resnet20``: He et al.'s CIFAR-10
ResNet-20, 16/32/64 channels, 1x1-conv shortcuts) trained on CIFAR-shaped (128, 3, 32, 32)
batches with cross-entropy and SGD (momentum 0.9, weight decay 5e-4): ``--steps`` timed steps
after 3 warm-up steps, reported per step and extrapolated to one epoch of CIFAR-10's 50,000
images (391 steps of 128). PyTorch trains the same network (the same weights) with the same
optimizer on the same device and the same number of CPU threads. Each library runs in a
process of its own (this one starts both), so neither's thread pool or allocator disturbs the
other's timing. Then the BatchNorm2d forward (training mode) and backward passes alone at
ResNet-20's three shapes, the same way.

    python -m fastmetal bench resnet [--steps 20] [--rounds 1] [--batch 128] [--device cpu]
                                     [--profile] [--no-torch] [--compile]

``--compile`` adds the same step under ``fastmetal.compile`` (traced once, then replayed
without Python per op; the images and labels are its inputs, the BatchNorm running
statistics and the momentum buffers its state) and PyTorch's under ``torch.compile`` (default
mode and ``mode="reduce-overhead"``: CUDA graphs), each from the same initial weights.

``--profile`` adds where fastmetal's step goes: each kind of layer's forward, backward() (and
of it the tape's own bookkeeping), the loss and the optimizer step.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time
import warnings
from typing import Any

import numpy as np

import fastmetal as fm

from .. import nn
from ..models import resnet20
from . import _epoch
from ._timing import machine_summary

BATCH = 128
EPOCH = 50_000  # CIFAR-10's training images
POOL_BATCHES = 4
BN_SHAPES = ((BATCH, 16, 32, 32), (BATCH, 32, 16, 16), (BATCH, 64, 8, 8))


def torch_resnet20(torch: Any, in_channels: int = 3, width: int = 16,
                   num_classes: int = 10) -> Any:
    """``fastmetal.models.resnet20`` in PyTorch, module for module (its state_dict keys are
    fastmetal's), for the benchmark and the tests that follow fastmetal's training."""
    tnn, F = torch.nn, torch.nn.functional

    class Block(tnn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.shortcut = tnn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False),
                                               tnn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return F.relu(out + self.shortcut(x))

    class Net(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(width)
            planes, stages = width, []
            for i in range(3):
                blocks = []
                for j in range(3):
                    blocks.append(Block(planes, width * 2 ** i, 2 if i > 0 and j == 0 else 1))
                    planes = width * 2 ** i
                stages.append(tnn.Sequential(*blocks))
            self.layer1, self.layer2, self.layer3 = stages
            self.linear = tnn.Linear(planes, num_classes)

        def forward(self, x: Any) -> Any:
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.layer3(self.layer2(self.layer1(out)))
            return self.linear(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))

    return Net()


def torch_copy(torch: Any, model: nn.Module, device: str = "cpu") -> Any:
    """A PyTorch twin of a fastmetal ResNet-20 with its weights and buffers."""
    first = model.conv1.weight
    twin = torch_resnet20(torch, first.shape[1], first.shape[0], model.linear.weight.shape[0])
    state = {k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()}
    twin.load_state_dict(state)
    return twin.to(device)


def make_batches(seed: int, batch: int = BATCH) -> list:
    """POOL_BATCHES (images float32 (batch, 3, 32, 32), labels int64 (batch,)) pairs."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32),
             rng.integers(0, 10, batch).astype(np.int64)) for _ in range(POOL_BATCHES)]


def fastmetal_step(device: str) -> tuple:
    model = resnet20(device=device)
    loss_fn = nn.CrossEntropyLoss()
    opt = fm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)

    def step(x: Any, y: Any) -> Any:
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    return step, model, loss_fn, opt


def torch_step(torch: Any, tdev: str) -> Any:
    """PyTorch's training step of a fresh ResNet-20 with fastmetal's initial weights."""
    model = torch_copy(torch, resnet20(device="cpu"), tdev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    F = torch.nn.functional

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def torch_rows(torch: Any, device: str, steps: int, batch: int = BATCH,
               compiled: bool = False) -> list:
    """PyTorch's rows of the table, (name, seconds, samples) each: eager, and with
    ``compiled`` torch.compile and torch.compile(mode="reduce-overhead")."""
    tdev, tsync = _epoch.torch_device(torch, device)
    batches = [(torch.from_numpy(x).to(tdev), torch.from_numpy(y).to(tdev))
               for x, y in make_batches(0, batch)]
    seconds, done = _epoch.run_epoch(torch_step(torch, tdev), batches, steps * batch, tsync,
                                     batch)
    rows = [(f"PyTorch {torch.__version__}, {tdev}", seconds, done)]
    if compiled:
        rows += _epoch.torch_compiled_rows(torch, lambda: torch_step(torch, tdev), batches,
                                           steps * batch, tsync, batch, tdev)
    return rows


def fastmetal_rows(device: str, steps: int, batch: int = BATCH, compiled: bool = False) -> list:
    """fastmetal's rows of the table: (name, seconds, samples); with ``compiled`` also the
    step under fastmetal.compile (a fresh model with the same initial weights)."""
    batches = [(fm.asarray(x, device=device), fm.asarray(y, dtype="int64", device=device))
               for x, y in make_batches(0, batch)]
    seconds, done = _epoch.run_epoch(fastmetal_step(device)[0], batches, steps * batch,
                                     fm.synchronize, batch)
    rows = [(f"fastmetal, {device}", seconds, done)]
    if compiled:
        with warnings.catch_warnings():  # a compiled row that ran eagerly would mislead
            warnings.simplefilter("error", fm.CompileWarning)
            seconds, done = _epoch.run_epoch(fm.compile(fastmetal_step(device)[0]), batches,
                                             steps * batch, fm.synchronize, batch)
        rows.append((f"fastmetal.compile, {device}", seconds, done))
    return rows


def batchnorm_times(lib: str, device: str, budget_s: float = 1.0) -> dict:
    """{shape: (forward ms, backward ms)}: BatchNorm2d in training mode, medians."""
    rng = np.random.default_rng(0)
    out = {}
    for shape in BN_SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        g = rng.standard_normal(shape).astype(np.float32)
        if lib == "torch":
            torch = _epoch.torch_or_none()
            tdev, sync = _epoch.torch_device(torch, device)
            layer = torch.nn.BatchNorm2d(shape[1]).to(tdev)
            xt = torch.from_numpy(x).to(tdev).requires_grad_()
            gt = torch.from_numpy(g).to(tdev)

            def forward(layer: Any = layer, xt: Any = xt) -> Any:
                return layer(xt)

            def backward(y: Any, gt: Any = gt, xt: Any = xt) -> None:
                torch.autograd.grad(y, [xt, *layer.parameters()], gt)
        else:
            sync = fm.synchronize
            layer = nn.BatchNorm2d(shape[1], device=device)
            xt = fm.asarray(x, device=device).requires_grad_()
            gt = fm.asarray(g, device=device)

            def forward(layer: Any = layer, xt: Any = xt) -> Any:
                return layer(xt)

            def backward(y: Any, gt: Any = gt, xt: Any = xt) -> None:
                fm.autograd.grad(y, [xt, *layer.parameters()], gt)
        fwd, bwd = [], []
        start = time.perf_counter()
        rounds = 0
        while rounds < 5 or (time.perf_counter() - start < budget_s and rounds < 200):
            t0 = time.perf_counter()
            y = forward()
            sync()
            t1 = time.perf_counter()
            backward(y)
            sync()
            t2 = time.perf_counter()
            if rounds:  # the first is warm-up
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
            rounds += 1
        out[shape] = (1e3 * statistics.median(fwd), 1e3 * statistics.median(bwd))
    return out


def profile_fastmetal(device: str, repeats: int = 5) -> dict:
    """Median ms per step of the forward of each kind of layer (summed over the network),
    the loss, backward() (and the tape's bookkeeping in it) and the optimizer step."""
    step, model, loss_fn, opt = fastmetal_step(device)
    batches = [(fm.asarray(x, device=device), fm.asarray(y, dtype="int64", device=device))
               for x, y in make_batches(0)]
    sync = fm.synchronize
    leaves = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.BatchNorm2d,
                                                           nn.Linear))]
    originals = {}
    per_step: dict = collections.defaultdict(float)

    def timed(module: Any, name: str) -> Any:
        forward = module.forward

        def wrapper(*args: Any) -> Any:
            sync()
            t0 = time.perf_counter()
            y = forward(*args)
            sync()
            per_step[f"{name} fwd"] += time.perf_counter() - t0
            return y
        return wrapper
    for m in leaves:
        originals[m] = m.forward
        m.forward = timed(m, type(m).__name__)
    rows: dict = collections.defaultdict(list)
    try:
        for r in range(repeats + 2):
            per_step.clear()
            x, y = batches[r % len(batches)]
            with _epoch.tape_profile() as profile:
                sync()
                t0 = time.perf_counter()
                out = model(x)
                sync()
                forward_total = time.perf_counter() - t0
                t0 = time.perf_counter()
                loss = loss_fn(out, y)
                sync()
                per_step["loss"] = time.perf_counter() - t0
                opt.zero_grad()
                t0 = time.perf_counter()
                loss.backward()
                sync()
                per_step["backward"] = time.perf_counter() - t0
            layers = sum(v for k, v in per_step.items() if k.endswith(" fwd"))
            per_step["rest of the forward (ReLU, adds, pooling)"] = forward_total - layers
            (per_step["autograd bookkeeping: recording"],
             per_step["autograd bookkeeping: graph walk"]) = _epoch.tape_seconds(profile)
            t0 = time.perf_counter()
            opt.step()
            sync()
            per_step["optimizer step"] = time.perf_counter() - t0
            if r >= 2:
                for k, v in per_step.items():
                    rows[k].append(v)
    finally:
        for m, f in originals.items():
            m.forward = f
    return {k: 1e3 * statistics.median(v) for k, v in rows.items()}


def worker(ns: argparse.Namespace) -> None:
    """One library's side, in its own process: prints its results as JSON."""
    if ns.worker == "torch":
        torch = _epoch.torch_or_none()
        torch.set_num_threads(ns.threads)
        rows = (torch_rows(torch, ns.device, ns.steps, ns.batch, ns.compile)
                if ns.part == "step" else None)
    else:
        rows = (fastmetal_rows(ns.device, ns.steps, ns.batch, ns.compile)
                if ns.part == "step" else None)
    if ns.part == "batchnorm":
        rows = [[list(k), *v] for k, v in batchnorm_times(ns.worker, ns.device).items()]
    _epoch.worker_reply(rows)


def main(argv: Any = None) -> Any:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench resnet", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed training steps (default 20)")
    ap.add_argument("--device", default=None, help="fastmetal device (default: the default "
                    "device); PyTorch runs on the matching one (cpu, cuda, or mps for metal)")
    ap.add_argument("--rounds", type=int, default=1, help="run each library's step process "
                    "this many times, alternating, and report the median (noisy machines)")
    ap.add_argument("--profile", action="store_true", help="fastmetal's time per kind of layer")
    ap.add_argument("--no-torch", action="store_true", help="fastmetal only")
    ap.add_argument("--batch", type=int, default=BATCH,
                    help=f"images per training step (default {BATCH})")
    ap.add_argument("--compile", action="store_true",
                    help="also time fastmetal.compile(step), and PyTorch's torch.compile(step) "
                         "and torch.compile(step, mode='reduce-overhead') (CUDA graphs)")
    _epoch.add_worker_arguments(ap, ("step", "batchnorm"))
    ns = ap.parse_args(argv)
    if ns.steps < 1:
        ap.error(f"--steps: expected at least 1, got {ns.steps}")
    if ns.batch < 1:
        ap.error(f"--batch: expected at least 1, got {ns.batch}")
    if ns.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {ns.rounds}")
    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")
    ns.device = device
    if ns.worker:
        return worker(ns)
    torch = None if ns.no_torch else _epoch.torch_or_none()
    if torch is not None:  # as the workers (for the machine line below)
        torch.set_num_threads(fm._core._num_threads())
    print(f"ResNet-20 training step, batch {ns.batch} of (3, 32, 32), cross-entropy, SGD momentum "
          f"0.9 + weight decay 5e-4; {ns.steps} steps after 3 warm-up, each library in its "
          "own process")
    print(f"machine: {machine_summary()}\n")
    argv_common = ["--steps", str(ns.steps), "--device", device]
    argv_step = argv_common + ["--batch", str(ns.batch)] + (["--compile"] if ns.compile else [])
    libraries = ("fastmetal",) + (("torch",) if torch is not None else ())
    runs: dict = {}  # row name -> that row of each round (a worker answers several rows)
    for _ in range(ns.rounds):  # alternating, so a change in the machine's load hits both
        for lib in libraries:
            for row in _epoch.in_process("resnet", lib, "step", argv_step):
                runs.setdefault(row[0], []).append(row)
    results = [sorted(rows, key=lambda r: r[1])[(len(rows) - 1) // 2] for rows in runs.values()]
    if ns.rounds > 1:
        print(f"(the median of {ns.rounds} alternating runs of each library's process)")
    ours = results[0][1] / results[0][2]
    print(f"{'':34} {'ms/step':>9} {'s/epoch (50k)':>14} {'images/s':>9} "
          f"{'fastmetal speed-up':>19}")
    for name, seconds, done in results:
        per = seconds / done
        print(f"{name:34} {1e3 * ns.batch * per:9.1f} {EPOCH * per:14.1f} {1 / per:9,.0f} "
              f"{per / ours:18.2f}x")

    print(f"\nBatchNorm2d (training mode), median ms of a forward and of a backward (input, "
          f"weight and bias gradients):")
    bn = {"fastmetal": _epoch.in_process("resnet", "fastmetal", "batchnorm", argv_common)}
    if torch is not None:
        bn["torch"] = _epoch.in_process("resnet", "torch", "batchnorm", argv_common)
    print(f"  {'shape':20} {'fastmetal fwd':>14} {'bwd':>8}" +
          (f" {'PyTorch fwd':>12} {'bwd':>8} {'speed-up fwd':>13} {'bwd':>6}" if torch else ""))
    for i, (shape, f_fwd, f_bwd) in enumerate(bn["fastmetal"]):
        line = f"  {str(tuple(shape)):20} {f_fwd:14.3f} {f_bwd:8.3f}"
        if torch is not None:
            _, t_fwd, t_bwd = bn["torch"][i]
            line += f" {t_fwd:12.3f} {t_bwd:8.3f} {t_fwd / f_fwd:12.2f}x {t_bwd / f_bwd:5.2f}x"
        print(line)

    if ns.profile:
        _epoch.print_step_profile(profile_fastmetal(device), f"fastmetal step on {device}, "
                                  "by part (median of 5 steps", 42)
    return results


if __name__ == "__main__":
    main()
