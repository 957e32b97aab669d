"""fastmetal.compile's fusion pass (csrc/ops/capture_fusion.h): ReLU folded into the
convolution before it (the GEMM forward and the Winograd output transform) and into an add
(a linear layer's bias), ReLU's gradient folded into the pooling backward and into the
Winograd transform of an input gradient.

Each compiled step must give the bits eager execution gives (losses and every parameter
after several updates, dropout included), fold exactly the launches it can, and fold none
where the intermediate is visible: returned by the step, kept by the user, or with fusion
switched off (FASTMETAL_COMPILE_FUSION=0). On the CPU the conv kernels run (the fixture),
so the folded kernels are the ones a GPU runs.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastmetal as fm
import fastmetal.nn.functional as F
from fastmetal import nn
from references import msl_conv_kernels_on_cpu, msl_kernels_on_cpu

conv_kernels = pytest.fixture(msl_conv_kernels_on_cpu)
# matmul and the bias add as kernels on the CPU too (its own GEMM adds the bias itself)
kernels = pytest.fixture(msl_kernels_on_cpu)


class Net(nn.Module):
    """MNIST's network in small: conv, relu, conv, relu, max_pool2d, dropout, linear."""

    def __init__(self, dropout):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3)
        self.conv2 = nn.Conv2d(8, 16, 3)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(16 * 5 * 5, 10)
        self.kept = None  # where keep=True leaves conv2's output

    def forward(self, x, keep=False):
        x = F.relu(self.conv1(x))
        h = self.conv2(x)
        if keep:
            self.kept = h
        x = self.drop(F.max_pool2d(F.relu(h), 2))
        return self.fc(fm.flatten(x, 1))


def _batches(rng, device, n=4, special=False):
    out = []
    for i in range(n):
        x = rng.standard_normal((4, 1, 14, 14)).astype(np.float32)
        if special and i == 1:
            x[0, 0, :3, :3] = 0.0     # exact zeros reach relu and its gradient
            x[1, 0, 5, 5] = np.inf    # so does inf (and NaN after it)
        y = rng.integers(0, 10, 4)
        out.append((fm.asarray(x, device=device), fm.asarray(y, dtype="int64", device=device)))
    return out


