"""The process group and its collectives, as ``torch.distributed``'s default group.

``init_process_group`` reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) and joins the ranks with an engine: MPI (mpi4py, between CPU
processes and host-visible devices such as Metal, whose memory MPI reads in place) or NCCL
(CuPy's bindings, between CUDA GPUs, reading fastmetal's device memory directly). Every
collective first all-gathers a small descriptor (operation, shape, dtype, root) and
compares it, so ranks that disagree all raise ValueError, naming what each rank gave,
instead of hanging or exchanging garbage.
"""
from __future__ import annotations

import os
import time
from typing import Any, Optional

import numpy as np

from .._core import Array
from ..ops.devices import default_device, device_capabilities
from . import mpi as _mpi
from . import nccl as _nccl
from .store import StoreClient, StoreServer

REDUCE_OPS = ("sum", "mean", "max", "min")
BACKENDS = ("mpi", "nccl")
# How long ranks wait for each other while joining (a rank that never comes is an error).
JOIN_TIMEOUT_S = float(os.environ.get("FASTMETAL_DIST_TIMEOUT", "300"))


class _State:
    backend: Any = None
    store_server: Optional[StoreServer] = None
    generation = 0  # init_process_group calls so far: each joins under fresh store keys


_state = _State()


def _where(fn: str) -> str:
    return f"fastmetal.distributed.{fn}"


def _env_int(name: str, where: str) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"[{where}] expected the environment variable {name} to be an "
                         f"integer, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"[{where}] expected {name} >= 0, got {value}")
    return value


def _default_backend() -> str:
    """NCCL where the default device is a CUDA GPU and CuPy's NCCL is installed, else MPI."""
    if device_capabilities(default_device())["cuda_array_interface"] and _nccl.available():
        return "nccl"
    return "mpi"


def init_process_group(backend: Optional[str] = None) -> None:
    """Join this process to the others of the launch (``python -m
    fastmetal.distributed.run``), as ``torch.distributed.init_process_group`` with the
    ``env://`` method. ``backend``: "mpi", "nccl" or None (NCCL on a CUDA default device
    where CuPy is installed, else MPI). Without RANK / WORLD_SIZE in the environment, MPI
    takes them from ``mpiexec``, and a plain ``python script.py`` is a world of one."""
    where = _where("init_process_group")
    if _state.backend is not None:
        raise RuntimeError(f"[{where}] expected one call, got a second (the process group is "
                           "already initialized; destroy_process_group() first)")
    if backend is None:
        backend = _default_backend()
    if not isinstance(backend, str) or backend.lower() not in BACKENDS:
        raise ValueError(f"[{where}] expected backend 'mpi', 'nccl' or None, got {backend!r}"
                         + (" (fastmetal's CPU engine is MPI: use 'mpi')"
                            if backend == "gloo" else ""))
    backend = backend.lower()
    rank, size = _env_int("RANK", where), _env_int("WORLD_SIZE", where)
    if (rank is None) != (size is None):
        raise ValueError(f"[{where}] expected RANK and WORLD_SIZE both set or both unset, got "
                         f"RANK={os.environ.get('RANK')!r} WORLD_SIZE="
                         f"{os.environ.get('WORLD_SIZE')!r}")
    if size is not None and (size < 1 or rank >= size):  # type: ignore[operator]
        raise ValueError(f"[{where}] expected 0 <= RANK < WORLD_SIZE, got RANK={rank} "
                         f"WORLD_SIZE={size}")
    store = None
    if size is not None and size > 1:
        store = _connect_store(rank, where)  # type: ignore[arg-type]
    _state.generation += 1
    key = f"{backend}/{_state.generation}"
    if store is not None:
        try:
            _arrive(store, key, rank, size, where)  # type: ignore[arg-type]
        except BaseException:
            store.close()
            raise
    try:
        if backend == "mpi":
            _state.backend = _mpi.MpiBackend(rank, size, store, key, JOIN_TIMEOUT_S)
        else:
            _state.backend = _nccl.NcclBackend(rank if rank is not None else 0,
                                               size if size is not None else 1, store, key,
                                               JOIN_TIMEOUT_S)
    finally:
        if store is not None:
            store.close()


