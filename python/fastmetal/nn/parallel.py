"""``fastmetal.nn.parallel``: ``DistributedDataParallel``, as ``torch.nn.parallel``'s.

Each process holds a replica of the model and computes gradients on its share of the batch;
DDP makes the replicas start equal (rank 0's parameters are broadcast when it wraps the
model) and stay equal (every gradient is averaged over the ranks during ``backward()``, so
the optimizers take the same step everywhere). Gradients are averaged in buckets of about
``bucket_cap_mb`` megabytes, filled in reverse parameter order (the order backward produces
them, as PyTorch): a bucket is all-reduced as soon as the last of its gradients has been
accumulated, from a post-accumulate-grad hook of the tape
(``fastmetal.autograd.tape.register_post_accumulate_grad_hook``), while backward goes on
with the layers below.
"""
from __future__ import annotations

import contextlib
import weakref
import zlib
from typing import Any, Iterator, Optional

import numpy as np

from .._core import Array
from ..autograd.tape import is_grad_enabled, no_grad, register_post_accumulate_grad_hook
from ..distributed import group as _group
from ..ops.creation import zeros
from ..ops.manipulation import concatenate
from ..ops.devices import host_visible
from .modules.module import Module

__all__ = ["DistributedDataParallel"]


class _Bucket:
    def __init__(self, params: list) -> None:
        self.params = params                      # in the order they are expected ready
        self.sizes = [int(p.size) for p in params]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]))
        self.numel = int(sum(self.sizes))
        self.flat: Optional[Array] = None         # allocated at the first reduction
        self.ready: set = set()                   # ids of its gradients ready this backward
        self.pending: Any = False                 # a GPU reduction not yet copied back


class _Hook:
    """The per-parameter hook; holds DDP weakly, so that a dropped DDP frees itself."""

    __slots__ = ("ddp", "bucket")

    def __init__(self, ddp: "DistributedDataParallel", bucket: int) -> None:
        self.ddp = weakref.ref(ddp)
        self.bucket = bucket

    def __call__(self, param: Array) -> None:
        ddp = self.ddp()
        if ddp is not None:
            ddp._grad_ready(self.bucket, param)