def _train(model, opt, loss_of, batches, compiled):
    """One optimizer step per batch, eagerly or under fm.compile (which must trace it, never
    fall back to eager): the losses, the final state_dict and the step function."""
    def step(*batch):
        loss = loss_of(model, *batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    run = fm.compile(step) if compiled else step
    with warnings.catch_warnings():
        warnings.simplefilter("error", fm.CompileWarning)
        losses = [np.array(run(*batch)) for batch in batches]
    return losses, {k: np.array(v) for k, v in model.state_dict().items()}, run


def _replayed_kernels(run):
    """The kernels the compiled function's (one) replay launches, in order."""
    (replay,) = [e for e in run._entries.values() if hasattr(e, "trace")]
    return replay.trace.capture.kernels()


def _run(device, compiled, *, dropout=0.25, keep=False, special=False, steps=4):
    """Losses and final parameters of `steps` SGD steps of Net; the step function too."""
    fm.random.seed(0)
    net = Net(dropout).to(device)
    opt = fm.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    batches = _batches(np.random.default_rng(1), device, steps, special)
    return _train(net, opt, lambda m, x, y: F.cross_entropy(m(x, keep), y), batches, compiled)


def _same(eager, compiled):
    for a, b in zip(eager[0], compiled[0]):
        np.testing.assert_array_equal(a, b)
    assert eager[1].keys() == compiled[1].keys()
    for k in eager[1]:
        np.testing.assert_array_equal(eager[1][k], compiled[1][k], err_msg=k)


# Both convolutions take the algorithm forced. Folds: relu after conv1 and after conv2 (into
# the GEMM or the Winograd output transform), relu_grad after the pooling backward, and with
# Winograd also relu_grad after conv2's input gradient (the implicit GEMM's is not folded).
@pytest.mark.parametrize("algo,folds", [("gemm", 3), ("winograd4", 4)])
def test_folds_and_replays_bit_for_bit(device, conv_kernels, monkeypatch, algo, folds):
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
    eager = _run(device, False)
    compiled = _run(device, True)
    assert compiled[2].fusions == folds
    _same(eager, compiled)


def test_special_values(device, conv_kernels, monkeypatch):
    """Zeros, inf and the NaN they make: relu's and relu_grad's rules at those values (relu(0)
    = 0, gradient 0 at 0, NaN passed through), folded as unfolded."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", "winograd4")
    eager = _run(device, False, special=True, dropout=0.0)
    compiled = _run(device, True, special=True, dropout=0.0)
    assert compiled[2].fusions == 4
    assert not np.isfinite(eager[0][1])  # the inf did reach the loss
    _same(eager, compiled)


@pytest.mark.parametrize("algo", ["gemm", "winograd4"])
def test_kernels_after_folding(device, conv_kernels, monkeypatch, algo):
    """The replay launches no relu kernel, and no relu_grad kernel of the conv layers: the
    folded launches are gone from the list, not only counted."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
    _, _, run = _run(device, True, dropout=0.0)
    kernels = _replayed_kernels(run)
    assert not any(k.startswith("unary_") and "relu" in k for k in kernels), kernels
    if algo == "gemm":  # both forwards on the GEMM's relu instance; conv2's input gradient
        # (the implicit GEMM) keeps its relu_grad launch
        assert sum(k.startswith("conv2d_forward_") and k.endswith("_relu") for k in kernels) == 2
        assert sum("relu_grad" in k for k in kernels) == 1, kernels
    else:  # conv1's and conv2's forward, conv2's input gradient (conv1 needs none)
        assert not any("relu_grad" in k for k in kernels), kernels
        assert kernels.count("conv2d_winograd4_output") == 3


def test_visible_intermediate_is_not_folded(device, conv_kernels, monkeypatch):
    """conv2's output kept on the module after the step: its relu is not folded (the kept
    Array must hold conv2's output, not relu's), and the replay still matches eager."""
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", "gemm")
    eager = _run(device, False, keep=True)
    compiled = _run(device, True, keep=True)
    assert compiled[2].fusions == 2  # conv1's relu and the pooling backward's relu_grad
    _same(eager, compiled)


def test_fusion_switched_off(device, conv_kernels, monkeypatch):
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", "winograd4")
    monkeypatch.setenv("FASTMETAL_COMPILE_FUSION", "0")
    eager = _run(device, False)
    compiled = _run(device, True)
    assert compiled[2].fusions == 0
    _same(eager, compiled)


def test_relu_saves_its_output_not_its_input(device):
    """relu's gradient reads relu's output (relu_grad(g, out)), so the convolution's output is
    not kept for backward (and can be folded): the gradient is the same, 0 at 0 as PyTorch's."""
    x = fm.asarray(np.array([-1.0, 0.0, 2.0, np.nan], np.float32), device=device).requires_grad_()
    y = fm.relu(x)
    y.backward(fm.ones_like(y))
    np.testing.assert_array_equal(np.array(x.grad), [0.0, 0.0, 1.0, 1.0])
    # Second order: relu's gradient is piecewise constant.
    x2 = fm.asarray(np.array([-1.0, 2.0], np.float32), device=device).requires_grad_()
    (g,) = fm.autograd.grad(fm.relu(x2).sum() * 3.0, [x2], create_graph=True)
    np.testing.assert_array_equal(np.array(g), [0.0, 3.0])
    (gg,) = fm.autograd.grad((g * g).sum(), [x2], allow_unused=True)
    assert gg is None or not np.any(np.array(gg))


class Varied(nn.Module):
    """A conv net whose shapes, biases, pooling and wiring vary: some of its launches can be
    folded and some cannot (a ReLU launch with a tail of < 4 elements, overlapping pooling
    windows, a convolution output that a residual sum reads as well)."""

    def __init__(self, c1, c2, bias, pool, residual):
        super().__init__()
        self.conv1 = nn.Conv2d(2, c1, 3, padding=1, bias=bias)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=bias)
        self.pool, self.residual = pool, residual

    def forward(self, x):
        h = F.relu(self.conv1(x))
        z = self.conv2(h)
        y = F.relu(z)
        if self.residual:
            y = y + z  # conv2's output is read twice: its relu cannot be folded
        k, s = self.pool
        y = F.max_pool2d(y, k, s)
        return fm.flatten(y, 1).sum(axis=1)


