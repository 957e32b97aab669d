"""Train a small GPT on characters with fastmetal, written as a PyTorch user writes it.

Model: token and position embeddings, ``--layers`` pre-norm blocks (causal multi-head
self-attention through ``F.scaled_dot_product_attention(is_causal=True)``, then a GELU MLP
of width 4 d), a final LayerNorm and a linear head (``--tie-weights``: the head shares the
token embedding's matrix). AdamW (weight decay on matrices only), ``clip_grad_norm_``, a
linear warm-up then a cosine learning-rate schedule (LambdaLR), cross-entropy on every
position. Each epoch prints the validation loss and a sampled text.

Data: ``--data FILE`` (any text), or by default Python's own standard library sources (the
``.py`` files beside ``os.py``: always installed, no download), 90% train / 10% validation,
cut into windows of ``--context + 1`` characters that a DataLoader shuffles.

    python examples/char_transformer.py [--epochs 2] [--device cpu] [--data FILE] [--plot FILE]
"""
from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import math
import os
import time
from typing import Any

import numpy as np

import fastmetal as fm
from fastmetal import nn, optim
from fastmetal.data import DataLoader, TensorDataset
from fastmetal.nn import functional as F


# ----------------------------------------------------------------------------- data
def load_text(path: str | None, max_chars: int) -> str:
    """The text of ``path``, or the standard library's sources (sorted, so reproducible on
    one Python version), at most ``max_chars`` characters."""
    if path is not None:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()[:max_chars]
    parts, size = [], 0
    for name in sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py"))):
        with open(name, encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        size += len(parts[-1])
        if size >= max_chars:
            break
    return "".join(parts)[:max_chars]


class Vocabulary:
    """Characters <-> ids (the characters of the text, sorted)."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.fromiter((self.index[c] for c in text), dtype=np.int64, count=len(text))

    def decode(self, ids: Any) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def windows(ids: np.ndarray, context: int) -> np.ndarray:
    """Consecutive windows of ``context + 1`` ids (inputs and next-character targets),
    ``(len(ids) // (context + 1), context + 1)``."""
    n = len(ids) // (context + 1)
    return ids[:n * (context + 1)].reshape(n, context + 1)


# ----------------------------------------------------------------------------- model
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Any) -> Any:
        B, T, C = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.n_head, C // self.n_head)
        # (B, n_head, T, head_dim) views of the one projection
        q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.permute(0, 2, 1, 3).reshape(B, T, C)
        return self.resid_dropout(self.proj(y))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(dropout))

    def forward(self, x: Any) -> Any:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, context: int, d_model: int = 128, n_layer: int = 4,
                 n_head: int = 4, dropout: float = 0.1, tie_weights: bool = True) -> None:
        super().__init__()
        self.context = context
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.Sequential(*[Block(d_model, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight  # one matrix, two uses
        # GPT-2's initialisation: N(0, 0.02) weights and embeddings, zero biases.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.ndim == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx: Any, targets: Any = None) -> Any:
        B, T = idx.shape
        x = self.drop(self.tok_emb(idx) + self.pos_emb(np.arange(T)))
        logits = self.head(self.ln_f(self.blocks(x)))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    def generate(self, idx: np.ndarray, new_tokens: int, rng: np.random.Generator,
                 temperature: float = 0.8) -> np.ndarray:
        """Append ``new_tokens`` sampled ids to the ``(1, T)`` ids ``idx``."""
        was_training = self.training
        self.eval()
        with fm.no_grad():
            for _ in range(new_tokens):
                logits, _ = self(idx[:, -self.context:])
                z = logits[0, -1].numpy().astype(np.float64) / temperature
                p = np.exp(z - z.max())
                idx = np.concatenate([idx, [[rng.choice(len(p), p=p / p.sum())]]], axis=1)
        self.train(was_training)
        return idx


# ----------------------------------------------------------------------------- training
def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> optim.AdamW:
    """AdamW decaying the matrices (weights, embeddings) only, as GPT-2's recipe."""
    params = list(model.parameters())
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                        {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def cosine_schedule(warmup: int, total: int, floor: float = 0.1) -> Any:
    """The learning rate's factor at step ``s``: linear warm-up, then a cosine to ``floor``."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
    return factor


def train_step(model: GPT, optimizer: optim.Optimizer, scheduler: Any, x: Any, y: Any,
               clip: float) -> Any:
    """One step on ``(B, context)`` ids ``x`` and next ids ``y``; returns the loss (an Array)."""
    _, loss = model(x, y)
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()
    return loss


def evaluate(model: GPT, data: np.ndarray, batch_size: int, device: str) -> float:
    """Mean loss over the validation windows, dropout off."""
    model.eval()
    total, count = 0.0, 0
    with fm.no_grad():
        for i in range(0, len(data), batch_size):
            chunk = fm.asarray(data[i:i + batch_size], dtype="int64", device=device)
            _, loss = model(chunk[:, :-1], chunk[:, 1:])
            total += float(loss) * len(chunk)
            count += len(chunk)
    model.train()
    return total / max(count, 1)


class History:
    def __init__(self) -> None:
        self.losses: list[float] = []
        self.val_losses: list[float] = []
        self.samples: list[str] = []
        self.seconds = 0.0


def plot(history: History, steps_per_epoch: int, path: str) -> None:
    matplotlib = importlib.import_module("matplotlib")  # optional: only for --plot
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, len(history.losses) + 1), history.losses, lw=0.8, label="train")
    ax.plot(np.arange(1, len(history.val_losses) + 1) * steps_per_epoch, history.val_losses,
            "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / character)")
    ax.set_title("char GPT on fastmetal")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help keeps the docstring's layout and shows each option's default."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--data", default=None, help="a text file; unset: the standard library's "
                    "sources")
    ap.add_argument("--max-chars", type=int, default=1_000_000, help="characters of text used")
    ap.add_argument("--device", default=fm.default_device(), help=f"one of {fm.devices()}")
    ap.add_argument("--epochs", type=int, default=2, help="passes over the training windows")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps "
                    "(0: no limit)")
    ap.add_argument("--batch-size", type=int, default=32, help="windows per step")
    ap.add_argument("--context", type=int, default=128, help="characters a position sees")
    ap.add_argument("--d-model", type=int, default=128, help="embedding width")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks")
    ap.add_argument("--heads", type=int, default=4, help="attention heads")
    ap.add_argument("--dropout", type=float, default=0.1, help="dropout probability")
    ap.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=True,
                    help="share the token embedding with the output head")
    ap.add_argument("--lr", type=float, default=3e-3, help="AdamW's peak learning rate")
    ap.add_argument("--weight-decay", type=float, default=0.1, help="AdamW's weight decay")
    ap.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    ap.add_argument("--sample-chars", type=int, default=200, help="characters sampled per "
                    "epoch (0: none)")
    ap.add_argument("--seed", type=int, default=1, help="weights, shuffling, dropout, sampling")
    ap.add_argument("--plot", default=None, metavar="FILE", help="write the loss curves (PNG)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or samples")
    ns = ap.parse_args(argv)
    if ns.device not in fm.devices():
        ap.error(f"--device: expected one of {fm.devices()}, got {ns.device!r}")
    if ns.plot and importlib.util.find_spec("matplotlib") is None:
        ap.error("--plot: needs matplotlib (pip install matplotlib)")
    return ns


def prepare(ns: argparse.Namespace) -> tuple[Vocabulary, np.ndarray, np.ndarray]:
    """(vocabulary, training windows, validation windows)."""
    text = load_text(ns.data, ns.max_chars)
    vocab = Vocabulary(text)
    ids = vocab.encode(text)
    split = int(0.9 * len(ids))
    return vocab, windows(ids[:split], ns.context), windows(ids[split:], ns.context)


def main(argv: list[str] | None = None) -> History:
    ns = parse(argv)
    fm.manual_seed(ns.seed)
    vocab, train, val = prepare(ns)
    model = GPT(len(vocab), ns.context, ns.d_model, ns.layers, ns.heads, ns.dropout,
                ns.tie_weights).to(ns.device)
    loader = DataLoader(TensorDataset(train[:, :-1], train[:, 1:]), batch_size=ns.batch_size,
                        shuffle=True, drop_last=True, device=ns.device)
    total = ns.epochs * len(loader)
    if ns.max_steps:
        total = min(total, ns.max_steps)
    optimizer = make_optimizer(model, ns.lr, ns.weight_decay)
    scheduler = optim.lr_scheduler.LambdaLR(optimizer, cosine_schedule(ns.warmup, total))
    n_params = sum(p.size for p in model.parameters())
    print(f"fastmetal {fm.__version__} on {ns.device}: {len(train) * (ns.context + 1):,} "
          f"training characters, vocabulary {len(vocab)}, {n_params:,} parameters, "
          f"{total} steps")
    history = History()
    rng = np.random.default_rng(ns.seed)
    tqdm = None if ns.quiet else _tqdm()
    start, step = time.perf_counter(), 0
    for epoch in range(1, ns.epochs + 1):
        bar = tqdm(total=min(len(loader), total - step), desc=f"epoch {epoch}") if tqdm else None
        for x, y in loader:
            if step >= total:
                break
            loss = float(train_step(model, optimizer, scheduler, x, y, ns.clip))
            history.losses.append(loss)
            step += 1
            if bar is not None:
                bar.set_postfix_str(f"loss {loss:.3f}", refresh=False)
                bar.update(1)
        if bar is not None:
            bar.close()
        history.val_losses.append(evaluate(model, val, 4 * ns.batch_size, ns.device))
        line = (f"epoch {epoch}: step {step}, train loss {np.mean(history.losses[-20:]):.3f}, "
                f"validation loss {history.val_losses[-1]:.3f}")
        print(line, flush=True)
        if ns.sample_chars and not ns.quiet:
            prompt = val[0][None, :16]
            text = vocab.decode(model.generate(prompt, ns.sample_chars, rng)[0])
            history.samples.append(text)
            print("-" * 20 + " sample " + "-" * 20 + "\n" + text + "\n" + "-" * 48, flush=True)
        if step >= total:
            break
    history.seconds = time.perf_counter() - start
    print(f"{step} steps in {history.seconds:.1f} s ({step / history.seconds:.2f} steps/s)")
    if ns.plot:
        plot(history, len(loader), ns.plot)
        print(f"loss curves written to {ns.plot}")
    return history


def _tqdm() -> Any:
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        return None


if __name__ == "__main__":
    main()
