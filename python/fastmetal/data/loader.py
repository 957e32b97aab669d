"""``Dataset``, ``TensorDataset`` and ``DataLoader``, as ``torch.utils.data``'s: batches of a
dataset as fastmetal Arrays, shuffled by a seeded permutation (``fm.manual_seed`` or
``generator=`` fixes the order), optionally with a sampler (a ``DistributedSampler``,
say). A ``TensorDataset``'s batch is gathered in one indexing step per array; any other
dataset's samples are collated one by one (``default_collate``). With ``prefetch=True`` the
next batch is prepared on a background thread while the caller works on the current one."""
from __future__ import annotations

import numbers
import queue
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .._core import Array
from ..ops import random as _random
from ..ops.creation import asarray

__all__ = ["Dataset", "TensorDataset", "DataLoader", "default_collate"]


class Dataset:
    """A map-style dataset: ``__getitem__(i)`` and ``__len__``."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"[fastmetal.data.{type(self).__name__}] expected "
                                  "__getitem__ to be defined by the subclass, got none")

    def __len__(self) -> int:
        raise NotImplementedError(f"[fastmetal.data.{type(self).__name__}] expected __len__ "
                                  "to be defined by the subclass, got none")


class TensorDataset(Dataset):
    """Samples ``i`` of several arrays (NumPy arrays or Arrays) of the same length."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("[fastmetal.data.TensorDataset] expected at least one array, got none")
        self.arrays = [a if isinstance(a, (Array, np.ndarray)) else np.asarray(a) for a in arrays]
        lengths = {a.shape[0] if a.ndim else None for a in self.arrays}
        if len(lengths) != 1 or None in lengths:
            raise ValueError("[fastmetal.data.TensorDataset] expected arrays with the same "
                             f"first dimension, got shapes {[tuple(a.shape) for a in self.arrays]}")

    def __getitem__(self, index: Any) -> tuple:
        return tuple(a[index] for a in self.arrays)

    def __len__(self) -> int:
        return int(self.arrays[0].shape[0])


def default_collate(samples: list, device: Optional[str] = None) -> Any:
    """Stack a list of samples (arrays, numbers, or tuples / dicts of them) into Arrays: floats
    as float32 (float16 kept), integers as int64."""
    first = samples[0]
    if isinstance(first, tuple) or isinstance(first, list):
        return type(first)(default_collate([s[i] for s in samples], device)
                           for i in range(len(first)))
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples], device) for k in first}
    host = np.stack([s.numpy() if isinstance(s, Array) else np.asarray(s) for s in samples])
    return _to_array(host, device)


def _to_array(host: np.ndarray, device: Optional[str]) -> Array:
    if host.dtype.kind in "iub":
        return asarray(host.astype(np.int64), dtype="int64", device=device)
    if host.dtype == np.float16:
        return asarray(host, dtype="float16", device=device)
    return asarray(host.astype(np.float32, copy=False), device=device)


