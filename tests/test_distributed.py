"""fastmetal.distributed, nn.parallel.DistributedDataParallel, data.DistributedSampler and the
launcher (python -m fastmetal.distributed.run): collectives against NumPy on 2 and 3 ranks,
mismatched calls raising on every rank, DDP on halves of a batch against one process on the
whole batch, a failing rank ending the launch, two launchers (--node-rank) forming one world.

The ranks are real processes started by the launcher (MPI through mpi4py between CPU
processes; on cuda NCCL through CuPy where it and enough GPUs are there, else MPI through
host copies); every launch runs under a timeout, so a hang fails the test instead of
stalling the suite. Without mpi4py / MPICH's mpiexec they skip with the reason (the 'test'
extra installs both from PyPI).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import fastmetal as fm
from fastmetal import nn
from fastmetal.autograd import tape
from fastmetal.data import sampler
from fastmetal.distributed import run as launcher
from helpers import torch

REPO = Path(__file__).resolve().parent.parent
LAUNCH_TIMEOUT = 240  # a loaded 2-core CI machine starts several Pythons per launch

try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
HYDRA = launcher.hydra_mpiexec() if HAVE_MPI4PY else None
needs_mpi = pytest.mark.skipif(
    HYDRA is None, reason="needs mpi4py and MPICH's mpiexec (pip install mpi4py mpich, or the "
    "'test' extra)" if not HAVE_MPI4PY else "needs MPICH's mpiexec (Hydra) beside Python or "
    "on PATH (pip install mpich)")


def _gpu_count() -> int:
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001  (no CuPy, no driver)
        return 0


def launch_env(device: str, nproc: int, tmp_path: Path) -> dict:
    """The environment of a launch on `device`: which engine, which GPUs."""
    env = dict(os.environ, OUT=str(tmp_path), FASTMETAL_DIST_TIMEOUT="120")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "tests")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    caps = fm.ops.devices.device_capabilities(device)
    if caps["cuda_array_interface"]:
        if _gpu_count() >= nproc:
            env["TEST_BACKEND"] = "nccl"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(nproc)))
        else:  # the launcher gives each rank a GPU of its own
            pytest.skip(f"needs {nproc} GPUs for {nproc} ranks on cuda, got {_gpu_count()}")
    else:
        env["TEST_BACKEND"] = "mpi"
    if env["TEST_BACKEND"] == "mpi" and HYDRA is None:
        pytest.skip("needs mpi4py and MPICH's mpiexec (pip install mpi4py mpich)")
    return env


def launch(script: str, tmp_path: Path, device: str, nproc: int = 2, extra: tuple = (),
           env: dict | None = None, timeout: float = LAUNCH_TIMEOUT
           ) -> subprocess.CompletedProcess:
    path = tmp_path / "rank_script.py"
    path.write_text(PRELUDE + textwrap.dedent(script))
    env = env if env is not None else launch_env(device, nproc, tmp_path)
    cmd = [sys.executable, "-m", "fastmetal.distributed.run", "--nproc-per-node", str(nproc),
           "--device", device, *extra, str(path)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


PRELUDE = """\
import os, sys
import numpy as np
import fastmetal as fm
import fastmetal.distributed as dist
OUT = os.environ["OUT"]
dist.init_process_group(os.environ["TEST_BACKEND"])
RANK, WORLD = dist.get_rank(), dist.get_world_size()
def save(name, *positional, **arrays):
    np.savez(os.path.join(OUT, f"{name}_{RANK}.npz"), *positional, **arrays)
"""


# ----------------------------------------------------------------------------- collectives
COLLECTIVES = """
def data(r, dtype, shape=(3, 5)):
    rng = np.random.default_rng(100 + r)
    if dtype == "int64":
        return rng.integers(-1000, 1000, shape).astype(np.int64)
    return (rng.standard_normal(shape) * 4).astype(dtype)

out = {}
for dtype in ("float32", "float16", "int64"):
    for op in ("sum", "mean", "max", "min"):
        if op == "mean" and dtype == "int64":
            continue
        a = fm.asarray(data(RANK, dtype), dtype=dtype)
        dist.all_reduce(a, op)
        out[f"{op}_{dtype}"] = a.numpy()
    b = fm.asarray(data(RANK, dtype, (2, 4)), dtype=dtype)
    dist.broadcast(b, WORLD - 1)
    out[f"broadcast_{dtype}"] = b.numpy()
    outs = [fm.zeros((4,), dtype=dtype) for _ in range(WORLD)]
    dist.all_gather(outs, fm.asarray(data(RANK, dtype, (4,)), dtype=dtype))
    out[f"all_gather_{dtype}"] = np.stack([o.numpy() for o in outs])
