"""Recurrent layers, as ``torch.nn``'s: RNN, LSTM, GRU and their cells RNNCell, LSTMCell,
GRUCell, with PyTorch's arguments, parameter names (``weight_ih_l0``, ...,
``bias_hh_l1_reverse``), gate order (LSTM i, f, g, o; GRU r, z, n) and initialisation, so a
PyTorch model's ``state_dict()`` loads and gives the same outputs. The time loops are
``fastmetal.ops.recurrent``'s (one input product per layer, one fused gate kernel a step).

A layer computes in its parameters' dtype: float32, or float64 after ``.double()`` (on the
devices with double: cpu, cuda). Input and states must have it, as in PyTorch (ValueError
for a layer's input, RuntimeError for the states and the cells'); NumPy arrays and lists
are converted to it."""
from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from ..._core import Array
from ...ops import recurrent as _rec
from ...ops.checks import check_bool, positive_int
from ...ops.creation import asarray, zeros
from .. import init
from .module import Module

__all__ = ['RNN', 'LSTM', 'GRU', 'RNNCell', 'LSTMCell', 'GRUCell']

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_COMPUTE = {np.dtype(np.float32), np.dtype(np.float64)}  # the gate kernels' dtypes


def _shape(a):
    return tuple(int(s) for s in np.shape(a))


def _nonlinearity(value, cls):
    if value not in ("tanh", "relu"):
        raise ValueError(f"[fastmetal.nn.{cls}] expected nonlinearity 'tanh' or 'relu', "
                         f"got {value!r}")
    return "RNN_TANH" if value == "tanh" else "RNN_RELU"


def _layer_dtype(weights, cls):
    """The dtype the layer computes in: its parameters' (one of float32, float64)."""
    dtypes = {w.dtype for w in weights if w is not None}
    if len(dtypes) != 1 or not dtypes <= _COMPUTE:
        raise TypeError(f"[fastmetal.nn.{cls}] expected float32 or float64 parameters of one "
                        f"dtype (module.float() or module.double()), got "
                        f"{sorted(str(d) for d in dtypes)}")
    return dtypes.pop()


def _array(x, device, dtype, name, cls, error=RuntimeError):
    """x as a fastmetal Array of the layer's dtype on its device (NumPy and lists are
    converted and uploaded; an Array of another dtype raises ``error``, PyTorch's class)."""
    if isinstance(x, Array):
        if x.dtype != dtype:
            raise error(f"[fastmetal.nn.{cls}] expected {name} of the parameters' dtype "
                        f"{dtype}, got {x.dtype} (convert it: {name.split(' ')[0]}.to({dtype}), "
                        f"or the module: module.to({x.dtype}))")
        return x
    host = np.asarray(x)
    if host.dtype.kind not in "fiu":
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be a real array, got dtype "
                        f"{host.dtype}")
    return asarray(host.astype(dtype), device=device)


def _uniform_parameters(module, names_shapes, hidden_size, seed, rng, device, cls):
    """PyTorch's reset_parameters: every parameter, in registration order, from
    U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)); from fastmetal.random (``fm.manual_seed`` /
    ``fm.random.seed``) unless ``seed`` / ``rng`` give the layer its own generator."""
    gen = init._rng_for(cls, seed, rng)
    bound = 1.0 / math.sqrt(hidden_size)
    for name, shape in names_shapes:
        setattr(module, name, init._uniform_parameter(gen, bound, shape, device))