class DistributedDataParallel(Module):
    """``DistributedDataParallel(module, device_ids=None, output_device=None,
    broadcast_buffers=True, bucket_cap_mb=25.0)``: ``module`` replicated over the ranks of
    the default process group (``fastmetal.distributed.init_process_group()`` first), its
    gradients averaged during ``backward()``. ``forward`` calls ``module``; the wrapped
    Module is ``.module``, so ``state_dict()``'s keys start with "module." as PyTorch's (load
    them into an unwrapped model through ``ddp.module.state_dict()``). ``device_ids`` and
    ``output_device`` are accepted for PyTorch's programs and must name nothing else than
    this process's one device: each rank drives one device (FASTMETAL_DEVICE, which the
    launcher sets). ``broadcast_buffers``: rank 0's buffers (BatchNorm's running statistics)
    go to every rank at wrap time and before each training forward, as PyTorch's. Every parameter that requires grad must get a gradient in each backward (an
    unused one is an error at the next forward, as PyTorch's default). Move the model to
    its device before wrapping (``Module.to`` makes new Parameters, which DDP would not
    know)."""

    def __init__(self, module: Module, device_ids: Any = None, output_device: Any = None,
                 broadcast_buffers: bool = True, bucket_cap_mb: float = 25.0) -> None:
        where = "fastmetal.nn.parallel.DistributedDataParallel"
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"[{where}] expected a fastmetal.nn.Module, got "
                            f"{type(module).__name__}")
        if not _group.is_initialized():
            raise RuntimeError(f"[{where}] expected an initialized process group, got none "
                               "(call fastmetal.distributed.init_process_group() first)")
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not bucket_cap_mb > 0:
            raise ValueError(f"[{where}] expected bucket_cap_mb > 0, got {bucket_cap_mb!r}")
        if device_ids is not None and len(list(device_ids)) > 1:
            raise ValueError(f"[{where}] expected at most one device id (one device per "
                             f"process), got {device_ids!r}")
        self.module = module
        self.broadcast_buffers = bool(broadcast_buffers)
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.require_backward_grad_sync = True
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._names = {id(p): n for n, p in named}
        self._check_replicas(named, where)
        with no_grad():
            for _, p in module.named_parameters():
                _group.broadcast(p, 0)
        self._sync_buffers()
        self._buckets = self._make_buckets([p for _, p in named])
        self._reduced = 0
        self._expect_hooks = False  # set by forward(): its backward averages, as PyTorch
        self._handles = [register_post_accumulate_grad_hook(p, _Hook(self, i))
                         for i, b in enumerate(self._buckets) for p in b.params]

    # -- set up
    @staticmethod
    def _check_replicas(named: list, where: str) -> None:
        """Every rank wraps the same parameters (names, shapes, dtypes), or all raise."""
        listing = repr([(n, tuple(p.shape), str(p.dtype)) for n, p in named]).encode()
        numel = int(sum(int(p.size) for _, p in named))
        desc = ("wrap", (len(named), numel), "parameters and elements",
                f"(crc32 {zlib.crc32(listing):08x} of names, shapes and dtypes)")
        _group.agree(where, desc)

    def _make_buckets(self, params: list) -> list:
        # The first bucket holds about 1 MB, as PyTorch's (first_bucket_bytes_cap): the last
        # layers' gradients are ready first and small, so their reduction starts early,
        # while the backward of the layers before them still runs.
        cap = min(self.bucket_cap_mb, 1.0) * 2**20
        buckets: list = []
        current: list = []
        size = 0
        for p in reversed(params):  # backward produces the last layers' gradients first
            key = (p.dtype, p.device)
            if current and ((current[0].dtype, current[0].device) != key or size >= cap):
                cap = self.bucket_cap_mb * 2**20
                buckets.append(_Bucket(current))
                current, size = [], 0
            current.append(p)
            size += int(p.nbytes)
        if current:
            buckets.append(_Bucket(current))
        return buckets

    # -- the reduction, from the tape's hooks
    def _grad_ready(self, index: int, param: Array) -> None:
        if not self._expect_hooks:  # backward of a graph not made by forward(), or no_sync()
            return
        bucket = self._buckets[index]
        bucket.ready.add(id(param))
        if len(bucket.ready) == len(bucket.params):
            self._reduce(bucket)
            self._reduced += 1
            if self._reduced == len(self._buckets):  # this backward is done
                self._finish()
                self._reset()

    def _reset(self) -> None:
        self._reduced = 0
        self._expect_hooks = False
        for b in self._buckets:
            b.ready.clear()

    def _reduce(self, bucket: _Bucket) -> None:
        first = bucket.params[0]
        if bucket.flat is None:
            bucket.flat = zeros((bucket.numel,), dtype=first.dtype, device=first.device)
        flat = bucket.flat
        with no_grad():
            if host_visible(flat):  # NumPy views of the same memory: no kernel launches
                host = np.asarray(flat)
                for p, off, n in zip(bucket.params, bucket.offsets, bucket.sizes):
                    host[off:off + n] = np.asarray(p.grad).reshape(-1)
                _group.all_reduce_unchecked(flat, "mean")
                for p, off, n in zip(bucket.params, bucket.offsets, bucket.sizes):
                    g = np.asarray(p.grad)
                    g[...] = host[off:off + n].reshape(g.shape)
            else:
                # On a GPU the host never waits: the reduction is ordered after the copies on
                # the GPU (NCCL's stream waits for fastmetal's), and the copies back wait for
                # it only at the end of backward (_finish), so the backward of the layers
                # before this bucket runs meanwhile.
                for p, off, n in zip(bucket.params, bucket.offsets, bucket.sizes):
                    flat[off:off + n] = p.grad.reshape(-1)
                bucket.pending = _group.start_all_reduce_unchecked(flat, "mean")

    def _finish(self) -> None:
        """The end of backward: each GPU bucket's averaged gradients back into .grad, after
        its reduction (on the GPU: fastmetal's queue waits for NCCL's event)."""
        with no_grad():
            for bucket in self._buckets:
                if bucket.pending is False:
                    continue
                _group.finish_all_reduce(bucket.pending, bucket.flat)
                bucket.pending = False
                flat = bucket.flat
                for p, off, n in zip(bucket.params, bucket.offsets, bucket.sizes):
                    p.grad[...] = flat[off:off + n].reshape(tuple(p.shape))

    # -- the Module
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._reduced or any(b.ready for b in self._buckets):
            missing = [self._names[id(p)] for b in self._buckets for p in b.params
                       if id(p) not in b.ready]
            self._reset()
            raise RuntimeError(
                "[fastmetal.nn.parallel.DistributedDataParallel] expected the previous "
                "backward() to produce a gradient for every parameter that requires grad "
                "(so that every bucket was averaged over the ranks), got none for "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}; freeze unused parameters "
                "(requires_grad_(False)) before wrapping")
        # As PyTorch: whether this forward's backward averages is decided here.
        self._expect_hooks = self.require_backward_grad_sync and is_grad_enabled()
        if self.module.training:
            self._sync_buffers()
        return self.module(*args, **kwargs)

    def _sync_buffers(self) -> None:
        """Rank 0's buffers (BatchNorm's running statistics) to every rank, as PyTorch's
        default (``broadcast_buffers=True``): at wrap time and before each training forward.
        One broadcast per dtype: the buffers are packed into one flat Array and unpacked."""
        if not self.broadcast_buffers:
            return
        by_dtype: dict = {}
        for b in self.module.buffers():
            if b.size:
                by_dtype.setdefault(str(b.dtype), []).append(b)
        with no_grad():
            for group in by_dtype.values():
                flat = concatenate([b.reshape(-1) for b in group])
                _group.broadcast(flat, 0)
                offset = 0
                for b in group:
                    b[...] = flat[offset:offset + b.size].reshape(tuple(b.shape))
                    offset += b.size

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """The backward() of a forward() run inside accumulates gradients locally without
        averaging them (gradient accumulation); the first one after the block averages the
        sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def extra_repr(self) -> str:
        return f"buckets={len(self._buckets)}, bucket_cap_mb={self.bucket_cap_mb:g}"