# a strided view (written back in place), a scalar and an empty Array
base = fm.asarray(data(RANK, "float32", (4, 6)))
view = base.T
dist.all_reduce(view, "sum")
out["transposed"] = base.numpy()
s = fm.asarray(np.array(RANK + 1.5, np.float32))
dist.all_reduce(s, "max")
out["scalar"] = s.numpy()
e = fm.zeros((0, 3))
dist.all_reduce(e)
out["empty"] = e.numpy()
dist.barrier()
save("collectives", **out)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("nproc", [2, 3])
def test_collectives_match_numpy(device, tmp_path, nproc):
    check(launch(COLLECTIVES, tmp_path, device, nproc))

    def data(r, dtype, shape=(3, 5)):
        rng = np.random.default_rng(100 + r)
        if dtype == "int64":
            return rng.integers(-1000, 1000, shape).astype(np.int64)
        return (rng.standard_normal(shape) * 4).astype(dtype)

    for r in range(nproc):
        got = np.load(tmp_path / f"collectives_{r}.npz")
        for dtype in ("float32", "float16", "int64"):
            stack = np.stack([data(q, dtype).astype(np.float64) for q in range(nproc)])
            refs = {"sum": stack.sum(0), "mean": stack.mean(0), "max": stack.max(0),
                    "min": stack.min(0)}
            for op, ref in refs.items():
                if op == "mean" and dtype == "int64":
                    continue
                value = got[f"{op}_{dtype}"]
                assert value.dtype == np.dtype(dtype), (op, dtype)
                if dtype == "int64":
                    np.testing.assert_array_equal(value, ref.astype(np.int64))
                else:  # one rounding of the float64 result (float16: reduced in float32)
                    tol = 2e-6 if dtype == "float32" else 1e-3
                    np.testing.assert_allclose(value, ref.astype(dtype), rtol=tol,
                                               atol=tol * 8, err_msg=f"{op} {dtype}")
            np.testing.assert_array_equal(got[f"broadcast_{dtype}"],
                                          data(nproc - 1, dtype, (2, 4)))
            np.testing.assert_array_equal(got[f"all_gather_{dtype}"],
                                          np.stack([data(q, dtype, (4,)) for q in range(nproc)]))
        np.testing.assert_allclose(got["transposed"], sum(data(q, "float32", (4, 6)).astype(
            np.float64) for q in range(nproc)), rtol=2e-6, atol=1e-5)
        assert got["scalar"] == nproc + 0.5 and got["empty"].shape == (0, 3)


MISMATCH = """
from fastmetal import nn
from fastmetal.nn.parallel import DistributedDataParallel as DDP
cases = {
    "shape": lambda: dist.all_reduce(fm.zeros((3 + RANK,))),
    "dtype": lambda: dist.all_reduce(fm.zeros((3,), dtype="float16" if RANK else "float32")),
    "op": lambda: dist.all_reduce(fm.zeros((3,)), "max" if RANK else "sum"),
    "src": lambda: dist.broadcast(fm.zeros((3,)), RANK),
    "gather": lambda: dist.all_gather([fm.zeros((2 + RANK,)) for _ in range(WORLD)],
                                      fm.zeros((2 + RANK,))),
    # a mistake on one rank only: that rank's error, raised on the others too
    "bad_op": lambda: dist.all_reduce(fm.zeros((3,)), "prod" if RANK else "sum"),
    "bad_src": lambda: dist.broadcast(fm.zeros((3,)), 5 if RANK else 0),
    "ddp": lambda: DDP(nn.Linear(3, 2 + RANK, seed=0)),
}
messages = {}
for name, call in cases.items():
    try:
        call()
        messages[name] = "no error"
    except ValueError as e:
        messages[name] = str(e)
ok = fm.ones((2,))
dist.all_reduce(ok)  # the group still works after the errors
messages["after"] = str(ok.numpy().tolist())
np.save(os.path.join(OUT, f"mismatch_{RANK}.npy"), np.array(messages, dtype=object))
"""


