"""Shared fixtures for fastmetal's tests.

Every test that takes the ``device`` fixture runs once per selected device (ids such as
``[cpu]``, ``[cuda]``, ``[metal]``), with that device as fastmetal's default for the
duration of the test, so NumPy inputs run there too. Select devices with ``--device NAME``
(repeatable); the default is every device in ``fastmetal.devices()``. A device that was asked
for but is not available on this machine skips its tests with the reason.

Markers:
  host_visible  the test relies on host-visible device memory (zero-copy NumPy views,
                buffer-protocol sharing); it runs only on devices where that holds.
  cpu_only      the test checks a facility only the cpu backend has (the CPU conv engine,
                per-ISA kernel variants, the fiber emulator): it runs with cpu as the
                default device, whatever --device selects.

Tests that take no `device` and are not cpu_only (the CLI, the examples, device selection)
run once, on the machine's default device. Shared helpers: references.py (every NumPy
reference, per-device tolerances), thread_harness.py (every multi-threaded test).
optional_rerun.py: ``--rerun-skipped-for-missing``, CI's second run after installing PyTorch.
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

import optional_rerun

REPO = Path(__file__).resolve().parent.parent

KNOWN_DEVICES = ("metal", "cuda", "cpu")
# Devices whose memory the CPU reads and writes directly (unified memory on Apple GPUs).
HOST_VISIBLE = frozenset({"cpu", "metal"})


def pytest_addoption(parser):
    parser.addoption(
        "--device", action="append", default=None, choices=KNOWN_DEVICES,
        help="run device-parametrised tests on this device (repeatable; default: every "
             "device in fastmetal.devices())")
    optional_rerun.addoption(parser)


def selected_devices(config) -> list[str]:
    chosen = config.getoption("--device")
    if chosen:
        return list(dict.fromkeys(chosen))
    import fastmetal
    return list(fastmetal.devices())


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "host_visible: needs host-visible device memory (cpu, metal); skipped elsewhere")
    config.addinivalue_line(
        "markers", "cpu_only: checks a cpu-backend-only facility; runs with cpu as default device")
    optional_rerun.configure(config)


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        names = selected_devices(metafunc.config)
        metafunc.parametrize("device", names, ids=names, indirect=True)


@pytest.fixture
def device(request):
    """The device under test, made fastmetal's default for the duration of the test."""
    import fastmetal as fm
    name = request.param
    if name not in fm.devices():
        pytest.skip(f"device {name!r} is not available here (available: {fm.devices()})")
    if request.node.get_closest_marker("host_visible") and name not in HOST_VISIBLE:
        pytest.skip(f"needs host-visible memory; {name!r} memory is not")
    if request.node.get_closest_marker("cpu_only") and name != "cpu":
        pytest.skip("checks a facility only the cpu backend has")
    before = fm.default_device()
    fm.set_default_device(name)
    try:
        yield name
    finally:
        fm.synchronize()
        fm.set_default_device(before)


@pytest.fixture(autouse=True)
def _cpu_for_cpu_only_tests(request):
    """cpu_only tests run on the cpu backend even where a GPU is the default device."""
    if request.node.get_closest_marker("cpu_only") is None or "device" in request.fixturenames:
        yield
        return
    import fastmetal as fm
    before = fm.default_device()
    fm.set_default_device("cpu")
    try:
        yield
    finally:
        fm.set_default_device(before)


@pytest.fixture
def rng(request):
    # A different, reproducible stream per test (crc32, not hash(): str hashes are salted
    # per process).
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