def _connect_store(rank: int, where: str) -> StoreClient:
    addr = os.environ.get("MASTER_ADDR")
    port = _env_int("MASTER_PORT", where)
    if not addr or port is None:
        raise ValueError(f"[{where}] expected MASTER_ADDR and MASTER_PORT in the environment "
                         "(python -m fastmetal.distributed.run sets them), got "
                         f"MASTER_ADDR={addr!r} MASTER_PORT={os.environ.get('MASTER_PORT')!r}")
    # The launcher serves the store itself (FASTMETAL_STORE_HOSTED=1); otherwise rank 0 does.
    if rank == 0 and os.environ.get("FASTMETAL_STORE_HOSTED") != "1":
        _state.store_server = StoreServer(addr, port)
    return StoreClient(addr, port, JOIN_TIMEOUT_S)


def _arrive(store: StoreClient, key: str, rank: int, size: int, where: str) -> None:
    """Every rank says it is here and waits for the others (up to JOIN_TIMEOUT_S): a rank
    that never comes, or one started with another WORLD_SIZE, is an error, not a hang in
    the engine's own join."""
    store.set(f"{key}/arrived/{rank}", str(size))
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for other in range(size):
        got = store.get(f"{key}/arrived/{other}", max(0.0, deadline - time.monotonic()))
        if got is None:
            raise RuntimeError(f"[{where}] expected all {size} ranks to join within "
                               f"{JOIN_TIMEOUT_S:.0f} s (FASTMETAL_DIST_TIMEOUT), got no rank "
                               f"{other}")
        if got != str(size):
            raise RuntimeError(f"[{where}] expected every rank to have WORLD_SIZE={size}, got "
                               f"WORLD_SIZE={got} on rank {other}")


def is_initialized() -> bool:
    """Whether init_process_group() has run (and destroy_process_group() has not)."""
    return _state.backend is not None


def _group(fn: str) -> Any:
    if _state.backend is None:
        raise RuntimeError(f"[{_where(fn)}] expected an initialized process group, got none "
                           "(call fastmetal.distributed.init_process_group() first)")
    return _state.backend


def get_rank() -> int:
    """This process's rank, 0 .. world size - 1."""
    return int(_group("get_rank").rank)


def get_world_size() -> int:
    """How many processes the group has."""
    return int(_group("get_world_size").size)


def get_backend() -> str:
    """The engine: "mpi" or "nccl"."""
    return str(_group("get_backend").name)


def destroy_process_group() -> None:
    """Leave the group (every rank calls it); init_process_group() may then run again."""
    backend, _state.backend = _state.backend, None
    if backend is not None:
        backend.close()
    if _state.store_server is not None:
        _state.store_server.close()
        _state.store_server = None


# ----------------------------------------------------------------------------- checks
def _check_array(a: Any, where: str, name: str = "array", writes: bool = True) -> None:
    if not isinstance(a, Array):
        raise TypeError(f"[{where}] expected {name} to be a fastmetal.Array, got "
                        f"{type(a).__name__}")
    if writes and a._readonly:
        raise ValueError(f"[{where}] expected {name} writeable (the result is written into "
                         "it), got a read-only Array")


def _describe(d: tuple) -> str:
    op, shape, dtype, extra = d[:4]
    return f"{op} of shape {tuple(shape)} {dtype}" + (f" {extra}" if extra != "" else "")


def _agree(backend: Any, fn: str, desc: tuple, problem: Optional[Exception] = None) -> None:
    """All-gather every rank's (op, shape, dtype, extra) and this rank's argument problem,
    if any; raise on every rank if any rank had a problem or the descriptors differ. A
    mistake on one rank is an error everywhere, never the others waiting in a collective."""
    where = fn if "." in fn else _where(fn)  # a caller above names itself in full
    seen = backend.agree((*desc, None if problem is None else str(problem)))
    if problem is not None:
        raise problem
    bad = [(r, d[4]) for r, d in enumerate(seen) if d[4] is not None]
    if bad:
        raise ValueError(f"[{where}] expected valid arguments on every rank, got rank "
                         f"{bad[0][0]}'s error: {bad[0][1]}")
    if any(d[:4] != seen[0][:4] for d in seen):
        listing = ", ".join(f"rank {r}: {_describe(d)}" for r, d in enumerate(seen))
        raise ValueError(f"[{where}] expected the same call on every rank (operation, "
                         f"shape and dtype), got {listing}")


def _shape_dtype(a: Any) -> tuple:
    return (tuple(a.shape), str(a.dtype)) if isinstance(a, Array) else ((), "?")


