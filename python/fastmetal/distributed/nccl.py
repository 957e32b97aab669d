"""The NCCL engine (CuPy's bindings, ``cupy.cuda.nccl``): collectives between CUDA GPUs on
fastmetal's device memory in place, read through ``__cuda_array_interface__`` (no copy).

Each process drives one GPU, the first it sees (the launcher restricts every rank to its own
with CUDA_VISIBLE_DEVICES). Rank 0 makes NCCL's unique id and publishes it in the rendezvous
store. Collectives run on a stream of their own after fastmetal's queued work has finished
(``synchronize``) and are waited for before returning, so fastmetal's next kernels see the
result. CuPy is imported on first use only: without it (or a GPU) the module loads, and
``available()`` says False.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Optional

import numpy as np

from .._core import Array
from ..ops.devices import queue_handle, synchronize

_cupy: Any = None
_nccl: Any = None
_DESC_BYTES = 1024  # a descriptor's JSON, padded (shapes of any rank fit)


def _load() -> tuple:
    global _cupy, _nccl
    if _cupy is None:
        try:
            import cupy  # optional engine: imported where it is used
            from cupy.cuda import nccl
        except ImportError as e:
            raise RuntimeError(
                "[fastmetal.distributed] expected CuPy with NCCL for the 'nccl' backend, got "
                f"ImportError: {e} (pip install cupy-cuda12x; NCCL comes with it, or "
                "pip install nvidia-nccl-cu12)") from None
        _cupy, _nccl = cupy, nccl
    return _cupy, _nccl


def available() -> bool:
    """Whether CuPy's NCCL bindings import and a CUDA GPU is visible."""
    try:
        cupy, _ = _load()
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # noqa: BLE001  (no driver, no GPU: not available)
        return False


