#!/usr/bin/env python3
"""Runs the Array API conformance suite (data-apis/array-api-tests) against one module.

The suite is not part of this repository and this script never fetches it: give it the path
of a checkout at the pinned commits (SUITE_COMMIT, with its array-api submodule at
SPEC_COMMIT); without one it prints how to get it. The checkout is copied to a temporary
folder and run from there, so it stays untouched; the copy gets the suite edits below
(SUITE_EDITS) and nothing else.

The project's settings (docs/API.md, "Conformance"): spec 2024.12, complex dtypes skipped
(ARRAY_API_TESTS_SKIP_DTYPES), the linalg and fft extensions disabled, 10 Hypothesis examples
per test, derandomized (the same examples each run, so the counts can be compared).

    python tools/array_api_conformance.py /path/to/array-api-tests --module fastmetal
    python tools/array_api_conformance.py /path/to/array-api-tests --module array_api_strict
    ... --shim-bool          give the module a `bool` attribute (numpy.dtype(bool)) in the
                             test process only: the suite refuses to start without one
    ... -- -k test_add       anything after `--` goes to pytest (a path there replaces
                             the whole suite: array_api_tests/test_has_names.py)

It prints a one-line summary (passed, failed, skipped, errors), then the failing tests
grouped by test function with one failure message each; --json FILE keeps every outcome.
The same file is the pytest plugin (-p array_api_conformance) that records the outcomes.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SUITE_URL = "https://github.com/data-apis/array-api-tests"
SUITE_COMMIT = "55fcc60179efa2680ddd6cd926ddf17b83530e2b"  # 2026.02.26-20-g55fcc60, 2026-04-03
SPEC_COMMIT = "5f847a3858875c682ae901aa22b0413bf24be9da"   # data-apis/array-api, its submodule
API_VERSION = "2024.12"
SKIP_DTYPES = "complex64,complex128"
DISABLED_EXTENSIONS = ("linalg", "fft")
MAX_EXAMPLES = 10

HOW_TO_GET = f"""\
get the suite at the pinned commits (outside this repository):
    git clone {SUITE_URL} /tmp/array-api-tests
    git -C /tmp/array-api-tests checkout {SUITE_COMMIT}
    git -C /tmp/array-api-tests submodule update --init   # array-api at {SPEC_COMMIT[:12]}
    pip install pytest 'hypothesis>=6.151' 'ndindex>=1.8' array-api-strict"""

# The suite's only edits: at the pinned commit it cannot import for a library without complex
# dtypes (or with them skipped): max() of no complex dtypes, a complex->real table that reads
# xp.float64 eagerly, and a dtype name looked up for the missing widest complex dtype.
SUITE_EDITS = [
    ("array_api_tests/dtype_helpers.py",
     "    [(dt, dtype_nbits[dt]) for dt in complex_dtypes], key=lambda x: x[1]\n",
     "    [(dt, dtype_nbits[dt]) for dt in complex_dtypes], key=lambda x: x[1], default=(None, 0)\n"),
    ("array_api_tests/dtype_helpers.py",
     '{"complex64": xp.float32, "complex128": xp.float64}',
     '{"complex64": xp.float32, "complex128": getattr(xp, "float64", None)}'),
    ("array_api_tests/test_signatures.py",
     "cmplx_name = dh.dtype_to_name[dh.widest_complex_dtype]",
     'cmplx_name = dh.dtype_to_name.get(dh.widest_complex_dtype, "complex64")'),
]

RESULTS_ENV = "ARRAY_API_CONFORMANCE_RESULTS"
SHIM_ENV = "ARRAY_API_CONFORMANCE_SHIM_BOOL"
SHRINK_ENV = "ARRAY_API_CONFORMANCE_SHRINK"


# ---- the pytest plugin (loaded in the test process with -p array_api_conformance) ----------

def _apply_shim() -> None:
    """--shim-bool: the suite's first line needs xp.bool; give the module NumPy's bool dtype in
    this process only (the module itself is not changed), so the rest of the suite can run."""
    if os.environ.get(SHIM_ENV) != "1":
        return
    import numpy
    module = importlib.import_module(os.environ["ARRAY_API_TESTS_MODULE"])
    if not hasattr(module, "bool"):
        module.bool = numpy.dtype(bool)


_apply_shim()
_outcomes: dict[str, dict] = {}


@pytest.hookimpl(trylast=True)  # after the suite's conftest registers its profile
def pytest_configure(config) -> None:
    """Hypothesis shrinks each failing example, which changes no verdict and takes most of the
    time of a run with many failures: leave it out unless ARRAY_API_CONFORMANCE_SHRINK=1."""
    if os.environ.get(SHRINK_ENV) == "1":
        return
    from hypothesis import Phase, settings
    settings.register_profile("array-api-tests-noshrink", parent=settings.get_profile(
        "array-api-tests"), phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target])
    settings.load_profile("array-api-tests-noshrink")


def pytest_collection_modifyitems(config, items) -> None:
    """What the settings leave out but the suite still runs: test_has_names checks the disabled
    extensions' names, and test_special_cases runs its complex cases with the complex dtypes
    skipped (on no dtype at all). Skip both, as the suite skips the extensions' own tests."""
    for item in items:
        param = item.nodeid.partition("test_has_names.py::test_has_names[")[2]
        if param.split("-", 1)[0] in DISABLED_EXTENSIONS:
            item.add_marker(pytest.mark.skip(reason="extension disabled (--disable-extension)"))
        case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
        if getattr(case, "is_complex", False):
            item.add_marker(pytest.mark.skip(reason="complex special case (complex dtypes skipped)"))


