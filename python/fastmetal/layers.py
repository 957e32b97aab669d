"""The layers of a small CNN besides Conv2d: Linear, ReLU, MaxPool2d, Dropout, Flatten,
LogSoftmax, Sequential and CrossEntropyLoss (exported from ``fastmetal.nn``).

As ``nn.Conv2d``: no autograd. ``forward(x)`` (or calling the layer) remembers what
``backward`` needs; ``backward(grad_output)`` returns the gradient of the layer's input and
stores parameter gradients in ``.weight_grad`` / ``.bias_grad`` (overwritten, not
accumulated). ``parameters()`` returns a :class:`Parameters` list, which the optimizers of
``fastmetal.nn.optim`` take.
"""
from __future__ import annotations

import inspect
import math
import numbers
import sys

import numpy as np

from . import _core
from . import training as F

__all__ = ["Module", "Parameters", "Linear", "ReLU", "MaxPool2d", "Dropout", "Flatten",
           "LogSoftmax", "Sequential", "CrossEntropyLoss"]


def _fm():
    # fastmetal itself, looked up at call time (linear comes from another part of the package).
    return sys.modules["fastmetal"]


class Parameters(list):
    """The parameter arrays of a layer (a plain list of them), remembering which layer
    attribute each one is, so that an optimizer finds its gradient (``<name>_grad`` on the
    same layer) and updates it in place."""

    def __init__(self, slots=()):
        self.slots = [(owner, name) for owner, name in slots]
        super().__init__(getattr(owner, name) for owner, name in self.slots)


def _slots(layer):
    """(layer, attribute) pairs of the parameters of any layer: ours, or one like nn.Conv2d
    that has .weight/.bias."""
    if isinstance(layer, Module):
        return layer._slots()
    out = []
    for name in ("weight", "bias"):
        if getattr(layer, name, None) is not None:
            out.append((layer, name))
    return out


_TAKES_INPUT_GRAD = {}  # backward function -> whether it accepts input_grad=


def _takes_input_grad(layer):
    fn = getattr(type(layer), "backward", None)
    if fn not in _TAKES_INPUT_GRAD:
        try:
            _TAKES_INPUT_GRAD[fn] = "input_grad" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            _TAKES_INPUT_GRAD[fn] = False
    return _TAKES_INPUT_GRAD[fn]


def _to_numpy(a):
    return a.numpy() if isinstance(a, _core.Array) else np.asarray(a)


def _check_forward_called(saved, cls):
    if saved is None:
        raise ValueError(f"[fastmetal.nn.{cls}] expected forward() to be called before "
                         "backward(), got no saved input")


def _reshape(x, shape):
    """x viewed with another shape: a view sharing memory for contiguous fastmetal.Arrays on
    any device (a gathered copy for strided ones) and for NumPy arrays where NumPy can."""
    if isinstance(x, _core.Array):
        try:
            return _core._reshaped_view(x, list(shape))
        except ValueError:  # strided: gather through the host first
            return _core.asarray(np.ascontiguousarray(x.numpy()).reshape(shape), device=x.device)
    return np.reshape(x, shape)


