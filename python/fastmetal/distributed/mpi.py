"""The MPI engine (mpi4py over MPICH or Open MPI): collectives between CPU processes, and
between host-visible devices (Metal's buffers are shared memory), on the Arrays' memory in
place through NumPy views; other devices go through a host copy.

Forming the world: under ``mpiexec -n N`` MPI_COMM_WORLD already is the world. Under
fastmetal's launcher (one ``mpiexec -n 1`` per rank, so that launchers started separately
on several machines can join) each rank is its own MPI world; rank 0 opens an MPI port
(MPI_Open_port) and publishes its name in the rendezvous store, and the world grows one
rank at a time by MPI_Comm_accept (collective over the ranks joined so far) /
MPI_Comm_connect (the newcomer, when rank 0 gives it its turn through the store: one
connect pending at a time) and MPI_Intercomm_merge, then is ordered by RANK
(MPI_Comm_split). The data then moves on MPI's own transports.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, Optional

import numpy as np

from .._core import Array
from ..autograd.tape import no_grad
from ..ops.devices import host_visible, synchronize

_MPI: Any = None


def _load() -> Any:
    """mpi4py's MPI module, imported on first use (an optional engine)."""
    global _MPI
    if _MPI is None:
        try:
            from mpi4py import MPI  # optional engine: imported where it is used
        except ImportError as e:
            raise RuntimeError(
                "[fastmetal.distributed] expected mpi4py and an MPI library for the 'mpi' "
                f"backend, got ImportError: {e} (pip install mpi4py mpich, or "
                "pip install 'fastmetal[test]')") from None
        _MPI = MPI
    return _MPI


def available() -> bool:
    try:
        _load()
    except RuntimeError:
        return False
    return True


_REDUCE = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN"}


class MpiBackend:
    name = "mpi"

    def __init__(self, rank: Optional[int], size: Optional[int], store: Any, key: str,
                 timeout: float) -> None:
        MPI = _load()
        world = MPI.COMM_WORLD
        if size is None:  # no launcher: mpiexec's world (or a world of one)
            self.comm = world.Dup()
        elif world.Get_size() == size:
            if rank != world.Get_rank():
                raise RuntimeError(f"[fastmetal.distributed.init_process_group] expected RANK "
                                   f"to be MPI's rank {world.Get_rank()} under mpiexec, got "
                                   f"RANK={rank}")
            self.comm = world.Dup()
        elif world.Get_size() == 1:
            try:
                self.comm = _join(MPI, rank, size, store, key, timeout)  # type: ignore[arg-type]
            except MPI.Exception as e:
                raise RuntimeError(
                    "[fastmetal.distributed.init_process_group] expected MPI to connect the "
                    f"ranks, got {str(e).splitlines()[0]} ... (MPICH connects only processes "
                    "started by mpiexec: python -m fastmetal.distributed.run runs each rank "
                    "under mpiexec -n 1 unless --no-mpiexec or FASTMETAL_LAUNCH_MPIEXEC=0; "
                    "or start the job with mpiexec -n N)") from e
        else:
            raise RuntimeError(f"[fastmetal.distributed.init_process_group] expected MPI's "
                               f"world to be of size 1 or WORLD_SIZE={size}, got "
                               f"{world.Get_size()}")
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    # -- the descriptor exchange
    def agree(self, desc: tuple) -> list:
        return list(self.comm.allgather(desc))

    # -- collectives on Arrays
    def all_reduce(self, a: Array, op: str) -> None:
        MPI = _MPI
        with _host(a, write=True) as buf:
            work = buf.astype(np.float32) if buf.dtype == np.float16 else buf
            if work.size:
                self.comm.Allreduce(MPI.IN_PLACE, work, op=getattr(MPI, _REDUCE[op]))
            if op == "mean":
                np.divide(work, self.size, out=work)
            if work is not buf:
                buf[...] = work  # float16: rounded once, after the float32 reduction

    def broadcast(self, a: Array, src: int) -> None:
        with _host(a, write=self.rank != src) as buf:
            if buf.size:
                self.comm.Bcast(_bytes(buf), root=src)

    def all_gather(self, outs: list, a: Array) -> None:
        with _host(a, write=False) as buf:
            recv = np.empty((self.size,) + buf.shape, buf.dtype)
            if buf.size:
                self.comm.Allgather(_bytes(buf), _bytes(recv))
        for i, out in enumerate(outs):
            with _host(out, write=True) as dst:
                dst[...] = recv[i]

    def barrier(self) -> None:
        self.comm.Barrier()

    def close(self) -> None:
        try:
            self.comm.Free()
        except Exception:  # noqa: BLE001  (MPI already finalized at exit)
            pass


