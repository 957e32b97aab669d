"""Where the CPU GPT training step of `python -m fastmetal bench gpt` spends its time, op by
op at its shapes, for fastmetal and for PyTorch, each library in its own process, the same
threads.

    python benchmarks/gpt_parts.py [--threads 2] [--repeats 15] [--tokens 4096] [--d-model 128]

Rows (milliseconds, medians of interleaved repeats; ratio = PyTorch / fastmetal, > 1:
fastmetal faster): each linear layer of a block (qkv d -> 3d, proj d -> d, fc1 d -> 4d,
fc2 4d -> d) and the tied head (d -> 96), forward (with its bias) and backward (the input,
weight and bias gradients; fastmetal's fused linear_backward, PyTorch's three products and
sum as its autograd runs them); causal attention over (batch, 4 heads, 128, d / 4), forward
and forward + backward; GELU on (tokens, 4d) and LayerNorm on (tokens, d), forward +
backward. FASTMETAL_CPU_ISA picks fastmetal's instruction set (base, avx2, avx512; default:
the best the CPU has).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from parts_common import median_ms, run_children


def _layers(d: int):
    return [("qkv", d, 3 * d), ("proj", d, d), ("fc1", d, 4 * d), ("fc2", 4 * d, d), ("head", d, 96)]


def _data(ns):
    """The same inputs for both libraries (NumPy, seeded)."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    T, d = ns.tokens, ns.d_model
    lin = {name: (rng.standard_normal((T, i)).astype(f32),
                  (rng.standard_normal((o, i)) * 0.05).astype(f32),
                  np.zeros(o, f32), rng.standard_normal((T, o)).astype(f32))
           for name, i, o in _layers(d)}
    heads, ctx = 4, 128
    qkv = [rng.standard_normal((T // ctx, heads, ctx, d // heads)).astype(f32) for _ in range(3)]
    act = rng.standard_normal((T, 4 * d)).astype(f32)
    norm_in = rng.standard_normal((T, d)).astype(f32)
    return lin, qkv, act, norm_in


def _fastmetal(ns) -> dict:
    import fastmetal as fm
    from fastmetal import _core
    F = fm.nn.functional
    lin, qkv, act, norm_in = _data(ns)
    fns = {}
    for name, (x, w, b, g) in lin.items():
        x, w, b, g = (fm.asarray(a) for a in (x, w, b, g))
        fns[f"{name} forward"] = lambda x=x, w=w, b=b: F.linear(x, w, b)
        fns[f"{name} backward"] = lambda x=x, w=w, g=g: _core._linear_backward(
            g, x, w, ("input", "weight", "bias"))
    q, k, v = (fm.asarray(a).requires_grad_() for a in qkv)
    go = fm.ones(q.shape)

    def sdpa_both():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    fns["attention forward"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fns["attention forward+backward"] = sdpa_both
    a = fm.asarray(act).requires_grad_()
    ga = fm.ones(a.shape)
    fns["gelu forward"] = lambda: F.gelu(a)
    fns["gelu forward+backward"] = lambda: F.gelu(a).backward(ga)
    n = fm.asarray(norm_in).requires_grad_()
    ln = fm.nn.LayerNorm(ns.d_model)
    gn = fm.ones(n.shape)
    fns["layer_norm forward+backward"] = lambda: ln(n).backward(gn)
    r = median_ms(fns, ns.repeats)
    r["isa"] = _core._cpu_isa()
    return r


def _torch(ns) -> dict:
    import torch
    torch.set_num_threads(ns.threads)
    F = torch.nn.functional
    lin, qkv, act, norm_in = _data(ns)
    fns = {}
    for name, (x, w, b, g) in lin.items():
        x, w, b, g = (torch.from_numpy(a) for a in (x, w, b, g))
        fns[f"{name} forward"] = lambda x=x, w=w, b=b: F.linear(x, w, b)
        fns[f"{name} backward"] = lambda x=x, w=w, g=g: (g @ w, g.t() @ x, g.sum(0))
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in qkv)
    go = torch.ones(q.shape)

    def sdpa_both():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    fns["attention forward"] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fns["attention forward+backward"] = sdpa_both
    a = torch.from_numpy(act).requires_grad_()
    ga = torch.ones(a.shape)
    fns["gelu forward"] = lambda: F.gelu(a)
    fns["gelu forward+backward"] = lambda: F.gelu(a).backward(ga)
    n = torch.from_numpy(norm_in).requires_grad_()
    ln = torch.nn.LayerNorm(ns.d_model)
    gn = torch.ones(n.shape)
    fns["layer_norm forward+backward"] = lambda: ln(n).backward(gn)
    return median_ms(fns, ns.repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=4096, help="batch x context (a multiple of 128)")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--child", choices=("fastmetal", "torch"), help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = ap.parse_args(argv)
    if ns.tokens % 128 or ns.tokens <= 0:
        ap.error(f"--tokens: expected a positive multiple of 128 (context 128), got {ns.tokens}")
    if ns.child:
        print(json.dumps((_fastmetal if ns.child == "fastmetal" else _torch)(ns)))
        return 0
    res = run_children(__file__, argv, ns.threads)
    fmr, tr = res["fastmetal"], res["torch"]
    print(f"GPT step ops, {ns.tokens} tokens, d_model {ns.d_model}, {ns.threads} threads, "
          f"fastmetal ISA {fmr.get('isa', '?')} (ms, medians of {ns.repeats})")
    print(f"{'':32}{'fastmetal':>11}{'torch':>11}{'ratio':>8}")
    for k in [k for k in fmr if k != "isa"]:
        t = tr.get(k)
        ratio = "-" if t is None else f"{t / fmr[k]:.2f}x"
        print(f"{k:32}{fmr[k]:11.3f}{'-' if t is None else format(t, '.3f'):>11}{ratio:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
