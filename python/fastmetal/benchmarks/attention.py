"""Fused attention on the CPU: fastmetal vs PyTorch, forward and forward + backward.

    python -m fastmetal bench attention [--budget 0.5] [--quick]

Rows: ``F.scaled_dot_product_attention`` (causal, through autograd: leaves that require
grad, ``backward`` of the output with a fixed gradient) on the char-transformer shapes
(batch 16, 4 heads of 16, T = 64 .. 256) and longer sequences at head dim 64; then
``nn.MultiheadAttention(64, 4)`` (input projections, fused attention, output projection)
on the same char-transformer shapes, PyTorch's with ``need_weights=False`` so that it takes
its fused path too. Medians of interleaved rounds (``_timing.time_calls``); PyTorch runs on
as many threads as fastmetal. Ratio = PyTorch time / fastmetal time (> 1: fastmetal faster).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import fastmetal as fm
from fastmetal.benchmarks._timing import fmt_ratio, fmt_time, machine_summary, time_calls, \
    torch_or_none

SDPA_SHAPES = [  # (batch, heads, T, head dim, causal)
    (16, 4, 64, 16, True), (16, 4, 128, 16, True), (16, 4, 256, 16, True),
    (4, 8, 512, 64, True), (1, 8, 2048, 64, True), (1, 1, 4096, 64, False),
]
MHA_SHAPES = [(16, 64), (16, 128), (16, 256)]  # (batch, T) at embed 64, 4 heads


def _sdpa_calls(torch, b, h, t, d, causal, rng):
    F = fm.nn.functional
    x = [rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4)]
    q, k, v = (fm.asarray(a).requires_grad_() for a in x[:3])
    g = fm.asarray(x[3])

    def ours_forward():
        with fm.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def ours_both():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)
        q.grad = k.grad = v.grad = None

    calls = {"fm fwd": ours_forward, "fm fwd+bwd": ours_both}
    if torch is not None:
        tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in x[:3])
        tg = torch.tensor(x[3])
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def torch_forward():
            with torch.no_grad():
                return sdpa(tq, tk, tv, is_causal=causal)

        def torch_both():
            sdpa(tq, tk, tv, is_causal=causal).backward(tg)
            tq.grad = tk.grad = tv.grad = None

        calls.update({"torch fwd": torch_forward, "torch fwd+bwd": torch_both})
    return calls


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
    ns = ap.parse_args(argv)
    fm.set_default_device("cpu")
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(fm._core._num_threads())
    print(machine_summary())
    rng = np.random.default_rng(0)
    print("\nF.scaled_dot_product_attention (float32, medians; ratio = torch / fastmetal)")
    print(f"{'B x H x T x D':>22} {'causal':>6} | {'fm fwd':>9} {'torch':>9} {'ratio':>6} | "
          f"{'fm f+b':>9} {'torch':>9} {'ratio':>6}")
    for b, h, t, d, causal in SDPA_SHAPES[:3] if ns.quick else SDPA_SHAPES:
        r = time_calls(_sdpa_calls(torch, b, h, t, d, causal, rng), budget_s=ns.budget)
        tf, tb = r.get("torch fwd"), r.get("torch fwd+bwd")
        print(f"{f'{b} x {h} x {t} x {d}':>22} {str(causal):>6} | "
              f"{fmt_time(r['fm fwd'].median):>9} {fmt_time(tf and tf.median):>9} "
              f"{fmt_ratio(tf and tf.median, r['fm fwd'].median):>6} | "
              f"{fmt_time(r['fm fwd+bwd'].median):>9} {fmt_time(tb and tb.median):>9} "
              f"{fmt_ratio(tb and tb.median, r['fm fwd+bwd'].median):>6}")
    if ns.quick:
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
    sys.exit(main())