class Module:
    """Base of the layers: train/eval mode, parameters, gradients and state dicts."""

    training = True
    _param_names: tuple = ()

    def _slots(self):
        return [(self, n) for n in self._param_names if getattr(self, n, None) is not None]

    def parameters(self):
        return Parameters(self._slots())

    def named_parameters(self):
        return [(name, getattr(owner, name)) for name, (owner, _) in
                zip(self._names(), self._slots())]

    def _names(self):
        return [n for _, n in self._slots()]

    def zero_grad(self):
        for owner, name in self._slots():
            setattr(owner, name + "_grad", None)

    def train(self, mode=True):
        if not isinstance(mode, (bool, np.bool_)):
            raise TypeError(f"[fastmetal.nn.{type(self).__name__}] expected mode to be True "
                            f"or False, got {mode!r}")
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def state_dict(self):
        """Parameter copies as NumPy float32 arrays by name (``numpy.savez(f, **sd)``)."""
        return {name: np.array(_to_numpy(getattr(owner, attr)), dtype=np.float32, copy=True)
                for name, (owner, attr) in zip(self._names(), self._slots())}

    def load_state_dict(self, state):
        """Copy parameters from a mapping of NumPy arrays (such as ``numpy.load`` of a file
        that ``numpy.savez(f, **state_dict())`` wrote). Keys and shapes must match."""
        cls = type(self).__name__
        names = self._names()
        keys = list(state.keys())
        if sorted(keys) != sorted(names):
            raise ValueError(f"[fastmetal.nn.{cls}] expected state_dict keys {sorted(names)}, "
                             f"got {sorted(keys)}")
        values = {}
        for name, (owner, attr) in zip(names, self._slots()):
            cur = getattr(owner, attr)
            new = np.asarray(state[name])
            if new.shape != tuple(cur.shape):
                raise ValueError(f"[fastmetal.nn.{cls}] expected {name} of shape "
                                 f"{tuple(cur.shape)}, got {new.shape}")
            if new.dtype.kind not in "fiu":
                raise TypeError(f"[fastmetal.nn.{cls}] expected {name} with a real dtype, "
                                f"got {new.dtype}")
            if isinstance(cur, np.ndarray) and not cur.flags.writeable:
                # checked for all before copying any: a failure loads nothing
                raise ValueError(f"[fastmetal.nn.{cls}] expected writeable parameters, got "
                                 f"{name} read-only (it views memory that is not writeable)")
            values[name] = new
        for name, (owner, attr) in zip(names, self._slots()):
            cur = getattr(owner, attr)
            if isinstance(cur, _core.Array):
                setattr(owner, attr, _core.asarray(values[name].astype(np.float32),
                                                   device=cur.device))
            else:
                np.copyto(cur, values[name], casting="unsafe")

    def __call__(self, *args):
        return self.forward(*args)


def _rng_for(cls, seed, rng):
    if seed is not None and rng is not None:
        raise ValueError(f"[fastmetal.nn.{cls}] expected at most one of seed and rng, got both")
    if rng is None:
        return np.random.default_rng(seed)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"[fastmetal.nn.{cls}] expected rng to be a numpy.random.Generator, "
                        f"got {type(rng).__name__}")
    return rng


def _positive_int(value, name, cls):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be a positive int, "
                        f"got {value!r}")
    if value < 1:
        raise ValueError(f"[fastmetal.nn.{cls}] expected {name} to be a positive int, "
                         f"got {value!r}")
    return int(value)


def _check_bool(value, name, cls):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be True or False, "
                        f"got {value!r}")


class Linear(Module):
    """``y = x @ weight.T + bias``, as ``torch.nn.Linear``: weight ``(out_features,
    in_features)`` and bias ``(out_features,)`` uniform in ``[-1/sqrt(in), 1/sqrt(in)]``
    (PyTorch's ``kaiming_uniform_(a=sqrt(5))``). Keyword extras as ``nn.Conv2d``: ``seed``,
    ``rng``, ``device``. Runs ``fastmetal.linear`` / ``fastmetal.linear_backward``."""

    _param_names = ("weight", "bias")

    def __init__(self, in_features, out_features, bias=True, *, seed=None, rng=None,
                 device=None):
        self.in_features = _positive_int(in_features, "in_features", "Linear")
        self.out_features = _positive_int(out_features, "out_features", "Linear")
        _check_bool(bias, "bias", "Linear")
        rng = _rng_for("Linear", seed, rng)
        bound = 1.0 / math.sqrt(self.in_features)
        w = rng.uniform(-bound, bound, size=(self.out_features, self.in_features))
        b = rng.uniform(-bound, bound, size=self.out_features) if bias else None
        w = w.astype(np.float32)
        b = None if b is None else b.astype(np.float32)
        self.device = device
        if device is not None:
            w = _core.asarray(w, device=device)
            b = None if b is None else _core.asarray(b, device=device)
        self.weight, self.bias = w, b
        self.weight_grad = self.bias_grad = None
        self._input = None

    def forward(self, x):
        y = _fm().linear(x, self.weight, self.bias)
        self._input = x
        return y

    def backward(self, grad_output, *, input_grad=True):
        """``input_grad=False`` skips the gradient with respect to the input (returns None)."""
        _check_forward_called(self._input, "Linear")
        needs = ("input",) if input_grad else ()
        needs += ("weight", "bias") if self.bias is not None else ("weight",)
        gx, gw, gb = _fm().linear_backward(grad_output, self._input, self.weight, needs=needs)
        self.weight_grad, self.bias_grad = gw, gb
        return gx

    def __repr__(self):
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None})")


