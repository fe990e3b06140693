"""Pieces of a tensor: where a shard's array lies in the full tensor, and putting the full one back.

A piece is a box of the full tensor: ``offset`` (its first index along every dim) and its array's
shape.  A tensor sharded along one axis over ``p`` devices (tensor parallelism's ``S(dim)``, a
ZeRO shard of a flattened parameter) is ``p`` pieces whose offsets differ along ``dim`` only;
a whole tensor is one piece at offset 0.  :func:`assemble` fills the full tensor from its pieces
and refuses boxes that leave a hole, overlap, or stick out — one pass over the pieces plus a
coverage mask of the tensor's size (bytes: ``numel``), so its cost is one copy of the tensor.
:func:`cut` is the inverse for a target layout: the box of every shard, along one axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..errors import VirtualParError

__all__ = ["Piece", "TileError", "assemble", "cut", "piece_along"]


class TileError(VirtualParError, ValueError):
    """Pieces that do not make up their tensor: a hole, an overlap, a box outside it, a wrong dtype."""


@dataclass(frozen=True)
class Piece:
    """``array`` placed at ``offset`` in a full tensor of ``shape`` (None: the array is the whole tensor)."""

    array: np.ndarray
    offset: tuple[int, ...] | None = None
    shape: tuple[int, ...] | None = None

    @property
    def full_shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in (self.shape if self.shape is not None else np.shape(self.array)))

    @property
    def start(self) -> tuple[int, ...]:
        return tuple(int(o) for o in self.offset) if self.offset is not None else (0,) * np.ndim(self.array)

    def box(self) -> list[list[int]]:
        """``[[start, stop], ...]`` per dim: how the index records it."""
        return [[s, s + n] for s, n in zip(self.start, np.shape(self.array))]


def piece_along(array: np.ndarray, axis: int, start: int, full: int) -> Piece:
    """``array`` as the slice ``[start, start + len)`` along ``axis`` of a tensor ``full`` long there."""
    array = np.asarray(array)
    shape = list(array.shape)
    shape[axis] = int(full)
    offset = [0] * array.ndim
    offset[axis] = int(start)
    return Piece(array, tuple(offset), tuple(shape))


def cut(shape: Sequence[int], axis: int, parts: int) -> list[tuple[slice, ...]]:
    """The index of each of ``parts`` equal slices along ``axis`` of a tensor of ``shape`` (a target layout's
    shards); refuses a length that does not divide, as an even sharding would."""
    n = int(shape[axis])
    if parts < 1 or n % parts:
        raise TileError(f"cannot cut dim {axis} of shape {tuple(shape)} into {parts} equal slices: {n} is "
                        f"not divisible by {parts}")
    step = n // parts
    return [tuple(slice(i * step, (i + 1) * step) if d == axis else slice(None) for d in range(len(shape)))
            for i in range(parts)]


def assemble(key: str, shape: Sequence[int], dtype: np.dtype | str,
             pieces: Iterable[tuple[Sequence[Sequence[int]], np.ndarray]]) -> np.ndarray:
    """The full tensor ``key`` of ``shape`` and ``dtype`` from ``(box, array)`` pieces, ``box`` being
    ``[[start, stop], ...]`` per dim.  Every element must be covered exactly once."""
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    out = np.empty(shape, dtype)
    covered = np.zeros(shape, bool)
    for box, array in pieces:
        box = [tuple(int(v) for v in b) for b in box]
        if len(box) != len(shape) or any(not 0 <= a <= b <= n for (a, b), n in zip(box, shape)):
            raise TileError(f"tensor {key!r} of shape {shape}: a piece's box {box} lies outside it")
        want = tuple(b - a for a, b in box)
        if np.shape(array) != want:
            raise TileError(f"tensor {key!r}: the piece at {box} holds an array of shape {np.shape(array)}, "
                            f"its box {want}")
        if np.asarray(array).dtype != dtype:
            raise TileError(f"tensor {key!r}: the piece at {box} is {np.asarray(array).dtype}, the tensor "
                            f"{dtype}")
        index = tuple(slice(a, b) for a, b in box)
        if covered[index].any():
            raise TileError(f"tensor {key!r} of shape {shape}: the piece at {box} overlaps another piece")
        covered[index] = True
        out[index] = array
    if not covered.all():
        hole = tuple(int(i[0]) for i in np.nonzero(~covered))
        raise TileError(f"tensor {key!r} of shape {shape}: its pieces leave a hole (element {hole} is in "
                        "none)")
    return out
