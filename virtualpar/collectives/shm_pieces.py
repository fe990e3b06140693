"""The rounds of the shared-memory algorithms in which member r reads piece r of every member's array.

The reduce_scatter and the all_to_all move the same bytes: member j's array is cut into n pieces
(items ``[e[c], e[c+1])`` of its flattened layout), member r needs piece r of every member's, and
what differs is only what it does with the n terms (add them, or keep them side by side).  Each
round copies into the member's own scratch the next ``q = scratch items // n`` items of every
piece — all but its own piece, which it reads in place, or everything in large evenly spaced
groups, whose scratch is one strided (n, k) view (``SharedComm.scratch_rows``) read in one numpy
call — then fences, hands the caller the terms of this round's part of piece r, and fences again
so that nobody refills a scratch before its last reader is done (the first fence is where the
runtime's contract check rides, ``registry.FENCE_FIRST``).

Every round carries part of *every* piece, so every member has work in every round.  Cutting the
flattened array into consecutive chunks instead left one member working per round once the array
was n times the scratch, the other n−1 waiting at the fence: at 8 devices a 32 MiB reduce_scatter
took longer than the all_reduce of the same array.  When the whole array fits (one round), the
pieces sit in the scratch as they sit in the array, and the copy in is one copy (two in the
member-by-member path, around our own piece).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from virtualpar.collectives import shm
from virtualpar.collectives.comm import SharedComm
from virtualpar.errors import UsageError

__all__ = ["piece_rounds", "round_count"]


def round_count(comm: SharedComm, e: list[int], itemsize: int) -> int:
    """Rounds :func:`piece_rounds` takes: ``ceil(longest piece / q)``, at least one."""
    longest = max(e[c + 1] - e[c] for c in range(len(e) - 1))
    q = comm.scratch_bytes // itemsize // comm.size
    return max(1, -(-longest // q)) if longest and q else 1


def piece_rounds(comm: SharedComm, source: np.ndarray, e: list[int], name: str,
                 other: str) -> Iterator[tuple[int, int, Any]]:
    """Yield ``(a, b, terms)`` once per round in which this member's piece has items: items [a, b)
    of piece r (counted from its start) and every member's terms for them in rank order — an
    (n, b − a) strided view, or a list of n arrays.  ``name`` and ``other`` (the message
    algorithm) name the collective in the error for a scratch smaller than one item per member."""
    n, r = comm.size, comm.rank
    itemsize = source.dtype.itemsize
    q = comm.scratch_bytes // itemsize // n  # items of each piece per round
    if q < 1 and source.size:
        raise UsageError(
            f"{name} algorithm 'shm' needs scratch memory of at least one {source.dtype} element per member "
            f"({n} here) per device, but the cluster has scratch_bytes={comm.scratch_bytes}; start it with a "
            f"larger scratch_bytes or choose algorithm='{other}'")
    width = n * q * itemsize
    table = comm.scratch_rows() if n >= shm.STRIDED_MIN_MEMBERS else None
    if table is not None:
        rows: Any = table[:, :width].view(source.dtype)
    else:
        rows = [comm.scratch(j)[:width].view(source.dtype) for j in range(n)]
    mine, lengths = rows[r], [e[c + 1] - e[c] for c in range(n)]
    rounds = round_count(comm, e, itemsize)
    for k in range(rounds):
        a = k * q
        seg = lengths if rounds == 1 else [min(max(length - a, 0), q) for length in lengths]
        off = e if rounds == 1 else np.concatenate([[0], np.cumsum(seg)]).tolist()
        if rounds == 1 and table is not None:
            mine[: e[n]] = source  # our own piece too: one strided read takes every row
        elif rounds == 1:
            mine[: e[r]] = source[: e[r]]
            mine[e[r + 1] : e[n]] = source[e[r + 1] :]
        else:
            for c in range(n):
                if seg[c] and (c != r or table is not None):
                    mine[off[c] : off[c] + seg[c]] = source[e[c] + a : e[c] + a + seg[c]]
        comm.fence()  # every member's part of every piece is in its scratch
        if seg[r]:
            lo, hi = off[r], off[r] + seg[r]
            if table is not None:
                terms = rows[:, lo:hi]
            else:
                terms = [source[e[r] + a : e[r] + a + seg[r]] if j == r else rows[j][lo:hi] for j in range(n)]
            yield a, a + seg[r], terms
        comm.fence()  # nobody reads our scratch any more: it may be reused