class ReLU(Module):
    """``max(x, 0)``; the gradient passes where ``x > 0`` (as PyTorch)."""

    def __init__(self):
        self._input = None

    def forward(self, x):
        y = _fm().relu(x)
        self._input = x
        return y

    def backward(self, grad_output):
        _check_forward_called(self._input, "ReLU")
        return _core._relu_backward(grad_output, self._input)

    def __repr__(self):
        return "ReLU()"


class MaxPool2d(Module):
    """:func:`fastmetal.max_pool2d` as a layer."""

    def __init__(self, kernel_size, stride=None, padding=0):
        F._pool_spec(kernel_size, stride, padding, "nn.MaxPool2d")  # validate now
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self._input = None

    def forward(self, x):
        y = F.max_pool2d(x, self.kernel_size, self.stride, self.padding)
        self._input = x
        return y

    def backward(self, grad_output):
        _check_forward_called(self._input, "MaxPool2d")
        return F.max_pool2d_backward(grad_output, self._input, self.kernel_size, self.stride,
                                     self.padding)

    def __repr__(self):
        return f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, " \
               f"padding={self.padding})"


class Dropout(Module):
    """:func:`fastmetal.dropout` as a layer: in training mode each forward call draws a new
    mask (seeds ``seed0, seed0 + 1, ...`` where ``seed0`` comes from ``seed``/``rng``, so a
    seed makes the whole sequence reproducible on every device); in eval mode the identity."""

    def __init__(self, p=0.5, *, seed=None, rng=None):
        F._dropout_key(p, 0, "nn.Dropout")
        self.p = float(p)
        rng = _rng_for("Dropout", seed, rng)
        self._next_seed = int(rng.integers(0, 2**63))
        self._seed = None

    def forward(self, x):
        if not self.training or self.p == 0.0:
            self._seed = -1  # identity: the backward passes the gradient through
            return x
        seed = self._next_seed
        y = F.dropout(x, self.p, seed=seed)
        self._seed = seed
        self._next_seed = (seed + 1) % 2**64
        return y

    def backward(self, grad_output):
        _check_forward_called(self._seed, "Dropout")
        if self._seed == -1:
            return grad_output
        return F.dropout_backward(grad_output, self.p, seed=self._seed)

    def __repr__(self):
        return f"Dropout(p={self.p})"


class Flatten(Module):
    """Merges dims ``start_dim .. end_dim`` (default: all but the batch dim)."""

    def __init__(self, start_dim=1, end_dim=-1):
        for name, v in (("start_dim", start_dim), ("end_dim", end_dim)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
                raise TypeError(f"[fastmetal.nn.Flatten] expected {name} to be an int, got {v!r}")
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)
        self._shape = None

    def forward(self, x):
        shape = tuple(x.shape)
        nd = len(shape)
        s = self.start_dim + nd if self.start_dim < 0 else self.start_dim
        e = self.end_dim + nd if self.end_dim < 0 else self.end_dim
        if not (0 <= s < max(nd, 1) and 0 <= e < max(nd, 1) and s <= e):
            raise ValueError(f"[fastmetal.nn.Flatten] expected start_dim <= end_dim inside a "
                             f"{nd}-D input, got start_dim={self.start_dim}, "
                             f"end_dim={self.end_dim}")
        new = shape[:s] + (int(np.prod(shape[s:e + 1], dtype=np.int64)),) + shape[e + 1:]
        self._shape = shape
        return _reshape(x, new)

    def backward(self, grad_output):
        _check_forward_called(self._shape, "Flatten")
        return _reshape(grad_output, self._shape)

    def __repr__(self):
        return f"Flatten(start_dim={self.start_dim}, end_dim={self.end_dim})"