class DataLoader:
    """Batches of ``dataset``: ``batch_size`` samples (the last one smaller unless
    ``drop_last``), in order, or shuffled each epoch (``shuffle``: a permutation drawn from
    ``generator``, a ``fastmetal.random.Generator``, else from fastmetal.random's own, so
    ``fm.manual_seed`` fixes it), or in a ``sampler``'s order (an iterable of indices, such
    as ``DistributedSampler``). Each batch is an Array (or a tuple of them) on ``device``
    (default: the default device), or what ``collate_fn(list_of_samples)`` returns.

    ``prefetch=True`` (off by default) prepares the next batch on one background thread (the
    dataset's ``__getitem__``, collation and the copy to the device) while the caller trains on
    the current one: the same batches in the same order. An exception raised while preparing
    a batch is raised by the iteration, where that batch would have come; leaving the loop
    early (``break``, an exception in the caller) stops and joins the thread.

    PyTorch's ``num_workers``, ``pin_memory`` and ``persistent_workers`` are taken, so its
    loaders are written the same way: ``num_workers > 0`` turns ``prefetch`` on (one thread,
    not worker processes: the same batches in the same order), ``pin_memory`` changes
    nothing (batches are copied to the device here, with no pinned staging), and
    ``persistent_workers=True`` needs ``num_workers > 0`` as in PyTorch."""

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 sampler: Any = None, drop_last: bool = False,
                 collate_fn: Optional[Callable] = None, generator: Any = None,
                 device: Optional[str] = None, prefetch: bool = False, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False) -> None:
        where = "fastmetal.data.DataLoader"
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"[{where}] expected a dataset with __getitem__ and __len__, got "
                            f"{type(dataset).__name__}")
        if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, numbers.Integral) \
                or batch_size < 1:
            raise ValueError(f"[{where}] expected batch_size to be a positive int, got "
                             f"{batch_size!r}")
        if shuffle and sampler is not None:
            raise ValueError(f"[{where}] expected shuffle or a sampler, not both")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.sampler, self.drop_last = bool(shuffle), sampler, bool(drop_last)
        self.collate_fn, self.generator, self.device = collate_fn, generator, device
        for name, flag in (("prefetch", prefetch), ("pin_memory", pin_memory),
                           ("persistent_workers", persistent_workers)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"[{where}] expected {name} to be a bool, got {flag!r}")
        if isinstance(num_workers, (bool, np.bool_)) or not isinstance(num_workers, numbers.Integral) \
                or num_workers < 0:
            raise ValueError(f"[{where}] expected num_workers to be a non-negative int, got "
                             f"{num_workers!r}")
        if persistent_workers and num_workers == 0:
            raise ValueError(f"[{where}] persistent_workers=True needs num_workers > 0 (PyTorch's "
                             "rule), got num_workers=0")
        # PyTorch's worker processes become the one prefetch thread (the batches and their
        # order are the same); pin_memory has nothing to do: batches are copied to the device
        # here, with no pinned staging buffer to ask for.
        self.num_workers, self.pin_memory = int(num_workers), bool(pin_memory)
        self.prefetch = bool(prefetch) or self.num_workers > 0

    def _order(self) -> np.ndarray:
        if self.sampler is not None:
            return np.fromiter(iter(self.sampler), dtype=np.int64)
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        return np.random.default_rng(_random.fresh_seed(self.generator)).permutation(n)

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        order = self._order()
        stop = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        chunks = (order[start:start + self.batch_size]
                  for start in range(0, stop, self.batch_size))
        if not self.prefetch:
            for indices in chunks:
                yield self._batch(indices)
            return
        yield from _prefetched(self._batch, chunks)

    def _batch(self, indices: np.ndarray) -> Any:
        if self.collate_fn is None and isinstance(self.dataset, TensorDataset):
            # One gather per array (device Arrays are indexed on their device).
            parts = [a[indices] if isinstance(a, np.ndarray) else
                     a[asarray(indices, dtype="int64", device=a.device)]
                     for a in self.dataset.arrays]
            parts = [_to_array(p, self.device) if isinstance(p, np.ndarray) else
                     (p.to(self.device) if self.device else p) for p in parts]
            return parts[0] if len(parts) == 1 else tuple(parts)
        samples = [self.dataset[int(i)] for i in indices]
        if self.collate_fn is not None:
            return self.collate_fn(samples)
        return default_collate(samples, self.device)


_DONE = object()


def _prefetched(make: Callable[[np.ndarray], Any], chunks: Iterator[np.ndarray]) -> Iterator[Any]:
    """make(chunk) for each chunk, one ahead, on a background thread. The queue holds one
    finished batch, so at most two exist besides the caller's. The thread's exception comes
    back through the queue; closing this generator (the caller left the loop) stops the
    thread and joins it."""
    ready: queue.Queue = queue.Queue(maxsize=1)
    stopping = threading.Event()

    def put(item: Any) -> bool:
        while not stopping.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def work() -> None:
        try:
            for chunk in chunks:
                if stopping.is_set() or not put(("batch", make(chunk))):
                    return
            put(("done", _DONE))
        except BaseException as e:  # handed to the caller, raised there
            put(("error", e))

    thread = threading.Thread(target=work, name="fastmetal-DataLoader-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, item = ready.get()
            if kind == "done":
                return
            if kind == "error":
                raise item
            yield item
    finally:
        stopping.set()
        thread.join()
