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
from ..autograd.tape import no_grad
from .checks import real_number
from .creation import asarray
from .elementwise import FUNCTIONS as E
from .manipulation import where
from .reductions import max as reduce_max
from .reductions import sum as reduce_sum
from .training import _is_int
from .views import reshape

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


@op(grads=("weight",), saves=("input",), aux=True, name="embedding", public=False)
def _lookup(input, weight, padding_idx=None):  # noqa: A002 (PyTorch's name)
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


@_lookup.vjp
def _embedding_vjp(ctx, g):  # aux: the table's rows and the checked padding row
    rows, pad = ctx.aux
    return _core._embedding_backward(g, ctx.input, rows, pad)


def _refuse_unbuilt_gradients(where, scale_grad_by_freq, sparse):
    """PyTorch's embedding options for other gradients: only their default (False) is built;
    anything else raises NotImplementedError naming the option (``where``: the caller)."""
    for name, flag in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
        if flag is not False:
            raise NotImplementedError(f"[{where}] {name}={flag!r} is not built: only the "
                                      "dense, unscaled gradient (False)")


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: A002
              scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` ``(num_embeddings, embedding_dim)`` picked by the integer ids in
    ``input``: ``weight[input]``, shape ``input.shape + (embedding_dim,)``, as
    ``torch.nn.functional.embedding``. Ids outside ``[0, num_embeddings)`` raise
    ``ValueError`` (in a replay of ``fastmetal.compile``: a row of NaN instead). The row
    ``padding_idx`` (if given; negative counts from the end) gets no gradient.
    Differentiable with respect to ``weight``.

    ``max_norm`` (PyTorch's): first, outside the graph and in place, every row the ids pick
    whose ``norm_type``-norm exceeds ``max_norm`` is scaled to ``max_norm / (norm + 1e-7)``
    times itself, as PyTorch's ``embedding_renorm_`` (on the device; a row picked twice is
    written twice with the same value). ``scale_grad_by_freq`` and ``sparse`` are PyTorch's
    options for other gradients; only their default (False) is built.
    """
    _refuse_unbuilt_gradients("fastmetal.embedding", scale_grad_by_freq, sparse)
    if max_norm is not None:
        _renorm_picked_rows(input, weight, max_norm, norm_type)
    return _lookup(input, weight, padding_idx)


def _renorm_picked_rows(input, weight, max_norm, norm_type):
    """PyTorch's embedding_renorm_: the picked rows longer than max_norm, shortened in place."""
    max_norm = real_number(max_norm, "max_norm", "embedding")
    norm_type = real_number(norm_type, "norm_type", "embedding")
    if not max_norm > 0:
        raise ValueError(f"[fastmetal.embedding] expected max_norm > 0, got {max_norm!r}")
    if not norm_type > 0:
        raise ValueError(f"[fastmetal.embedding] expected norm_type > 0, got {norm_type!r}")
    if not isinstance(weight, Array):
        raise TypeError("[fastmetal.embedding] max_norm renormalises weight in place: expected "
                        f"weight to be a fastmetal.Array, got {type(weight).__name__}")
    with no_grad():
        ids = input if isinstance(input, Array) else asarray(np.asarray(input), dtype="int64",
                                                             device=weight.device)
        ids = reshape(ids, -1)
        rows = _core._embedding(ids, weight)  # checks the ids against the table
        size = E["abs"](rows)
        if np.isinf(norm_type):
            norms = reduce_max(size, axis=-1, keepdims=True)
        else:
            norms = E["power"](reduce_sum(E["power"](size, norm_type), axis=-1, keepdims=True),
                               1.0 / norm_type)
        scale = where(E["greater"](norms, max_norm),
                      E["divide"](max_norm, E["add"](norms, 1e-7)), 1.0)
        weight[ids] = E["multiply"](rows, scale)


def one_hot(tensor, num_classes=-1):
    """``(..., num_classes)`` int64 with a 1 at each id's class, as
    ``torch.nn.functional.one_hot``; ``num_classes=-1`` takes ``max(tensor) + 1``. Ids must be
    in ``[0, num_classes)``. Not differentiable (an integer result)."""
    if not _is_int(num_classes):
        raise TypeError(f"[fastmetal.one_hot] expected num_classes to be an int, got "
                        f"{num_classes!r}")
    return _core._one_hot(tensor, int(num_classes))
