"""Autograd: every differentiable op's gradient against central finite differences of a
float64 NumPy reference, on every device of the --device suite; the tape's rules (grad
mode, retain_graph, version counter, leaves, detach); fm.grad / value_and_grad.

The checker: for an op f, random inputs and a random cotangent w, the gradient of
sum(f(inputs) * w) from fastmetal's backward() (float32, on the device) is compared with
central differences of the same sum over the float64 NumPy reference (h = 1e-6).
"""
from __future__ import annotations

import gc
import weakref

import inspect

import numpy as np
import pytest

import fastmetal as fm
from fastmetal.ops.optable import OPS
from references import numpy_reference, ref_conv2d

RNG = np.random.default_rng(20261126)


def finite_differences(f, inputs, w, h=1e-6):
    grads = []
    for k, x in enumerate(inputs):
        g = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            xs = [a.copy() for a in inputs]
            xs[k][idx] += h
            plus = float(np.sum(f(*xs) * w))
            xs[k][idx] -= 2 * h
            minus = float(np.sum(f(*xs) * w))
            g[idx] = (plus - minus) / (2 * h)
        grads.append(g)
    return grads


def backward_grads(f, inputs, w, device, dtype=np.float32):
    arrays = [fm.asarray(x.astype(dtype), device=device).requires_grad_() for x in inputs]
    out = f(*arrays)
    (out * fm.asarray(w.astype(np.float32), device=device)).sum().backward()
    return [a.grad for a in arrays], arrays


def check_gradient(f_fm, f_np, inputs, device, rtol=3e-3, atol=3e-3):
    inputs = [np.asarray(x, np.float64) for x in inputs]
    w = RNG.standard_normal(np.shape(f_np(*inputs)))
    want = finite_differences(f_np, inputs, w)
    got, arrays = backward_grads(f_fm, inputs, w, device)
    for k, (g, ref, a) in enumerate(zip(got, want, arrays)):
        assert g is not None, f"input {k} got no gradient"
        assert g.device == device and g.shape == a.shape and g.dtype == a.dtype
        scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
        np.testing.assert_allclose(g.numpy().astype(np.float64), ref, rtol=rtol,
                                   atol=atol * scale, err_msg=f"gradient of input {k}")


# ----------------------------------------------------------------------------- elementwise
DIFFERENTIABLE = [s for s in OPS if s.differentiable]
# Domains away from the kinks and poles (the kinks have their own tests below).
POSITIVE = {"log", "sqrt", "reciprocal", "power", "log1p", "log2", "log10"}
PROBABILITY = {"bce", "bce_grad"}
AWAY_FROM_ZERO = {"relu", "abs", "maximum", "minimum", "hypot", "atan2"}
INSIDE_UNIT = {"asin", "acos", "atanh"}  # poles at +-1


def _sample(name, shape):
    if name in PROBABILITY:
        return RNG.uniform(0.05, 0.95, shape)
    if name in POSITIVE:
        return RNG.uniform(0.5, 2.0, shape)
    if name in INSIDE_UNIT:
        return RNG.uniform(-0.9, 0.9, shape)
    if name == "acosh":  # pole at 1
        return RNG.uniform(1.2, 3.0, shape)
    if name == "tan":  # poles at +-pi/2
        return RNG.uniform(-1.2, 1.2, shape)
    x = RNG.uniform(-2.0, 2.0, shape)
    if name in AWAY_FROM_ZERO:
        x = np.where(np.abs(x) < 0.05, 0.5, x)
    return x


def _reference(spec):
    return lambda *args: numpy_reference(spec, *args)


@pytest.mark.parametrize("spec", DIFFERENTIABLE, ids=[s.name for s in DIFFERENTIABLE])
def test_elementwise_gradient(spec, device):
    fn = fm.ops.elementwise.FUNCTIONS[spec.name]
    if spec.arity == 1:
        check_gradient(fn, _reference(spec), [_sample(spec.name, (3, 4))], device)
        return
    x, y = _sample(spec.name, (3, 1, 4)), _sample(spec.name, (2, 4))  # broadcast both ways
    if spec.name in ("maximum", "minimum"):
        y = y + 0.01  # no ties
    if spec.name == "bce":
        y = RNG.uniform(0, 1, (2, 4))
    check_gradient(fn, _reference(spec), [x, y], device)


