"""Training steps of a small GPT, fastmetal against PyTorch, each in its own process.

The network of examples/char_transformer.py: token and position embeddings, ``--layers``
pre-norm blocks (causal ``F.scaled_dot_product_attention``, GELU MLP of width 4 d), final
LayerNorm, a head tied to the token embedding; cross-entropy on every position, AdamW,
``clip_grad_norm_``. Defaults: 4 layers, d_model 128, 4 heads, context 128, batch 32,
vocabulary 96 (the size of a character vocabulary), float32. One source defines the model
for both libraries (``_classes(nn, F)``), so they run the same network; PyTorch's starts
from fastmetal's weights.

Each library runs in a fresh Python process (``--worker``) on the same device and the same
number of CPU threads (``--threads``, default fastmetal's), so neither inherits the other's
allocator, thread pool or caches. A worker prepares ``--batches`` random batches on the
device, runs 3 warm-up steps, then times ``--steps`` steps one by one (synchronised) and
reports the median and the mean step time. Ratio = PyTorch time / fastmetal time (> 1:
fastmetal faster).

    python -m fastmetal bench gpt [--steps 30] [--device cpu|cuda] [--threads 2] [--profile]
                                  [--compile]

``--compile`` adds the step under ``fastmetal.compile`` (traced once, then replayed without
Python per op; the batch's ids and targets are its inputs) and PyTorch's under
``torch.compile`` (default mode and ``mode="reduce-overhead"``: CUDA graphs), each in a
process of its own, from the same weights.

``--profile`` runs fastmetal's worker under cProfile as well and prints where its steps'
time goes (functions by own time, then by cumulative time).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

WORKER_FLAG = "--worker"
if __name__ == "__main__" and sys.path and \
        os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a script: this folder's modules are not top-level names
# A PyTorch worker (this file run as a script) loads no fastmetal at all.
_TORCH_WORKER = __name__ == "__main__" and WORKER_FLAG in sys.argv and \
    json.loads(sys.argv[-1]).get("library") == "torch"
if not _TORCH_WORKER:
    import fastmetal as fm
    from fastmetal.benchmarks._timing import machine_summary, torch_or_none


def _classes(nn, F, arange):
    """The GPT of examples/char_transformer.py in library ``nn``/``F`` (fastmetal's or
    PyTorch's: the two accept the same calls); ``arange(T)``: position ids."""

    class CausalSelfAttention(nn.Module):
        def __init__(self, d, n_head):
            super().__init__()
            self.n_head = n_head
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            B, T, C = x.shape
            qkv = self.qkv(x).reshape(B, T, 3, self.n_head, C // self.n_head)
            q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.permute(0, 2, 1, 3).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self, d, n_head):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = CausalSelfAttention(d, n_head)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self, vocab, context, d, n_layer, n_head):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab, d)
            self.pos_emb = nn.Embedding(context, d)
            self.blocks = nn.Sequential(*[Block(d, n_head) for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok_emb.weight

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.tok_emb(idx) + self.pos_emb(arange(T))
            logits = self.head(self.ln_f(self.blocks(x)))
            return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))

    return GPT


def _weights(model):
    """Initial weights for ``model``'s state_dict (GPT-2's: N(0, 0.02) matrices and
    embeddings, zero biases, unit LayerNorm weights), as float32 NumPy arrays drawn in sorted
    name order: the same numbers for both libraries' models (their names are the same)."""
    rng = np.random.default_rng(0)
    out = {}
    for name, p in sorted(model.state_dict().items()):
        shape = tuple(p.shape)
        if name.endswith("bias"):
            out[name] = np.zeros(shape, np.float32)
        elif name.split(".")[-2].startswith("ln"):
            out[name] = np.ones(shape, np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
    out["head.weight"] = out["tok_emb.weight"]  # tied
    return out


def _dims(cfg):
    return cfg["vocab"], cfg["context"], cfg["d_model"], cfg["layers"], cfg["heads"]


def _batches(cfg):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg["vocab"], (cfg["batches"], cfg["batch"], cfg["context"] + 1))
    return [(b[:, :-1].copy(), b[:, 1:].copy()) for b in ids]


