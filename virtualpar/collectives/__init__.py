"""Collective algorithms over a tiny point-to-point protocol, a numpy oracle, and a threaded test comm.

``ALGORITHMS[collective][name]`` is the explicit registry the runtime dispatches through;
``get_algorithm`` rejects unknown names with the list of known ones.  ``DEFAULT_ALGORITHMS`` names the
algorithm used when the caller does not choose: the bandwidth-optimal ring for the bulk collectives,
binomial trees for the rooted ones.
"""

from __future__ import annotations

from typing import Callable

from virtualpar.collectives import direct, reference, ring, tree
from virtualpar.collectives.comm import Comm, Request, sendrecv
from virtualpar.collectives.ops import REDUCE_OPS, ReduceOp, check_op, combine, finalize
from virtualpar.collectives.threaded import ThreadComm, ThreadWorld, run_threaded
from virtualpar.errors import UsageError

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHMS",
    "get_algorithm",
    "Comm",
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
    "tree",
]

ALGORITHMS: dict[str, dict[str, Callable[..., object]]] = {
    "all_reduce": {"ring": ring.all_reduce, "tree": tree.all_reduce, "direct": direct.all_reduce},
    "all_gather": {"ring": ring.all_gather, "direct": direct.all_gather},
    "reduce_scatter": {"ring": ring.reduce_scatter},
    "broadcast": {"tree": tree.broadcast},
    "reduce": {"tree": tree.reduce},
    "gather": {"direct": direct.gather},
    "scatter": {"direct": direct.scatter},
    "all_to_all": {"direct": direct.all_to_all},
    "barrier": {"direct": direct.barrier},
}

DEFAULT_ALGORITHMS: dict[str, str] = {
    "all_reduce": "ring",
    "all_gather": "ring",
    "reduce_scatter": "ring",
    "broadcast": "tree",
    "reduce": "tree",
    "gather": "direct",
    "scatter": "direct",
    "all_to_all": "direct",
    "barrier": "direct",
}


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
