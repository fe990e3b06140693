"""Single-process numpy oracle for every collective: the expected output of each group member.

Each function takes ``xs``, the list of every member's input (``xs[i]`` for group position i), and
returns the list of every member's expected output (None where a member gets nothing).  Written as
plainly as possible — ``np.stack`` then one numpy reduction, ``np.concatenate``, ``np.array_split`` —
so that it shares no logic with the ring/tree/direct algorithms it checks.  Only the op-name
validation (``check_op``) is shared, so that bad arguments raise the same ``UsageError``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from virtualpar.collectives.ops import check_op

__all__ = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "all_to_all",
]

_NUMPY_REDUCTIONS = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "avg": np.mean}


def _reduced(xs: Sequence[np.ndarray], op: str) -> np.ndarray:
    """``xs[0] ⊕ … ⊕ xs[n−1]`` by one numpy reduction over a stacked axis, in the inputs' dtype."""
    dtype = np.asarray(xs[0]).dtype
    check_op(op, dtype)
    stacked = np.stack([np.asarray(x) for x in xs])
    # np.sum/np.prod widen small ints; casting back wraps exactly as in-dtype arithmetic would.
    return np.asarray(_NUMPY_REDUCTIONS[op](stacked, axis=0)).astype(dtype)


def all_reduce(xs: Sequence[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """Every member gets the elementwise reduction of all inputs."""
    result = _reduced(xs, op)
    return [result.copy() for _ in xs]


def all_gather(xs: Sequence[np.ndarray], dim: int = 0) -> list[np.ndarray]:
    """Every member gets all inputs concatenated along ``dim`` in rank order."""
    result = np.concatenate(xs, axis=dim)
    return [result.copy() for _ in xs]


def reduce_scatter(xs: Sequence[np.ndarray], dim: int = 0, op: str = "sum") -> list[np.ndarray]:
    """Member i gets piece i of ``np.array_split(reduction, n, axis=dim)``."""
    pieces = np.array_split(_reduced(xs, op), len(xs), axis=dim)
    return [piece.copy() for piece in pieces]


def broadcast(xs: Sequence[np.ndarray | None], root: int = 0) -> list[np.ndarray]:
    """Every member gets a copy of the root's input."""
    return [np.array(xs[root], copy=True) for _ in xs]


def reduce(xs: Sequence[np.ndarray], root: int = 0, op: str = "sum") -> list[np.ndarray | None]:
    """The root gets the reduction of all inputs; everyone else gets None."""
    result = _reduced(xs, op)
    return [result if i == root else None for i in range(len(xs))]


def gather(xs: Sequence[np.ndarray], root: int = 0, dim: int = 0) -> list[np.ndarray | None]:
    """The root gets all inputs concatenated along ``dim`` in rank order; everyone else None."""
    result = np.concatenate(xs, axis=dim)
    return [result if i == root else None for i in range(len(xs))]


def scatter(xs: Sequence[np.ndarray | None], root: int = 0, dim: int = 0) -> list[np.ndarray]:
    """Member i gets piece i of ``np.array_split(xs[root], n, axis=dim)``."""
    return [piece.copy() for piece in np.array_split(xs[root], len(xs), axis=dim)]


def all_to_all(xs: Sequence[np.ndarray], split_dim: int = 0, concat_dim: int = 0) -> list[np.ndarray]:
    """Member j gets piece j of every member's split input, concatenated along ``concat_dim``."""
    n = len(xs)
    split = [np.array_split(x, n, axis=split_dim) for x in xs]
    return [np.concatenate([split[i][j] for i in range(n)], axis=concat_dim) for j in range(n)]