def test_binary_ops_with_scalars_and_numpy_operands(device):
    x = RNG.uniform(0.5, 2, (2, 3))
    c = RNG.uniform(0.5, 2, (3,))
    check_gradient(lambda a: (a * 3.0 - c) / a ** 2.0 + 2.0 ** a,
                   lambda a: (a * 3.0 - c) / a ** 2.0 + 2.0 ** a, [x], device)


def test_comparisons_are_not_differentiable(device):
    a = fm.asarray(np.ones(3, np.float32), device=device).requires_grad_()
    m = a > 0.5
    assert not m.requires_grad and m.grad_fn is None


def test_relu_and_abs_at_zero_give_zero_as_pytorch(device):
    x = fm.asarray(np.array([-1.0, 0.0, 2.0], np.float32), device=device).requires_grad_()
    (fm.relu(x) + fm.abs(x)).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [-1.0, 0.0, 2.0])


def test_maximum_minimum_split_ties_evenly_as_pytorch(device):
    a = fm.asarray(np.array([1.0, 2.0, 3.0], np.float32), device=device).requires_grad_()
    b = fm.asarray(np.array([1.0, 5.0, 0.0], np.float32), device=device).requires_grad_()
    (fm.maximum(a, b) + 10 * fm.minimum(a, b)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [5.5, 10.0, 1.0])
    np.testing.assert_allclose(b.grad.numpy(), [5.5, 1.0, 10.0])


def test_float16_gradients_come_back_in_float16(device):
    x = fm.asarray(np.array([0.5, -1.0], np.float16), device=device).requires_grad_()
    y = fm.asarray(np.array([2.0, 3.0], np.float32), device=device).requires_grad_()
    (x * y).sum().backward()
    assert x.grad.dtype == np.float16 and y.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 3.0])
    np.testing.assert_allclose(y.grad.numpy(), [0.5, -1.0])


# ----------------------------------------------------------------------------- reductions
AXES = [None, 0, -1, (0, 2)]


@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "max", "min"])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_gradient(name, axis, keepdims, device):
    x = RNG.permutation(24).reshape(2, 3, 4) / 7.0 - 1.5  # distinct: no ties for max/min
    kw = {"ddof": 1} if name in ("var", "std") else {}
    check_gradient(lambda a: getattr(fm, name)(a, axis=axis, keepdims=keepdims, **kw),
                   lambda a: getattr(np, name)(a, axis=axis, keepdims=keepdims, **kw),
                   [x], device)


def test_max_splits_ties_evenly(device):
    x = fm.asarray(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]], np.float32),
                   device=device).requires_grad_()
    fm.max(x, axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 0.5, 0.5], [0.5, 0, 0.5]])


# ----------------------------------------------------------------------------- linear algebra
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (4, 5)),
                                   ((3, 4), (4,)), ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul_gradient(sa, sb, device):
    check_gradient(fm.matmul, np.matmul, [RNG.standard_normal(sa), RNG.standard_normal(sb)],
                   device)


def test_matmul_operator_and_transposed_operands(device):
    a, b = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 5))
    check_gradient(lambda x, y: x.T @ y, lambda x, y: x.T @ y, [a, b], device)


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_gradient(with_bias, device):
    x, w, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((5, 4)), RNG.standard_normal(5)
    if with_bias:
        check_gradient(fm.linear, lambda x, w, b: x @ w.T + b, [x, w, b], device)
    else:
        check_gradient(lambda x, w: fm.linear(x, w), lambda x, w: x @ w.T, [x, w], device)


