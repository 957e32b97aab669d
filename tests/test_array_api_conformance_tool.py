"""tools/array_api_conformance.py without the suite (it is not in the repository): it says how
to get it, refuses a folder that is not a checkout at the pinned commit's layout, edits only
its temporary copy (the three lines, each found exactly once), and counts and groups outcomes."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO

TOOL = REPO / "tools" / "array_api_conformance.py"


def _load():
    spec = importlib.util.spec_from_file_location("array_api_conformance", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _load()


def _fake_checkout(root, edits=True):
    (root / "array_api_tests").mkdir(parents=True)
    (root / "array_api_tests" / "__init__.py").write_text("")
    (root / "array-api" / "src" / "array_api_stubs").mkdir(parents=True)
    for rel, old, _new in tool.SUITE_EDITS:
        path = root / rel
        text = path.read_text() if path.exists() else ""
        path.write_text(text + "before\n" + (old if edits else "") + "\nafter\n")


def test_without_a_path_it_says_how_to_get_the_suite():
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, check=False)
    assert out.returncode == 2
    assert tool.SUITE_COMMIT in out.stdout and tool.SPEC_COMMIT[:12] in out.stdout
    assert "git clone https://github.com/data-apis/array-api-tests" in out.stdout


def test_a_folder_that_is_not_a_checkout_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="is not an array-api-tests checkout"):
        tool.check_checkout(tmp_path)
    (tmp_path / "array_api_tests").mkdir()
    (tmp_path / "array_api_tests" / "__init__.py").write_text("")
    with pytest.raises(SystemExit, match="the spec submodule\\) is empty"):
        tool.check_checkout(tmp_path)


def test_the_copy_gets_the_edits_and_the_checkout_stays(tmp_path):
    src = tmp_path / "suite"
    _fake_checkout(src)
    originals = {rel: (src / rel).read_text() for rel, _, _ in tool.SUITE_EDITS}
    tool.prepare_copy(src, tmp_path / "copy")
    for rel, old, new in tool.SUITE_EDITS:
        assert (src / rel).read_text() == originals[rel]
        copied = (tmp_path / "copy" / rel).read_text()
        assert new in copied and old not in copied.replace(new, "")
    other = tmp_path / "other"
    _fake_checkout(other, edits=False)  # another suite commit: the lines are not there
    with pytest.raises(SystemExit, match="the line to edit was not found once"):
        tool.prepare_copy(other, tmp_path / "copy2")


def test_counts_and_groups():
    tests = {
        "array_api_tests/test_a.py::test_f[x]": {"outcome": "failed", "message": "E1: first\nmore"},
        "array_api_tests/test_a.py::test_f[y]": {"outcome": "failed", "message": "E1: second"},
        "array_api_tests/test_a.py::test_g": {"outcome": "passed", "message": ""},
        "array_api_tests/test_b.py": {"outcome": "error", "message": "ImportError: no"},
        "array_api_tests/test_c.py::test_h": {"outcome": "skipped", "message": "off"},
    }
    line = tool.summarize("mod", tests, 3.0)
    assert "module mod: 1 passed, 2 failed, 1 skipped, 1 errors (5 tests, 3 s)" in line
    assert tool.failure_groups(tests) == [("test_a.py::test_f", 2, "E1: first"),
                                          ("test_b.py", 1, "ImportError: no")]
