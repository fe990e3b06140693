"""Device functions that child processes must import by name (start methods "spawn"/"forkserver").

A function sent to a device is pickled by reference (module + qualified name); a spawned child
starts a fresh interpreter and imports that module, so these live in a small importable module
rather than in a test file.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np


def rank_all_reduce(dev: Any, algorithm: str) -> tuple[int, int, np.ndarray]:
    """(rank, pid, all_reduce over every device of [rank, rank + 1, ..., rank + 4])."""
    x = np.arange(5, dtype=np.int64) + dev.rank
    return dev.rank, os.getpid(), dev.all_reduce(x, algorithm=algorithm)


def ring_pass(dev: Any) -> int:
    """Pass a token around the ring; returns what this device received."""
    n, r = dev.size, dev.rank
    if n == 1:
        return r
    dev.send(r * 10, (r + 1) % n)
    return dev.recv((r - 1) % n)
