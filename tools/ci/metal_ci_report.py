#!/usr/bin/env python3
"""The macOS CI job's verdict on the Metal tests: run tests/test_metal*.py against the
installed fastmetal and say in one line what ran.

Fails when the Metal backend was built but no Metal test executed, unless the runner is
known to lack Metal 3 (GitHub's macOS runners expose a paravirtual GPU without it): then
the one line says so. Also fails when a macOS build has no Metal backend at all.

    python tools/ci/metal_ci_report.py [pytest args...]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DISABLED = "[fastmetal] Metal backend disabled: "


def probe() -> tuple[list[str], str]:
    """fastmetal.devices() and the Metal backend's one-line reason, in a fresh process."""
    r = subprocess.run([sys.executable, "-c", "import json, fastmetal; print(json.dumps(fastmetal.devices()))"],
                       capture_output=True, text=True, cwd=tempfile.gettempdir())
    if r.returncode != 0:
        raise SystemExit(f"metal_ci_report: cannot import fastmetal:\n{r.stderr}")
    reason = next((line[len(DISABLED):] for line in r.stderr.splitlines() if line.startswith(DISABLED)), "")
    return json.loads(r.stdout.strip().splitlines()[-1]), reason


def verdict(platform: str, devices: list[str], reason: str, executed: int) -> tuple[bool, str]:
    """(ok, the one line) from what was built and what ran."""
    built = "metal" in devices or bool(reason)  # only a Metal build prints the reason
    if platform != "darwin":
        return True, "metal: not macOS, no Metal tests expected"
    if not built:
        return False, "metal: FAIL the macOS build has no Metal backend (was the Metal toolchain missing?)"
    if "metal" in devices:
        if executed > 0:
            return True, f"metal: {executed} Metal tests executed on the GPU"
        return False, "metal: FAIL a Metal device exists but no Metal test executed"
    if "does not support Metal 3" in reason:
        return True, f"metal: NOT TESTED, this runner's GPU lacks Metal 3 ({reason}); Metal tests skipped"
    return False, f"metal: FAIL the Metal backend was built but is disabled: {reason}"


def executed_tests(junit: Path) -> int:
    root = ET.parse(junit).getroot()
    n = 0
    for case in root.iter("testcase"):
        if not any(child.tag in ("skipped", "failure", "error") for child in case):
            n += 1
    return n


def main(argv: list[str]) -> int:
    devices, reason = probe()
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "metal.xml"
        tests = sorted(str(p) for p in (REPO / "tests").glob("test_metal.py"))
        r = subprocess.run([sys.executable, "-m", "pytest", *tests, "-q", "-ra",
                            f"--junitxml={junit}", *argv], cwd=tmp)
        executed = executed_tests(junit) if junit.exists() else 0
    ok, line = verdict(sys.platform, devices, reason, executed)
    print(line)
    return 0 if ok and r.returncode in (0, 5) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