@needs_mpi
def test_mismatched_calls_raise_on_every_rank(tmp_path):
    check(launch(MISMATCH, tmp_path, "cpu", 2, timeout=LAUNCH_TIMEOUT))
    for r in range(2):
        messages = np.load(tmp_path / f"mismatch_{r}.npy", allow_pickle=True).item()
        assert "rank 0: all_reduce(sum) of shape (3,) float32" in messages["shape"]
        assert "rank 1: all_reduce(sum) of shape (4,) float32" in messages["shape"]
        assert "float16" in messages["dtype"] and "all_reduce(max)" in messages["op"]
        assert "from 0" in messages["src"] and "from 1" in messages["src"]
        assert "shape (3,)" in messages["gather"]
        assert "expected op 'sum', 'mean', 'max' or 'min', got 'prod'" in messages["bad_op"]
        assert "expected src to be a rank, 0 .. 1, got 5" in messages["bad_src"]
        if r == 0:
            assert "rank 1's error" in messages["bad_op"]
        assert messages["ddp"].startswith("[fastmetal.nn.parallel.DistributedDataParallel] "
                                          "expected the same call on every rank")
        assert "rank 0: wrap of shape (2, 8)" in messages["ddp"]
        assert "rank 1: wrap of shape (2, 12)" in messages["ddp"]
        assert all(m.startswith("[fastmetal.distributed.") for k, m in messages.items()
                   if k not in ("after", "ddp")), messages
        assert messages["after"] == "[2.0, 2.0]"


# ----------------------------------------------------------------------------- DDP
DDP_SCRIPT = """
from fastmetal import nn
from fastmetal.nn.parallel import DistributedDataParallel as DDP
from ddp_case import batch, model, train

X, Y = batch()
half = slice(RANK * len(X) // WORLD, (RANK + 1) * len(X) // WORLD)
net = model(seed=1 + RANK)  # different on each rank: wrapping must broadcast rank 0's
ddp = DDP(net, bucket_cap_mb=0.002)  # several buckets
assert list(ddp.state_dict())[0].startswith("module."), list(ddp.state_dict())
train(ddp, X[half], Y[half], steps=4)
save("ddp", *[p.numpy() for p in net.parameters()])
# gradient accumulation: two micro-batches, the first under no_sync()
net2 = model(seed=1)
ddp2 = DDP(net2)
quarter = len(X) // (2 * WORLD)
mine = X[half], Y[half]
opt = fm.optim.SGD(ddp2.parameters(), lr=0.1)
opt.zero_grad()
with ddp2.no_sync():
    loss = fm.cross_entropy(ddp2(fm.asarray(mine[0][:quarter])), mine[1][:quarter]) * 0.5
    loss.backward()
local_grad = [p.grad.numpy().copy() for p in net2.parameters()]
loss = fm.cross_entropy(ddp2(fm.asarray(mine[0][quarter:])), mine[1][quarter:]) * 0.5
loss.backward()
save("accumulated", *[p.grad.numpy() for p in net2.parameters()])
save("local", *local_grad)
"""

DDP_CASE = '''
import numpy as np
import fastmetal as fm
from fastmetal import nn

def batch():
    rng = np.random.default_rng(7)
    return rng.standard_normal((8, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, 8)

def model(seed):
    rng = np.random.default_rng(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, rng=rng), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 16, rng=rng), nn.Tanh(), nn.Linear(16, 3, rng=rng))

def train(m, x, y, steps):
    opt = fm.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    for _ in range(steps):
        opt.zero_grad()
        loss = fm.cross_entropy(m(fm.asarray(x)), y)
        loss.backward()
        opt.step()
'''


def _ddp_case(tmp_path):
    (tmp_path / "ddp_case.py").write_text(DDP_CASE)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib
        import ddp_case
        return importlib.reload(ddp_case)
    finally:
        sys.path.remove(str(tmp_path))


