"""Read-only memory stays read-only through the whole Array surface: operators, indexing,
views, out=, NumPy dispatch, matmul and the optimizers. Each write raises ValueError (as
NumPy does for a read-only array) before anything is written; a broadcast (zero-stride)
view is never a valid output either."""
from __future__ import annotations

import numpy as np
import pytest

import fastmetal as fm

ZEROS = bytes(16)  # four float32 zeros


def readonly_array(device):
    buf = bytes(ZEROS)  # a fresh immutable buffer per test
    a = fm.asarray(np.frombuffer(buf, np.float32), device=device)
    return buf, a


def _iadd(a): a += 1  # noqa: E704
def _isub(a): a -= 1  # noqa: E704
def _imul(a): a *= 2  # noqa: E704
def _idiv(a): a /= 2  # noqa: E704
def _ipow(a): a **= 2  # noqa: E704
def _setitem(a): a[0] = 1  # noqa: E704
def _setslice(a): a[:] = a  # noqa: E704
def _setellipsis(a): a[...] = np.ones(a.shape, np.float32)  # noqa: E704
def _fm_out(a): fm.exp(a, out=a)  # noqa: E704
def _fm_binary_out(a): fm.add(a, 1.0, out=a)  # noqa: E704
def _np_out(a): np.exp(a, out=a)  # noqa: E704
def _np_binary_out(a): np.add(a, a, out=a)  # noqa: E704


WRITES = [_iadd, _isub, _imul, _idiv, _ipow, _setitem, _setslice, _setellipsis, _fm_out,
          _fm_binary_out, _np_out, _np_binary_out]
VIEWS = {
    "whole": lambda a: a,
    "a[1:]": lambda a: a[1:],
    "a[::-1]": lambda a: a[::-1],
    "a.T": lambda a: a.reshape(2, 2).T,
    "reshape": lambda a: a.reshape(2, 2),
    "expand_dims": lambda a: fm.expand_dims(a, 0),
    "squeeze": lambda a: fm.expand_dims(a, 0).squeeze(),
}


@pytest.mark.parametrize("view", list(VIEWS), ids=list(VIEWS))
@pytest.mark.parametrize("write", WRITES, ids=[w.__name__[1:] for w in WRITES])
def test_writes_into_read_only_memory_raise(device, view, write):
    buf, a = readonly_array(device)
    v = VIEWS[view](a)
    with pytest.raises(ValueError, match="read-only"):
        write(v)
    fm.synchronize()
    assert buf == ZEROS
    assert np.array_equal(a.numpy(), np.zeros(4, np.float32))


def test_views_inherit_the_read_only_flag(device):
    _, a = readonly_array(device)
    for name, make in VIEWS.items():
        v = make(a)
        assert isinstance(v, fm.Array), name
        if device in ("cpu", "metal"):  # host-visible: the NumPy view says so too
            assert not np.asarray(v).flags.writeable, name
            assert memoryview(v).readonly, name
    # A copy is a new, writeable array; the source stays untouched.
    c = a.copy()
    c += 1
    assert np.array_equal(c.numpy(), np.ones(4, np.float32))
    assert np.array_equal(a.numpy(), np.zeros(4, np.float32))


def test_matmul_into_read_only_out_raises(device):
    buf = bytes(16)
    out = fm.asarray(np.frombuffer(buf, np.float32).reshape(2, 2), device=device)
    a = fm.asarray(np.ones((2, 2), np.float32), device=device)
    with pytest.raises(ValueError, match="read-only"):
        fm.matmul(a, a, out=out)
    assert buf == bytes(16)
    host_out = np.frombuffer(buf, np.float32).reshape(2, 2)
    with pytest.raises(ValueError):
        fm.matmul(a, a, out=host_out)
    assert buf == bytes(16)


def test_reduction_into_read_only_out_raises(device):
    buf = bytes(8)
    out = fm.asarray(np.frombuffer(buf, np.float32), device=device)
    a = fm.asarray(np.ones((2, 3), np.float32), device=device)
    with pytest.raises(ValueError, match="read-only"):
        fm.sum(a, axis=1, out=out)
    assert buf == bytes(8)