# With at most 4 output channels a convolution runs the direct kernel (its forward, and its
# input gradient with at most 4 input channels), which the pass does not fold into.
@pytest.mark.parametrize("c1,c2,hw,bias,pool,residual,algo,folds", [
    # conv1 direct; conv2's relu into the Winograd output? no: 4 channels, direct too; the
    # pooling backward's relu_grad (9 x 9: the last cells reach the edge) is folded
    (4, 4, 9, True, (2, 2), False, "winograd4", 1),
    # conv2's relu into its GEMM forward, the pooling backward's relu_grad: on the CPU (one
    # element a thread). 3 * 5 * 49 elements: a GPU runs them in 16-byte chunks plus a launch
    # for the 3 left over, and the pass folds no launch that covers part of an intermediate
    (3, 5, 7, False, (2, 2), False, "gemm", 2),
    # overlapping windows: the general pooling backward, not folded; conv2's relu folded
    (4, 8, 8, True, (3, 2), False, "winograd4", 1),
    # residual: conv2's output read twice, and the pooling reads the sum: nothing folded
    (4, 8, 8, False, (2, 2), True, "gemm", 0),
    # conv1's relu and its gradient (into conv2's Winograd input gradient) folded
    (8, 8, 6, True, (2, 2), True, "winograd4", 2),
    # F(2x2, 3x3): conv2's relu into its output transform, the pooling backward's relu_grad
    (2, 6, 10, False, (2, 2), False, "winograd", 2),
])
def test_varied_networks_replay_bit_for_bit(device, conv_kernels, monkeypatch, c1, c2, hw, bias,
                                            pool, residual, algo, folds):
    monkeypatch.setenv("FASTMETAL_CONV_ALGO", algo)
    rng = np.random.default_rng(c1 * 100 + c2 * 10 + hw)
    xs = [fm.asarray(rng.standard_normal((3, 2, hw, hw)).astype(np.float32), device=device)
          for _ in range(3)]

    def run(compiled):
        fm.random.seed(0)
        net = Varied(c1, c2, bias, pool, residual).to(device)
        opt = fm.optim.SGD(net.parameters(), lr=0.01)
        return _train(net, opt, lambda m, x: (m(x) ** 2).mean(), [(x,) for x in xs], compiled)

    eager, compiled = run(False), run(True)
    _same(eager, compiled)
    chunked = device != "cpu" and (3 * c2 * hw * hw) % 4 != 0
    assert compiled[2].fusions == (0 if chunked else folds)
    kernels = _replayed_kernels(compiled[2])
    if residual:  # conv2's relu (its input is read again) stays a launch of its own
        assert any(k.startswith("unary_") and "relu" in k for k in kernels), kernels
    if pool == (3, 2):  # the general pooling backward is not a producer the pass knows
        assert "max_pool2d_backward" in kernels


def test_linear_relu_folds_into_the_bias_add(device, kernels):
    """An MLP: each Linear's bias add and the ReLU after it become one add_relu launch; losses
    and parameters (Adam) equal eager's bit for bit."""
    rng = np.random.default_rng(5)
    batches = [(fm.asarray(rng.standard_normal((16, 20)).astype(np.float32), device=device),
                fm.asarray(rng.integers(0, 5, 16), dtype="int64", device=device)) for _ in range(4)]

    def run(compiled):
        fm.random.seed(0)
        net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 24), nn.ReLU(),
                            nn.Linear(24, 5)).to(device)
        opt = fm.optim.Adam(net.parameters(), lr=1e-2)
        return _train(net, opt, lambda m, x, y: F.cross_entropy(m(x), y), batches, compiled)

    eager, compiled = run(False), run(True)
    _same(eager, compiled)
    assert compiled[2].fusions == 2
    kernels = _replayed_kernels(compiled[2])
    assert sum(k.endswith("_add_relu_float32") for k in kernels) == 2, kernels
    assert not any(k.startswith("unary_") and "relu" in k for k in kernels), kernels


def test_add_into_part_of_an_array_is_not_folded(device, kernels):
    """An add that writes part of an array (out= a column slice) and a relu over all of it:
    folding would leave the rest of relu's output unwritten, so the pass leaves them; a plain
    relu(a + b) is folded. Both replay what eager computes."""
    rng = np.random.default_rng(6)
    a = fm.asarray(rng.standard_normal((8, 8)).astype(np.float32), device=device)
    b = fm.asarray(rng.standard_normal(8).astype(np.float32), device=device)

    def part(a, b):
        big = fm.full((8, 16), -1.0, device=device)
        fm.add(a, b, out=big[:, :8])
        return fm.relu(big) * 2.0

    def whole(a, b):
        return fm.relu(a + b) * 2.0

    for fn, folds in ((part, 0), (whole, 1)):
        c = fm.compile(fn)
        outs = [np.array(c(a, b)) for _ in range(3)]
        for o in outs:
            np.testing.assert_array_equal(o, np.array(fn(a, b)))
        assert c.fusions == folds, fn.__name__


def test_resnet20_residual_add_relu_folds(device, kernels, conv_kernels):
    """ResNet-20's blocks end in relu(out + shortcut): each of the 9 is one add_relu launch
    in the replay, which still equals eager bit for bit (losses, parameters, BatchNorm's
    buffers, momentum). Its other ReLUs follow BatchNorm, which the pass does not fold into."""
    from fastmetal.models import resnet20

    rng = np.random.default_rng(0)
    batches = [(fm.asarray(rng.standard_normal((6, 3, 8, 8)).astype(np.float32), device=device),
                fm.asarray(rng.integers(0, 5, 6), dtype="int64", device=device)) for _ in range(3)]

    def run(compiled):
        model = resnet20(num_classes=5, width=4, seed=3, device=device)
        opt = fm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        return _train(model, opt, lambda m, x, y: F.cross_entropy(m(x), y), batches, compiled)

    eager, compiled = run(False), run(True)
    _same(eager, compiled)
    # 9 on the CPU's kernels; a GPU may find more where its layouts allow (never fewer)
    assert compiled[2].fusions == 9 if device == "cpu" else compiled[2].fusions >= 9