def test_ddp_on_halves_matches_one_process_on_the_batch(device, tmp_path):
    case = _ddp_case(tmp_path)
    env = launch_env(device, 2, tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    check(launch(DDP_SCRIPT, tmp_path, device, 2, env=env))
    X, Y = case.batch()
    ref = case.model(seed=1)
    case.train(ref, X, Y, steps=4)
    want = [p.numpy() for p in ref.parameters()]
    for r in range(2):
        got = np.load(tmp_path / f"ddp_{r}.npz")
        for i, w in enumerate(want):
            np.testing.assert_allclose(got[f"arr_{i}"], w, rtol=0, atol=1e-5,
                                       err_msg=f"rank {r}, parameter {i}")
    # no_sync: the first micro-batch's gradient stayed local; the sync step averaged the sum
    ref2 = case.model(seed=1)
    ref2.zero_grad()
    loss = fm.cross_entropy(ref2(fm.asarray(X)), Y)
    loss.backward()
    full = [p.grad.numpy() for p in ref2.parameters()]
    local = [np.load(tmp_path / f"local_{r}.npz") for r in range(2)]
    assert any(not np.allclose(local[0][f"arr_{i}"], local[1][f"arr_{i}"])
               for i in range(len(full))), "no_sync() averaged the gradients"
    for r in range(2):
        got = np.load(tmp_path / f"accumulated_{r}.npz")
        for i, g in enumerate(full):
            np.testing.assert_allclose(got[f"arr_{i}"], g, rtol=0, atol=1e-5)


BUFFERS = """
from fastmetal import nn
bn = nn.BatchNorm2d(3)
if RANK == 1:  # a different start: the wrap must replace it with rank 0's
    bn.running_mean[...] = 5.0
    bn.running_var[...] = 7.0
ddp = nn.parallel.DistributedDataParallel(bn)
after_wrap = bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()
xs = [np.random.default_rng(10 * RANK + k).standard_normal((4, 3, 2, 2)).astype(np.float32)
      for k in range(2)]
seen = []
for x in xs:  # each training forward starts from rank 0's statistics
    ddp(fm.asarray(x))
    seen.append(bn.running_mean.numpy().copy())
save("buffers", after_wrap[0], after_wrap[1], *seen, bn.num_batches_tracked.numpy())
"""


def test_ddp_broadcasts_batchnorm_buffers_from_rank_0(device, tmp_path):
    check(launch(BUFFERS, tmp_path, device, 2))
    got = [np.load(tmp_path / f"buffers_{r}.npz") for r in range(2)]
    xs = [[np.random.default_rng(10 * r + k).standard_normal((4, 3, 2, 2)) for k in range(2)]
          for r in range(2)]
    for r in range(2):
        np.testing.assert_array_equal(got[r]["arr_0"], np.zeros(3))  # rank 0's, after the wrap
        np.testing.assert_array_equal(got[r]["arr_1"], np.ones(3))
        first = 0.1 * xs[r][0].mean(axis=(0, 2, 3))
        np.testing.assert_allclose(got[r]["arr_2"], first, rtol=1e-5, atol=1e-6)
        # the second forward started from rank 0's statistics after its first forward
        rank0_first = 0.1 * xs[0][0].mean(axis=(0, 2, 3))
        second = 0.9 * rank0_first + 0.1 * xs[r][1].mean(axis=(0, 2, 3))
        np.testing.assert_allclose(got[r]["arr_3"], second, rtol=1e-5, atol=1e-6)
        assert int(got[r]["arr_4"]) == 2


# ----------------------------------------------------------------------------- failures
FAILING = """
import time
if RANK == 1:
    time.sleep(0.5)
    raise ValueError("boom from rank 1")
dist.barrier()  # rank 0 waits here for a rank that is gone
time.sleep(600)
"""


@needs_mpi
def test_a_failing_rank_ends_the_launch_with_its_message(tmp_path):
    started = time.monotonic()
    result = launch(FAILING, tmp_path, "cpu", 2, timeout=LAUNCH_TIMEOUT)
    took = time.monotonic() - started
    assert result.returncode != 0
    assert "ValueError: boom from rank 1" in result.stderr
    assert "rank 1 (node 0, local rank 1) exited with code 1" in result.stderr
    assert took < 120, f"the launch took {took:.0f} s to end"


TWO_NODES = """
a = fm.asarray(np.full(3, RANK + 1.0, np.float32))
dist.all_reduce(a)
save("two_nodes", value=a.numpy(), local=np.array(int(os.environ["LOCAL_RANK"])))
if os.environ.get("FAIL_ON_NODE_1") and os.environ["GROUP_RANK"] == "1":
    raise RuntimeError("node 1 gives up")
dist.barrier()
"""


def _two_launchers(tmp_path, env):
    port = str(launcher._free_port())
    procs = []
    for node in (1, 0):
        extra = ("--nnodes", "2", "--node-rank", str(node), "--master-port", port)
        path = tmp_path / "rank_script.py"
        path.write_text(PRELUDE + textwrap.dedent(TWO_NODES))
        cmd = [sys.executable, "-m", "fastmetal.distributed.run", "--nproc-per-node", "1",
               "--device", "cpu", *extra, str(path)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=LAUNCH_TIMEOUT))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    return [(p.returncode, *o) for p, o in zip(procs, outs)]


