"""The strict MSL gate (tools/check_msl.py): the kernels compile the way Apple's compiler
wants them, and the gate proves it can fail. Also the CPU shim's NaN test mode, in which
metal::min/max/clamp answer differently for NaN (MSL leaves those cases undefined)."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from conftest import REPO


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


check_msl = _load("check_msl")


def skip_or_fail(reason: str):
    """A gate whose tool is missing skips; with FASTMETAL_REQUIRE_GATES=1 (CI) it fails."""
    if os.environ.get("FASTMETAL_REQUIRE_GATES") == "1":
        pytest.fail(f"FASTMETAL_REQUIRE_GATES=1 but the gate cannot run: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cindex():
    ci, why = check_msl.load_cindex()
    if ci is None:
        skip_or_fail(why)
    return ci


def test_kernels_pass_the_strict_gate(cindex):
    findings = check_msl.run_gate(REPO / "metal", cindex)
    assert findings == [], "\n".join(map(str, findings))


def test_gate_rejects_every_planted_error(cindex):
    """Teeth: each kind of error a Mac rejects, planted into a copy of a real kernel."""
    assert check_msl.self_check(REPO / "metal", cindex) == []
    assert len({m.rule for m in check_msl.MUTATIONS}) >= 11


def test_gate_names_file_line_and_rule(cindex, tmp_path):
    copy = check_msl.copy_metal(REPO / "metal", tmp_path / "metal")
    m = next(m for m in check_msl.MUTATIONS if m.rule == "metal-namespace")
    check_msl.plant(copy, m)
    text = (copy / m.file).read_text()
    line = text[: text.index(m.new)].count("\n") + 1
    found = [str(f) for f in check_msl.run_gate(copy, cindex)]
    assert any(s.endswith(f"fm_math.h:{line}: [metal-namespace] use of undeclared identifier 'clamp'")
               for s in found), found


def test_cli_exit_status(cindex, tmp_path, capsys):
    copy = check_msl.copy_metal(REPO / "metal", tmp_path / "metal")
    assert check_msl.main(["--metal-dir", str(copy)]) == 0
    check_msl.plant(copy, check_msl.MUTATIONS[0])
    assert check_msl.main(["--metal-dir", str(copy)]) == 1
    assert "[kernel-param]" in capsys.readouterr().out


def test_missing_libclang_is_reported(monkeypatch):
    """Without libclang the gate says why (and the test fixture turns that into a skip)."""
    import builtins
    real_import = builtins.__import__

    def no_clang(name, *a, **k):
        if name.startswith("clang"):
            raise ImportError("No module named 'clang'")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_clang)
    monkeypatch.delitem(sys.modules, "clang.cindex", raising=False)
    monkeypatch.delitem(sys.modules, "clang", raising=False)
    ci, why = check_msl.load_cindex()
    assert ci is None and "pip install libclang" in why