class LogSoftmax(Module):
    """:func:`fastmetal.log_softmax` along ``dim`` as a layer."""

    def __init__(self, dim=-1):
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"[fastmetal.nn.LogSoftmax] expected dim to be an int, got {dim!r}")
        self.dim = int(dim)
        self._output = None

    def forward(self, x):
        y = F.log_softmax(x, self.dim)
        self._output = y
        return y

    def backward(self, grad_output):
        _check_forward_called(self._output, "LogSoftmax")
        return F.log_softmax_backward(grad_output, self._output, self.dim)

    def __repr__(self):
        return f"LogSoftmax(dim={self.dim})"


class Sequential(Module):
    """Layers applied in order; ``backward`` runs through them in reverse. Parameter names
    in ``state_dict()`` are ``"<index>.weight"`` / ``"<index>.bias"`` as PyTorch's."""

    def __init__(self, *layers):
        for i, layer in enumerate(layers):
            if not (callable(getattr(layer, "forward", None))
                    and callable(getattr(layer, "backward", None))):
                raise TypeError(f"[fastmetal.nn.Sequential] expected layers with forward() "
                                f"and backward(), got {type(layer).__name__} at index {i}")
        self.layers = list(layers)

    def __getitem__(self, i):
        return self.layers[i]

    def __len__(self):
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def _slots(self):
        return [s for layer in self.layers for s in _slots(layer)]

    def _names(self):
        return [f"{i}.{name}" for i, layer in enumerate(self.layers)
                for _, name in _slots(layer)]

    def train(self, mode=True):
        super().train(mode)
        for layer in self.layers:
            if hasattr(layer, "train"):
                layer.train(mode)
            else:
                layer.training = bool(mode)
        return self

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def backward(self, grad_output, *, input_grad=True):
        """Gradients of every layer, in reverse; returns the gradient with respect to the
        input. ``input_grad=False`` (a training step, where nobody reads it) skips it, as
        PyTorch does for inputs that do not require grad: layers before the first one with
        parameters are not run backward, and that one computes only its parameters'
        gradients. Returns None then."""
        first = 0
        if not input_grad:
            with_params = [i for i, layer in enumerate(self.layers) if _slots(layer)]
            if not with_params:
                return None
            first = with_params[0]
        for i in range(len(self.layers) - 1, first - 1, -1):
            layer = self.layers[i]
            if i == first and not input_grad:
                if _takes_input_grad(layer):
                    layer.backward(grad_output, input_grad=False)
                else:  # a layer without the keyword computes it anyway
                    layer.backward(grad_output)
                return None
            grad_output = layer.backward(grad_output)
        return grad_output

    def __repr__(self):
        inner = "".join(f"\n  ({i}): {layer!r}" for i, layer in enumerate(self.layers))
        return f"Sequential({inner}\n)"


class CrossEntropyLoss(Module):
    """``CrossEntropyLoss()(logits, labels)`` returns ``(loss, grad_logits)``
    (:func:`fastmetal.cross_entropy`, mean reduction); ``backward()`` returns the last
    ``grad_logits`` again."""

    def __init__(self):
        self._grad = None

    def forward(self, logits, labels):
        loss, grad = F.cross_entropy(logits, labels)
        self._grad = grad
        return loss, grad

    def backward(self, grad_output=None):
        _check_forward_called(self._grad, "CrossEntropyLoss")
        return self._grad

    def __repr__(self):
        return "CrossEntropyLoss()"