@needs_mpi
def test_two_launchers_form_one_world(tmp_path):
    env = launch_env("cpu", 1, tmp_path)
    for code, out, err in _two_launchers(tmp_path, env):
        assert code == 0, out + err
    for r in range(2):
        got = np.load(tmp_path / f"two_nodes_{r}.npz")
        np.testing.assert_array_equal(got["value"], [3.0, 3.0, 3.0])
        assert int(got["local"]) == 0


@needs_mpi
def test_a_failure_on_one_node_stops_the_other(tmp_path):
    env = dict(launch_env("cpu", 1, tmp_path), FAIL_ON_NODE_1="1")
    started = time.monotonic()
    (code1, _, err1), (code0, _, err0) = _two_launchers(tmp_path, env)
    assert code1 != 0 and "node 1 gives up" in err1
    assert code0 != 0 and "node 1 gives up" in err0 and "another node failed" in err0
    assert time.monotonic() - started < 150


def test_launcher_refuses_bad_arguments():
    for args, says in ((["--nproc-per-node", "0", "x.py"], "--nproc-per-node must be >= 1"),
                       (["--nnodes", "2", "--node-rank", "2", "x.py"], "--node-rank must be"),
                       (["--device", "abacus", "x.py"], "expected --device (or FASTMETAL_DEVICE)")):
        result = subprocess.run([sys.executable, "-m", "fastmetal.distributed.run", *args],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and says in result.stderr, result.stderr


def test_launcher_sets_each_ranks_environment():
    ns = launcher.parse_args(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "3",
                              "--master-addr", "10.0.0.1", "--master-port", "1234", "s.py",
                              "--lr", "3"])
    assert ns.script_args == ["--lr", "3"]
    envs = launcher.rank_environments(ns, "cpu", {"cuda_array_interface": False})
    assert [e["RANK"] for e in envs] == ["3", "4", "5"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"6"} and {e["MASTER_PORT"] for e in envs} == {"1234"}
    assert {e["FASTMETAL_DEVICE"] for e in envs} == {"cpu"}
    gpu = launcher.rank_environments(ns, "gpu0", {"cuda_array_interface": True})
    assert [e["CUDA_VISIBLE_DEVICES"] for e in gpu] == ["0", "1", "2"]


# ----------------------------------------------------------------------------- in process
def test_collectives_need_an_initialized_group():
    from fastmetal import distributed as dist
    assert not dist.is_initialized()
    for call in (dist.get_rank, dist.barrier, lambda: dist.all_reduce(fm.zeros(2))):
        with pytest.raises(RuntimeError, match="init_process_group"):
            call()
    with pytest.raises(RuntimeError, match="init_process_group"):
        nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="backend 'mpi', 'nccl'"):
        dist.init_process_group("gloo")


def test_post_accumulate_grad_hook_runs_once_per_backward():
    w = fm.asarray(np.array([1.0, 2.0], np.float32)).requires_grad_()
    unused = fm.asarray(np.array([1.0], np.float32)).requires_grad_()
    seen = []
    h1 = tape.register_post_accumulate_grad_hook(w, lambda p: seen.append(p.grad.numpy().copy()))
    h2 = tape.register_post_accumulate_grad_hook(unused, lambda p: seen.append("unused"))
    loss = fm.sum(w * w) + fm.sum(w * 3.0)  # w reaches the loss through three edges
    loss.backward()
    assert len(seen) == 1 and np.allclose(seen[0], [5.0, 7.0])  # after all of them
    fm.sum(w).backward()
    assert len(seen) == 2 and np.allclose(seen[1], [6.0, 8.0])  # accumulated
    h1.remove()
    h2.remove()
    fm.sum(w).backward()
    assert len(seen) == 2 and not tape._post_hooks
    with pytest.raises(RuntimeError, match="leaf Array that requires grad"):
        tape.register_post_accumulate_grad_hook(w * 2, print)


