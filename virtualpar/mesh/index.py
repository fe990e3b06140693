"""``MeshIndex``: the named coordinates of one rank of a :class:`~virtualpar.mesh.Mesh`.

Frozen and value-like: ``idx.dp``, ``idx["tp"]``, ``tuple(idx)``, prints ``(dp=1, tp=2)``, and
compares equal (and hashes equal) to the plain tuple of its coordinates, like a namedtuple.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any

from virtualpar.errors import MeshError, UnknownAxisError

__all__ = ["MeshIndex"]

# MeshIndex exposes coordinates as attributes, so an axis may not shadow its own API.
RESERVED_NAMES = frozenset({"as_dict", "axis_names"})


def as_int(value: Any, what: str) -> int:
    """``operator.index(value)`` (so numpy ints pass), refusing bools; the error names ``what``."""
    if isinstance(value, bool):
        raise MeshError(f"{what} must be an integer; got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise MeshError(f"{what} must be an integer; got {value!r}") from None


class MeshIndex:
    """The named coordinates of one rank: ``idx.dp``, ``idx["tp"]``, ``tuple(idx)``; prints ``(dp=1, tp=2)``.

    Like a namedtuple it also compares equal to the plain tuple of its coordinates.
    """

    __slots__ = ("_names", "_coords")

    def __init__(self, axis_names: Sequence[str], coords: Sequence[int]) -> None:
        names, values = tuple(axis_names), tuple(as_int(c, "a mesh coordinate") for c in coords)
        if len(names) != len(values):
            raise MeshError(f"MeshIndex needs one coordinate per axis: axes {names}, coordinates {values}")
        object.__setattr__(self, "_names", names)
        object.__setattr__(self, "_coords", values)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"MeshIndex is immutable; cannot set {key!r}")

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self._names

    def __getattr__(self, name: str) -> int:
        if not name.startswith("_"):
            try:
                return self._coords[self._names.index(name)]
            except ValueError:
                pass
        raise UnknownAxisError(f"unknown mesh axis {name!r}; this index has axes {self._names}")

    def __getitem__(self, key: str | int) -> int:
        if isinstance(key, str):
            if key not in self._names:
                raise MeshError(f"unknown mesh axis {key!r}; this index has axes {self._names}")
            return self._coords[self._names.index(key)]
        return self._coords[key]

    def __iter__(self) -> Iterator[int]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self._names, self._coords))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MeshIndex):
            return self._names == other._names and self._coords == other._coords
        if isinstance(other, tuple):
            return self._coords == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._coords)  # equal to hash(tuple) so that idx == tuple stays consistent

    def __reduce__(self):
        return (MeshIndex, (self._names, self._coords))

    def __str__(self) -> str:
        return "(" + ", ".join(f"{n}={c}" for n, c in zip(self._names, self._coords)) + ")"

    __repr__ = __str__
