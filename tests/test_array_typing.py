"""Type stubs: py.typed + .pyi for fastmetal and fastmetal._core, checked by mypy --strict and
held against the runtime by mypy's stubtest."""
from __future__ import annotations

import ast
import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import fastmetal as fm

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "python" / "fastmetal"

# A user's code touching the Array surface: the stubs must accept it and infer Arrays.
ARRAY_USAGE = textwrap.dedent('''
    import numpy as np
    import fastmetal as fm

    a = fm.asarray(np.ones((2, 3), np.float32))
    b: fm.Array = (a + 1) * a - 2 / a ** 2
    c: fm.Array = a[0, ::-1].reshape(3, 1).T.squeeze() + fm.expand_dims(a, 0)[0]
    a[1, :] = np.arange(3.0)
    a += 1.0
    mask: fm.Array = (a > 0.5) * (a != b)
    host: np.ndarray = fm.relu(np.zeros(3, np.float32))
    dev: fm.Array = fm.maximum(a, 0.0)
    x: float = a[0, 0].item()
    d: fm.Array = a.astype("float16").copy().to(a.device).ravel().flatten()
    fm.random.seed(0)
    g = fm.random.Generator(2**40)
    eps: fm.Array = fm.random.normal((2, 3), std=0.5, generator=g) * fm.random.uniform(3)
    m: fm.Array = fm.random.bernoulli(0.25, [4], dtype="float16", device=a.device)
    n: int = g.counter + g.manual_seed(1).seed
    ''')


def stub_tree(tmp_path: Path) -> Path:
    """A directory holding only the stubs of the fastmetal being tested, for MYPYPATH (mypy
    then reads no .py). The elementwise stubs (ops/elementwise.pyi) are generated from the op
    table by the build and installed beside ops/elementwise.py; an editable install runs the
    package from the source tree, where they are generated here the same way."""
    root = tmp_path / "stubs"
    (root / "fastmetal").mkdir(parents=True)
    package = Path(fm.__file__).resolve().parent
    for f in [*package.rglob("*.pyi"), package / "py.typed"]:
        target = root / "fastmetal" / f.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, target)
    generated = root / "fastmetal" / "ops" / "elementwise.pyi"
    if not generated.exists():
        assert package == PACKAGE, f"{package} has no ops/elementwise.pyi: the build must install it"
        subprocess.run([sys.executable, str(REPO / "tools" / "gen" / "gen_stubs.py"),
                        "--out", str(generated)], check=True, timeout=60)
    return root / "fastmetal"


def run_mypy(tmp_path: Path, *files: str) -> subprocess.CompletedProcess[str]:
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
            pytest.fail("mypy is not installed and FASTMETAL_REQUIRE_GATES=1")
        pytest.skip("mypy is not installed (pip install mypy, or the 'test' extra)")
    env = dict(os.environ, MYPYPATH=str(stub_tree(tmp_path).parent))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / "mypy_cache"), *files],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)


def test_examples_and_array_surface_pass_mypy_strict(tmp_path):
    # One mypy run (they are slow): the examples and the usage snippet must be clean, and
    # the deliberately wrong file must fail on exactly its two bad lines, so the check
    # can fail.
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.py"))
    assert examples
    (tmp_path / "usage.py").write_text(ARRAY_USAGE)
    (tmp_path / "bad.py").write_text("import fastmetal as fm\nfm.zeros(3).squeeze(axis='x')\n"
                                     "y: str = fm.zeros(3) + 1\n")
    result = run_mypy(tmp_path, *examples, str(tmp_path / "usage.py"), str(tmp_path / "bad.py"))
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    bad_lines = sorted({line.split(":")[1] for line in errors if line.startswith("bad.py:")})
    others = [line for line in errors if not line.startswith("bad.py:")]
    assert not others, result.stdout + result.stderr
    assert bad_lines == ["2", "3"], result.stdout + result.stderr


def _stub_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and [a.name for a in node.names] == ["*"]:
            # `from .mod import *`: the names in mod.pyi's __all__
            names.update(_stub_all(_relative_stub(path, node)))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _relative_stub(path: Path, node: ast.ImportFrom) -> Path:
    """The stub file a relative `from .a.b import ...` in stub `path` names."""
    base = path.parent
    for _ in range(node.level - 1):
        base = base.parent
    target = base.joinpath(*(node.module or "").split("."))
    return target / "__init__.pyi" if target.is_dir() else target.with_suffix(".pyi")


