"""The rounds of the shared-memory algorithms in which member r reads piece r of every member's array.

The reduce_scatter and the all_to_all move the same bytes: member j's array is cut into n pieces
(items ``[e[c], e[c+1])`` of its flattened layout), member r needs piece r of every member's, and
what differs is only what it does with the n terms (add them, or keep them side by side).  Each
round copies up to ``scratch_bytes`` of the array into the member's own scratch — all but its own
piece, which it reads in place, or everything in large evenly spaced groups, whose scratch is one
strided (n, k) view (``SharedComm.scratch_rows``) read in one numpy call — then fences, hands the
caller the terms of this round's part of piece r, and fences again so that nobody refills a
scratch before its last reader is done (the first fence is where the runtime's contract check
rides, ``registry.FENCE_FIRST``).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from virtualpar.collectives import shm
from virtualpar.collectives.comm import SharedComm
from virtualpar.errors import UsageError

__all__ = ["piece_rounds", "round_count"]


def round_count(comm: SharedComm, source: np.ndarray) -> int:
    """Rounds :func:`piece_rounds` takes for ``source``: one per ``scratch_bytes``, at least one."""
    return max(1, -(-source.size // max(comm.scratch_bytes // source.dtype.itemsize, 1)))


def piece_rounds(comm: SharedComm, source: np.ndarray, e: list[int], name: str,
                 other: str) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(a, b, terms)`` once per round in which this member's piece has items: items [a, b)
    of piece r (counted from its start) and every member's terms for them in rank order — an
    (n, b − a) strided view, or a list of n arrays.  ``name`` and ``other`` (the message
    algorithm) name the collective in the error for a scratch smaller than one item."""
    n, r = comm.size, comm.rank
    itemsize = source.dtype.itemsize
    capacity = comm.scratch_bytes // itemsize
    if capacity < 1:
        raise UsageError(
            f"{name} algorithm 'shm' needs scratch memory of at least one {source.dtype} element per device, "
            f"but the cluster has scratch_bytes={comm.scratch_bytes}; start it with a larger scratch_bytes "
            f"or choose algorithm='{other}'")
    table = comm.scratch_rows() if n >= shm.STRIDED_MIN_MEMBERS else None
    if table is not None:
        rows: Any = table[:, : capacity * itemsize].view(source.dtype)
    else:
        rows = [comm.scratch(j)[: capacity * itemsize].view(source.dtype) for j in range(n)]
    mine, total = rows[r], source.size
    for start in range(0, max(total, 1), capacity):  # an empty array still takes one (empty) round
        m = min(capacity, total - start)
        chunk = source[start : start + m]
        lo, hi = min(max(e[r] - start, 0), m), min(max(e[r + 1] - start, 0), m)  # our piece, in this chunk
        if table is not None:
            mine[:m] = chunk  # our own piece too: one strided read takes every row
        else:
            mine[:lo] = chunk[:lo]
            mine[hi:m] = chunk[hi:]
        comm.fence()  # every member's chunk is in its scratch
        if hi > lo:
            terms = rows[:, lo:hi] if table is not None else [chunk[lo:hi] if j == r else rows[j][lo:hi] for j in range(n)]
            yield start + lo - e[r], start + hi - e[r], terms
        comm.fence()  # nobody reads our scratch any more: it may be reused