def _message(report) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, tuple):  # a skip: (path, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr)


def pytest_collectreport(report) -> None:
    if report.failed:  # a test module that cannot import: all its tests are one error
        _outcomes[report.nodeid] = {"outcome": "error", "message": _message(report)}


def pytest_runtest_logreport(report) -> None:
    entry = _outcomes.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
    if report.when == "call" and report.failed:
        entry.update(outcome="failed", message=_message(report))
    elif report.failed:  # setup or teardown
        entry.update(outcome="error", message=_message(report))
    elif report.skipped and entry["outcome"] == "passed":
        entry.update(outcome="skipped", message=_message(report))


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).write_text(json.dumps({"exitstatus": int(exitstatus), "tests": _outcomes}))


# ---- the runner ----------------------------------------------------------------------------

def _git_head(path: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def check_checkout(path: Path) -> list[str]:
    """What is wrong with the checkout (missing: fatal; another commit: a warning)."""
    if not (path / "array_api_tests" / "__init__.py").is_file():
        sys.exit(f"[array_api_conformance] {path} is not an array-api-tests checkout\n{HOW_TO_GET}")
    if not (path / "array-api" / "src" / "array_api_stubs").is_dir():
        sys.exit(f"[array_api_conformance] {path}/array-api (the spec submodule) is empty\n{HOW_TO_GET}")
    warnings = []
    for where, want in ((path, SUITE_COMMIT), (path / "array-api", SPEC_COMMIT)):
        head = _git_head(where)
        if head is not None and head != want:
            warnings.append(f"{where} is at {head[:12]}, not the pinned {want[:12]}: counts may differ")
    return warnings


def prepare_copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".git", ".hypothesis", "__pycache__",
                                                            ".pytest_cache"))
    for rel, old, new in SUITE_EDITS:
        file = dst / rel
        text = file.read_text()
        if text.count(old) != 1:
            sys.exit(f"[array_api_conformance] {rel}: the line to edit was not found once "
                     f"(another suite commit?): {old.strip()!r}")
        file.write_text(text.replace(old, new))


def group_key(nodeid: str) -> str:
    """array_api_tests/test_x.py::test_f[params] -> test_x.py::test_f"""
    return nodeid.split("[", 1)[0].removeprefix("array_api_tests/")