def _bytes(buf: np.ndarray) -> list:
    return [buf.reshape(-1).view(np.uint8), _MPI.BYTE]


@contextlib.contextmanager
def _host(a: Array, write: bool) -> Iterator[np.ndarray]:
    """A contiguous NumPy array over ``a``'s memory: ``a`` itself where the device is
    host-visible and ``a`` contiguous (no copy), else a copy, written back into ``a`` on exit
    when ``write``."""
    if host_visible(a):
        synchronize(a.device)  # kernels queued to write `a` finish first
        view = np.asarray(a)
        if view.flags.c_contiguous:
            yield view
            return
        buf = np.ascontiguousarray(view)
        yield buf
        if write:
            view[...] = buf
        return
    buf = a.numpy()  # device memory: through the host
    yield buf
    if write:
        with no_grad():  # a parameter is written as data, as torch.distributed does
            a[...] = buf


def _join(MPI: Any, rank: int, size: int, store: Any, key: str, timeout: float) -> Any:
    """One intracommunicator of `size` ranks ordered by RANK, from `size` worlds of one."""
    where = "fastmetal.distributed.init_process_group"
    if rank == 0:
        port = MPI.Open_port()
        store.set(f"{key}/port", port)
        comm = MPI.COMM_SELF
    else:
        port = store.get(f"{key}/port", timeout)
        if port is None:
            raise RuntimeError(f"[{where}] expected rank 0 to publish its MPI port within "
                               f"{timeout:.0f} s, got nothing (did rank 0 start, with the "
                               "same MASTER_ADDR:MASTER_PORT?)")
        # One newcomer at a time, in RANK order: MPICH can crash in MPI_Comm_accept when
        # several connects to one port are pending at once (seen with 3 ranks).
        if store.get(f"{key}/turn/{rank}", timeout) is None:
            raise RuntimeError(f"[{where}] expected the ranks before {rank} to join within "
                               f"{timeout:.0f} s, got no turn")
        _debug(f"rank {rank}: connecting to {port[:40]}")
        inter = MPI.COMM_SELF.Connect(port)
        comm = inter.Merge(high=True)
        inter.Disconnect()
    while comm.Get_size() < size:  # the ranks joined so far accept the next one together
        _debug(f"rank {rank}: {comm.Get_size()} joined, accepting on {port[:40]}")
        if rank == 0:
            store.set(f"{key}/turn/{comm.Get_size()}", "1")
        inter = comm.Accept(port, root=0)
        merged = inter.Merge(high=False)
        inter.Disconnect()
        if comm is not MPI.COMM_SELF:
            comm.Free()
        comm = merged
    if rank == 0:
        MPI.Close_port(port)
    ordered = comm.Split(0, rank)
    if comm is not MPI.COMM_SELF:
        comm.Free()
    _debug(f"rank {rank}: joined MPI world of {ordered.Get_size()}")
    return ordered


def _debug(msg: str) -> None:
    if os.environ.get("FASTMETAL_DIST_DEBUG"):
        print(f"[fastmetal.distributed] {msg}", file=sys.stderr, flush=True)
