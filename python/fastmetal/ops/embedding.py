"""Embedding lookup and one_hot, as ``torch.nn.functional.embedding`` / ``one_hot``.

Token ids are an int64 ``fastmetal.Array`` (``fm.asarray(ids, dtype="int64")``) or NumPy
integers / Python ints; they are checked against the table on the host (one copy of the
ids). A replay of ``fastmetal.compile`` runs no host code: there the kernels check each id
themselves (an out-of-range id reads a row of NaN and adds nothing to the gradient), and on a
discrete GPU the traced call does not read the ids either (that read would wait for the
device and make the step uncapturable). The weight's gradient is a device-side scatter-add that is deterministic: every row is
the sum of its positions' gradient rows in increasing position order, the same bits on
every run, thread count and device path (``metal/embedding.metal``).
"""
from __future__ import annotations

import numpy as np

from .. import _core
from .._core import Array
from ..autograd.declare import op
from .training import _is_int

__all__ = ["embedding", "one_hot"]


def _padding_idx(padding_idx, rows, where):
    """PyTorch's padding_idx: None, or an int in [-rows, rows) (negative counts from the end);
    -1 (none) or the row, for the kernel."""
    if padding_idx is None:
        return -1
    if not _is_int(padding_idx):
        raise TypeError(f"[fastmetal.{where}] expected padding_idx to be None or an int, "
                        f"got {padding_idx!r}")
    if not -rows <= padding_idx < rows:
        raise ValueError(f"[fastmetal.{where}] expected padding_idx in [-{rows}, {rows}) "
                         f"(num_embeddings = {rows}), got {padding_idx}")
    return int(padding_idx) % rows


@op(grads=("weight",), saves=("input",), aux=True)
def embedding(input, weight, padding_idx=None):  # noqa: A002 (PyTorch's name)
    """Rows of ``weight`` ``(num_embeddings, embedding_dim)`` picked by the integer ids in
    ``input``: ``weight[input]``, shape ``input.shape + (embedding_dim,)``, as
    ``torch.nn.functional.embedding``. Ids outside ``[0, num_embeddings)`` raise
    ``ValueError`` (in a replay of ``fastmetal.compile``: a row of NaN instead). The row ``padding_idx`` (if given; negative counts from the end) gets no
    gradient. Differentiable with respect to ``weight``.
    """
    shape = tuple(weight.shape) if isinstance(weight, Array) else np.shape(weight)
    if len(shape) != 2:
        raise ValueError(f"[fastmetal.embedding] expected a 2-D weight (num_embeddings, "
                         f"embedding_dim), got shape {shape}")
    pad = _padding_idx(padding_idx, shape[0], "embedding")
    return _core._embedding(input, weight), (shape[0], pad)


@embedding.vjp
def _embedding_vjp(ctx, g):  # aux: the table's rows and the checked padding row
    rows, pad = ctx.aux
    return _core._embedding_backward(g, ctx.input, rows, pad)


def one_hot(tensor, num_classes=-1):
    """``(..., num_classes)`` int64 with a 1 at each id's class, as
    ``torch.nn.functional.one_hot``; ``num_classes=-1`` takes ``max(tensor) + 1``. Ids must be
    in ``[0, num_classes)``. Not differentiable (an integer result)."""
    if not _is_int(num_classes):
        raise TypeError(f"[fastmetal.one_hot] expected num_classes to be an int, got "
                        f"{num_classes!r}")
    return _core._one_hot(tensor, int(num_classes))
