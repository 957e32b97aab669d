"""Shared fixtures and references for fastmetal's tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def rng(request):
    # A different, reproducible stream per test.
    return np.random.default_rng(abs(hash(request.node.nodeid)) % (2**32))