# ----------------------------------------------------------------------------- conv and training ops
@pytest.mark.parametrize("stride,padding,groups", [(1, 0, 1), (2, 1, 2), (1, "same", 1)])
def test_conv2d_gradient(stride, padding, groups, device):
    x = RNG.standard_normal((2, 4, 5, 5))
    w = RNG.standard_normal((4, 4 // groups, 3, 3))
    b = RNG.standard_normal(4)
    kw = dict(stride=stride, padding=padding, groups=groups)
    check_gradient(lambda x, w, b: fm.conv2d(x, w, b, **kw),
                   lambda x, w, b: ref_conv2d(x, w, b, **kw), [x, w, b], device)


def _max_pool_reference(x, k=2):
    n, c, h, w = x.shape
    return x[:, :, :h // k * k, :w // k * k].reshape(n, c, h // k, k, w // k, k).max(axis=(3, 5))


def test_max_pool2d_gradient(device):
    x = RNG.permutation(2 * 3 * 4 * 5).reshape(2, 3, 4, 5) / 10.0
    check_gradient(lambda a: fm.max_pool2d(a, 2), _max_pool_reference, [x], device)


def _log_softmax_reference(x, axis=-1):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("axis", [-1, 0])
def test_log_softmax_gradient(axis, device):
    check_gradient(lambda a: fm.log_softmax(a, axis),
                   lambda a: _log_softmax_reference(a, axis), [RNG.standard_normal((3, 5))],
                   device)


def test_cross_entropy_gradient(device):
    labels = np.array([0, 4, 2])
    check_gradient(lambda a: fm.cross_entropy(a, labels),
                   lambda a: -_log_softmax_reference(a)[np.arange(3), labels].mean(),
                   [RNG.standard_normal((3, 5))], device)


def test_dropout_gradient_uses_the_forward_mask(device):
    x = RNG.standard_normal((4, 6))
    kept = fm.dropout(fm.asarray(np.ones((4, 6), np.float32), device=device), 0.5,
                      seed=7).numpy().astype(np.float64)
    check_gradient(lambda a: fm.dropout(a, 0.5, seed=7), lambda a: a * kept, [x], device)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_gradients(reduction, device):
    p, t = RNG.uniform(0.05, 0.95, (3, 4)), RNG.uniform(0, 1, (3, 4))
    bce = lambda x, y: -(y * np.log(x) + (1 - y) * np.log(1 - x))  # noqa: E731
    red = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    check_gradient(lambda x, y: fm.binary_cross_entropy(x, y, reduction=reduction),
                   lambda x, y: red(bce(x, y)), [p, t], device)
    z = RNG.standard_normal((3, 4))
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    check_gradient(lambda x, y: fm.binary_cross_entropy_with_logits(x, y, reduction=reduction),
                   lambda x, y: red(bce(sig(x), y)), [z, t], device)
    check_gradient(lambda x, y: fm.mse_loss(x, y, reduction=reduction),
                   lambda x, y: red((x - y) ** 2), [z, t], device)


def test_bce_saturated_sigmoid_is_finite_as_pytorch(device):
    p = fm.asarray(np.array([0.0, 1.0, 1.0], np.float32), device=device).requires_grad_()
    t = np.array([1.0, 0.0, 1.0], np.float32)
    loss = fm.binary_cross_entropy(p, t, reduction="sum")
    assert loss.item() == pytest.approx(200.0)
    loss.backward()
    assert np.all(np.isfinite(p.grad.numpy()))


# ----------------------------------------------------------------------------- views and indexing
VIEWS = [
    ("reshape", lambda a: a.reshape(4, 6), lambda a: a.reshape(4, 6)),
    ("transpose", lambda a: a.transpose(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    ("T", lambda a: a.T, lambda a: a.T),
    ("negative-step slice", lambda a: a[::-1, 1:, ::-2], lambda a: a[::-1, 1:, ::-2]),
    ("int index", lambda a: a[1, :, 2], lambda a: a[1, :, 2]),
    ("index array, repeats", lambda a: a[:, [0, 2, 0, 0]], lambda a: a[:, [0, 2, 0, 0]]),
    ("bool mask", lambda a: a[np.arange(24).reshape(2, 3, 4) % 3 == 0],
     lambda a: a[np.arange(24).reshape(2, 3, 4) % 3 == 0]),
    ("squeeze/expand_dims", lambda a: fm.expand_dims(a[:1], 0).squeeze(),
     lambda a: np.expand_dims(a[:1], 0).squeeze()),
    ("flatten", lambda a: a.flatten(), lambda a: a.flatten()),
    ("astype float16", lambda a: a.astype("float16").astype("float32") * 2.0,
     lambda a: a * 2.0),
]


@pytest.mark.parametrize("name,f_fm,f_np", VIEWS, ids=[v[0] for v in VIEWS])
def test_view_and_index_gradients(name, f_fm, f_np, device):
    rtol = 2e-2 if "float16" in name else 3e-3
    check_gradient(f_fm, f_np, [RNG.uniform(-1, 1, (2, 3, 4))], device, rtol=rtol, atol=rtol)


# ----------------------------------------------------------------------------- the tape's rules
def _leaf(values, device):
    return fm.asarray(np.asarray(values, np.float32), device=device).requires_grad_()


def test_gradients_accumulate_and_zero_grad_forgets(device):
    x = _leaf([1.0, 2.0], device)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 7.0])


def test_second_backward_needs_retain_graph(device):
    x = _leaf([1.0, 2.0], device)
    y = fm.exp(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp([1.0, 2.0]), rtol=1e-6)
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()


def test_in_place_write_into_a_saved_array_raises_at_backward(device):
    x = _leaf([1.0, 2.0], device)
    h = x * 2.0
    y = fm.sigmoid(h)  # sigmoid saves its result
    y += 1.0
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.sum().backward()


def test_in_place_ops_on_non_leaves_are_recorded(device):
    x = _leaf([1.0, 2.0], device)
    h = x * 2.0
    h += x  # h = 3x
    h *= 2.0  # h = 6x
    h.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])


def test_in_place_on_a_leaf_that_requires_grad_is_refused(device):
    x = _leaf([1.0, 2.0], device)
    with pytest.raises(RuntimeError, match="leaf"):
        x += 1.0
    with fm.no_grad():
        x += 1.0  # the optimizer's case
    np.testing.assert_allclose(x.numpy(), [2.0, 3.0])


def test_no_grad_detach_and_requires_grad_rules(device):
    x = _leaf([1.0, 2.0], device)
    with fm.no_grad():
        y = x * 2.0
    assert not y.requires_grad and y.grad_fn is None
    d = (x * 2.0).detach()
    assert not d.requires_grad and d.is_leaf
    z = x * 2.0
    assert z.requires_grad and not z.is_leaf and "Multiply" in repr(z.grad_fn)
    with pytest.raises(RuntimeError, match="leaf"):
        z.requires_grad = False
    with pytest.raises(TypeError, match="float16, float32 or float64 Array"):
        fm.asarray(np.arange(3), dtype=np.int64, device=device).requires_grad_()
    with pytest.raises(RuntimeError, match="got one that does not"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match="gradient argument"):
        z.backward()
    assert fm.is_grad_enabled()

    @fm.no_grad()
    def f(a):
        return a * 2.0
    assert not f(x).requires_grad


def test_backward_with_an_explicit_gradient_and_retain_grad(device):
    x = _leaf([1.0, 2.0, 3.0], device)
    h = x * 2.0
    h.retain_grad()
    y = h * h
    y.backward(fm.asarray(np.array([1.0, 0.0, 2.0], np.float32), device=device))
    np.testing.assert_allclose(h.grad.numpy(), [4.0, 0.0, 24.0])
    np.testing.assert_allclose(x.grad.numpy(), [8.0, 0.0, 48.0])


def test_setitem_into_the_graph_is_refused(device):
    x = _leaf([1.0, 2.0], device)
    z = fm.zeros(2, device=device)
    with pytest.raises(RuntimeError, match="not differentiable"):
        z[0] = x[0]


def test_graph_is_freed_after_backward(device):
    x = _leaf([1.0, 2.0], device)
    y = fm.sigmoid(x * 2.0).sum()
    node = weakref.ref(y.grad_fn)
    y.backward()
    del y
    gc.collect()
    assert node() is None


def test_functional_grad_and_value_and_grad(device):
    def f(w, x):
        return fm.sum(fm.tanh(x @ w))

    w = RNG.standard_normal((3, 2)).astype(np.float32)
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    value, (gw, gx) = fm.value_and_grad(f, argnums=(0, 1))(fm.asarray(w, device=device),
                                                           fm.asarray(x, device=device))
    t = np.tanh(x.astype(np.float64) @ w)
    assert value.item() == pytest.approx(t.sum(), rel=1e-5)
    np.testing.assert_allclose(gw.numpy(), x.T @ (1 - t ** 2), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gx.numpy(), (1 - t ** 2) @ w.T, rtol=1e-4, atol=1e-5)
    g = fm.grad(f)(fm.asarray(w, device=device), fm.asarray(x, device=device))
    np.testing.assert_allclose(g.numpy(), gw.numpy())
    with pytest.raises(TypeError, match="one-element"):
        fm.grad(lambda a: a * 2.0)(fm.asarray(w, device=device))
    with pytest.raises(TypeError, match="argnums"):
        fm.grad(f, argnums="0")


# ----------------------------------------------------------------------------- the NumPy surface
def test_numpy_surface_gradients(device):
    a, b = RNG.uniform(0.5, 2, (2, 3)), RNG.uniform(0.5, 2, (2, 3))
    cond = np.array([[True, False, True], [False, False, True]])
    check_gradient(lambda x, y: fm.where(cond, x, y), lambda x, y: np.where(cond, x, y),
                   [a, b], device)
    check_gradient(lambda x, y: fm.concatenate([x, y * 2.0], axis=1),
                   lambda x, y: np.concatenate([x, y * 2.0], axis=1), [a, b], device)
    check_gradient(lambda x, y: fm.concatenate([x, y], axis=None),
                   lambda x, y: np.concatenate([x, y], axis=None), [a, b], device)
    check_gradient(lambda x, y: fm.stack([x, y], axis=1), lambda x, y: np.stack([x, y], axis=1),
                   [a, b], device)
    c = RNG.uniform(0.5, 2, (2, 3, 4))
    check_gradient(lambda x: fm.permute(x, 2, 0, 1), lambda x: np.transpose(x, (2, 0, 1)), [c],
                   device)
    check_gradient(lambda x: fm.swapaxes(x, 0, 2), lambda x: np.swapaxes(x, 0, 2), [c], device)
    check_gradient(lambda x: fm.moveaxis(x, 0, -1), lambda x: np.moveaxis(x, 0, -1), [c], device)
    check_gradient(lambda x: fm.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1), [c], device)
    check_gradient(lambda x: fm.cumsum(x), lambda x: np.cumsum(x), [c], device)
    check_gradient(lambda x: fm.prod(x, axis=1), lambda x: np.prod(x, axis=1), [c], device)
    check_gradient(lambda x, y: x % y, lambda x, y: np.remainder(x, y),
                   [RNG.uniform(1, 5, (2, 3)), RNG.uniform(0.7, 0.9, (2, 3))], device)


