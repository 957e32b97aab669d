"""Rerun, once optional modules are installed, only the tests whose result they can change.

CI (`.ci/run`) runs the whole suite without PyTorch and mlxtend, installs them, and runs
`pytest --rerun-skipped-for-missing`. Every run WITHOUT that option records, in pytest's
cache (key ``fastmetal/optional_rerun``), what it saw; the rerun selects from the record:
  - every test that was skipped (most for a missing module; the others skip again at once);
  - every test that looked up a module that was missing then and is importable now (a
    finder at the end of ``sys.meta_path`` is asked only when no real finder found the
    module): ``importorskip``, ``try: import torch`` inside library code such as the
    benchmarks, ``importlib.util.find_spec("mlxtend")``;
  - every test that names such a module in its code, its fixtures or the test-folder
    helpers it calls (``if torch is not None:`` on helpers.py's module-level ``torch``);
  - every test that started a process, in a file that names such a module (the child's
    imports are not visible from here);
  - every test the recorded run did not run (a parametrisation or a test module that
    exists only with the module installed, or a record from a partial run).
Without a usable record (no cache, or a recorded run that missed none of the optional
modules) it falls back to every test of the files that mention torch or mlxtend. It never
selects nothing silently: the selection is printed, and an empty one is an error."""
from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from functools import lru_cache
from pathlib import Path

import pytest

CACHE_KEY = "fastmetal/optional_rerun"
OPTION = "--rerun-skipped-for-missing"
# The fallback's file filter: the optional modules CI installs for the rerun.
FALLBACK_NAMES = ("torch", "mlxtend")
# Audit events of starting a child process (multiprocessing is not used by the package or
# the tests; its fork start method raises os.fork).
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.fork", "os.forkpty",
                          "os.posix_spawn", "os.exec", "os.spawn"})


def addoption(parser):
    parser.addoption(
        OPTION, action="store_true", default=False,
        help="run only the tests whose result can differ now that modules missing in the "
             "last recorded run (pytest's cache) are installed; see tests/optional_rerun.py")


def configure(config):
    cache = getattr(config, "cache", None)
    if config.getoption(OPTION):
        config.pluginmanager.register(Select(config, cache), "fastmetal-optional-select")
    elif cache is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Record(cache), "fastmetal-optional-record")


class _MissingModuleWatch:
    """Last on sys.meta_path: called only for modules no real finder has, i.e. missing ones."""

    def __init__(self, record):
        self.record = record

    def find_spec(self, name, path=None, target=None):
        if path is None and "." not in name:  # a top-level module, not a package's submodule
            self.record.note_lookup(name)
        return None


class Record:
    def __init__(self, cache):
        self.cache = cache
        self.current = None          # node id of the test running now
        self.ran, self.skipped, self.spawned = set(), set(), set()
        self.lookups: dict = {}      # node id (or "" outside tests) -> missing module names
        self.watch = _MissingModuleWatch(self)
        sys.meta_path.append(self.watch)
        sys.addaudithook(self._audit)  # cannot be removed: it checks self.current only

    def note_lookup(self, name):
        self.lookups.setdefault(self.current or "", set()).add(name)

    def _audit(self, event, args):
        if event in SPAWN_EVENTS and self.current is not None:
            self.spawned.add(self.current)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        try:
            yield
        finally:
            self.current = None

    def pytest_runtest_logreport(self, report):
        self.ran.add(report.nodeid)
        if report.skipped:
            self.skipped.add(report.nodeid)

    def pytest_sessionfinish(self, session):
        if self.watch in sys.meta_path:
            sys.meta_path.remove(self.watch)
        if not self.ran:
            return  # a collect-only or empty run: keep the last record
        self.cache.set(CACHE_KEY, {
            "ran": sorted(self.ran), "skipped": sorted(self.skipped),
            "spawned": sorted(self.spawned),
            "lookups": {k: sorted(v) for k, v in sorted(self.lookups.items())}})