def _fastmetal_worker(cfg):
    dev = cfg["device"]
    arange_cache = {}

    def arange(t):  # host ids: fastmetal's Embedding takes NumPy integers as they are
        return arange_cache.setdefault(t, np.arange(t))

    model = _classes(fm.nn, fm.nn.functional, arange)(*_dims(cfg))
    model.load_state_dict({k: fm.asarray(v) for k, v in _weights(model).items()})
    model.to(dev)
    params = list(model.parameters())
    opt = fm.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.1},
                          {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                         lr=1e-3, betas=(0.9, 0.95))
    batches = [(fm.asarray(x, dtype="int64", device=dev), fm.asarray(y, dtype="int64",
                                                                      device=dev))
               for x, y in _batches(cfg)]

    def step(x, y):
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        fm.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    name = "fastmetal.compile" if cfg.get("mode") else "fastmetal"
    if cfg.get("mode"):  # a compiled row that ran eagerly would mislead: fail instead
        warnings.simplefilter("error", fm.CompileWarning)
    return fm.compile(step) if cfg.get("mode") else step, fm.synchronize, \
        lambda loss: float(loss), f"{name} {fm.__version__}", batches


def _torch_worker(cfg):
    import torch  # only in the PyTorch worker's process
    dev = cfg["device"]
    torch.set_num_threads(cfg["threads"])
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, as fastmetal's
    model = _classes(torch.nn, torch.nn.functional,
                     lambda t: torch.arange(t, device=dev))(*_dims(cfg))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in _weights(model).items()})
    model.to(dev)
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2],
                              "weight_decay": 0.1},
                             {"params": [p for p in params if p.ndim < 2],
                              "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    batches = [(torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev))
               for x, y in _batches(cfg)]

    def step(x, y):
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    name = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads)"
    mode = cfg.get("mode")
    if mode:  # compiled in the untimed warm-up steps
        step = torch.compile(step, mode=None if mode == "default" else mode)
        name = f"torch.compile{'' if mode == 'default' else '(' + mode + ')'} {torch.__version__}"
    return step, sync, lambda loss: loss.item(), name, batches


def worker(cfg):
    """Build, warm up, time; print one JSON line (and a profile, with cfg["profile"])."""
    build = _fastmetal_worker if cfg["library"] == "fastmetal" else _torch_worker
    step, sync, value, name, batches = build(cfg)
    first = value(step(*batches[0]))
    for i in range(1, 3):
        step(*batches[i % len(batches)])
    sync()
    times, cpus = [], []
    profiler = cProfile.Profile() if cfg.get("profile") else None
    for i in range(cfg["steps"]):
        t0, c0 = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        loss = step(*batches[i % len(batches)])
        sync()
        if profiler is not None:
            profiler.disable()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    last = value(loss)
    if profiler is not None:
        for key in ("tottime", "cumulative"):
            print(f"--- fastmetal's {cfg['steps']} steps by {key} ---", file=sys.stderr)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats(key).print_stats(22)
    print(json.dumps({"name": name, "median": statistics.median(times),
                      "mean": statistics.fmean(times), "min": min(times),
                      "cpu": statistics.median(cpus),
                      "first_loss": first, "last_loss": last}), flush=True)


