"""Property-based search (hypothesis) over every public function's inputs: shapes with zero
and huge extents, zero and negative strides, dtypes, read-only flags, NumPy or fastmetal
arrays, out=. Each function's search runs in a child process (property_fuzz_child.py), so a
crash is a test failure that names the case, not a lost run. On Linux the children are forked
from one process per device that has imported NumPy and hypothesis (not fastmetal: each child imports
it, as a fresh process does, and runs the script as `python property_fuzz_child.py` would):
the imports were half of each child's time.

FASTMETAL_FUZZ_EXAMPLES sets the examples per function (default 60; e.g. 2000 for a long run).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastmetal as fm

CHILD = Path(__file__).with_name("property_fuzz_child.py")
EXAMPLES = int(os.environ.get("FASTMETAL_FUZZ_EXAMPLES", "60"))
FUNCTIONS = [n for n in fm.__all__ if n not in ("__version__", "Array", "nn", "devices",
                                                 "default_device", "set_default_device",
                                                 "synchronize")]


def test_every_public_function_is_searched():
    assert {"asarray", "conv2d", "conv2d_backward", "gradient", "derivative", "fourier_series",
            "sigmoid", "add", "zeros"} <= set(FUNCTIONS)


# Reads "NAME<TAB>STDOUT_FILE<TAB>STDERR_FILE" lines; forks a child for each that runs CHILD
# as __main__ with argv [CHILD, NAME, EXAMPLES], its stdout and stderr in those files, killed
# by SIGALRM after TIMEOUT_S; answers the child's exit status (-N: killed by signal N).
ZYGOTE = r"""
import os, runpy, signal, sys, traceback
import numpy, hypothesis, hypothesis.strategies
child, examples, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[0] = os.path.dirname(child)
for line in sys.stdin:
    name, out, err = line.rstrip("\n").split("\t")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            signal.alarm(timeout)
            sys.argv = [child, name, examples]
            runpy.run_path(child, run_name="__main__")
            code = 0
        except SystemExit as e:  # as the interpreter exits on it
            code = e.code if isinstance(e.code, int) else e.code is not None
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""
TIMEOUT_S = 600


@pytest.fixture(scope="module")
def zygotes():
    started: dict = {}
    yield started
    for z in started.values():
        z.stdin.close()  # its loop ends
        z.wait(timeout=60)
        z.stdout.close()


def search(zygotes, device, name, work):
    """(exit status, stdout, stderr) of CHILD's search over `name` on `device`."""
    if not sys.platform.startswith("linux"):
        # macOS: a child forked after NumPy (Accelerate, CoreFoundation) has loaded may not
        # use Metal; a fresh process each time there.
        r = subprocess.run([sys.executable, str(CHILD), name, str(EXAMPLES)], capture_output=True,
                           text=True, timeout=TIMEOUT_S, cwd=CHILD.parent,
                           env={**os.environ, "FASTMETAL_DEVICE": device})
        return r.returncode, r.stdout, r.stderr
    z = zygotes.get(device)
    if z is None or z.poll() is not None:
        if z is not None:
            z.stdin.close()
            z.stdout.close()
        z = zygotes[device] = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(CHILD), str(EXAMPLES), str(TIMEOUT_S)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=CHILD.parent,
            env={**os.environ, "FASTMETAL_DEVICE": device})
    out, err = work / "stdout", work / "stderr"
    z.stdin.write(f"{name}\t{out}\t{err}\n")
    z.stdin.flush()
    status = z.stdout.readline()
    assert status, f"{name}: the process that forks the searches died (exit {z.wait()})"
    return int(status), out.read_text(), err.read_text()


@pytest.mark.parametrize("name", FUNCTIONS)
def test_property_search_in_a_child_process(device, name, zygotes, tmp_path):
    returncode, stdout, stderr = search(zygotes, device, name, tmp_path)
    cases = [line for line in stdout.splitlines() if line.startswith("CASE")]
    if returncode < 0:
        pytest.fail(f"{name}: the child process died of signal {-returncode} on "
                    f"{cases[-1] if cases else 'its first case'}\n{stderr[-3000:]}")
    assert returncode == 0, f"{name}: last case {cases[-1] if cases else None}\n{stderr[-5000:]}"
    assert stdout.rstrip().endswith(f"DONE {name}")
    assert len(cases) >= EXAMPLES // 2
