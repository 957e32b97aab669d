"""``fastmetal.accelerator``: PyTorch's ``torch.accelerator`` — whether a GPU is present and
which one. fastmetal's accelerator is the first GPU of ``fastmetal.devices()`` (metal on a
Mac, cuda where the CUDA backend was built and a GPU is visible); one per process."""
from .ops.devices import accelerators, device
from .ops.devices import synchronize as _synchronize

__all__ = ["is_available", "current_accelerator", "device_count", "current_device_index",
           "synchronize"]


def is_available() -> bool:
    """Whether this process has a GPU device (metal or cuda)."""
    return bool(accelerators())


def current_accelerator(check_available: bool = False):
    """The accelerator as a ``fastmetal.device`` (Metal's or CUDA's GPU), or None without one.
    (``check_available`` is PyTorch's; with one device kind per process it changes nothing.)"""
    found = accelerators()
    return device(found[0]) if found else None


def device_count() -> int:
    """How many accelerator devices fastmetal drives: 1, or 0 without one."""
    return 1 if accelerators() else 0


def current_device_index() -> int:
    """The index of the accelerator in use: always 0 (one per process); -1 without one."""
    return 0 if accelerators() else -1


def synchronize(device=None) -> None:
    """Wait until the accelerator (or ``device``) has finished the work queued so far."""
    target = device if device is not None else current_accelerator()
    if target is not None:
        _synchronize(str(target))


def __dir__():
    return sorted(__all__)
