"""Collective algorithms over a tiny point-to-point protocol, a numpy oracle, and a threaded test comm.

``ALGORITHMS[collective][name]`` is the explicit registry the runtime dispatches through;
``get_algorithm`` rejects unknown names with the list of known ones.  ``DEFAULT_ALGORITHMS`` names the
algorithm for any message-passing ``Comm``: the bandwidth-optimal ring for the bulk collectives,
binomial trees for the rooted ones; ``default_algorithm`` refines it by size and by whether the
members share memory (what the runtime uses when the caller does not choose): then the all_reduce
(``shm``), the all_gather and the broadcast (``shm_copy``) and the barrier go through shared memory.
"""

from __future__ import annotations

from typing import Callable

from virtualpar.collectives import direct, reference, ring, shm, shm_copy, tree
from virtualpar.collectives.comm import Comm, Request, SharedComm, sendrecv
from virtualpar.collectives.registry import ALGORITHMS, DEFAULT_ALGORITHMS, FENCE_FIRST
from virtualpar.collectives.selection import default_algorithm
from virtualpar.collectives.ops import REDUCE_OPS, ReduceOp, check_op, combine, finalize
from virtualpar.collectives.threaded import ThreadComm, ThreadWorld, run_threaded
from virtualpar.errors import UsageError

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHMS",
    "FENCE_FIRST",
    "get_algorithm",
    "default_algorithm",
    "Comm",
    "SharedComm",
    "Request",
    "sendrecv",
    "REDUCE_OPS",
    "ReduceOp",
    "check_op",
    "combine",
    "finalize",
    "ThreadComm",
    "ThreadWorld",
    "run_threaded",
    "direct",
    "reference",
    "ring",
    "shm",
    "shm_copy",
    "tree",
]

def get_algorithm(collective: str, name: str | None = None) -> Callable[..., object]:
    """Look up ``ALGORITHMS[collective][name]`` (``name=None``: the default); UsageError if unknown."""
    try:
        table = ALGORITHMS[collective]
    except (KeyError, TypeError):
        raise UsageError(
            f"unknown collective {collective!r}: expected one of {sorted(ALGORITHMS)}",
            op=collective,
        ) from None
    chosen = DEFAULT_ALGORITHMS[collective] if name is None else name
    try:
        return table[chosen]
    except (KeyError, TypeError):
        raise UsageError(
            f"unknown algorithm {chosen!r} for {collective}: expected one of {sorted(table)}",
            op=collective,
        ) from None
