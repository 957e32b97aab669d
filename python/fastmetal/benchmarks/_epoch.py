"""What the training benchmarks (bench mnist, vae, resnet) share: their command line, one
timed epoch, each library timed in a process of its own, PyTorch's matching device, the
results table and the tape's own time."""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import fastmetal as fm
from fastmetal.autograd import tape as _autograd

from ._timing import torch_or_none


def parser(name: str, doc: str | None, data_default: str,
           profile_help: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m fastmetal bench {name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=60_000,
                    help="images in the timed epoch (default 60,000; less for a quick run)")
    ap.add_argument("--device", default=None, help="fastmetal device (default: the default "
                    "device); PyTorch runs on the matching one (cpu, cuda, or mps for metal)")
    ap.add_argument("--data", default=None, help="directory of the MNIST IDX files "
                    f"(default: {data_default})")
    ap.add_argument("--profile", action="store_true", help=profile_help)
    ap.add_argument("--no-torch", action="store_true", help="fastmetal only")
    ap.add_argument("--compile", action="store_true",
                    help="also time fastmetal.compile(step), and PyTorch's torch.compile(step) "
                         "and torch.compile(step, mode='reduce-overhead') (CUDA graphs)")
    add_worker_arguments(ap, ("epoch",))
    return ap


_REPLY = "fastmetal-bench-reply: "  # the line a worker process answers on


def add_worker_arguments(ap: argparse.ArgumentParser, parts: tuple) -> None:
    """The hidden options of a worker process (one library's side of a benchmark)."""
    ap.add_argument("--worker", choices=("fastmetal", "torch"), default=None,
                    help=argparse.SUPPRESS)
    ap.add_argument("--part", choices=parts, default=parts[0], help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)


def worker_reply(rows: Any) -> None:
    """A worker's results, one JSON line on stdout for `in_process` to read."""
    print(_REPLY + json.dumps(rows), flush=True)


def in_process(name: str, library: str, part: str, argv: list) -> list:
    """Runs one library's side of `bench name` in a fresh Python process (its own thread
    pool, allocator and caches: neither library's warm state or threads disturb the other's
    timing) and returns what it replied. PyTorch gets fastmetal's CPU thread count."""
    cmd = [sys.executable, "-m", f"fastmetal.benchmarks.{name}", "--worker", library,
           "--part", part, "--threads", str(fm._core._num_threads()), *argv]
    r = subprocess.run(cmd, capture_output=True, text=True)
    replies = [line for line in r.stdout.splitlines() if line.startswith(_REPLY)]
    if r.returncode != 0 or not replies:
        raise RuntimeError(f"[fastmetal bench {name}] expected the {library} worker to reply, "
                           f"got exit status {r.returncode}:\n{r.stderr[-2000:]}")
    return [tuple(row) if isinstance(row, list) else row
            for row in json.loads(replies[-1][len(_REPLY):])]


def epoch_worker(ns: argparse.Namespace, device: str, torch: Any, make_batches: Callable,
                 fastmetal_rows: Callable, torch_rows: Callable) -> None:
    """A worker's side of `bench mnist` / `bench vae` (--worker): one library's epoch rows."""
    batches = make_batches(ns.data, 0)
    worker_reply(fastmetal_rows(device, batches, ns.samples, ns.compile)
                 if ns.worker == "fastmetal" else
                 torch_rows(torch, device, batches, ns.samples, ns.compile))


def epochs_in_processes(name: str, ns: argparse.Namespace, torch: Any) -> list:
    """fastmetal's epoch, then PyTorch's where it is installed, each in a worker process."""
    argv_worker = forwarded(ns)
    results = in_process(name, "fastmetal", "epoch", argv_worker)
    if torch is not None:
        results += in_process(name, "torch", "epoch", argv_worker)
    return results


def forwarded(ns: argparse.Namespace) -> list:
    """The parsed options of `parser` as a worker's command line."""
    argv = ["--samples", str(ns.samples), "--device", ns.device]
    argv += ["--compile"] if getattr(ns, "compile", False) else []
    return argv + (["--data", ns.data] if ns.data else [])


def torch_compiled_rows(torch: Any, make_step: Callable[[], Callable[..., Any]], batches: list,
                        samples: int, sync: Callable[[], Any], batch: int, tdev: str) -> list:
    """PyTorch's torch.compile rows (default mode, then reduce-overhead: CUDA graphs), each
    from a fresh model (make_step); compilation happens in the warm-up steps, untimed. A mode
    that fails here (no C++ compiler for inductor, say) is reported on stderr and left out."""
    rows = []
    for mode in (None, "reduce-overhead"):
        name = f"torch.compile{'(' + mode + ')' if mode else ''}, {tdev}"
        try:
            step = torch.compile(make_step(), mode=mode)
            seconds, done = run_epoch(step, batches, samples, sync, batch)
        except Exception as e:  # noqa: BLE001  (a peer's failure is reported, not fatal)
            print(f"[bench] {name} failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
            continue
        rows.append((name, seconds, done))
    return rows


def setup(ap: argparse.ArgumentParser, ns: argparse.Namespace, batch: int) -> tuple[str, Any]:
    """(fastmetal's device, torch or None) for the parsed arguments; torch gets fastmetal's
    CPU thread count."""
    if ns.samples < batch:
        ap.error(f"--samples: expected at least {batch}, got {ns.samples}")
    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")
    ns.device = device
    torch = None if ns.no_torch or ns.worker == "fastmetal" else torch_or_none()
    if torch is not None:  # the same CPU threads for both (a worker is told fastmetal's)
        torch.set_num_threads(ns.threads if ns.worker else fm._core._num_threads())
    return device, torch


def torch_device(torch: Any, device: str) -> tuple[str, Callable[[], None]]:
    """PyTorch's name for fastmetal's device, and its synchronize (a no-op on the CPU)."""
    tdev = {"metal": "mps"}.get(device, device)
    sync = {"cuda": torch.cuda.synchronize,
            "mps": getattr(getattr(torch, "mps", None), "synchronize", None)}.get(tdev)
    return tdev, sync or (lambda: None)


def run_epoch(step: Callable[..., Any], batches: list, samples: int, sync: Callable[[], Any],
              batch: int) -> tuple[float, int]:
    """(seconds, samples) for ceil(samples / batch) steps over the cycled batches (each a
    tuple of step's arguments), after 3 warm-up steps."""
    for args in batches[:3]:
        step(*args)
    sync()
    steps = -(-samples // batch)
    start = time.perf_counter()
    for i in range(steps):
        step(*batches[i % len(batches)])
    sync()
    return time.perf_counter() - start, steps * batch


def print_table(results: list, batch: int, samples: int,
                references: tuple = ()) -> float:
    """The results (name, seconds, samples) as per-epoch times and ratios to the first row
    (fastmetal's); `references` rows (name, seconds per 60,000) are printed without a ratio.
    Returns fastmetal's seconds a sample."""
    ours = results[0][1] / results[0][2]
    print(f"{'':34} {'s/epoch (60k)':>14} {'samples/s':>10} {'ms/batch':>9} "
          f"{'fastmetal speed-up':>19}")
    for name, seconds, done in results:
        per = seconds / done
        print(f"{name:34} {60_000 * per:14.1f} {1 / per:10,.0f} {1e3 * batch * per:9.2f} "
              f"{per / ours:18.2f}x")
    for name, seconds in references:
        print(f"{name:34} {seconds:14.1f} {60_000 / seconds:10,.0f} "
              f"{1e3 * batch * seconds / 60_000:9.2f} {'':>19}")
    if samples != 60_000:
        print(f"(measured on {samples:,} samples, scaled to 60,000)")
    return ours


def print_step_profile(prof: dict, title: str, width: int) -> None:
    """A step's milliseconds by part, largest first, then the tape's own share of them (the
    parts named "autograd ...")."""
    inside = {k: prof.pop(k) for k in list(prof) if k.startswith("autograd")}
    total = sum(prof.values())
    print(f"\n{title}; sum {total:.1f} ms):")
    for k, v in sorted(prof.items(), key=lambda kv: -kv[1]):
        print(f"  {k:{width}} {v:7.2f} ms  {100 * v / total:5.1f}%")
    print("of which the tape's own work (Python, no kernels):")
    for k, v in inside.items():
        print(f"  {k[len('autograd bookkeeping: '):]:{width}} {v:7.2f} ms  {100 * v / total:5.1f}%")


@contextlib.contextmanager
def tape_profile() -> Iterator[dict]:
    """Collects the tape's own seconds (autograd.PROFILE) while the block runs."""
    profile: dict = {}
    _autograd.PROFILE = profile
    try:
        yield profile
    finally:
        _autograd.PROFILE = None


def tape_seconds(profile: dict) -> tuple[float, float]:
    """(recording, graph walk): what recording added to the forward calls, and backward()
    less its vjps (the kernels and their Python)."""
    return profile.get("record", 0.0), profile.get("backward", 0.0) - profile.get("vjp", 0.0)
