"""Kinds of groups: which set of mesh axes a collective's group spans, as a small int.

A device belongs to exactly one group for each set of axes, so (kind, device) names a group
membership, and the fences of shared-memory collectives keep one arrival word per pair
(transport/arrivals.py).  Axes of size 1 change no group, so only the others count: kind = the
bitmask of the group's axes among those, and a mesh has 2**(axes longer than 1) kinds — at most
as many as it has devices.
"""

from __future__ import annotations

from typing import Sequence

from ..mesh import Mesh

__all__ = ["fence_kinds", "fence_kind", "kind_axes"]


def _spanning(mesh: Mesh) -> list[str]:
    return [a for a, size in zip(mesh.axis_names, mesh.sizes) if size > 1]


def fence_kinds(mesh: Mesh) -> int:
    """How many kinds of groups ``mesh`` has."""
    return 1 << len(_spanning(mesh))


def fence_kind(mesh: Mesh, axes: Sequence[str]) -> int:
    """The kind of the groups spanning ``axes`` (valid axis names of ``mesh``)."""
    return sum(1 << i for i, a in enumerate(_spanning(mesh)) if a in axes)


def kind_axes(mesh: Mesh, kind: int) -> tuple[str, ...]:
    """The axes (longer than 1) of the groups of ``kind``: the inverse of :func:`fence_kind`."""
    return tuple(a for i, a in enumerate(_spanning(mesh)) if kind >> i & 1)
