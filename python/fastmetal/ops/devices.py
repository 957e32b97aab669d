"""What each device can do, asked of its backend (never decided by the device's name)."""
from __future__ import annotations

import builtins

from .. import _core
from .._core import Array
# The device functions are the compiled ones (public as fastmetal.<name>).
from .._core import default_device, devices, set_default_device, synchronize  # noqa: F401

# Devices whose memory NumPy views share (cpu, metal; not cuda's device memory).
HOST_VISIBLE = frozenset(d for d in _core.devices() if _core._device_capabilities(d)["host_visible"])


def host_visible(a: Array) -> bool:
    """Whether NumPy can view `a`'s memory without a copy."""
    return a.device in HOST_VISIBLE


def configuration_problems() -> list:
    """FASTMETAL_* environment variables that were not understood, each said in a sentence
    naming the variable and the accepted values (the default was used instead)."""
    return list(_core._config_problems())


def device_capabilities(device: str) -> dict:
    """What the backend of `device` says it can do: host_visible, discrete_gpu,
    dlpack_device, cuda_array_interface (read by fastmetal.distributed to pick an engine)."""
    return dict(_core._device_capabilities(device))


def queue_handle(device: str) -> int:
    """The device's queue as an int (a ``cudaStream_t`` on cuda; 0 where it has none): an
    engine that orders its own work after fastmetal's (NCCL) waits on it, not on the host."""
    return int(_core._queue_handle(device))


def device_kinds() -> list:
    """Every device kind this build knows: the devices present, then those built but absent
    or not built (named by _core's device problems), best first within each."""
    kinds = list(devices())
    for line in _core._device_problems():
        kind = line.split(":", 1)[0]
        if kind not in kinds:
            kinds.append(kind)
    return kinds


class device(str):  # noqa: N801  (PyTorch's name: torch.device)
    """A device, written as PyTorch's ``torch.device``: ``device(kind)``,
    ``device(f"{kind}:0")`` or ``device(kind, 0)``, for a kind of ``device_kinds()``.

    It *is* the device's name (a ``str``), so every function that takes a device takes it,
    and ``device(kind) == kind``. ``type`` and ``index`` are PyTorch's. fastmetal drives
    one device of each kind per process (index 0; ``CUDA_VISIBLE_DEVICES`` picks which GPU
    that is), so another index is a ``ValueError``. Like PyTorch's, making one does not ask
    whether the device is present; using it does. ``with device(kind):`` makes it the
    default device for the block, as PyTorch's does.
    """

    def __new__(cls, type, index=None):  # noqa: A002  (PyTorch's argument name)
        if isinstance(type, device) and index is None:
            return type
        if not isinstance(type, str):
            raise TypeError(f"[fastmetal.device] expected a device name, a kind of "
                            f"{', '.join(device_kinds())} optionally with ':0', got "
                            f"{builtins.type(type).__name__}")
        kind, colon, number = type.partition(":")
        if colon:
            if index is not None:
                raise ValueError(f"[fastmetal.device] the index is given twice: in {type!r} "
                                 f"and as index={index!r}")
            if not number.isdigit():
                raise ValueError(f"[fastmetal.device] expected 'kind:index' with a "
                                 f"non-negative integer index, got {type!r}")
            index = int(number)
        kinds = device_kinds()
        if kind not in kinds:
            hint = (" (PyTorch's 'mps', Apple's GPU, is fastmetal's Metal device)"
                    if kind == "mps" else "")
            raise ValueError(f"[fastmetal.device] expected a device kind among "
                             f"{', '.join(kinds)}, got {type!r}{hint}")
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise ValueError(f"[fastmetal.device] expected index to be a non-negative "
                                 f"int, got {index!r}")
            if index != 0:
                raise ValueError(f"[fastmetal.device] fastmetal drives one {kind} device per "
                                 f"process, index 0, got index {index}; to run on another GPU "
                                 f"set CUDA_VISIBLE_DEVICES for the process (fastmetal."
                                 f"distributed.run does so for each rank)")
        made = super().__new__(cls, kind)
        made._index = index
        made._previous = []
        return made

    @property
    def type(self) -> str:
        """The kind, as a plain str (the device's name)."""
        return str.__str__(self)

    @property
    def index(self):
        """0 where one was given, else None (PyTorch's)."""
        return self._index

    def __repr__(self) -> str:
        extra = "" if self._index is None else f", index={self._index}"
        return f"device(type='{self.type}'{extra})"

    def __reduce__(self):
        return (device, (self.type, self._index))

    def __enter__(self) -> "device":
        self._previous.append(default_device())
        set_default_device(self.type)
        return self

    def __exit__(self, *exc) -> None:
        set_default_device(self._previous.pop())



def accelerators() -> list:
    """The GPUs present (discrete or not), most preferred first (fastmetal.devices()'
    order)."""
    return [d for d in devices() if _core._device_capabilities(d)["gpu"]]