def _code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _functions_of(obj):
    """The plain functions behind a test function, a fixture or a class."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, type):
        for value in vars(obj).values():
            yield from _functions_of(value)
        return
    inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)  # @given
    if inner is not None:
        yield from _functions_of(inner)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(obj, types.FunctionType):
        yield obj


def _source_file(obj):
    """The file that defines a function, class or module (None for anything else)."""
    if isinstance(obj, types.FunctionType):
        return obj.__code__.co_filename
    if isinstance(obj, types.ModuleType):
        return getattr(obj, "__file__", None)
    if isinstance(obj, type):
        return getattr(sys.modules.get(obj.__module__), "__file__", None)
    return None


@lru_cache(maxsize=None)
def _folder(path: str) -> Path:
    return Path(path).resolve().parent


class _NameScan:
    """Whether code names one of `names`, through the functions, classes and modules of the
    test folders (`folders`) it refers to."""

    def __init__(self, names, folders):
        self.names = frozenset(names)
        self.folders = frozenset(folders)
        self.memo: dict = {}

    def local(self, obj) -> bool:
        path = _source_file(obj)
        return bool(path) and _folder(path) in self.folders

    def function(self, fn) -> bool:
        if fn in self.memo:
            return self.memo[fn]
        self.memo[fn] = False  # recursion guard
        found = False
        referred = set()
        for code in _code_objects(fn.__code__):
            referred.update(code.co_names)
            strings = {c.split(".")[0] for c in code.co_consts if isinstance(c, str)}
            if self.names & (set(code.co_names) | strings):
                found = True
                break
        if not found:
            for name in referred:
                value = fn.__globals__.get(name)
                if isinstance(value, types.ModuleType) and self.local(value):
                    targets = [getattr(value, n) for n in referred if hasattr(value, n)]
                elif self.local(value):
                    targets = [value]
                else:
                    continue
                if any(self.function(f) for t in targets for f in _functions_of(t)
                       if self.local(f)):
                    found = True
                    break
        self.memo[fn] = found
        return found

    def item(self, item) -> bool:
        fns = [f for f in _functions_of(getattr(item, "function", None)) if self.local(f)]
        info = getattr(item, "_fixtureinfo", None)
        for defs in (info.name2fixturedefs.values() if info else ()):
            for d in defs:
                fns += [f for f in _functions_of(d.func) if self.local(f)]
        if any(self.function(f) for f in fns):
            return True
        params = getattr(getattr(item, "callspec", None), "params", {})
        return any((getattr(v, "__module__", None) or type(v).__module__ or "").split(".")[0]
                   in self.names for v in params.values())


def _file_mentions(path, names, memo) -> bool:
    if path not in memo:
        text = Path(path).read_text(errors="replace")
        memo[path] = any(n in text for n in names)
    return memo[path]


class Select:
    def __init__(self, config, cache):
        self.config = config
        self.record = cache.get(CACHE_KEY, None) if cache is not None else None
        self.summary = ""

    def pytest_collection_modifyitems(self, session, config, items):
        rec = self.record
        looked_up = set().union(*map(set, rec["lookups"].values())) if rec else set()
        available = sorted(n for n in looked_up if importlib.util.find_spec(n) is not None)
        memo: dict = {}
        if not available:
            why = ("no record in pytest's cache (run the suite without the option first)"
                   if not rec else "the recorded run missed none of the modules installed now")
            keep = [i for i in items if _file_mentions(i.path, FALLBACK_NAMES, memo)]
            self.summary = (f"{OPTION}: {why}; falling back to the files that mention "
                            f"{' or '.join(FALLBACK_NAMES)}: {len(keep)} of {len(items)} tests")
        else:
            ran, skipped = set(rec["ran"]), set(rec["skipped"])
            spawned = set(rec["spawned"])
            wanted = set(available)
            looked = {k for k, v in rec["lookups"].items() if wanted & set(v)}
            scan = _NameScan(available, {Path(i.path).resolve().parent for i in items})
            counts = dict.fromkeys(("skipped", "looked up", "name", "started a process", "new"), 0)
            keep = []
            for item in items:
                why = ("skipped" if item.nodeid in skipped else
                       "looked up" if item.nodeid in looked else
                       "new" if item.nodeid not in ran else
                       "name" if scan.item(item) else
                       "started a process" if item.nodeid in spawned and
                       _file_mentions(item.path, available, memo) else None)
                if why:
                    counts[why] += 1
                    keep.append(item)
            self.summary = (f"{OPTION}: {len(keep)} of {len(items)} tests can change now that "
                            f"{', '.join(available)} can be imported: "
                            + ", ".join(f"{n} {k}" for k, n in counts.items()))
        if not keep:
            raise pytest.UsageError(f"{self.summary}: none selected; refusing to run nothing")
        keep_ids = {id(i) for i in keep}
        deselected = [i for i in items if id(i) not in keep_ids]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = keep

    def pytest_report_collectionfinish(self, config, start_path, items):
        return self.summary