# ----------------------------------------------------------------------------- collectives
def all_reduce(array: Array, op: str = "sum") -> None:
    """Reduce ``array`` over all ranks, in place on every rank: op "sum", "mean", "max" or
    "min" (float32, float16; int64 for sum, max and min). float16 is reduced in float32 on
    the MPI engine and rounded once."""
    fn = "all_reduce"
    where = _where(fn)
    backend = _group(fn)
    problem: Optional[Exception] = None
    try:
        _check_array(array, where)
        if not isinstance(op, str) or op.lower() not in REDUCE_OPS:
            raise ValueError(f"[{where}] expected op 'sum', 'mean', 'max' or 'min', got "
                             f"{op!r}")
        op = op.lower()
        if array.dtype.kind != "f" and op == "mean":
            raise TypeError(f"[{where}] expected a float Array for op 'mean', got dtype "
                            f"{array.dtype} (use 'sum' and divide)")
    except (TypeError, ValueError) as e:
        problem = e
    _agree(backend, fn, (f"all_reduce({op})", *_shape_dtype(array), ""), problem)
    backend.all_reduce(array, op)


def broadcast(array: Array, src: int) -> None:
    """Copy rank ``src``'s ``array`` into ``array`` on every other rank, in place."""
    fn = "broadcast"
    where = _where(fn)
    backend = _group(fn)
    problem: Optional[Exception] = None
    try:
        if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or \
                not 0 <= int(src) < backend.size:
            raise ValueError(f"[{where}] expected src to be a rank, 0 .. {backend.size - 1}, "
                             f"got {src!r}")
        _check_array(array, where, writes=backend.rank != src)
    except (TypeError, ValueError) as e:
        problem = e
    _agree(backend, fn, ("broadcast", *_shape_dtype(array), f"from {src!r}"), problem)
    backend.broadcast(array, int(src))


def all_gather(tensor_list: list, tensor: Array) -> None:
    """Every rank's ``tensor`` into ``tensor_list`` (one Array per rank, in rank order, each of
    ``tensor``'s shape and dtype, written in place), as ``torch.distributed.all_gather``."""
    fn = "all_gather"
    where = _where(fn)
    backend = _group(fn)
    problem: Optional[Exception] = None
    try:
        _check_array(tensor, where, "tensor", writes=False)
        if not isinstance(tensor_list, list) or len(tensor_list) != backend.size:
            got = (f"a list of {len(tensor_list)}" if isinstance(tensor_list, list)
                   else type(tensor_list).__name__)
            raise ValueError(f"[{where}] expected tensor_list to be a list of {backend.size} "
                             f"Arrays (one per rank), got {got}")
        for i, out in enumerate(tensor_list):
            _check_array(out, where, f"tensor_list[{i}]")
            if tuple(out.shape) != tuple(tensor.shape) or out.dtype != tensor.dtype:
                raise ValueError(f"[{where}] expected tensor_list[{i}] of shape "
                                 f"{tuple(tensor.shape)} {tensor.dtype} (as tensor), got "
                                 f"{tuple(out.shape)} {out.dtype}")
    except (TypeError, ValueError) as e:
        problem = e
    _agree(backend, fn, ("all_gather", *_shape_dtype(tensor), ""), problem)
    backend.all_gather(tensor_list, tensor)


def barrier() -> None:
    """Wait until every rank has called barrier()."""
    _group("barrier").barrier()


def all_reduce_unchecked(array: Array, op: str) -> None:
    """all_reduce without the descriptor exchange, for callers that made sure every rank
    passes the same shape and dtype (DistributedDataParallel's buckets, checked at wrap
    time): one collective per call instead of two."""
    _group("all_reduce").all_reduce(array, op)


def start_all_reduce_unchecked(array: Array, op: str) -> Any:
    """all_reduce_unchecked that the GPU orders where the engine can (NCCL): returns what
    :func:`finish_all_reduce` takes before fastmetal reads ``array`` again; engines that
    reduce at once (MPI) return None."""
    engine = _group("all_reduce")
    if hasattr(engine, "start_all_reduce"):
        return engine.start_all_reduce(array, op)
    engine.all_reduce(array, op)
    return None


def finish_all_reduce(pending: Any, array: Array) -> None:
    if pending is not None:
        _group("all_reduce").finish(pending, array.device)


def agree(where: str, desc: tuple) -> None:
    """Raise ValueError on every rank unless every rank passes the same ``desc``, a tuple
    (operation, shape, dtype, detail): a check for the layers above (DistributedDataParallel
    checks that every rank wraps the same parameters); ``where`` names the caller in full."""
    _agree(_group(where), where, tuple(desc))
