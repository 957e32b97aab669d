"""tests/optional_rerun.py, CI's `--rerun-skipped-for-missing`: a small project is run once
without an optional module (`fakeopt`), then, with the module importable, the rerun must
select exactly the tests whose result can change, print why, fall back to the files that
mention torch/mlxtend without a record, and refuse to select nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import optional_rerun

def pytest_addoption(parser):
    optional_rerun.addoption(parser)

def pytest_configure(config):
    optional_rerun.configure(config)
"""

TEST_OPT = """
import subprocess, sys
import pytest
import libmod
try:
    import fakeopt
except ImportError:
    fakeopt = None

def _reference(x):
    return fakeopt.double(x) if fakeopt is not None else 2 * x

@pytest.fixture
def ref():
    return fakeopt

def test_plain():
    assert 2 * 2 == 4

@pytest.mark.skipif(fakeopt is None, reason="fakeopt is not installed")
def test_skipif():
    assert fakeopt.double(1) == 2

def test_importorskip():
    mod = pytest.importorskip("fakeopt")
    assert mod.double(2) == 4

def test_library_looks_it_up():
    assert libmod.has_fakeopt() in (True, False)

def test_names_it():
    if fakeopt is not None:
        assert fakeopt.double(3) == 6

def test_through_helper():
    assert _reference(4) == 8

def test_through_fixture(ref):
    assert ref is None or ref.double(5) == 10

def test_spawns():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.parametrize("n", [1] + ([2] if fakeopt is not None else []))
def test_param(n):
    assert n in (1, 2)

class TestGroup:
    def test_method_names_it(self):
        assert fakeopt is None or fakeopt.double(0) == 0

    def test_method_plain(self):
        assert True
"""

TEST_OTHER = """
import subprocess, sys

def test_other_plain():
    assert True

def test_other_spawns():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""

LIBMOD = """
def has_fakeopt():
    try:
        import fakeopt
    except ImportError:
        return False
    return True
"""


def _project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "tests").mkdir(parents=True)
    (proj / "lib").mkdir()
    (proj / "opt").mkdir()
    (proj / "pytest.ini").write_text("[pytest]\n")
    (proj / "tests" / "conftest.py").write_text(CONFTEST)
    (proj / "tests" / "test_opt.py").write_text(textwrap.dedent(TEST_OPT))
    (proj / "tests" / "test_other.py").write_text(textwrap.dedent(TEST_OTHER))
    (proj / "lib" / "libmod.py").write_text(LIBMOD)
    (proj / "fakeopt.py.off").write_text("def double(x):\n    return 2 * x\n")
    return proj


def _pytest(proj: Path, *args, with_module: bool):
    path = [str(proj / "lib")] + ([str(proj / "opt")] if with_module else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.pop("PYTEST_ADDOPTS", None)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # faster start; the plugin is in conftest
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=120)


def _install(proj: Path):
    (proj / "opt" / "fakeopt.py").write_text((proj / "fakeopt.py.off").read_text())


def _selected(out: str) -> set:
    return {line.split("::", 1)[1] for line in out.splitlines() if line.startswith("tests/")}


def test_rerun_selects_the_tests_a_new_module_can_change(tmp_path):
    proj = _project(tmp_path)
    first = _pytest(proj, with_module=False)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "2 skipped" in first.stdout, first.stdout
    _install(proj)
    second = _pytest(proj, "--rerun-skipped-for-missing", "--collect-only", with_module=True)
    assert second.returncode == 0, second.stdout + second.stderr
    assert _selected(second.stdout) == {
        "test_skipif", "test_importorskip", "test_library_looks_it_up", "test_names_it",
        "test_through_helper", "test_through_fixture", "test_spawns", "test_param[2]",
        "TestGroup::test_method_names_it"}, second.stdout
    assert ("--rerun-skipped-for-missing: 9 of 14 tests can change now that fakeopt can be "
            "imported: 2 skipped, 1 looked up, 4 name, 1 started a process, 1 new") \
        in second.stdout, second.stdout
    # The rerun itself runs them (and passes: fakeopt is there now).
    third = _pytest(proj, "--rerun-skipped-for-missing", with_module=True)
    assert third.returncode == 0 and "9 passed, 5 deselected" in third.stdout, third.stdout


def test_without_a_record_it_falls_back_to_the_files_that_mention_torch(tmp_path):
    proj = _project(tmp_path)
    (proj / "tests" / "test_other.py").write_text(
        textwrap.dedent(TEST_OTHER) + "\n# compares with torch where installed\n")
    _install(proj)
    out = _pytest(proj, "--rerun-skipped-for-missing", "--collect-only", with_module=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no record in pytest's cache" in out.stdout, out.stdout
    assert _selected(out.stdout) == {"test_other_plain", "test_other_spawns"}, out.stdout


def test_a_record_that_selects_nothing_is_an_error(tmp_path):
    proj = _project(tmp_path)
    # The module is looked up (while collecting) but no test depends on it.
    (proj / "tests" / "test_opt.py").write_text(
        "try:\n    import fakeopt\nexcept ImportError:\n    pass\n\ndef test_x():\n    pass\n")
    first = _pytest(proj, with_module=False)
    assert first.returncode == 0, first.stdout + first.stderr
    _install(proj)
    out = _pytest(proj, "--rerun-skipped-for-missing", with_module=True)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "none selected; refusing to run nothing" in out.stdout + out.stderr


def test_a_record_from_a_run_that_had_the_module_is_no_guide(tmp_path):
    """Nothing was missing then: fall back to the file list (here empty: an error)."""
    proj = _project(tmp_path)
    _install(proj)
    first = _pytest(proj, with_module=True)
    assert first.returncode == 0, first.stdout + first.stderr
    out = _pytest(proj, "--rerun-skipped-for-missing", "--collect-only", with_module=True)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "the recorded run missed none" in out.stdout + out.stderr
