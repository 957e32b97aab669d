"""The public namespace is exactly the documented API (docs/API.md's lists plus one name per
line of the op table): nothing leaks, every name is defined for real (no globals().update),
and the elementwise names match the op table."""
from __future__ import annotations

import re
import types
from pathlib import Path

import fastmetal as fm
from fastmetal import _core, _declare, _elementwise, nn, random
from fastmetal._optable import OPS

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "API.md"
# Where the functions are defined (imported by the package, so attributes of it); not API names.
SUBMODULES = {"conv", "numerics", "nn", "reductions", "linalg", "training", "layers", "optim",
              "module", "losses", "nn_utils", "creation", "manipulation", "arithmetic"}


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
        assert name in fm.__all__, name
        assert getattr(fm, name) is fn, name
        if name not in {spec.name for spec in OPS}:
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
    assert {n for n in vars(nn) if not n.startswith("_")} == set(nn.__all__)
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