def test_prod_gradient_with_zeros_divides_by_nothing(device):
    x = _leaf([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 4.0]], device)
    fm.prod(x, axis=1).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [[0, 6, 0], [0, 0, 0], [8, 4, 2]])


# ----------------------------------------------------------------------------- property-based
def _broadcast_pair(draw):
    from hypothesis import strategies as st
    nd = draw(st.integers(0, 3))
    shape = [draw(st.integers(1, 3)) for _ in range(nd)]
    def variant():
        drop = draw(st.integers(0, nd))
        return tuple(1 if draw(st.booleans()) else n for n in shape[drop:])
    return variant(), variant()


def test_binary_gradients_over_random_broadcasts_and_strides(device):
    hypothesis = pytest.importorskip("hypothesis")
    from hypothesis import given, settings, strategies as st

    names = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power"]

    @settings(max_examples=25, deadline=None, derandomize=True)
    @given(st.data(), st.sampled_from(names), st.booleans())
    def run(data, name, strided):
        sx, sy = _broadcast_pair(data.draw)
        spec = next(s for s in OPS if s.name == name)
        x = RNG.uniform(0.5, 2.0, sx)
        y = RNG.uniform(0.5, 2.0, sy) + 0.013  # no ties for maximum/minimum
        fn = fm.ops.elementwise.FUNCTIONS[name]
        if strided and x.ndim:  # a reversed, non-contiguous view of the first operand
            f_fm = lambda a, b: fn(a[::-1], b)  # noqa: E731
            f_np = lambda a, b: numpy_reference(spec, a[::-1], b)  # noqa: E731
        else:
            f_fm, f_np = fn, _reference(spec)
        check_gradient(f_fm, f_np, [x, y], device)

    run()


