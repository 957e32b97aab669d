"""Fused attention: fastmetal vs PyTorch, forward and forward + backward, on the CPU or CUDA.

    python -m fastmetal bench attention [--budget 0.5] [--quick] [--device cpu|cuda]
                                        [--shapes char|long|all] [--memory T]

Rows: ``F.scaled_dot_product_attention`` (causal, through autograd: leaves that require
grad, ``backward`` of the output with a fixed gradient) on the char-transformer shapes
(batch 16, 4 heads of 16, T = 64 .. 256) and longer sequences at head dim 64; then
``nn.MultiheadAttention(64, 4)`` (input projections, fused attention, output projection)
on the same char-transformer shapes, PyTorch's with ``need_weights=False`` so that it takes
its fused path too. Medians of interleaved rounds (``_timing.time_calls``); PyTorch runs on
as many threads as fastmetal. Ratio = PyTorch time / fastmetal time (> 1: fastmetal faster).

``--device cuda``: both libraries on the GPU (float32; TF32 off in PyTorch), every timed
call synchronised; the default rows are then ``--shapes long``: T = 1024 and 4096 at head
dim 64 (8 heads), causal and not. ``--memory T`` (default 16384 on cuda, off on the CPU) then
runs one causal forward + backward at (1, 8, T, 64) for each library in a fresh process of
its own (the PyTorch one loads no fastmetal) and reports its peak memory: on CUDA the rise of
the GPU's used memory (nvidia-smi, polled every 10 ms: CUDA context and allocator caches
included) and PyTorch's own ``max_memory_allocated``; on the CPU the process's peak RSS rise.
An ``L x S`` score matrix there would take ``8 T^2 * 4`` bytes (8 GiB at T = 16384).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

import numpy as np

WORKER_FLAG = "--memory-worker"
if __name__ == "__main__" and sys.path and \
        os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a script: this folder's modules are not top-level names
# A PyTorch memory worker (this file run as a script) loads no fastmetal at all.
_TORCH_WORKER = __name__ == "__main__" and WORKER_FLAG in sys.argv and \
    json.loads(sys.argv[-1]).get("library") == "torch"
if not _TORCH_WORKER:
    import fastmetal as fm
    from fastmetal.benchmarks._timing import fmt_ratio, fmt_time, machine_summary, \
        time_calls, torch_or_none

SDPA_SHAPES = [  # (batch, heads, T, head dim, causal)
    (16, 4, 64, 16, True), (16, 4, 128, 16, True), (16, 4, 256, 16, True),
    (4, 8, 512, 64, True), (1, 8, 2048, 64, True), (1, 1, 4096, 64, False),
]
LONG_SHAPES = [  # the GPU rows: long sequences at head dim 64
    (4, 8, 1024, 64, False), (4, 8, 1024, 64, True), (1, 8, 4096, 64, False),
    (1, 8, 4096, 64, True),
]
MHA_SHAPES = [(16, 64), (16, 128), (16, 256)]  # (batch, T) at embed 64, 4 heads


def _synced(fn, sync):
    def call():
        out = fn()
        sync()
        return out
    return call


def _torch_sync(torch, device):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _sdpa_calls(torch, b, h, t, d, causal, rng, device="cpu"):
    F = fm.nn.functional
    x = [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4)]
    q, k, v = (fm.asarray(a, device=device).requires_grad_() for a in x[:3])
    g = fm.asarray(x[3], device=device)

    def ours_forward():
        with fm.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def ours_both():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)
        q.grad = k.grad = v.grad = None

    calls = {"fm fwd": _synced(ours_forward, fm.synchronize),
             "fm fwd+bwd": _synced(ours_both, fm.synchronize)}
    if torch is not None:
        tq, tk, tv = (torch.tensor(a, requires_grad=True, device=device) for a in x[:3])
        tg = torch.tensor(x[3], device=device)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        sync = _torch_sync(torch, device)

        def torch_forward():
            with torch.no_grad():
                return sdpa(tq, tk, tv, is_causal=causal)

        def torch_both():
            sdpa(tq, tk, tv, is_causal=causal).backward(tg)
            tq.grad = tk.grad = tv.grad = None

        calls.update({"torch fwd": _synced(torch_forward, sync),
                      "torch fwd+bwd": _synced(torch_both, sync)})
    return calls


def memory_worker(cfg):
    """One causal forward + backward at (1, heads, T, 64) in this fresh process; prints JSON
    with the peak RSS rise (bytes) and, for PyTorch on CUDA, its max_memory_allocated."""
    b, h, t, d = 1, cfg["heads"], cfg["T"], 64
    device = cfg["device"]
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4)]
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {}
    if cfg["library"] == "torch":
        import torch  # only in the PyTorch worker's process
        torch.backends.cuda.matmul.allow_tf32 = False
        q, k, v = (torch.tensor(a, device=device, requires_grad=True) for a in x[:3])
        g = torch.tensor(x[3], device=device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        _torch_sync(torch, device)()
        out["seconds"] = time.perf_counter() - t0
        if device == "cuda":
            out["allocated"] = torch.cuda.max_memory_allocated()
    else:
        q, k, v = (fm.asarray(a, device=device).requires_grad_() for a in x[:3])
        g = fm.asarray(x[3], device=device)
        fm.synchronize()
        t0 = time.perf_counter()
        fm.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
        fm.synchronize()
        out["seconds"] = time.perf_counter() - t0
    out["rss_rise"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    time.sleep(0.5)  # the parent polls nvidia-smi (~0.1 s a call): it sees the cached peak
    print(json.dumps(out), flush=True)


def _gpu_used_mib():
    """The used memory of the first visible GPU (MiB, nvidia-smi), or None."""
    index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,"
                            "nounits", "-i", index], capture_output=True, text=True, timeout=10)
        return float(r.stdout.split()[0]) if r.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def _memory_row(library, device, t, heads):
    """Run one memory worker; (its JSON, the GPU's peak used-memory rise in MiB or None)."""
    cfg = {"library": library, "device": device, "T": t, "heads": heads}
    base = _gpu_used_mib() if device == "cuda" else None
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.is_set():
            used = _gpu_used_mib()
            if used is not None and (peak[0] is None or used > peak[0]):
                peak[0] = used
            time.sleep(0.01)

    poller = threading.Thread(target=poll, daemon=True) if base is not None else None
    if poller is not None:
        poller.start()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), WORKER_FLAG,
                           json.dumps(cfg)], capture_output=True, text=True)
    done.set()
    if poller is not None:
        poller.join()
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                else f"exit {proc.returncode}"}, None
    rise = None if base is None or peak[0] is None else peak[0] - base
    return json.loads(proc.stdout.strip().splitlines()[-1]), rise


