"""``raises_within``: pytest.raises plus an upper bound on how long the error took to arrive."""

from __future__ import annotations

import time
from contextlib import contextmanager

import pytest


@contextmanager
def raises_within(exc_type: type, bound: float = 10.0):
    """``pytest.raises`` that also checks the error arrived within ``bound`` seconds."""
    t0 = time.monotonic()
    with pytest.raises(exc_type) as info:
        yield info
    elapsed = time.monotonic() - t0
    assert elapsed < bound, f"{exc_type.__name__} took {elapsed:.2f} s (bound {bound} s)"
