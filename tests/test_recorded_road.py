"""Nothing bypasses the recorded road: every public function, given an input that requires
grad, either records a gradient (its float result requires grad and backward reaches the
input) or raises a clear error. A function that silently returns a float result outside
the graph (as fm.dot(x, 3.0) once did) fails here. The walk covers fastmetal.__all__ and
fastmetal.nn.functional.__all__: a new public function needs a call below, or a reason."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.nn import functional as F
from fastmetal.ops.optable import OPS

RNG = np.random.default_rng(0)


def leaf(*shape, device):
    return fm.asarray(RNG.uniform(0.5, 1.5, shape).astype(np.float32), device=device
                      ).requires_grad_()


# name -> call(x, y, device), x and y (3, 4) leaves that require grad.
CALLS = {
    "isnan": lambda x, y, d: fm.isnan(x),
    "signbit": lambda x, y, d: fm.signbit(x),
    "isinf": lambda x, y, d: fm.isinf(x),
    "isfinite": lambda x, y, d: fm.isfinite(x),
    "where": lambda x, y, d: fm.where(x > 1.0, x, y),
    "concatenate": lambda x, y, d: fm.concatenate([x, y], axis=1),
    "stack": lambda x, y, d: fm.stack([x, y]),
    "transpose": lambda x, y, d: fm.transpose(x),
    "permute": lambda x, y, d: fm.permute(x, 1, 0),
    "swapaxes": lambda x, y, d: fm.swapaxes(x, 0, 1),
    "moveaxis": lambda x, y, d: fm.moveaxis(x, 0, 1),
    "squeeze": lambda x, y, d: fm.squeeze(fm.expand_dims(x, 0)),
    "expand_dims": lambda x, y, d: fm.expand_dims(x, 0),
    "divmod": lambda x, y, d: fm.divmod(x, y)[1],
    "sum": lambda x, y, d: fm.sum(x, axis=0),
    "mean": lambda x, y, d: fm.mean(x),
    "var": lambda x, y, d: fm.var(x, axis=1),
    "std": lambda x, y, d: fm.std(x),
    "max": lambda x, y, d: fm.max(x, axis=1),
    "min": lambda x, y, d: fm.min(x),
    "prod": lambda x, y, d: fm.prod(x, axis=0),
    "cumsum": lambda x, y, d: fm.cumsum(x, axis=1),
    "cumprod": lambda x, y, d: fm.cumprod(x, axis=1),
    "matmul": lambda x, y, d: fm.matmul(x, fm.transpose(y)),
    "dot": lambda x, y, d: fm.dot(x, 3.0),
    "linear": lambda x, y, d: fm.linear(x, y),
    "conv2d": lambda x, y, d: fm.conv2d(x.reshape(1, 1, 3, 4), y.reshape(1, 1, 3, 4)[..., :2, :2]),
    "max_pool2d": lambda x, y, d: fm.max_pool2d(x.reshape(1, 1, 3, 4), 2),
    "dropout": lambda x, y, d: fm.dropout(x, 0.5, seed=1),
    "log_softmax": lambda x, y, d: fm.log_softmax(x),
    "cross_entropy": lambda x, y, d: fm.cross_entropy(x, np.array([0, 1, 2])),
    "nll_loss": lambda x, y, d: fm.nll_loss(x, np.array([0, 1, 2])),
    "mse_loss": lambda x, y, d: fm.mse_loss(x, y),
    "binary_cross_entropy": lambda x, y, d: fm.binary_cross_entropy(x * 0.5, y * 0.5),
    "binary_cross_entropy_with_logits": lambda x, y, d: fm.binary_cross_entropy_with_logits(x, y),
    "leaky_relu": lambda x, y, d: F.leaky_relu(x - 1.0, 0.1),
    "elu": lambda x, y, d: F.elu(x - 1.0),
    "dropout2d": lambda x, y, d: F.dropout2d(x.reshape(1, 3, 2, 2), 0.5),
    "l1_loss": lambda x, y, d: F.l1_loss(x, y),
    "smooth_l1_loss": lambda x, y, d: F.smooth_l1_loss(x, y, beta=0.5),
    "huber_loss": lambda x, y, d: F.huber_loss(x, y),
    "kl_div": lambda x, y, d: F.kl_div(fm.log(x), y),
    "softmax": lambda x, y, d: fm.softmax(x, dim=0),
    "logsumexp": lambda x, y, d: fm.logsumexp(x, axis=1),
    "batch_norm": lambda x, y, d: F.batch_norm(x, None, None, y[0], y[1], training=True),
    "group_norm": lambda x, y, d: F.group_norm(x.reshape(1, 3, 4), 3, y[:, 0], y[:, 1]),
    "layer_norm": lambda x, y, d: F.layer_norm(x, (4,), y[0], y[1]),
    "rms_norm": lambda x, y, d: F.rms_norm(x, 4, y[0]),
    "conv1d": lambda x, y, d: F.conv1d(x.reshape(1, 3, 4), y.reshape(1, 3, 4)[..., :2]),
    "conv_transpose2d": lambda x, y, d: F.conv_transpose2d(
        x.reshape(1, 1, 3, 4), y.reshape(1, 1, 3, 4)[..., :2, :2], stride=2),
    "avg_pool2d": lambda x, y, d: F.avg_pool2d(x.reshape(1, 1, 3, 4), 2),
    "adaptive_avg_pool2d": lambda x, y, d: F.adaptive_avg_pool2d(x.reshape(1, 1, 3, 4), (2, 3)),
    "interpolate": lambda x, y, d: F.interpolate(x.reshape(1, 1, 3, 4), scale_factor=2),
    "embedding": lambda x, y, d: F.embedding(np.array([[0, 2], [1, 1]]), x),
    "one_hot": lambda x, y, d: F.one_hot(fm.asarray([0, 2], dtype="int64", device=d)),
    "scaled_dot_product_attention": lambda x, y, d: F.scaled_dot_product_attention(x, y, y),
    "fourier_series": lambda x, y, d: fm.fourier_series(x, y[0], y[1]),
    "gradient": lambda x, y, d: fm.gradient(x, axis=1),
    "derivative": lambda x, y, d: fm.derivative(x),
    # The Array API standard's functions and PyTorch's names (ops/standard.py, ops/habits.py)
    "concat": lambda x, y, d: fm.concat([x, y], axis=1),
    "cat": lambda x, y, d: fm.cat([x, y], dim=1),
    "permute_dims": lambda x, y, d: fm.permute_dims(x, (1, 0)),
    "pow": lambda x, y, d: fm.pow(x, y),
    "clip": lambda x, y, d: fm.clip(x, 0.8, y),
    "clamp": lambda x, y, d: fm.clamp(x, min=y),
    "all": lambda x, y, d: fm.all(x - 1.0, axis=0),
    "any": lambda x, y, d: fm.any(x - 1.0),
    "broadcast_to": lambda x, y, d: fm.broadcast_to(x, (2, 3, 4)),
    "broadcast_arrays": lambda x, y, d: fm.broadcast_arrays(y[0], x)[0],
    "flip": lambda x, y, d: fm.flip(x, axis=0),
    "roll": lambda x, y, d: fm.roll(x, 1, axis=1),
    "repeat": lambda x, y, d: fm.repeat(x, [1, 0, 2], axis=0),
    "tile": lambda x, y, d: fm.tile(x, (2, 1)),
    "tril": lambda x, y, d: fm.tril(x),
    "triu": lambda x, y, d: fm.triu(x, k=1),
    "meshgrid": lambda x, y, d: fm.meshgrid(x[0], y[:, 0])[0],
    "take": lambda x, y, d: fm.take(x, [0, 2, 2], axis=1),
    "tensordot": lambda x, y, d: fm.tensordot(x, y, axes=([1], [1])),
    "vecdot": lambda x, y, d: fm.vecdot(x, y),
    "matrix_transpose": lambda x, y, d: fm.matrix_transpose(x),
    "flatten": lambda x, y, d: fm.flatten(x),
    "unsqueeze": lambda x, y, d: fm.unsqueeze(x, -1),
    "split": lambda x, y, d: fm.split(x, 3, dim=1)[1],
    "chunk": lambda x, y, d: fm.chunk(x, 2)[1],
    "logical_not": lambda x, y, d: fm.logical_not(x),
    "logical_and": lambda x, y, d: fm.logical_and(x, y),
    "logical_or": lambda x, y, d: fm.logical_or(x, y),
    "logical_xor": lambda x, y, d: fm.logical_xor(x, y),
    "count_nonzero": lambda x, y, d: fm.count_nonzero(x),
    "argsort": lambda x, y, d: fm.argsort(x),
    "sort": lambda x, y, d: fm.sort(x, axis=0, descending=True),
    "searchsorted": lambda x, y, d: fm.searchsorted(fm.sort(x[0]), y),
    "unique_values": lambda x, y, d: fm.unique_values(x),
    "unique_counts": lambda x, y, d: fm.unique_counts(x)[1],
    "unique_inverse": lambda x, y, d: fm.unique_inverse(x)[1],
    "unique_all": lambda x, y, d: fm.unique_all(x)[0],
    "nonzero": lambda x, y, d: fm.nonzero(x - 1.0)[1],
    "reshape": lambda x, y, d: fm.reshape(x, (4, 3)),
    "astype": lambda x, y, d: fm.astype(x, fm.float16),
    "positive": lambda x, y, d: fm.positive(x),
    "conj": lambda x, y, d: fm.conj(x),
    "real": lambda x, y, d: fm.real(x),
    "unstack": lambda x, y, d: fm.unstack(x, axis=1)[2],
    "cumulative_sum": lambda x, y, d: fm.cumulative_sum(x, axis=1, include_initial=True),
    "cumulative_prod": lambda x, y, d: fm.cumulative_prod(x, axis=1, include_initial=True),
    "imag": lambda x, y, d: fm.imag(x),
    "diff": lambda x, y, d: fm.diff(x, axis=0, prepend=y[:1]),
    "take_along_axis": lambda x, y, d: fm.take_along_axis(x, fm.argsort(y, axis=1), axis=1),
    # The gradients themselves (the per-layer API before autograd): not differentiable.
    "conv2d_backward": lambda x, y, d: fm.conv2d_backward(
        x.reshape(1, 1, 3, 4)[..., :2, :3], x.reshape(1, 1, 3, 4), y.reshape(1, 1, 3, 4)[..., :2, :2])[0],
    "linear_backward": lambda x, y, d: fm.linear_backward(x, x, y)[0],
    "dropout_backward": lambda x, y, d: fm.dropout_backward(x, 0.5, seed=1),
    "log_softmax_backward": lambda x, y, d: fm.log_softmax_backward(x, y),
    "max_pool2d_backward": lambda x, y, d: fm.max_pool2d_backward(
        x.reshape(1, 1, 3, 4)[..., :1, :2], y.reshape(1, 1, 3, 4), 2),
}
# Public names that take no Array to differentiate (they make leaves, name devices or
# transform functions) or whose float result is piecewise constant, so outside the graph by
# design, as PyTorch's (comparisons there give bool).
NOT_OPS = {"Array", "asarray", "default_device", "devices", "empty", "ones", "zeros",
           "set_default_device", "synchronize", "arange", "linspace", "full", "zeros_like",
           "ones_like", "full_like", "empty_like", "grad", "value_and_grad", "no_grad",
           "enable_grad", "is_grad_enabled", "set_grad_enabled", "argmax", "argmin", "manual_seed",
           "save", "load", "compile", "CompileWarning",
           # dtype introspection; creation and random draws (they make leaves)
           "finfo", "iinfo", "isdtype", "result_type", "can_cast", "eye", "randn", "rand",
           "randint", "randn_like", "rand_like", "from_numpy", "__array_namespace_info__",
           # an import (as torch.from_dlpack: the result is a new leaf over the same memory)
           "from_dlpack",
           # integer and bool results: no gradient by design (floats are a TypeError)
           "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
           "bitwise_right_shift", "bitwise_invert", "left_shift", "right_shift", "invert",
           "bitwise_not"}
# all / any: reductions of comparisons (bool in PyTorch).
PIECEWISE_CONSTANT = {s.name for s in OPS if s.public and not s.grads} | {
    "all", "any", "logical_not", "logical_and", "logical_or", "logical_xor", "isnan", "isinf",
    "isfinite", "signbit", "imag",  # imag of a real number: the constant 0
    "unique_values", "unique_all"}  # unique: which values is an index decision


def _public_functions():
    names = set()
    for module in (fm, F):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or callable(obj) and not inspect.isclass(obj) \
                    and not inspect.ismodule(obj):
                names.add(name)
    return sorted(names - {"__version__"})


def _call(name, x, y, device):
    if name in CALLS:
        return CALLS[name](x, y, device)
    spec = next((s for s in OPS if s.name == name), None)
    assert spec is not None, (f"{name} is public but has no call in CALLS (nor a reason in "
                              "NOT_OPS): add one so the walk covers it")
    fn = getattr(fm, name)
    return fn(x) if spec.arity == 1 else fn(x, y)


@pytest.mark.parametrize("name", [n for n in _public_functions() if n not in NOT_OPS])
def test_every_public_function_records_or_refuses(name, device):
    x, y = leaf(3, 4, device=device), leaf(3, 4, device=device)
    try:
        out = _call(name, x, y, device)
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
        assert str(e).startswith("[fastmetal."), f"{name}: an unclear error: {e!r}"
        return
    assert isinstance(out, fm.Array), f"{name} returned {type(out).__name__} for Array input"
    if out.dtype.kind != "f" or name in PIECEWISE_CONSTANT:
        assert not out.requires_grad
        return
    assert out.requires_grad, (f"fastmetal.{name} returned a float result outside the graph "
                               "for an input that requires grad (a silently lost gradient)")
    fm.sum(out * out).backward()
    assert x.grad is not None or y.grad is not None, f"{name}: backward reached no input"


def test_the_walk_covers_every_public_function():
    missing = [n for n in _public_functions()
               if n not in CALLS and n not in NOT_OPS and not any(s.name == n for s in OPS)]
    assert not missing, f"add calls for: {missing}"


def test_dot_with_a_scalar_keeps_the_gradient(device):
    # fm.dot(x, 3.0) once called the kernel directly: requires_grad False, a lost gradient.
    x = leaf(3, device=device)
    out = fm.dot(x, 3.0)
    assert out.requires_grad
    fm.sum(out).backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(3, 3.0, np.float32))


def test_concatenate_records_through_op(device):
    x, y = leaf(2, 3, device=device), leaf(2, 1, device=device)
    out = fm.concatenate([x, y], axis=1)
    assert type(out.grad_fn).__name__ == "Node" and repr(out.grad_fn) == "<ConcatenateBackward>"
    (out * fm.asarray(np.arange(8, dtype=np.float32).reshape(2, 4), device=device)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[0, 1, 2], [4, 5, 6]])
    np.testing.assert_array_equal(y.grad.numpy(), [[3], [7]])
    # Flattened inputs (axis=None) get their gradients back in their shapes.
    a, b = leaf(2, 2, device=device), leaf(3, device=device)
    fm.concatenate([a, b], axis=None).sum().backward()
    assert a.grad.shape == (2, 2) and b.grad.shape == (3,)
