"""Sharding specs: which mesh axes split each dimension of a tensor, and a pending reduction.

``DimSharding(("tp",))`` prints ``S(tp)`` (dim split over axis tp; ``S(dp,tp)`` over both, dp
major); ``DimSharding()`` prints ``R`` (replicated).  ``TensorSharding`` holds one per dim plus an
optional pending reduction: ``[R, S(tp)] P(sum)`` is a tensor whose devices hold *partial sums*
still to be added over the mesh axes that shard no dim; ``P(sum:dp)`` names the axes when only
some of them carry partial values (the others then hold copies).  ``TensorSharding.parse(str(spec)) ==
spec`` exactly.

A device's piece of dim d is the block at its position within the group of d's axes (the order
in which ``all_gather`` concatenates).  Sizes must divide evenly unless ``uneven="array_split"``,
which splits like ``numpy.array_split`` (the first ``size % n`` blocks one longer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ShardingError
from .spec_text import PARTIAL_OPS as _PARTIAL_OPS, read_dim, read_tensor

__all__ = ["DimSharding", "TensorSharding", "bounds"]


@dataclass(frozen=True)
class DimSharding:
    """How one dim is split: over the mesh ``axes`` (major first, in the mesh's order; prints ``S(dp,tp)``),
    or replicated when ``axes`` is empty (prints ``R``)."""

    axes: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "S(" + ",".join(self.axes) + ")" if self.axes else "R"

    @classmethod
    def parse(cls, text: str) -> "DimSharding":
        """``"R"`` or ``"S(dp,tp)"`` (spaces allowed around names); anything else is a ``ShardingError``
        giving the column of the first character that does not fit."""
        return parse_dim(text)


@dataclass(frozen=True)
class TensorSharding:
    """A tensor's sharding: one ``DimSharding`` per dim in ``dims``, and an optional pending reduction
    ``partial`` (``"sum"``, ``"max"``, ...) still to run over ``partial_over`` (empty: every mesh axis no dim
    uses); prints ``[R, S(tp)] P(sum)`` and ``parse`` reads that back."""

    dims: tuple[DimSharding, ...]
    partial: str | None = None  # a pending reduction op ("sum", "max", ...)
    partial_over: tuple[str, ...] = ()  # the axes it runs over; () = every axis no dim uses

    def __post_init__(self) -> None:
        if self.partial is not None and self.partial not in _PARTIAL_OPS:
            raise ShardingError(f"unknown pending reduction P({self.partial}); expected one "
                                f"of {sorted(_PARTIAL_OPS)}",
                                partial=self.partial)

    def __str__(self) -> str:
        over = ":" + ",".join(self.partial_over) if self.partial_over else ""
        pending = f" P({self.partial}{over})" if self.partial else ""
        return "[" + ", ".join(map(str, self.dims)) + "]" + pending

    @classmethod
    def parse(cls, text: str) -> "TensorSharding":
        """The exact inverse of ``str``: ``"[S(tp), R] P(sum)"``, ``"[R,S(x, y)]"``, ``"[R] P(sum:dp)"``.
        Malformed text (``[S(x) R]``, ``[R,, R]``, ``S(tp), R``) is a ``ShardingError`` that gives the
        column (0-based) of the first character that does not fit and what was expected there."""
        return parse_tensor(text)

    @classmethod
    def from_axes(cls, axes: Sequence[Sequence[str]], partial: str | None = None) -> "TensorSharding":
        """``(("x",), ())`` -> ``[S(x), R]``: one tuple of mesh axes per dim (``()`` replicated)."""
        return cls(tuple(DimSharding(tuple(a)) for a in axes), partial)

    @property
    def axes(self) -> tuple[tuple[str, ...], ...]:
        """The mesh axes of every dim, ``[S(x), R]`` -> ``(("x",), ())`` (not the pending reduction's)."""
        return tuple(d.axes for d in self.dims)

    @classmethod
    def of(cls, *dims: str | Sequence[str] | None, partial: str | None = None) -> "TensorSharding":
        """``TensorSharding.of("tp", None)`` or ``.of(("dp", "tp"), "R")``: one entry per dim."""
        out = []
        for d in dims:
            if d is None or d == "R":
                out.append(DimSharding())
            elif isinstance(d, str):
                out.append(DimSharding.parse(d) if d.startswith("S(") else DimSharding((d,)))
            else:
                out.append(DimSharding(tuple(d)))
        return cls(tuple(out), partial)

    @classmethod
    def replicated(cls, ndim: int) -> "TensorSharding":
        return cls(tuple(DimSharding() for _ in range(ndim)))

    # -- on a mesh ----------------------------------------------------------------------------------
    def used_axes(self) -> tuple[str, ...]:
        return tuple(a for d in self.dims for a in d.axes)

    def partial_axes(self, mesh: Any) -> tuple[str, ...]:
        """The axes a pending reduction runs over: ``partial_over``, or every mesh axis no dim uses."""
        if self.partial_over:
            self.check_axes(mesh)
            return tuple(a for a in mesh.axis_names if a in self.partial_over)
        used = set(self.used_axes())
        return tuple(a for a in mesh.axis_names if a not in used)

    def check_axes(self, mesh: Any, name: str = "tensor") -> None:
        """Raise ``ShardingError`` unless every axis this spec names — of a dim or of its pending
        reduction ``P(op:axes)`` — is an axis of ``mesh``, and a reduction names none twice."""
        names = list(mesh.axis_names)
        for where, axes in [(f"dim {d}", dim.axes) for d, dim in enumerate(self.dims)] + \
                [(f"its pending reduction P({self.partial})", self.partial_over)]:
            for a in axes:
                if a not in names:
                    if name == "tensor":
                        said = f"spec {self} names mesh axis {a!r}, but the mesh's axes are {names} " \
                            f"(in {where})"
                    else:  # a named tensor: its name first, then the dim
                        said = f"{self}: {where} names mesh axis {a!r}; the mesh {mesh} has axes " \
                            f"{tuple(names)}"
                    raise ShardingError(f"{name}: {said}", spec=str(self), axis=a)
        if len(set(self.partial_over)) != len(self.partial_over):
            raise ShardingError(f"{name}: spec {self} names an axis of its pending reduction twice",
                                spec=str(self))

    def check(self, shape: Sequence[int], mesh: Any, uneven: str = "error", name: str = "tensor") -> None:
        """Raise ``ShardingError`` unless this spec fits ``shape`` on ``mesh``: as many dims as the
        shape, every axis (pending reduction included) a mesh axis used once, axes of one dim in
        the mesh's order, sizes divisible (unless ``uneven="array_split"``)."""
        if uneven not in ("error", "array_split"):
            raise ShardingError(f"uneven must be 'error' or 'array_split', got {uneven!r}")
        if len(self.dims) != len(shape):
            raise ShardingError(f"{name}: spec {self} has {len(self.dims)} dims but the "
                                f"shape {tuple(shape)} has "
                                f"{len(shape)}", spec=str(self), shape=tuple(shape))
        self.check_axes(mesh, name)
        seen: dict[str, int] = {}
        for d, dim in enumerate(self.dims):
            for a in dim.axes:
                if a in seen:
                    raise ShardingError(f"{name}: spec {self} uses mesh axis {a!r} twice "
                                        f"(dims {seen[a]} and {d}); "
                                        "an axis can split one dim only", spec=str(self), axis=a)
                seen[a] = d
            if list(dim.axes) != [a for a in mesh.axis_names if a in dim.axes]:  # S(y,x) placed as S(x,y)
                ordered = ",".join(a for a in mesh.axis_names if a in dim.axes)
                raise ShardingError(f"{name}: spec {self} lists the axes of dim {d} as "
                                    f"({','.join(dim.axes)}); several "
                                    "axes of one dim go major first in the mesh's order "
                                    f"{list(mesh.axis_names)}: "
                                    f"write S({ordered})", spec=str(self))
            n = self.group_size(dim, mesh)
            if set(dim.axes) & set(self.partial_over):
                raise ShardingError(f"{name}: spec {self} reduces over an axis that also shards dim {d}",
                                    spec=str(self))
            if uneven == "error" and shape[d] % n:
                axes = ",".join(dim.axes)
                what = f"of shape {tuple(shape)} over mesh axis '{axes}'" if name == "tensor" else \
                    f"of {name}, shape {tuple(shape)}, over mesh axes {dim.axes}"  # a named tensor: say which
                raise ShardingError(f"cannot shard dim {d} {what} (size {n}): {shape[d]} is not divisible "
                                    f"by {n}", dim=d, shape=tuple(shape), axis=axes, size=n)

    @staticmethod
    def group_size(dim: DimSharding, mesh: Any) -> int:
        return math.prod(mesh.shape[a] for a in dim.axes) if dim.axes else 1

    def block(self, shape: Sequence[int], mesh: Any, rank: int) -> tuple[slice, ...]:
        """The slice of the global array that device ``rank`` holds."""
        out = []
        for d, dim in enumerate(self.dims):
            if not dim.axes:
                out.append(slice(None))
                continue
            group = mesh.group_of(rank, mesh.axes(dim.axes))
            b = bounds(shape[d], len(group))
            i = group.index(rank)
            out.append(slice(b[i], b[i + 1]))
        return tuple(out)

    def local_shape(self, shape: Sequence[int], mesh: Any, rank: int = 0) -> tuple[int, ...]:
        return tuple(len(range(*s.indices(n))) for s, n in zip(self.block(shape, mesh, rank), shape))


def bounds(m: int, n: int) -> list[int]:
    """Block boundaries of ``numpy.array_split`` of ``m`` items into ``n`` parts."""
    q, r = divmod(m, n)
    return [i * q + min(i, r) for i in range(n + 1)]


def parse_dim(text: str) -> DimSharding:
    """``"R"`` or ``"S(a,b)"`` (see :meth:`DimSharding.parse`)."""
    return DimSharding(read_dim(text))


def parse_tensor(text: str) -> TensorSharding:
    """``"[dim, dim, ...] P(op:axes)"`` (see :meth:`TensorSharding.parse`); ``"[]"`` is a 0-d tensor."""
    dims, partial, over = read_tensor(text)
    return TensorSharding(tuple(DimSharding(axes) for axes in dims), partial, over)