def _run_worker(cfg, env):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), WORKER_FLAG,
                           json.dumps(cfg)], capture_output=True, text=True, env=env)
    if proc.stderr and cfg.get("profile"):
        print(proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"[fastmetal bench gpt] the {cfg['library']} worker failed "
                           f"(exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m fastmetal bench gpt", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: fastmetal's "
                    "default device); PyTorch runs on the same")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per library")
    ap.add_argument("--batches", type=int, default=4, help="distinct batches cycled through")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for both "
                    "(FASTMETAL_NUM_THREADS and torch.set_num_threads; default: fastmetal's)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=96)
    ap.add_argument("--profile", action="store_true", help="cProfile fastmetal's steps")
    ap.add_argument("--no-torch", action="store_true", help="fastmetal only")
    ap.add_argument("--compile", action="store_true",
                    help="also time fastmetal.compile(step), and PyTorch's torch.compile(step) "
                         "and torch.compile(step, mode='reduce-overhead') (CUDA graphs)")
    ns = ap.parse_args(argv)
    device = ns.device or fm.default_device()
    if device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {device!r}")
    if device not in ("cpu", "cuda"):
        ap.error(f"--device: expected cpu or cuda (PyTorch's device must match), got {device!r}")
    threads = ns.threads or fm._core._num_threads()
    cfg = {"device": device, "steps": ns.steps, "batches": ns.batches, "threads": threads,
           "layers": ns.layers, "d_model": ns.d_model, "heads": ns.heads,
           "context": ns.context, "batch": ns.batch, "vocab": ns.vocab}
    env = dict(os.environ, FASTMETAL_NUM_THREADS=str(threads))
    print(f"GPT training step: {ns.layers} layers, d_model {ns.d_model}, {ns.heads} heads, "
          f"context {ns.context}, batch {ns.batch}, vocabulary {ns.vocab}, AdamW + "
          f"clip_grad_norm_, float32, {device}, {threads} CPU threads; each library in its "
          f"own process, {ns.steps} timed steps after 3 warm-up")
    print(f"machine: {machine_summary()}\n")
    results = [_run_worker(dict(cfg, library="fastmetal", profile=ns.profile), env)]
    if ns.compile:
        results.append(_run_worker(dict(cfg, library="fastmetal", mode="compile"), env))
    if not ns.no_torch:
        torch = torch_or_none()  # here only to ask what it has; the worker times it
        if torch is None:
            print("(PyTorch is not installed: fastmetal only)")
        elif device == "cuda" and not torch.cuda.is_available():
            print("(this PyTorch has no CUDA: fastmetal only)")
        else:
            results.append(_run_worker(dict(cfg, library="torch"), env))
            for mode in ("default", "reduce-overhead") if ns.compile else ():
                try:  # a mode that fails here (no C++ compiler for inductor) is left out
                    results.append(_run_worker(dict(cfg, library="torch", mode=mode), env))
                except RuntimeError as e:
                    print(f"[bench] torch.compile mode {mode} failed: {str(e)[-300:]}",
                          file=sys.stderr)
    ours = results[0]["median"]
    compiled = results[1]["median"] if ns.compile else None
    tokens = ns.batch * ns.context
    print(f"{'':36} {'ms/step':>9} {'(mean)':>9} {'CPU ms':>8} {'tokens/s':>10} "
          f"{'loss 1st->last':>16} {'fastmetal speed-up':>19}" +
          (f" {'fastmetal.compile speed-up':>27}" if compiled else ""))
    for r in results:
        print(f"{r['name']:36} {1e3 * r['median']:9.1f} {1e3 * r['mean']:9.1f} "
              f"{1e3 * r['cpu']:8.1f} {tokens / r['median']:10,.0f} "
              f"{r['first_loss']:7.3f}->{r['last_loss']:.3f} {r['median'] / ours:18.2f}x" +
              (f" {r['median'] / compiled:26.2f}x" if compiled else ""))
    print("(ms/step: median wall time of a synchronised step; CPU ms: its median process CPU "
          "time, all threads, waiting threads that spin included)")
    if not all(math.isfinite(r["last_loss"]) for r in results):
        print("warning: a non-finite loss")
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:  # this file as a script: a worker
        worker(json.loads(sys.argv[2]))
    else:
        main()