def _optimizers(params):
    return [fm.nn.optim.SGD(params, lr=0.1), fm.nn.optim.SGD(params, lr=0.1, momentum=0.9),
            fm.nn.optim.Adam(params, lr=0.1), fm.nn.optim.Adadelta(params, lr=0.1)]


@pytest.mark.parametrize("route", ["attribute", "list"])
def test_optimizer_step_on_read_only_parameter_raises(device, route):
    """A read-only Array as a parameter (assigned to a layer, which makes it a Parameter over
    the same memory, or passed in a plain list): every optimizer's step raises before
    writing it."""
    wbuf = bytes(16)
    w = fm.asarray(np.frombuffer(wbuf, np.float32).reshape(2, 2), device=device)
    if route == "attribute":
        layer = fm.nn.Linear(2, 2, device=device, seed=0)
        layer.weight = w
        params = list(layer.parameters())
        assert params[0] is layer.weight
        layer.bias.grad = None
    else:
        params = [w]
    params[0].grad = fm.ones((2, 2), device=device)
    for opt in _optimizers(params):
        with pytest.raises(ValueError, match="writeable"):
            opt.step()
        fm.synchronize()
        assert wbuf == bytes(16), type(opt).__name__


def test_load_state_dict_into_read_only_parameter_changes_nothing():
    layer = fm.nn.Linear(2, 2, seed=0)
    bias_before = layer.bias.numpy().copy()
    wbuf = bytes(16)
    layer.weight = fm.asarray(np.frombuffer(wbuf, np.float32).reshape(2, 2))
    state = {"weight": np.ones((2, 2), np.float32), "bias": np.full(2, 7, np.float32)}
    with pytest.raises(ValueError, match="read-only"):
        layer.load_state_dict(state)
    assert wbuf == bytes(16)
    assert np.array_equal(layer.bias.numpy(), bias_before)
    # a read-only parameter after a writeable one: still nothing half-loaded
    layer = fm.nn.Linear(2, 2, seed=0)
    weight_before = layer.weight.numpy().copy()
    bbuf = bytes(8)
    layer.bias = fm.asarray(np.frombuffer(bbuf, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        layer.load_state_dict(state)
    assert bbuf == bytes(8)
    assert np.array_equal(layer.weight.numpy(), weight_before)


def test_inplace_power_is_in_place(device):
    a = fm.asarray(np.array([1.0, 2.0, 3.0], np.float32), device=device)
    alias = a
    a **= 2
    assert a is alias
    assert np.array_equal(alias.numpy(), np.array([1.0, 4.0, 9.0], np.float32))


def broadcast_view(device):
    """A writeable Array viewed with a zero stride (as only a broadcast would make one)."""
    base = fm.zeros(4, device=device)
    return base, base._view(0, [3, 4], [0, 1])


def test_broadcast_view_is_never_an_output(device):
    base, b = broadcast_view(device)
    x = fm.ones((3, 4), device=device)
    for write in (lambda: fm.exp(x, out=b), lambda: np.exp(x, out=b),
                  lambda: fm.add(x, 1.0, out=b), _iadd_of(b), lambda: b.__setitem__(..., x)):
        with pytest.raises(ValueError, match="broadcast"):
            write()
    assert np.array_equal(base.numpy(), np.zeros(4, np.float32))
    # a broadcast from NumPy is read-only from the start (NumPy marks it so)
    nb = fm.asarray(np.broadcast_to(np.zeros(4, np.float32), (3, 4)), device=device)
    with pytest.raises(ValueError):
        fm.exp(x, out=nb)


def _iadd_of(b):
    def write():
        v = b
        v += 1
    return write


def test_optimizer_rejects_a_broadcast_parameter(device):
    base, b = broadcast_view(device)
    layer = fm.nn.Linear(4, 3, bias=False, device=device, seed=0)
    layer.weight = b
    layer.weight.grad = fm.ones((3, 4), device=device)
    with pytest.raises(ValueError, match="broadcast"):
        fm.nn.optim.SGD(layer.parameters(), lr=0.1).step()
    assert np.array_equal(base.numpy(), np.zeros(4, np.float32))
