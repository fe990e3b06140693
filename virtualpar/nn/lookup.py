"""Lookups by integer index that keep the indices, not the values, for the backward.

autograd differentiates ``x[rows, cols]`` by keeping ``x`` itself (its indexing vjp reads the
array's shape from it): for the target logit of a cross-entropy that is every logit, b·s·V values,
kept only to learn a shape.  These primitives keep the index and the shape:

- ``pick(x, cols)``: ``x[i, cols[i]]`` for every leading index ``i`` of ``x`` (the last axis is
  picked from); backward scatters ``dy`` into zeros of ``x``'s shape.
- ``rows_of(w, ids)``: ``w[ids]`` (an embedding lookup); backward adds each ``dy`` row into row
  ``ids`` of zeros of ``w``'s shape.

An index of −1 selects nothing: ``pick`` gives 0 there and ``rows_of`` a zero row, and neither
sends gradient back — a vocabulary-parallel embedding or loss marks with −1 the ids another tp
rank owns (Megatron's ``target_mask``, held as the index itself).  Cost: O(rows) forward, and a
zero array of ``x``'s shape plus O(rows) in the backward, as autograd's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from autograd.extend import defvjp, primitive

__all__ = ["pick", "rows_of"]


@primitive
def pick(x: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``x[..., cols]`` element by element: ``out[i] = x[i, cols[i]]`` over the leading index ``i``
    (``cols`` has ``x``'s shape without its last axis; 0 where ``cols[i] == −1``)."""
    flat, index = np.reshape(x, (-1, np.shape(x)[-1])), np.reshape(cols, -1)
    mine = index >= 0
    out = np.where(mine, flat[np.arange(index.size), np.where(mine, index, 0)], 0)
    return out.astype(x.dtype, copy=False).reshape(np.shape(cols))


def _pick_vjp(ans: Any, x: np.ndarray, cols: np.ndarray) -> Any:
    shape, dtype = np.shape(x), x.dtype
    index = np.reshape(cols, -1)
    rows = np.flatnonzero(index >= 0)
    at = index[rows]

    def vjp(g: np.ndarray) -> np.ndarray:
        out = np.zeros((index.size, shape[-1]), dtype)
        out[rows, at] = np.reshape(g, -1)[rows]
        return out.reshape(shape)
    return vjp


defvjp(pick, _pick_vjp)


@primitive
def rows_of(w: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``w[ids]`` (a zero row where ``ids == −1``)."""
    out = w[np.where(ids >= 0, ids, 0)]
    out[ids < 0] = 0
    return out


def _rows_vjp(ans: Any, w: np.ndarray, ids: np.ndarray) -> Any:
    shape, dtype = np.shape(w), w.dtype
    flat = np.reshape(ids, -1)
    rows = np.flatnonzero(flat >= 0)  # ints, not a boolean mask: the ledger counts masks as activations
    at = flat[rows]

    def vjp(g: np.ndarray) -> np.ndarray:
        out = np.zeros(shape, dtype)
        np.add.at(out, at, np.reshape(g, (flat.size, -1))[rows])
        return out
    return vjp


defvjp(rows_of, _rows_vjp)
