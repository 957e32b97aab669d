"""A character-level language model: embedding -> 2-layer LSTM -> linear, trained on text,
written as a PyTorch user writes it (``fm.nn``, ``fm.optim``, ``clip_grad_norm_``).

Data: ``--data FILE`` (any text), or by default the Python standard library's own source
(a few modules from ``os.path.dirname(os.__file__)``: on every machine, no download). The
characters are numbered by sorted order; the last 10% of the text is the validation split.
Each step trains on ``--batch-size`` random windows of ``--seq-len`` characters (the target:
the window shifted by one). Every epoch (``--steps-per-epoch`` steps) prints the validation
loss (nats per character) and a sampled text; ``--plot DIR`` saves the loss curves
(matplotlib, if installed).

    python examples/lstm.py [--epochs 5] [--data FILE] [--device cpu] [--plot DIR]
"""
from __future__ import annotations

import argparse
import importlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

import fastmetal as fm
from fastmetal import nn, optim

# Standard-library modules of plain Python source, present in every CPython install.
STDLIB_FILES = ("textwrap.py", "argparse.py", "string.py", "os.py", "functools.py",
                "dataclasses.py", "json/encoder.py", "json/decoder.py", "shutil.py")


def load_text(path: str | None, max_chars: int) -> str:
    """The training text: the file at `path`, else the standard library sources above."""
    if path is not None:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    else:
        root = Path(os.path.dirname(os.__file__))
        text = "\n".join((root / f).read_text(encoding="utf-8", errors="replace")
                         for f in STDLIB_FILES if (root / f).exists())
    if len(text) < 1000:
        raise ValueError(f"expected at least 1,000 characters of text, got {len(text)}")
    return text[:max_chars]


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, layers: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, dropout=dropout, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: Any, state: Any = None) -> tuple[Any, Any]:
        out, state = self.lstm(self.embed(ids), state)
        return self.head(out), state


class Batches:
    """Random windows of a text's ids: (inputs, targets) int64 (batch, seq_len) each."""

    def __init__(self, ids: np.ndarray, batch: int, seq_len: int, seed: int):
        self.ids, self.batch, self.seq_len = ids, batch, seq_len
        self.rng = np.random.default_rng(seed)

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self.rng.integers(0, len(self.ids) - self.seq_len - 1, size=self.batch)
        w = self.ids[starts[:, None] + np.arange(self.seq_len + 1)]
        return w[:, :-1], w[:, 1:]


def step_loss(model: CharLSTM, loss_fn: Any, x: np.ndarray, y: np.ndarray) -> Any:
    logits, _ = model(x)
    return loss_fn(logits.reshape((-1, logits.shape[-1])), y.reshape(-1))


def evaluate(model: CharLSTM, loss_fn: Any, batches: Batches, n: int) -> float:
    model.eval()
    with fm.no_grad():
        loss = float(np.mean([step_loss(model, loss_fn, *batches.next()).item()
                              for _ in range(n)]))
    model.train()
    return loss


def sample(model: CharLSTM, chars: str, prime: str, length: int, temperature: float,
           rng: np.random.Generator) -> str:
    """Text generated one character at a time, carrying the LSTM's (h, c) along."""
    index = {c: i for i, c in enumerate(chars)}
    ids = [index.get(c, 0) for c in prime] or [0]
    out = []
    model.eval()
    with fm.no_grad():
        logits, state = model(np.array([ids], np.int64))
        for _ in range(length):
            z = logits.numpy()[0, -1].astype(np.float64) / temperature
            p = np.exp(z - z.max())
            nxt = int(rng.choice(len(p), p=p / p.sum()))
            out.append(chars[nxt])
            logits, state = model(np.array([[nxt]], np.int64), state)
    model.train()
    return prime + "".join(out)


def progress_bar(total: int, desc: str, quiet: bool) -> Any:
    if quiet:
        return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="step", leave=False)