TORCH_NAMES = {"negative": "neg", "subtract": "sub", "multiply": "mul", "divide": "div",
               "power": "pow", "copy": "clone"}


@pytest.mark.parametrize("spec", [s for s in DIFFERENTIABLE if s.public], ids=lambda s: s.name)
def test_elementwise_gradients_equal_torch(spec, device):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    tfn = {"softplus": F.softplus, "gelu": F.gelu, "silu": F.silu}.get(spec.name) or \
        getattr(torch, TORCH_NAMES.get(spec.name, spec.name))
    args = [_sample(spec.name, (3, 4)).astype(np.float32) for _ in range(spec.arity)]
    if spec.name == "remainder":
        args[1] = np.abs(args[1]) + 0.5
    ours = [fm.asarray(a, device=device).requires_grad_() for a in args]
    theirs = [torch.tensor(a, requires_grad=True) for a in args]
    w = RNG.standard_normal((3, 4)).astype(np.float32)
    (fm.ops.elementwise.FUNCTIONS[spec.name](*ours) * w).sum().backward()
    (tfn(*theirs) * torch.tensor(w)).sum().backward()
    for a, t in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "max", "min", "prod"])
def test_reduction_gradients_equal_torch(name, device):
    torch = pytest.importorskip("torch")
    x = (RNG.permutation(24).reshape(2, 3, 4) / 7.0 + 0.5).astype(np.float32)
    a = fm.asarray(x, device=device).requires_grad_()
    t = torch.tensor(x, requires_grad=True)
    getattr(fm, name)(a, axis=1).sum().backward()
    tfn = {"max": lambda v: torch.amax(v, 1), "min": lambda v: torch.amin(v, 1),
           "var": lambda v: torch.var(v, 1, unbiased=False),
           "std": lambda v: torch.std(v, 1, unbiased=False)}.get(name) or \
        (lambda v: getattr(torch, name)(v, 1))
    tfn(t).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=2e-5, atol=2e-6)


