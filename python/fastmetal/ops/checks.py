"""Argument checks shared by the layers and the optimizers: each error names the caller and
the argument, what was expected and what was given."""
from __future__ import annotations

import numbers

import numpy as np


def positive_int(value, name, cls):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be a positive int, "
                        f"got {value!r}")
    if value < 1:
        raise ValueError(f"[fastmetal.nn.{cls}] expected {name} to be a positive int, "
                         f"got {value!r}")
    return int(value)


def check_bool(value, name, cls):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"[fastmetal.nn.{cls}] expected {name} to be True or False, "
                        f"got {value!r}")


def real_number(value, name, where):
    """``value`` as a float; a TypeError naming ``fastmetal.<where>`` and the argument if it
    is not a real number (bools are not)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"[fastmetal.{where}] expected {name} to be a number, got {value!r}")
    return float(value)