class RNNBase(Module):
    """What RNN, LSTM and GRU share: the arguments, parameters and forward of
    ``torch.nn.RNNBase`` (``proj_size`` is not supported)."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, *, seed=None, rng=None,
                 device=None):
        super().__init__()
        cls = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(mode, mode)
        self.mode = mode
        self.input_size = positive_int(input_size, "input_size", cls)
        self.hidden_size = positive_int(hidden_size, "hidden_size", cls)
        self.num_layers = positive_int(num_layers, "num_layers", cls)
        for name, flag in (("bias", bias), ("batch_first", batch_first),
                           ("bidirectional", bidirectional)):
            check_bool(flag, name, cls)
        if isinstance(dropout, (bool, np.bool_)) or not isinstance(dropout, numbers.Real) \
                or not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(f"[fastmetal.nn.{cls}] expected dropout to be a number in [0, 1] "
                             f"(the probability of an element being zeroed), got {dropout!r}")
        if dropout > 0 and self.num_layers == 1:
            warnings.warn(f"[fastmetal.nn.{cls}] dropout={dropout} acts between layers, so "
                          "with num_layers=1 it does nothing (as in PyTorch)", UserWarning,
                          stacklevel=2)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self._cls = cls
        D = 2 if bidirectional else 1
        G = _GATES[mode] * self.hidden_size
        names = []
        for layer in range(self.num_layers):
            in_size = self.input_size if layer == 0 else self.hidden_size * D
            for d in range(D):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                names += [(f"weight_ih{sfx}", (G, in_size)),
                          (f"weight_hh{sfx}", (G, self.hidden_size))]
                if bias:
                    names += [(f"bias_ih{sfx}", (G,)), (f"bias_hh{sfx}", (G,))]
        self._flat_weights_names = [n for n, _ in names]
        _uniform_parameters(self, names, self.hidden_size, seed, rng, device, cls)
        gen = init._rng_for(cls, seed, rng)
        self._next_seed = init._seed_for(gen)

    def _weights(self):
        D = 2 if self.bidirectional else 1
        out = []
        for layer in range(self.num_layers):
            for d in range(D):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                b_ih = getattr(self, f"bias_ih{sfx}") if self.bias else None
                b_hh = getattr(self, f"bias_hh{sfx}") if self.bias else None
                out.append((getattr(self, f"weight_ih{sfx}"), getattr(self, f"weight_hh{sfx}"),
                            b_ih, b_hh))
        return out

    def _seed(self):
        seed = self._next_seed
        self._next_seed = (seed + 1) % 2**64
        return seed

    def _check_state(self, h, name, want, batched):
        if not batched and np.ndim(h) != 2:
            raise RuntimeError(f"[fastmetal.nn.{self._cls}] expected {name} to be 2-D for "
                               f"unbatched 2-D input, got a {np.ndim(h)}-D array")
        if batched and np.ndim(h) != 3:
            raise RuntimeError(f"[fastmetal.nn.{self._cls}] expected {name} to be 3-D for "
                               f"batched 3-D input, got a {np.ndim(h)}-D array")
        got = _shape(h) if batched else (_shape(h)[0], 1, _shape(h)[1])
        if got != want:
            shown = want if batched else (want[0], want[2])
            raise RuntimeError(f"[fastmetal.nn.{self._cls}] expected {name} of shape "
                               f"{shown} (num_layers * num_directions, batch, hidden_size), "
                               f"got {_shape(h)}")

    def forward(self, input, hx=None):  # noqa: A002 (PyTorch's name)
        cls = self._cls
        w0 = self.weight_ih_l0
        nd = np.ndim(input)
        if nd not in (2, 3):
            raise ValueError(f"[fastmetal.nn.{cls}] expected input to be 2-D (unbatched) or "
                             f"3-D, got a {nd}-D input of shape {_shape(input)}")
        weights = self._weights()
        dtype = _layer_dtype([w for ws in weights for w in ws], cls)
        x = _array(input, w0.device, dtype, "input", cls, ValueError)
        batched = nd == 3
        if not batched:
            x = x.reshape((x.shape[0], 1, x.shape[1]))
        elif self.batch_first:
            x = x.swapaxes(0, 1)
        T, B, size = _shape(x)
        if size != self.input_size:
            raise RuntimeError(f"[fastmetal.nn.{cls}] expected input.shape[-1] == input_size "
                               f"= {self.input_size}, got {size}")
        if T == 0:
            raise RuntimeError(f"[fastmetal.nn.{cls}] expected a sequence length larger than "
                               f"0, got input of shape {_shape(input)}")
        D = 2 if self.bidirectional else 1
        want = (self.num_layers * D, B, self.hidden_size)
        lstm = self.mode == "LSTM"
        if hx is None:
            h0 = zeros(want, dtype=dtype, device=w0.device)
            c0 = zeros(want, dtype=dtype, device=w0.device) if lstm else None
        else:
            if lstm:
                if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                    raise TypeError(f"[fastmetal.nn.{cls}] expected hx to be a tuple (h_0, "
                                    f"c_0), got {type(hx).__name__}")
                h0, c0 = hx
                self._check_state(h0, "hx[0] (h_0)", want, batched)
                self._check_state(c0, "hx[1] (c_0)", want, batched)
                c0 = _array(c0, w0.device, dtype, "c_0", cls).reshape(want)
            else:
                h0, c0 = hx, None
                self._check_state(h0, "hx", want, batched)
            h0 = _array(h0, w0.device, dtype, "h_0", cls).reshape(want)
        out, hn, cn = _rec.recurrent(self.mode, x, h0, c0, weights, self.num_layers,
                                     self.bidirectional, self.dropout, self.training, self._seed)
        if not batched:
            out = out.reshape((T, out.shape[2]))
            hn = hn.reshape((hn.shape[0], hn.shape[2]))
            cn = None if cn is None else cn.reshape((cn.shape[0], cn.shape[2]))
        elif self.batch_first:
            out = out.swapaxes(0, 1)
        return (out, (hn, cn)) if lstm else (out, hn)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(RNNBase):
    """Elman RNN, as ``torch.nn.RNN``: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T +
    b_hh)`` (or relu). ``forward(input, hx=None) -> (output, h_n)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, *, seed=None, rng=None,
                 device=None):
        super().__init__(_nonlinearity(nonlinearity, "RNN"), input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, seed=seed, rng=rng,
                         device=device)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """Long short-term memory, as ``torch.nn.LSTM`` (gates i, f, g, o):
    ``forward(input, hx=None) -> (output, (h_n, c_n))``, ``hx = (h_0, c_0)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, *, seed=None, rng=None, device=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, seed=seed, rng=rng, device=device)


class GRU(RNNBase):
    """Gated recurrent unit, as ``torch.nn.GRU`` (gates r, z, n; ``n = tanh(W_in x + b_in +
    r * (W_hn h + b_hn))``): ``forward(input, hx=None) -> (output, h_n)``."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, *, seed=None, rng=None, device=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first,
                         dropout, bidirectional, seed=seed, rng=rng, device=device)