def _print_memory(device, t, heads, torch_available):
    gib = 2.0 ** 30
    print(f"\npeak memory of one causal forward + backward at (1, {heads}, {t}, 64) float32, "
          f"each library in its own process (inputs, output and gradients: "
          f"{7 * heads * t * 64 * 4 / gib:.3f} GiB; an L x S score matrix alone would be "
          f"{heads * t * t * 4 / gib:.1f} GiB)")
    for library in ("fastmetal", "torch") if torch_available else ("fastmetal",):
        info, rise = _memory_row(library, device, t, heads)
        if "error" in info:
            print(f"  {library:10} failed: {info['error']}")
            continue
        parts = [f"{info['seconds'] * 1e3:9.1f} ms"]
        if rise is not None:
            parts.append(f"GPU used memory +{rise / 1024:.3f} GiB (nvidia-smi)")
        if "allocated" in info:
            parts.append(f"max_memory_allocated {info['allocated'] / gib:.3f} GiB")
        parts.append(f"host peak RSS +{info['rss_rise'] / gib:.3f} GiB")
        print(f"  {library:10} " + ", ".join(parts))


def _mha_calls(torch, b, t, rng):
    e, heads = 64, 4
    x = rng.standard_normal((t, b, e)).astype(np.float32)
    gy = fm.asarray(rng.standard_normal((t, b, e)).astype(np.float32))
    m = fm.nn.MultiheadAttention(e, heads, seed=0)
    xa = fm.asarray(x).requires_grad_()

    def ours():
        out, _ = m(xa, xa, xa, need_weights=False, is_causal=True)
        out.backward(gy)
        m.zero_grad()
        xa.grad = None

    calls = {"fm fwd+bwd": ours}
    if torch is not None:
        tm = torch.nn.MultiheadAttention(e, heads)
        m.load_state_dict({n: p.detach().numpy() for n, p in tm.state_dict().items()})
        tx = torch.tensor(x, requires_grad=True)
        tg = torch.tensor(gy.numpy())
        causal = torch.nn.Transformer.generate_square_subsequent_mask(t)

        def theirs():
            out, _ = tm(tx, tx, tx, need_weights=False, attn_mask=causal, is_causal=True)
            out.backward(tg)
            tm.zero_grad()
            tx.grad = None

        calls["torch fwd+bwd"] = theirs
    return calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench attention",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per timed function")
    ap.add_argument("--quick", action="store_true", help="the three smallest SDPA rows only")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where both libraries run")
    ap.add_argument("--shapes", default=None, choices=("char", "long", "all"),
                    help="SDPA rows: the CPU's (char-transformer and longer), the GPU's long "
                    "ones at head dim 64, or both (default: char on cpu, long on cuda)")
    ap.add_argument("--memory", type=int, default=None, metavar="T",
                    help="peak memory at sequence length T, each library in its own process "
                    "(default: 16384 on cuda, none on cpu; 0: none)")
    ns = ap.parse_args(argv)
    if ns.device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {ns.device!r}")
    fm.set_default_device(ns.device)
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(fm._core._num_threads())
        if ns.device == "cuda":
            if not torch.cuda.is_available():
                print("(PyTorch has no CUDA here: fastmetal only)")
                torch = None
            else:
                torch.backends.cuda.matmul.allow_tf32 = False
    print(machine_summary())
    rng = np.random.default_rng(0)
    shapes = ns.shapes or ("long" if ns.device == "cuda" else "char")
    rows = {"char": SDPA_SHAPES, "long": LONG_SHAPES, "all": SDPA_SHAPES + LONG_SHAPES}[shapes]
    print(f"\nF.scaled_dot_product_attention on {ns.device} (float32, medians; "
          f"ratio = torch / fastmetal)")
    print(f"{'B x H x T x D':>22} {'causal':>6} | {'fm fwd':>9} {'torch':>9} {'ratio':>6} | "
          f"{'fm f+b':>9} {'torch':>9} {'ratio':>6}")
    for b, h, t, d, causal in rows[:3] if ns.quick else rows:
        r = time_calls(_sdpa_calls(torch, b, h, t, d, causal, rng, ns.device),
                       budget_s=ns.budget)
        tf, tb = r.get("torch fwd"), r.get("torch fwd+bwd")
        print(f"{f'{b} x {h} x {t} x {d}':>22} {str(causal):>6} | "
              f"{fmt_time(r['fm fwd'].median):>9} {fmt_time(tf and tf.median):>9} "
              f"{fmt_ratio(tf and tf.median, r['fm fwd'].median):>6} | "
              f"{fmt_time(r['fm fwd+bwd'].median):>9} {fmt_time(tb and tb.median):>9} "
              f"{fmt_ratio(tb and tb.median, r['fm fwd+bwd'].median):>6}")
    memory = ns.memory if ns.memory is not None else (16384 if ns.device == "cuda" else 0)
    if memory:
        _print_memory(ns.device, memory, 8, torch is not None)
    if ns.quick or ns.device != "cpu":
        return 0
    print("\nnn.MultiheadAttention(64, 4), causal, forward + backward")
    print(f"{'batch x T':>12} | {'fm':>9} {'torch':>9} {'ratio':>6}")
    for b, t in MHA_SHAPES:
        r = time_calls(_mha_calls(torch, b, t, rng), budget_s=ns.budget)
        tt = r.get("torch fwd+bwd")
        print(f"{f'{b} x {t}':>12} | {fmt_time(r['fm fwd+bwd'].median):>9} "
              f"{fmt_time(tt and tt.median):>9} {fmt_ratio(tt and tt.median, r['fm fwd+bwd'].median):>6}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:  # this file as a script: a worker
        memory_worker(json.loads(sys.argv[2]))
    else:
        sys.exit(main())