def _stub_all(path: Path) -> list[str]:
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "__all__"):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path} has no literal __all__")


def test_every_public_name_has_a_stub(tmp_path):
    package = stub_tree(tmp_path)
    assert (PACKAGE / "py.typed").exists() and (package / "py.typed").exists()
    declared = _stub_names(package / "__init__.pyi")
    missing = sorted(set(fm.__all__) - declared)
    assert not missing, f"add these to python/fastmetal/__init__.pyi: {missing}"
    for module, stub in (("nn", "nn/__init__.pyi"), ("optim", "optim/__init__.pyi"),
                         ("random", "random.pyi"), ("autograd", "autograd/__init__.pyi"),
                         ("data", "data/__init__.pyi"), ("nn.functional", "nn/functional.pyi"),
                         ("distributed", "distributed/__init__.pyi"),
                         ("nn.parallel", "nn/parallel.pyi"),
                         ("nn.init", "nn/init.pyi"), ("nn.utils", "nn/utils.pyi"),
                         ("optim.lr_scheduler", "optim/lr_scheduler.pyi")):
        runtime = importlib.import_module(f"fastmetal.{module}")
        missing = sorted(set(runtime.__all__) - _stub_names(package / stub))
        assert not missing, f"add these to python/fastmetal/{stub}: {missing}"


def test_elementwise_stubs_follow_the_op_table(tmp_path):
    # Generated from the table by the build: one stub per line, unary/binary as the table says.
    from fastmetal.ops.optable import OPS
    stub = stub_tree(tmp_path) / "ops" / "elementwise.pyi"
    assert _stub_all(stub) == [spec.name for spec in OPS if spec.public]
    arity = {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            arity.setdefault(node.name, len(node.args.args) - 1)  # minus out
    assert arity == {spec.name: spec.arity for spec in OPS}


def test_every_array_attribute_has_a_stub():
    tree = ast.parse((PACKAGE / "_core.pyi").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Array")
    declared = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    declared |= {n.target.id for n in cls.body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    public = {n for n in dir(fm.Array) if not n.startswith("_")}
    missing = sorted(public - declared)
    assert not missing, f"add these to fastmetal.Array in python/fastmetal/_core.pyi: {missing}"


def test_stubs_match_the_runtime(tmp_path):
    """mypy's stubtest holds every .pyi against the imported package: a name, parameter or
    default the stubs lack or invent fails here. Deliberate differences are listed, with
    why, in tests/stubtest_allowlist.txt; modules typed inline (py.typed, no .pyi) have no
    stub to check. The compiled functions of _core carry no signature pybind11 exposes, so
    for them stubtest checks that each exists (and each stub has a runtime object)."""
    try:
        import mypy.stubtest  # noqa: F401
    except ImportError:
        if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
            pytest.fail("mypy is not installed and FASTMETAL_REQUIRE_GATES=1")
        pytest.skip("mypy is not installed (pip install mypy, or the 'test' extra)")
    stubs = stub_tree(tmp_path)
    # Modules without a stub, as stubtest names them (it skips private ones).
    private = lambda part: part.startswith("_") and not part.endswith("__")  # noqa: E731
    inline = [p.relative_to(PACKAGE).with_suffix("") for p in sorted(PACKAGE.rglob("*.py"))
              if not (stubs / p.relative_to(PACKAGE)).with_suffix(".pyi").exists()
              and not any(map(private, p.relative_to(PACKAGE).with_suffix("").parts))]
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text((REPO / "tests" / "stubtest_allowlist.txt").read_text() + "".join(
        ".".join(("fastmetal", *p.parts)).removesuffix(".__init__") + "\n" for p in inline))
    config = tmp_path / "mypy.ini"
    # The inline-typed modules the stubs import are read, their errors not reported (mypy
    # --strict of the stubs is the test above).
    config.write_text("[mypy]\nignore_missing_imports = True\nfollow_imports = silent\n")
    result = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "fastmetal", "--concise",
         "--allowlist", str(allowlist), "--mypy-config-file", str(config)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env=dict(os.environ, MYPYPATH=str(stubs.parent), SKBUILD_EDITABLE_VERBOSE="0"))
    assert result.returncode == 0, result.stdout + result.stderr