def save_plot(directory: str, history: dict[str, Any]) -> Path:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "lstm_loss.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(history["train"]) + 1), history["train"], lw=0.8, label="train")
    ax.plot(history["val_step"], history["val"], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per character)")
    ax.set_title("fastmetal char-LSTM")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Text, vocabulary, model, optimizer and batch streams: what main() trains (and what a
    test drives step by step)."""
    fm.manual_seed(args.seed)
    text = load_text(args.data, args.max_chars)
    chars = "".join(sorted(set(text)))
    lookup = np.zeros(max(map(ord, chars)) + 1, np.int64)  # code point -> id
    lookup[[ord(c) for c in chars]] = np.arange(len(chars))
    data = lookup[np.frombuffer(text.encode("utf-32-le"), np.uint32)]
    split = int(len(data) * 0.9)
    model = CharLSTM(len(chars), args.embed, args.hidden, args.layers, args.dropout)
    if args.device:
        model.to(args.device)
    return {"chars": chars, "model": model,
            "optimizer": optim.Adam(model.parameters(), lr=args.lr),
            "loss_fn": nn.CrossEntropyLoss(),
            "train": Batches(data[:split], args.batch_size, args.seq_len, args.seed),
            "val": Batches(data[split:], args.batch_size, args.seq_len, args.seed + 1)}


def train_step(parts: dict[str, Any], clip: float) -> Any:
    model, opt = parts["model"], parts["optimizer"]
    x, y = parts["train"].next()
    loss = step_loss(model, parts["loss_fn"], x, y)
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--data", default=None, help="a text file (default: stdlib sources)")
    ap.add_argument("--max-chars", type=int, default=400_000, help="characters of text used")
    ap.add_argument("--epochs", type=int, default=5, help="epochs")
    ap.add_argument("--steps-per-epoch", type=int, default=200, help="training steps an epoch")
    ap.add_argument("--batch-size", type=int, default=32, help="windows per step")
    ap.add_argument("--seq-len", type=int, default=64, help="characters per window")
    ap.add_argument("--embed", type=int, default=64, help="embedding size")
    ap.add_argument("--hidden", type=int, default=256, help="LSTM hidden size")
    ap.add_argument("--layers", type=int, default=2, help="LSTM layers")
    ap.add_argument("--dropout", type=float, default=0.1, help="dropout between LSTM layers")
    ap.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    ap.add_argument("--clip", type=float, default=1.0, help="gradient norm clip")
    ap.add_argument("--val-batches", type=int, default=8, help="validation batches an epoch")
    ap.add_argument("--sample-chars", type=int, default=200, help="sampled characters an epoch")
    ap.add_argument("--seed", type=int, default=0, help="seeds weights, batches and sampling")
    ap.add_argument("--device", default=None, help=f"one of {fm.devices()}")
    ap.add_argument("--plot", default=None, help="directory for lstm_loss.png (matplotlib)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar or samples")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parser().parse_args(argv)
    parts = build(args)
    print(f"{len(parts['train'].ids) + len(parts['val'].ids):,} characters, vocabulary "
          f"{len(parts['chars'])}; {sum(p.size for p in parts['model'].parameters()):,} "
          f"parameters on {args.device or fm.default_device()}")
    history: dict[str, Any] = {"train": [], "val": [], "val_step": []}
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        bar = progress_bar(args.steps_per_epoch, f"epoch {epoch}", args.quiet)
        for _ in range(args.steps_per_epoch):
            history["train"].append(train_step(parts, args.clip).item())
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{history['train'][-1]:.3f}", refresh=False)
        if bar is not None:
            bar.close()
        val = evaluate(parts["model"], parts["loss_fn"], parts["val"], args.val_batches)
        history["val"].append(val)
        history["val_step"].append(len(history["train"]))
        print(f"epoch {epoch}: train {np.mean(history['train'][-args.steps_per_epoch:]):.3f}, "
              f"validation {val:.3f} nats/char ({time.perf_counter() - t0:.0f} s)")
        if not args.quiet and args.sample_chars > 0:
            print("  " + sample(parts["model"], parts["chars"], "def ", args.sample_chars,
                                0.8, rng).replace("\n", "\n  "))
    if args.plot:
        try:
            print(f"saved {save_plot(args.plot, history)}")
        except ImportError:
            print("--plot needs matplotlib (pip install matplotlib)")
    return history


if __name__ == "__main__":
    main()
