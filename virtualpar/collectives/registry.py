"""The explicit registry of collective algorithms: ``ALGORITHMS[collective][name]``."""

from __future__ import annotations

from typing import Callable

from virtualpar.collectives import direct, ring, shm, shm_all_to_all, shm_copy, shm_reduce_scatter, tree

__all__ = ["ALGORITHMS", "DEFAULT_ALGORITHMS", "FENCE_FIRST"]

ALGORITHMS: dict[str, dict[str, Callable[..., object]]] = {
    "all_reduce": {"ring": ring.all_reduce, "tree": tree.all_reduce, "direct": direct.all_reduce,
                   "shm": shm.all_reduce},
    "all_gather": {"ring": ring.all_gather, "direct": direct.all_gather, "shm": shm_copy.all_gather},
    "reduce_scatter": {"ring": ring.reduce_scatter, "shm": shm_reduce_scatter.reduce_scatter},
    "broadcast": {"tree": tree.broadcast, "shm": shm_copy.broadcast},
    "reduce": {"tree": tree.reduce},
    "gather": {"direct": direct.gather},
    "scatter": {"direct": direct.scatter},
    "all_to_all": {"direct": direct.all_to_all, "shm": shm_all_to_all.all_to_all},
    "barrier": {"direct": direct.barrier, "shm": shm.barrier},
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

#: Algorithms whose first dependency on the peers is a ``fence()`` (before it a member at most writes
#: its own scratch): the runtime's contract check rides on that fence instead of a fence of its own.
FENCE_FIRST: frozenset[tuple[str, str]] = frozenset({
    ("all_reduce", "shm"), ("all_gather", "shm"), ("broadcast", "shm"), ("reduce_scatter", "shm"),
    ("all_to_all", "shm"), ("barrier", "shm")})
