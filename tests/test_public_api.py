"""The public namespace is exactly the documented API (docs/API.md's lists plus one name per
line of the op table): nothing leaks, every name is defined for real (no globals().update),
and the elementwise names match the op table."""
from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import _core, nn, random
from fastmetal.autograd import declare as _declare
from fastmetal.ops import elementwise as _elementwise
from fastmetal.ops.optable import OPS

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "API.md"
# Where the functions are defined (imported by the package, so attributes of it); not API names.
# The subpackages the package imports that are not API names of their own (docs/API.md).
SUBMODULES = {"ops", "array"}


def documented_names(section_prefix: str) -> set[str]:
    """Names in the `<!-- api: ... -->` list of docs/API.md."""
    text = API_DOC.read_text()
    m = re.search(rf"<!-- api: {re.escape(section_prefix)} -->\n(.*?)\n<!-- /api -->", text, re.S)
    assert m, f"docs/API.md has no api list for {section_prefix}"
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", m.group(1)))


def test_dir_of_fastmetal_is_exactly_the_documented_api():
    # Adding an elementwise op is one line of the op table: its name is API without a doc edit.
    table = {spec.name for spec in OPS if spec.public}  # "internal:" lines are not API
    documented = documented_names("fastmetal")
    assert not documented & table, "list the op table's names in the table, not in docs/API.md"
    assert set(dir(fm)) == set(fm.__all__) == documented | table


def test_one_road_to_a_public_op():
    # FM_PYTHON_OP binds private kernels only; a public op is a Python declaration (op), whose
    # name is in __all__, in docs/API.md (or the op table) and in the stubs.
    assert all(name.startswith("_") for name, _sig, _doc in _core._python_ops())
    stubs = (Path(fm.__file__).with_name("__init__.pyi")).read_text()
    for name, fn in _declare.DECLARED.items():
        home = fm if name in fm.__all__ else fm.nn.functional  # F-only functions, as PyTorch's
        assert name in home.__all__, name
        assert getattr(home, name) is fn, name
        if name not in {spec.name for spec in OPS} and home is fm:
            assert f"def {name}(" in stubs, f"{name} has no stub in __init__.pyi"


def test_dir_of_fastmetal_nn_is_exactly_the_documented_api():
    assert set(dir(nn)) == set(nn.__all__) == documented_names("fastmetal.nn")


def test_dir_of_fastmetal_random_is_exactly_the_documented_api():
    assert fm.random is random and random.__name__ == "fastmetal.random"
    assert set(dir(random)) == set(random.__all__) == documented_names("fastmetal.random")
    assert {n for n in vars(random) if not n.startswith("_")} == set(random.__all__)


def test_no_leaked_public_attributes():
    public = {n for n in vars(fm) if not n.startswith("_")}
    # Beyond the modules the package imports, a submodule that someone imported (for example
    # fastmetal.datasets, fastmetal.benchmarks) becomes an attribute too; nothing else may.
    on_demand = {n for n in public - set(fm.__all__) - SUBMODULES
                 if isinstance(getattr(fm, n), types.ModuleType)
                 and getattr(fm, n).__name__ == f"fastmetal.{n}"}
    assert public - set(fm.__all__) - on_demand <= SUBMODULES
    for leaked in ("annotations", "version", "PackageNotFoundError", "globals"):
        assert not hasattr(fm, leaked)
    # nn.modules: the Modules' subpackage, as torch.nn.modules (not an API name).
    assert {n for n in vars(nn) if not n.startswith("_")} - {"modules"} == set(nn.__all__)
    assert not hasattr(nn, "np")


def test_every_public_name_is_a_real_definition():
    for name in fm.__all__:
        assert hasattr(fm, name), name
    public = [s for s in OPS if s.public]
    for spec in public:
        fn = getattr(fm, spec.name)
        assert isinstance(fn, types.FunctionType) and fn.__name__ == spec.name
        assert fn is getattr(_elementwise, spec.name)
    assert _elementwise.UNARY == [s.name for s in public if s.arity == 1]
    assert _elementwise.BINARY == [s.name for s in public if s.arity == 2]
    assert _elementwise.__all__ == [s.name for s in public]
    assert "globals().update" not in Path(fm.__file__).read_text()


@pytest.mark.parametrize("module", ["fastmetal.accelerator", "fastmetal.optim", "fastmetal.optim.lr_scheduler",
                                    "fastmetal.nn.functional", "fastmetal.autograd",
                                    "fastmetal.data", "fastmetal.distributed",
                                    "fastmetal.nn.parallel"])
def test_the_subpackages_export_exactly_the_documented_api(module):
    mod = importlib.import_module(module)
    assert set(mod.__all__) == documented_names(module)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"


def test_the_namespaces_a_pytorch_user_imports():
    # The imports PyTorch's programs use, spelled with fastmetal, each the same object as
    # the top-level name where one exists.
    import fastmetal.nn.functional as F
    from fastmetal.nn.optim import StepLR
    from fastmetal.optim.lr_scheduler import StepLR as StepLR2
    import fastmetal.nn.init  # noqa: F401
    import fastmetal.nn.utils  # noqa: F401
    assert fm.nn.optim is fm.optim and StepLR is StepLR2 is fm.optim.StepLR
    assert importlib.import_module("fastmetal.nn.optim") is fm.optim
    assert F.relu is fm.relu and F.conv2d is fm.conv2d and F.cross_entropy is fm.cross_entropy
    assert fm.autograd.no_grad is fm.no_grad and fm.autograd.grad is not fm.grad


def test_autograd_grad_returns_gradients_and_leaves_dot_grad_alone():
    w = fm.asarray(np.array([1.0, 2.0, 3.0], np.float32)).requires_grad_()
    b = fm.asarray(np.array([0.5], np.float32)).requires_grad_()
    loss = fm.sum(w * w) + fm.sum(b * 3.0)
    (gw,) = fm.autograd.grad(loss, w, retain_graph=True)
    np.testing.assert_allclose(gw.numpy(), [2.0, 4.0, 6.0])
    assert w.grad is None and b.grad is None  # other leaves untouched too
    gw2, gb = fm.autograd.grad([loss], [w, b])
    np.testing.assert_allclose(gb.numpy(), [3.0])
    # A non-leaf input: its gradient, as PyTorch's.
    x = fm.asarray(np.array([1.0, -2.0], np.float32)).requires_grad_()
    h = x * 2.0
    (gh,) = fm.autograd.grad(fm.sum(h * h), h)
    np.testing.assert_allclose(gh.numpy(), [4.0, -8.0])
    with pytest.raises(RuntimeError, match=r"\[fastmetal.autograd.grad\] expected every input"):
        fm.autograd.grad(fm.sum(x * 1.0), [x, w])
    (g2,) = fm.autograd.grad(fm.sum(x * x * x), x, create_graph=True)
    assert g2.requires_grad  # differentiable again (tests/test_higher_order.py)
    (none,) = fm.autograd.grad(fm.sum(x * 1.0), [w], allow_unused=True)
    assert none is None
