"""A device mesh: named axes over a row-major grid of ranks, laid on a network topology.

``Mesh({"dp": 2, "tp": 4})`` holds 8 ranks; rank r has coordinates (dp, tp) = (r // 4, r % 4) —
row-major, the last axis varies fastest (as in torch's DeviceMesh and jax's Mesh)::

            tp=0 tp=1 tp=2 tp=3
    dp=0      0    1    2    3        groups("tp") = [(0,1,2,3), (4,5,6,7)]
    dp=1      4    5    6    7        groups("dp") = [(0,4), (1,5), (2,6), (3,7)]

A group along axes A holds the ranks that agree on every coordinate not in A; inside a group ranks
are ordered row-major over A (in mesh order), and groups are listed by their smallest rank.
Everything here is pure and immutable: a Mesh pickles to a device process and compares by value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from virtualpar.errors import MeshError
from virtualpar.mesh.index import RESERVED_NAMES, MeshIndex, as_int
from virtualpar.mesh.topology import Topology

__all__ = ["Mesh", "AxesLike"]

#: An axes argument: one axis name, several, or ``None`` for all axes of the mesh.
AxesLike = str | Sequence[str] | None

@functools.lru_cache(maxsize=64)
def _default_topology(size: int) -> Topology:
    # Topologies are immutable, so every mesh of one size can share the default.
    return Topology.fully_connected(size)


def _format_ranks(ranks: Sequence[int]) -> str:
    """(0,1,2,3); a long arithmetic run abbreviates to (0,1,...,15)."""
    r = list(ranks)
    if len(r) > 8 and all(b - a == r[1] - r[0] for a, b in zip(r, r[1:])):
        return f"({r[0]},{r[1]},...,{r[-1]})"
    return "(" + ",".join(str(x) for x in r) + ")"


class Mesh:
    """Ordered named axes over ``size`` ranks, row-major (last axis fastest), on a ``Topology``.

    ``Mesh({"dp": 2, "tp": 4})``, ``Mesh((2, 4), ("dp", "tp"))``, ``Mesh(8)`` (one axis ``"world"``);
    ``topology=`` defaults to ``Topology.fully_connected(size)`` with NVLink-class links.
    """

    __slots__ = ("_names", "_sizes", "_strides", "_topology", "_cache")

    def __init__(self, shape: int | Mapping[str, int] | Sequence[int],
                 axis_names: str | Sequence[str] | None = None, *, topology: Topology | None = None) -> None:
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        if isinstance(shape, Mapping):
            if axis_names is not None:
                raise MeshError(f"give axis names either as the keys of the shape mapping or as "
                                f"axis_names, not both; got {dict(shape)} and {tuple(axis_names)}")
            names, raw = tuple(shape.keys()), tuple(shape.values())
        else:
            if isinstance(shape, Iterable) and not isinstance(shape, (str, bytes)):
                raw = tuple(shape)
            elif isinstance(shape, int) or hasattr(shape, "__index__"):
                raw = (shape,)
            else:
                raise MeshError(f"a mesh shape is an int, a sequence of ints or a mapping "
                                f"name -> size; got {shape!r}")
            if not raw:
                raise MeshError("a mesh needs at least one axis; got an empty shape")
            if axis_names is None:
                if len(raw) != 1:
                    raise MeshError(f"a mesh of shape {raw} needs axis_names (one name per axis), "
                                    f"e.g. Mesh({raw}, {tuple('d' + str(i) for i in range(len(raw)))})")
                axis_names = ("world",)
            names = tuple(axis_names)
            if len(names) != len(raw):
                raise MeshError(f"mesh shape {raw} has {len(raw)} axes but {len(names)} axis names "
                                f"were given: {names}")
        if not names:
            raise MeshError("a mesh needs at least one axis; got an empty shape")
        for name in names:
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_") \
                    or name in RESERVED_NAMES:
                raise MeshError(f"mesh axis names must be non-empty identifiers not starting with '_' "
                                f"and not in {sorted(RESERVED_NAMES)}; got {name!r} in {names}")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise MeshError(f"duplicate mesh axis name {dupes[0]!r} in {names}")
        sizes = tuple(as_int(s, f"the size of mesh axis {n!r}") for n, s in zip(names, raw))
        for n, s in zip(names, sizes):
            if s < 1:
                raise MeshError(f"mesh axis {n!r} has size {s}; axis sizes must be positive integers")
        size = math.prod(sizes)
        if topology is None:
            pass  # built lazily by .topology: a large mesh used only for its index math costs nothing
        elif not isinstance(topology, Topology):
            raise MeshError(f"topology must be a Topology; got {type(topology).__name__}")
        elif topology.num_devices != size:
            raise MeshError(f"mesh shape {_shape_str(names, sizes)} holds {size} devices, but its "
                            f"topology {topology.name} has {topology.num_devices}")
        strides = tuple(math.prod(sizes[i + 1:]) for i in range(len(sizes)))
        for key, value in (("_names", names), ("_sizes", sizes), ("_strides", strides),
                           ("_topology", topology), ("_cache", {})):
            object.__setattr__(self, key, value)

    @classmethod
    def for_devices(cls, n: int, shape: int | Mapping[str, int] | Sequence[int],
                    axis_names: str | Sequence[str] | None = None, *,
                    topology: Topology | None = None) -> Mesh:
        """Build a mesh and check that it holds exactly ``n`` devices."""
        mesh = cls(shape, axis_names, topology=topology)
        mesh.check_devices(n)
        return mesh

    def check_devices(self, n: int) -> None:
        """Raise MeshError unless this mesh holds exactly ``n`` devices."""
        n = as_int(n, "a device count")
        if n != self.size:
            raise MeshError(f"mesh shape {self} holds {self.size} devices, but {n} "
                            f"{'was' if n == 1 else 'were'} asked for")

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Mesh is immutable; cannot set {key!r}")

    # -- shape ---------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return math.prod(self._sizes)

    @property
    def shape(self) -> Mapping[str, int]:
        """Read-only ordered mapping axis name -> size."""
        return MappingProxyType(dict(zip(self._names, self._sizes)))

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def axis_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def ndim(self) -> int:
        return len(self._names)

    @property
    def topology(self) -> Topology:
        """The network; ``Topology.fully_connected(size)`` (NVLink-class) unless one was given."""
        return _default_topology(self.size) if self._topology is None else self._topology

    def axis_size(self, axis: str) -> int:
        if not isinstance(axis, str):
            raise MeshError(f"axis_size() takes one axis name; got {axis!r}")
        return self._sizes[self._names.index(self.axes(axis)[0])]

    def axes(self, axes: AxesLike) -> tuple[str, ...]:
        """Normalise an axes argument to a tuple of valid, distinct names in mesh order (None = all)."""
        if axes is None:
            return self._names
        wanted = (axes,) if isinstance(axes, str) else axes
        if not isinstance(wanted, Iterable):
            raise MeshError(f"mesh axes must be a name, a sequence of names or None; got {axes!r}")
        wanted = tuple(wanted)
        for a in wanted:
            if a not in self._names:
                raise MeshError(f"unknown mesh axis {a!r}; this mesh has axes {self._names}")
        if len(set(wanted)) != len(wanted):
            raise MeshError(f"mesh axes {wanted} name an axis twice")
        return tuple(n for n in self._names if n in wanted)

    # -- ranks <-> coordinates -------------------------------------------------------------------------
    def _check_rank(self, rank: Any) -> int:
        r = as_int(rank, "a rank")
        if not 0 <= r < self.size:
            raise MeshError(f"rank {r} is out of range for mesh {self} with {self.size} devices "
                            f"(valid ranks: 0..{self.size - 1})")
        return r

    def index(self, rank: int) -> MeshIndex:
        """Coordinates of ``rank``: coordinate_i = (rank // stride_i) % size_i."""
        r = self._check_rank(rank)
        return MeshIndex(self._names, tuple((r // st) % sz for st, sz in zip(self._strides, self._sizes)))

    def rank(self, index: MeshIndex | Sequence[int] | None = None, /, **coords: int) -> int:
        """Rank of an index (MeshIndex, tuple, or one keyword per axis): Σ coordinate_i · stride_i."""
        if index is not None and coords:
            raise MeshError(f"rank() takes an index or keywords, not both; got {index!r} and {coords}")
        if index is None:
            unknown = [k for k in coords if k not in self._names]
            missing = [n for n in self._names if n not in coords]
            if unknown or missing:
                raise MeshError(f"rank() needs exactly one keyword per mesh axis {self._names}; "
                                f"got {sorted(coords)} (unknown: {unknown}, missing: {missing})")
            values = tuple(coords[n] for n in self._names)
        elif isinstance(index, MeshIndex):
            if index.axis_names != self._names:
                raise MeshError(f"index {index} has axes {index.axis_names}; this "
                                f"mesh has axes {self._names}")
            values = tuple(index)
        else:
            values = tuple(index) if isinstance(index, Iterable) else (index,)
            if len(values) != self.ndim:
                raise MeshError(f"index {values} has {len(values)} coordinates; mesh "
                                f"{self} has {self.ndim} axes")
        rank = 0
        for name, size, stride, value in zip(self._names, self._sizes, self._strides, values):
            c = as_int(value, f"coordinate {name}")
            if not 0 <= c < size:
                raise MeshError(f"coordinate {name}={c} is out of range for mesh {self}: valid 0..{size - 1}")
            rank += c * stride
        return rank

    # -- groups ------------------------------------------------------------------------------------------
    def groups(self, axes: AxesLike) -> list[tuple[int, ...]]:
        """Every group along ``axes`` (ranks agreeing on all other coordinates), by smallest rank."""
        return list(self._groups(self.axes(axes)))

    def _groups(self, axes: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        key = ("groups", axes)
        if key not in self._cache:
            inside = [i for i, n in enumerate(self._names) if n in axes]
            outside = [i for i, n in enumerate(self._names) if n not in axes]
            # Outside axes first (row-major => rows ordered by smallest rank), group axes last.
            grid = np.arange(self.size).reshape(self._sizes).transpose(outside + inside)
            rows = grid.reshape(-1, math.prod(self._sizes[i] for i in inside))
            groups = tuple(tuple(int(x) for x in row) for row in rows)
            self._cache[key] = groups
            self._cache[("of", axes)] = {r: g for g in groups for r in g}
        return self._cache[key]

    def prepare_groups(self) -> None:
        """Compute the groups of every set of axes now: a driver does so before forking its devices,
        which then inherit them (at 64 devices each device's first barrier computed its own)."""
        for mask in range(1, 1 << self.ndim):
            self._groups(tuple(a for i, a in enumerate(self._names) if mask >> i & 1))

    def group_of(self, rank: int, axes: AxesLike) -> tuple[int, ...]:
        """The group along ``axes`` that contains ``rank``."""
        r, normal = self._check_rank(rank), self.axes(axes)
        self._groups(normal)
        return self._cache[("of", normal)][r]

    def describe_group(self, group_axes: AxesLike, ranks: Iterable[int]) -> str:
        """``tp=(0,1,2,3)``, ``dp,tp=(0,...)``; ``world=(...)`` when group_axes is None."""
        if group_axes is None:
            label = "world"
        else:
            label = ",".join(self.axes(group_axes)) or "rank"
        return f"{label}={_format_ranks(tuple(ranks))}"

    # -- value semantics -------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        if (self._names, self._sizes) != (other._names, other._sizes):
            return False
        if self._topology is None and other._topology is None:
            return True  # both default
        return self.topology == other.topology

    def __hash__(self) -> int:
        return hash((self._names, self._sizes))  # topology left out: a default equals its explicit twin

    def __reduce__(self):
        # A default topology is rebuilt on the other side instead of being pickled.
        return (_rebuild_mesh, (self._names, self._sizes, self._topology))

    def __str__(self) -> str:
        return _shape_str(self._names, self._sizes)

    def __repr__(self) -> str:
        return f"Mesh({dict(zip(self._names, self._sizes))}, topology={self.topology.name})"


def _shape_str(names: Sequence[str], sizes: Sequence[int]) -> str:
    return "(" + ", ".join(f"{n}={s}" for n, s in zip(names, sizes)) + ")"


def _rebuild_mesh(names: tuple[str, ...], sizes: tuple[int, ...], topology: Topology | None) -> Mesh:
    return Mesh(sizes, names, topology=topology)