def summarize(module: str, tests: dict[str, dict], seconds: float) -> str:
    counts = collections.Counter(t["outcome"] for t in tests.values())
    return (f"array-api-tests {SUITE_COMMIT[:7]} api {API_VERSION} module {module}: "
            f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
            f"{counts['error']} errors ({len(tests)} tests, {seconds:.0f} s)")


def failure_groups(tests: dict[str, dict]) -> list[tuple[str, int, str]]:
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for nodeid, t in tests.items():
        if t["outcome"] in ("failed", "error"):
            groups[group_key(nodeid)].append(t["message"])
    rows = []
    for key, messages in sorted(groups.items()):
        first = next((line for line in messages[0].splitlines() if line.strip()), "")
        rows.append((key, len(messages), re.sub(r"\s+", " ", first)[:160]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite", type=Path, nargs="?", help="array-api-tests checkout")
    parser.add_argument("--module", default="fastmetal", help="the namespace to test")
    parser.add_argument("--max-examples", type=int, default=MAX_EXAMPLES)
    parser.add_argument("--shim-bool", action="store_true",
                        help="give the module numpy.dtype(bool) as `bool` in the test process")
    parser.add_argument("--shrink", action="store_true",
                        help="let Hypothesis shrink failing examples (slower; same counts)")
    parser.add_argument("--json", type=Path, help="write every test's outcome and message here")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:len(argv) - len(extra) - (1 if "--" in argv else 0)])
    args.pytest_args = extra
    if args.suite is None:
        print(HOW_TO_GET)
        return 2
    suite = args.suite.resolve()
    for warning in check_checkout(suite):
        print(f"[array_api_conformance] warning: {warning}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="array_api_conformance_") as tmp:
        copy = Path(tmp) / "array-api-tests"
        prepare_copy(suite, copy)
        results = Path(tmp) / "results.json"
        env = dict(os.environ)
        env.update({
            "ARRAY_API_TESTS_MODULE": args.module,
            "ARRAY_API_TESTS_VERSION": API_VERSION,
            "ARRAY_API_TESTS_SKIP_DTYPES": SKIP_DTYPES,
            "ARRAY_API_STRICT_API_VERSION": API_VERSION,  # array_api_strict's own default is newer
            RESULTS_ENV: str(results),
            SHIM_ENV: "1" if args.shim_bool else "0",
            SHRINK_ENV: "1" if args.shrink else "0",
            "PYTHONPATH": os.pathsep.join(p for p in (str(Path(__file__).resolve().parent),
                                                      env.get("PYTHONPATH", "")) if p),
        })
        targets = [] if any(a.startswith("array_api_tests") for a in args.pytest_args) else ["array_api_tests"]
        command = [sys.executable, "-m", "pytest", *targets, "-p", "array_api_conformance",
                   "-p", "no:cacheprovider", "-q", "--max-examples", str(args.max_examples),
                   "--derandomize", "--continue-on-collection-errors", "--disable-extension", *DISABLED_EXTENSIONS,
                   "--skips-file", os.devnull, "--xfails-file", os.devnull, *args.pytest_args]
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True,
                              check=False)
        seconds = time.perf_counter() - start
        if not results.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            print(f"array-api-tests {SUITE_COMMIT[:7]} api {API_VERSION} module {args.module}: "
                  f"could not start (pytest exit {proc.returncode})\n{tail}")
            return 3
        tests = json.loads(results.read_text())["tests"]
        if not tests:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            print(f"array-api-tests {SUITE_COMMIT[:7]} api {API_VERSION} module {args.module}: "
                  f"no test collected (pytest exit {proc.returncode})\n{tail}")
            return 3
    if args.json:
        args.json.write_text(json.dumps(tests, indent=1))
    print(summarize(args.module, tests, seconds))
    rows = failure_groups(tests)
    if rows:
        print(f"failing tests by test function ({len(rows)} functions):")
        for key, count, message in rows:
            print(f"  {count:4d}  {key}: {message}")
    return 0 if proc.returncode in (0, 1) else proc.returncode


if __name__ == "__main__":
    sys.exit(main())
