"""What each device can do, asked of its backend (never decided by the device's name)."""
from __future__ import annotations

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