def _torch_rules(n, replicas, rank, drop_last, perm):
    """torch.utils.data.DistributedSampler's padding and split, over a given order."""
    import math
    indices = list(perm)
    if drop_last and n % replicas:
        num = math.ceil((n - replicas) / replicas)
    else:
        num = math.ceil(n / replicas)
    total = num * replicas
    if not drop_last:
        pad = total - len(indices)
        indices += (indices * math.ceil(pad / max(len(indices), 1)))[:pad] if pad else []
    else:
        indices = indices[:total]
    return indices[rank:total:replicas]


@pytest.mark.parametrize("n,replicas", [(10, 3), (9, 3), (2, 4), (7, 2), (0, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_splits_as_pytorch(n, replicas, drop_last):
    from fastmetal.data import DistributedSampler
    parts = [list(DistributedSampler(n, replicas, r, shuffle=False, drop_last=drop_last))
             for r in range(replicas)]
    for r, part in enumerate(parts):
        assert part == _torch_rules(n, replicas, r, drop_last, range(n))
        assert len(DistributedSampler(list(range(n)), replicas, r, drop_last=drop_last)) == \
            len(part)
    if not drop_last and n:
        assert set().union(*map(set, parts)) == set(range(n))
    shuffled = [DistributedSampler(n, replicas, r, seed=3) for r in range(replicas)]
    for s in shuffled:
        s.set_epoch(2)
    perm = list(sampler.randperm(n, 3 + 2))
    assert sorted(perm) == list(range(n))
    for r, s in enumerate(shuffled):
        assert list(s) == _torch_rules(n, replicas, r, False, perm)


def test_distributed_sampler_shuffles_as_pytorch():
    # torch.randperm(n, generator=torch.Generator().manual_seed(seed)), printed by torch 2.13
    assert sampler.randperm(10, 0).tolist() == [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]
    assert sampler.randperm(17, 5).tolist() == [13, 15, 9, 6, 3, 1, 4, 10, 14, 0, 7, 11, 2,
                                                12, 8, 5, 16]
    # torch's DistributedSampler(range(11), num_replicas=3, rank=1, seed=4), epoch 2
    s = sampler.DistributedSampler(list(range(11)), num_replicas=3, rank=1, seed=4)
    s.set_epoch(2)
    assert list(s) == [0, 1, 9, 10]
    if torch is not None:
        for n, seed in ((1000, 123), (5, 2**33 + 1), (1, 0), (0, 0)):
            g = torch.Generator()
            g.manual_seed(seed)
            assert sampler.randperm(n, seed).tolist() == torch.randperm(n, generator=g).tolist()


def test_distributed_sampler_epochs_and_errors():
    from fastmetal.data import DistributedSampler
    s = DistributedSampler(100, 2, 0, seed=1)
    first = list(s)
    assert list(s) == first
    s.set_epoch(1)
    assert list(s) != first and sorted(list(s) + list(DistributedSampler(100, 2, 1, seed=1))) \
        != sorted(first)  # another epoch, another split
    with pytest.raises(ValueError, match="rank"):
        DistributedSampler(10, 2, 2)
    with pytest.raises(TypeError, match="len"):
        DistributedSampler(object(), 2, 0)
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedSampler(10)  # num_replicas from a group that does not exist


@pytest.mark.skipif(not HAVE_MPI4PY, reason="needs mpi4py")
def test_example_and_benchmark_run_on_two_ranks(tmp_path):
    if HYDRA is None:
        pytest.skip("needs MPICH's mpiexec")
    env = dict(os.environ, FASTMETAL_DIST_TIMEOUT="120")
    result = subprocess.run(
        [sys.executable, "-m", "fastmetal.distributed.run", "--nproc-per-node", "2",
         "--device", "cpu", str(REPO / "examples" / "ddp.py"), "--steps", "3",
         "--batch-size", "8", "--synthetic"],
        env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    check(result)
    assert "step 3" in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "fastmetal", "bench", "ddp", "--nproc", "2", "--steps", "2",
         "--batch", "4", "--model", "mlp"], env=env, capture_output=True, text=True,
        timeout=LAUNCH_TIMEOUT)
    check(result)
    assert "samples/s" in result.stdout and "| 2 " in result.stdout


@pytest.mark.parametrize("through_numpy", [True, False])
def test_ddp_buckets_carry_every_gradient_to_its_place(monkeypatch, through_numpy):
    # In process, with the group faked: "the other rank" contributes zeros, so averaging
    # halves each gradient; a gradient put at the wrong offset of its bucket would show.
    # through_numpy=False takes the device path (fastmetal ops, for memory NumPy can't view).
    from fastmetal.distributed import group
    from fastmetal.nn import parallel
    reduced = []

    def fake_mean(flat, op):
        assert op == "mean"
        reduced.append(int(flat.size))
        fm.multiply(flat, 0.5, out=flat)  # in place on any device (a NumPy view is a copy on cuda)

    monkeypatch.setattr(group, "is_initialized", lambda: True)
    monkeypatch.setattr(group, "agree", lambda fn, desc: None)
    monkeypatch.setattr(group, "broadcast", lambda a, src: None)
    monkeypatch.setattr(group, "all_reduce_unchecked", fake_mean)
    monkeypatch.setattr(group, "start_all_reduce_unchecked", fake_mean)  # returns None: done
    if not through_numpy:
        monkeypatch.setattr(parallel, "host_visible", lambda a: False)
    rng = np.random.default_rng(0)
    net = nn.Sequential(nn.Linear(5, 7, rng=rng), nn.Tanh(), nn.Linear(7, 3, rng=rng))
    frozen = nn.Linear(3, 3, rng=rng).requires_grad_(False)
    model = nn.Sequential(net, frozen)
    ddp = parallel.DistributedDataParallel(model, bucket_cap_mb=100 / 2**20)  # 100 bytes
    x = rng.standard_normal((4, 5)).astype(np.float32)
    fm.sum(model(x) ** 2).backward()
    local = [p.grad.numpy().copy() for p in net.parameters()]
    model.zero_grad()
    fm.sum(ddp(x) ** 2).backward()
    # reverse parameter order, a bucket closed at 100 bytes: [b2 w2 b1] [w1]
    assert sorted(reduced) == [3 + 21 + 7, 35]
    for p, g in zip(net.parameters(), local):
        np.testing.assert_array_equal(p.grad.numpy(), g * 0.5)
    assert all(p.grad is None for p in frozen.parameters())
    # a plain backward (not of ddp's forward) and one under no_sync() average nothing
    reduced.clear()
    fm.sum(model(x)).backward()
    with ddp.no_sync():
        out = ddp(x)
    fm.sum(out).backward()
    assert reduced == []

    # a parameter left without a gradient: an error at the next forward, naming it
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.use_b = nn.Linear(5, 3, rng=rng), nn.Linear(5, 3, rng=rng), True

        def forward(self, x):
            return self.a(x) + self.b(x) if self.use_b else self.a(x)

    branchy = Branchy()
    ddp = parallel.DistributedDataParallel(branchy)
    branchy.use_b = False
    fm.sum(ddp(x)).backward()
    with pytest.raises(RuntimeError, match=r"got none for \['b.bias', 'b.weight'\]"):
        ddp(x)
    branchy.use_b = True
    fm.sum(ddp(x)).backward()  # the state was reset: this one averages
    assert reduced[-1] == 2 * (15 + 3)


MPIEXEC_SCRIPT = """
import sys
import numpy as np
import fastmetal as fm
import fastmetal.distributed as dist
dist.init_process_group()
a = fm.asarray(np.full(2, dist.get_rank() + 1.0, np.float32))
dist.all_reduce(a)
line = f"rank {dist.get_rank()} of {dist.get_world_size()} sum {a.numpy().tolist()}"
with open(sys.argv[1] + f"_{dist.get_rank()}", "w") as f:  # stdout lines could interleave
    f.write(line)
dist.destroy_process_group()
"""


@needs_mpi
def test_mpiexec_and_a_plain_python_need_no_launcher(tmp_path):
    # Under `mpiexec -n 2` MPI_COMM_WORLD is the world; a plain `python script.py` is one.
    script = tmp_path / "script.py"
    script.write_text(MPIEXEC_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["FASTMETAL_DEVICE"] = "cpu"
    out = str(tmp_path / "two")
    result = subprocess.run([HYDRA, "-n", "2", sys.executable, str(script), out], env=env,
                            capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)
    check(result)
    assert [Path(f"{out}_{r}").read_text() for r in range(2)] == \
        ["rank 0 of 2 sum [3.0, 3.0]", "rank 1 of 2 sum [3.0, 3.0]"]
    out = str(tmp_path / "one")
    result = subprocess.run([sys.executable, str(script), out], env=env, capture_output=True,
                            text=True, timeout=LAUNCH_TIMEOUT)
    check(result)
    assert Path(f"{out}_0").read_text() == "rank 0 of 1 sum [1.0, 1.0]"