def test_declared_op_signatures(device):
    """The op wrapper keeps the forward's signature: a keyword-only differentiable argument
    records, defaults apply, a wrong call is Python's own TypeError; a forward taking
    *args (bound at every call instead) records as well."""
    from fastmetal.autograd.declare import op

    @op(grads=("x", "scale"), saves=("x", "scale"), public=False)
    def scaled(x, *, scale, offset=0.0):
        return fm.add(fm.multiply(x, scale), offset)

    @scaled.vjp
    def _(ctx, g):
        return fm.multiply(g, ctx.scale), fm.multiply(g, ctx.x)

    @op(grads=("x",), public=False)
    def doubled(x, **options):
        return fm.multiply(x, options.get("factor", 2.0))

    @doubled.vjp
    def _(ctx, g):
        return (fm.multiply(g, ctx.options.get("factor", 2.0)),)

    x = fm.asarray(np.array([1.0, 2.0], np.float32), device=device).requires_grad_()
    s = fm.asarray(np.array([3.0, 4.0], np.float32), device=device).requires_grad_()
    out = scaled(x, scale=s)
    np.testing.assert_allclose(out.numpy(), [3.0, 8.0])
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 4.0])
    np.testing.assert_allclose(s.grad.numpy(), [1.0, 2.0])
    np.testing.assert_allclose(scaled(x, scale=s, offset=1.0).numpy(), [4.0, 9.0])
    with pytest.raises(TypeError):
        scaled(x, s)  # scale is keyword-only
    assert scaled.__name__ == "scaled" and "scale" in str(inspect.signature(scaled))
    y = fm.asarray(np.array([1.0, 2.0], np.float32), device=device).requires_grad_()
    doubled(y, factor=3.0).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [3.0, 3.0])
    with fm.no_grad():
        assert not doubled(y).requires_grad