class NcclBackend:
    name = "nccl"

    def __init__(self, rank: int, size: int, store: Any, key: str, timeout: float) -> None:
        cupy, nccl = _load()
        where = "fastmetal.distributed.init_process_group"
        self.rank, self.size = rank, size
        cupy.cuda.Device(0).use()  # this rank's GPU: the only one it sees under the launcher
        if rank == 0:
            uid = nccl.get_unique_id()
            if store is not None:  # CuPy 14 gives bytes, earlier ones a tuple of ints
                store.set(f"{key}/uid", json.dumps({"bytes": isinstance(uid, bytes),
                                                    "id": list(uid)}))
        else:
            got: Optional[str] = store.get(f"{key}/uid", timeout)
            if got is None:
                raise RuntimeError(f"[{where}] expected rank 0 to publish NCCL's unique id "
                                   f"within {timeout:.0f} s, got nothing")
            sent = json.loads(got)
            uid = bytes(sent["id"]) if sent["bytes"] else tuple(sent["id"])
        self.comm = nccl.NcclCommunicator(size, uid, rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._kept: dict = {}  # id -> (Array, its CuPy view): start_all_reduce's buffers
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32,
                       np.dtype(np.float16): nccl.NCCL_FLOAT16,
                       np.dtype(np.int64): nccl.NCCL_INT64}
        self._ops = {"sum": nccl.NCCL_SUM, "mean": nccl.NCCL_SUM, "max": nccl.NCCL_MAX,
                     "min": nccl.NCCL_MIN}

    def _view(self, a: Array, where: str) -> Any:
        if not hasattr(a, "__cuda_array_interface__"):
            raise TypeError(f"[fastmetal.distributed.{where}] expected an Array on a CUDA "
                            f"device for the 'nccl' backend, got one on '{a.device}' (use "
                            "init_process_group('mpi') for host memory)")
        synchronize(a.device)  # fastmetal's queued kernels that write `a` finish first
        return _cupy.asarray(a)  # the same device memory

    # -- the descriptor exchange: fixed-size JSON bytes, all-gathered on the GPU
    def agree(self, desc: tuple) -> list:
        text = json.dumps(desc).encode()
        if len(text) > _DESC_BYTES:  # a huge shape or message: its digest stands in
            digest = hashlib.sha256(text).hexdigest()
            text = json.dumps([str(desc[0])[:100], [-1], str(desc[2])[:50], digest,
                               None if desc[4] is None else str(desc[4])[:600]]).encode()
        with self.stream:  # everything on our stream (it does not wait for the null one)
            send = _cupy.zeros(_DESC_BYTES, _cupy.uint8)
            send[:len(text)] = _cupy.asarray(np.frombuffer(text, np.uint8))
            recv = _cupy.empty((self.size, _DESC_BYTES), _cupy.uint8)
            self.comm.allGather(send.data.ptr, recv.data.ptr, _DESC_BYTES, _nccl.NCCL_UINT8,
                                self.stream.ptr)
        self.stream.synchronize()
        out = []
        for row in _cupy.asnumpy(recv):
            op, shape, dtype, extra, problem = json.loads(bytes(row).rstrip(b"\0").decode())
            out.append((op, tuple(shape), dtype, extra, problem))
        return out

    def all_reduce(self, a: Array, op: str) -> None:
        x = self._view(a, "all_reduce")
        with self.stream:
            work = x if x.flags.c_contiguous else _cupy.ascontiguousarray(x)
            if work.size:
                self.comm.allReduce(work.data.ptr, work.data.ptr, work.size,
                                    self._types[np.dtype(a.dtype)], self._ops[op],
                                    self.stream.ptr)
            if op == "mean":
                work /= self.size
            if work is not x:
                x[...] = work
        self.stream.synchronize()

    def start_all_reduce(self, a: Array, op: str) -> Any:
        """all_reduce of a contiguous Array that fastmetal keeps (a DDP bucket), ordered by
        the GPU alone: NCCL's stream waits for an event on fastmetal's queue (the kernels
        that wrote ``a``), and the returned event marks the end of the reduction; the host
        waits for neither. Hand the event to :meth:`finish` before fastmetal reads ``a``."""
        view = self._kept.get(id(a))
        if view is None or view[0] is not a:
            view = self._kept[id(a)] = (a, self._view(a, "all_reduce"))  # one wait, once
        x = view[1]
        ours = _cupy.cuda.ExternalStream(queue_handle(a.device))
        written = _cupy.cuda.Event(disable_timing=True)
        written.record(ours)
        self.stream.wait_event(written)
        with self.stream:
            if x.size:
                self.comm.allReduce(x.data.ptr, x.data.ptr, x.size,
                                    self._types[np.dtype(a.dtype)], self._ops[op],
                                    self.stream.ptr)
            if op == "mean":
                x /= self.size
        done = _cupy.cuda.Event(disable_timing=True)
        done.record(self.stream)
        return done

    def finish(self, done: Any, device: str) -> None:
        """fastmetal's queue waits (on the GPU) for a reduction started by start_all_reduce."""
        _cupy.cuda.ExternalStream(queue_handle(device)).wait_event(done)

    def broadcast(self, a: Array, src: int) -> None:
        x = self._view(a, "broadcast")
        with self.stream:
            work = x if x.flags.c_contiguous else _cupy.ascontiguousarray(x)
            if work.size:
                self.comm.broadcast(work.data.ptr, work.data.ptr, work.nbytes,
                                    _nccl.NCCL_UINT8, src, self.stream.ptr)
            if work is not x:
                x[...] = work
        self.stream.synchronize()

    def all_gather(self, outs: list, a: Array) -> None:
        x = self._view(a, "all_gather")
        with self.stream:
            send = _cupy.ascontiguousarray(x)
            recv = _cupy.empty((self.size,) + x.shape, x.dtype)
            if send.size:
                self.comm.allGather(send.data.ptr, recv.data.ptr, send.nbytes,
                                    _nccl.NCCL_UINT8, self.stream.ptr)
            for i, out in enumerate(outs):
                self._view(out, "all_gather")[...] = recv[i]
        self.stream.synchronize()

    def barrier(self) -> None:
        with self.stream:
            one = _cupy.ones(1, _cupy.float32)
            self.comm.allReduce(one.data.ptr, one.data.ptr, 1, _nccl.NCCL_FLOAT32,
                                _nccl.NCCL_SUM, self.stream.ptr)
        self.stream.synchronize()

    def close(self) -> None:
        try:
            self.comm.destroy()
        except Exception:  # noqa: BLE001  (already torn down at exit)
            pass
