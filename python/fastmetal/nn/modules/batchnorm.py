"""Batch normalization layers, as ``torch.nn``'s: BatchNorm1d and BatchNorm2d, with
PyTorch's parameters (``weight``, ``bias``) and buffers (``running_mean``, ``running_var``,
``num_batches_tracked``), so that their state_dict keys are PyTorch's."""
from __future__ import annotations

import numbers

import numpy as np

from ...autograd.tape import no_grad
from ...ops.checks import check_bool, positive_int
from ...ops.creation import ones, zeros
from ...ops.normalization import batch_norm
from .module import Module, Parameter

__all__ = ['BatchNorm1d', 'BatchNorm2d']


class _BatchNorm(Module):
    _dims: tuple = ()
    _layout = ""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        cls = type(self).__name__
        self.num_features = positive_int(num_features, "num_features", cls)
        if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real) or eps < 0:
            raise ValueError(f"[fastmetal.nn.{cls}] expected eps to be a number >= 0, got "
                             f"{eps!r}")
        if momentum is not None and (isinstance(momentum, (bool, np.bool_))
                                     or not isinstance(momentum, numbers.Real)):
            raise TypeError(f"[fastmetal.nn.{cls}] expected momentum to be a number or None "
                            f"(a cumulative average), got {momentum!r}")
        self.eps = float(eps)
        self.momentum = None if momentum is None else float(momentum)
        check_bool(affine, "affine", cls)
        check_bool(track_running_stats, "track_running_stats", cls)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        dt = "float16" if dtype in ("float16", np.float16) else "float32"
        C = self.num_features
        if self.affine:
            self.weight = Parameter(ones((C,), dtype=dt, device=device))
            self.bias = Parameter(zeros((C,), dtype=dt, device=device))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", zeros((C,), dtype=dt, device=device))
            self.register_buffer("running_var", ones((C,), dtype=dt, device=device))
            self.register_buffer("num_batches_tracked", zeros((), dtype="int64", device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        if self.track_running_stats:
            with no_grad():
                self.running_mean = zeros((self.num_features,), dtype=self.running_mean.dtype,
                                          device=self.running_mean.device)
                self.running_var = ones((self.num_features,), dtype=self.running_var.dtype,
                                        device=self.running_var.device)
                self.num_batches_tracked = zeros((), dtype="int64",
                                                 device=self.num_batches_tracked.device)

    def forward(self, x):
        shape = tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
        if len(shape) not in self._dims:
            dims = " or ".join(f"{d}-D" for d in self._dims)
            raise ValueError(f"[fastmetal.nn.{type(self).__name__}] expected a {dims} input "
                             f"{self._layout}, got shape {shape}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            with no_grad():
                self.num_batches_tracked += 1
            if self.momentum is None:  # cumulative moving average (reads the count)
                factor = 1.0 / float(self.num_batches_tracked.numpy())
        # Batch statistics while training, or where no running statistics are kept.
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return batch_norm(x, self.running_mean if keep else None,
                          self.running_var if keep else None, self.weight, self.bias,
                          use_batch, factor, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of ``(N, C)`` or ``(N, C, L)`` input, as ``torch.nn.BatchNorm1d``:
    training normalises by the batch's statistics per channel and updates the running ones
    (``momentum``; None: a cumulative average); eval mode normalises by the running ones."""
    _dims = (2, 3)
    _layout = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch normalization of ``(N, C, H, W)`` input, as ``torch.nn.BatchNorm2d`` (see
    :class:`BatchNorm1d`)."""
    _dims = (4,)
    _layout = "(N, C, H, W)"