class RNNCellBase(Module):
    """What the cells share: ``weight_ih`` ``(G * hidden, input)``, ``weight_hh``
    ``(G * hidden, hidden)``, ``bias_ih``, ``bias_hh`` ``(G * hidden,)``; one time step
    through the layers' fused kernels."""

    def __init__(self, mode, cls, input_size, hidden_size, bias, seed, rng, device):
        super().__init__()
        self.input_size = positive_int(input_size, "input_size", cls)
        self.hidden_size = positive_int(hidden_size, "hidden_size", cls)
        check_bool(bias, "bias", cls)
        self.bias = bool(bias)
        self.mode = mode
        self._cls = cls
        G = _GATES[mode] * self.hidden_size
        names = [("weight_ih", (G, self.input_size)), ("weight_hh", (G, self.hidden_size))]
        if bias:
            names += [("bias_ih", (G,)), ("bias_hh", (G,))]
        _uniform_parameters(self, names, self.hidden_size, seed, rng, device, cls)

    def _state(self, h, name, B, batched, dtype):
        want = (B, self.hidden_size) if batched else (self.hidden_size,)
        if _shape(h) != want:
            raise RuntimeError(f"[fastmetal.nn.{self._cls}] expected {name} of shape {want} "
                               f"(batch, hidden_size), got {_shape(h)}")
        return _array(h, self.weight_ih.device, dtype, name, self._cls).reshape(
            (1, B, self.hidden_size))

    def forward(self, input, hx=None):  # noqa: A002 (PyTorch's name)
        cls = self._cls
        nd = np.ndim(input)
        if nd not in (1, 2):
            raise ValueError(f"[fastmetal.nn.{cls}] expected input to be 1-D (unbatched) or "
                             f"2-D, got a {nd}-D input of shape {_shape(input)}")
        batched = nd == 2
        b_ih = self.bias_ih if self.bias else None
        b_hh = self.bias_hh if self.bias else None
        dtype = _layer_dtype([self.weight_ih, self.weight_hh, b_ih, b_hh], cls)
        x = _array(input, self.weight_ih.device, dtype, "input", cls)
        if not batched:
            x = x.reshape((1, x.shape[0]))
        B, size = _shape(x)
        if size != self.input_size:
            raise RuntimeError(f"[fastmetal.nn.{cls}] expected input.shape[-1] == input_size "
                               f"= {self.input_size}, got {size}")
        lstm = self.mode == "LSTM"
        H = self.hidden_size
        if hx is None:
            h0 = zeros((1, B, H), dtype=dtype, device=self.weight_ih.device)
            c0 = zeros((1, B, H), dtype=dtype, device=self.weight_ih.device) if lstm else None
        elif lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"[fastmetal.nn.{cls}] expected hx to be a tuple (h_0, c_0), "
                                f"got {type(hx).__name__}")
            h0 = self._state(hx[0], "hx[0] (h_0)", B, batched, dtype)
            c0 = self._state(hx[1], "hx[1] (c_0)", B, batched, dtype)
        else:
            h0, c0 = self._state(hx, "hx", B, batched, dtype), None
        _, h, c = _rec.layer_step(self.mode, x.reshape((1, B, size)), h0[0],
                                  None if c0 is None else c0[0], self.weight_ih,
                                  self.weight_hh, b_ih, b_hh, False)
        if not batched:
            h = h.reshape((H,))
            c = None if c is None else c.reshape((H,))
        return (h, c) if lstm else h

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    """One step of :class:`RNN`, as ``torch.nn.RNNCell``: ``forward(input, hx=None) -> h'``."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", *, seed=None,
                 rng=None, device=None):
        mode = _nonlinearity(nonlinearity, "RNNCell")
        super().__init__(mode, "RNNCell", input_size, hidden_size, bias, seed, rng, device)
        self.nonlinearity = nonlinearity


class LSTMCell(RNNCellBase):
    """One step of :class:`LSTM`, as ``torch.nn.LSTMCell``: ``forward(input, hx=None) ->
    (h', c')``, ``hx = (h, c)``."""

    def __init__(self, input_size, hidden_size, bias=True, *, seed=None, rng=None, device=None):
        super().__init__("LSTM", "LSTMCell", input_size, hidden_size, bias, seed, rng, device)


class GRUCell(RNNCellBase):
    """One step of :class:`GRU`, as ``torch.nn.GRUCell``: ``forward(input, hx=None) -> h'``."""

    def __init__(self, input_size, hidden_size, bias=True, *, seed=None, rng=None, device=None):
        super().__init__("GRU", "GRUCell", input_size, hidden_size, bias, seed, rng, device)