def test_recording_sees_every_argument_position(device):
    """An op records whichever of its arguments requires grad, by position or by keyword,
    with NumPy beside it (the op wrapper's shortcut for positional calls must not miss the
    second argument), and records nothing under no_grad."""
    x = np.array([1.0, 2.0, 3.0], np.float32)
    for call in (lambda a: fm.multiply(x, a), lambda a: fm.multiply(a, x),
                 lambda a: fm.multiply(x, y=a), lambda a: fm.sigmoid(a),
                 lambda a: fm.where(x > 1.5, x, a)):
        a = fm.asarray(np.array([0.5, -1.0, 2.0], np.float32), device=device).requires_grad_()
        out = call(a)
        assert out.requires_grad and out.grad_fn is not None
        out.sum().backward()
        assert a.grad is not None and np.isfinite(a.grad.numpy()).all()
        with fm.no_grad():
            assert not call(a).requires_grad
    b = fm.asarray(np.array([0.5, -1.0, 2.0], np.float32), device=device).requires_grad_()
    fm.multiply(x, b).sum().backward()
    np.testing.assert_array_equal(b.grad.numpy(), x)


def test_slice_reads_of_one_array_add_into_one_gradient(device):
    """Several basic reads of one non-leaf (GPT's qkv[:, :, i], overlapping ranges, a step,
    an int, an empty slice) after a non-slice use of it: the tape adds each read's gradient
    into the pending one in place (tape._add_in_place) instead of zeros + copy + add; the
    result is still the sum of every use's gradient."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 6, 3)).astype(np.float32)
    keys = [(slice(None), slice(None), 0), (slice(None), slice(None), 1),
            (slice(None), slice(None), 2), (slice(1, 3),), (slice(None), slice(None, None, 2)),
            (3,), (slice(4, None),), (slice(0, 2), 5)]
    ws = [rng.standard_normal(x[k].shape).astype(np.float32) for k in keys]
    xa = fm.asarray(x, device=device).requires_grad_()
    y = xa * 2.0  # a non-leaf: its gradient waits in the tape while the reads add into it
    loss = (y * y).sum()
    for k, w in zip(keys, ws):
        loss = loss + (y[k] * fm.asarray(w, device=device)).sum()
    loss.backward()
    want = 2.0 * x.astype(np.float64) * 2.0
    for k, w in zip(keys, ws):
        want[k] += w
    want *= 2.0
    np.testing.assert_allclose(xa.grad.numpy(), want, rtol=2e-6, atol=2e-6)
    # The same reads first (the first read's zeros become the gradient the others add into).
    xb = fm.asarray(x, device=device).requires_grad_()
    yb = xb * 2.0
    total = sum((yb[k] * fm.asarray(w, device=device)).sum() for k, w in zip(keys, ws))
    total.backward()
    want2 = np.zeros(x.shape)
    for k, w in zip(keys, ws):
        want2[k] += w
    np.testing.assert_allclose(xb.grad.numpy(), 2.0 * want2, rtol=2e-6, atol=2e-6)
