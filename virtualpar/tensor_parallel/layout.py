"""Layouts of the tensors a tensor-parallel policy consumes and produces.

A layout names, per tensor dimension, the mesh axes that shard it (``()`` = replicated along every
axis not named elsewhere).  It prints in the placement vocabulary ``[S(x), R]`` (``S(x,y)``: one
dim split over two axes, major axis first, in the mesh's order: ``S(y,x)`` on a mesh (x, y) is
refused, not placed as ``S(x,y)``), which is also how a
layout converts to and from the sharding package's ``TensorSharding``.

Pieces: on a device, the piece of dim d is the block at the device's position within the group of
the dim's axes (``dev.group_rank(axes)``), the same order in which ``all_gather`` concatenates, so
gathering a piece over its axes restores the dim.  Dims must divide evenly; anything else is a
``ShardingError`` that names the tensor, dim, shape, axes and their size.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import ShardingError

__all__ = ["Layout", "format_layout", "parse_layout", "check_layout", "check_layer", "local_shape", "piece", "device_piece", "unshard"]

Layout = tuple[tuple[str, ...], ...]


def format_layout(layout: Layout) -> str:
    """``((), ("x",))`` -> ``"[R, S(x)]"``."""
    return "[" + ", ".join("S(" + ",".join(axes) + ")" if axes else "R" for axes in layout) + "]"


def parse_layout(text: str) -> Layout:
    """Exact inverse of :func:`format_layout`; also takes ``[R,S(x)]`` and ``[S(x, y), R]``."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ShardingError(f"cannot parse layout {text!r}: expected e.g. '[S(x), R]'", text=text)
    parts, depth, start, inner = [], 0, 0, body[1:-1]
    for i, ch in enumerate(inner):  # split on the commas between dims, not those inside S(...)
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    out = []
    for part in (p.strip() for p in parts if p.strip()):
        if part == "R":
            out.append(())
        elif part.startswith("S(") and part.endswith(")") and part[2:-1]:
            out.append(tuple(a.strip() for a in part[2:-1].split(",")))
        else:
            raise ShardingError(f"cannot parse layout {text!r}: {part!r} is neither 'R' nor 'S(axis,...)'", text=text)
    return tuple(out)


def axes_size(mesh: Any, axes: Sequence[str]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


def check_layout(name: str, layout: Layout, shape: Sequence[int], mesh: Any) -> None:
    """Raise ``ShardingError`` unless ``layout`` fits ``shape`` on ``mesh``: one entry per dim, known
    axes, no axis twice, every sharded dim divisible by the product of its axes' sizes."""
    where = f"{name} {format_layout(layout)} of shape {tuple(shape)}"
    if len(layout) != len(shape):
        raise ShardingError(f"{where}: the layout has {len(layout)} dims, the tensor {len(shape)}",
                            tensor=name, layout=format_layout(layout), shape=tuple(shape))
    seen: dict[str, int] = {}
    for dim, axes in enumerate(layout):
        for axis in axes:
            if axis not in mesh.axis_names:
                raise ShardingError(f"{where}: dim {dim} names mesh axis {axis!r}; the mesh {mesh} has axes {mesh.axis_names}",
                                    tensor=name, dim=dim, axis=axis)
            if axis in seen:
                raise ShardingError(f"{where}: mesh axis {axis!r} used twice (dims {seen[axis]} and {dim}); "
                                    "expected each axis to shard at most one dim", tensor=name, axis=axis)
            seen[axis] = dim
        if list(axes) != [a for a in mesh.axis_names if a in axes]:  # S(y,x) would be placed as S(x,y)
            ordered = ",".join(a for a in mesh.axis_names if a in axes)
            raise ShardingError(f"{where}: dim {dim} lists mesh axes ({','.join(axes)}); several axes of one dim go "
                                f"major first in the mesh's order {list(mesh.axis_names)}: write S({ordered})",
                                tensor=name, dim=dim, axes=axes)
        n = axes_size(mesh, axes)
        if shape[dim] % n:
            raise ShardingError(f"cannot shard dim {dim} of {name}, shape {tuple(shape)}, over mesh axes {axes} "
                                f"(size {n}): {shape[dim]} is not divisible by {n}", tensor=name, dim=dim, axes=axes)


def role_axes(policy: str, roles: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Roles as given (an axis name, or a list or tuple of them) as tuples of names; anything else,
    and a role with no axis, is refused naming the policy and the role."""
    out = {}
    for role, v in roles.items():
        axes = (v,) if isinstance(v, str) else tuple(v) if isinstance(v, (list, tuple)) else None
        if axes is None or not all(isinstance(a, str) for a in axes):
            raise ShardingError(f"policy {policy!r}: role {role}= takes a mesh axis name or a tuple of them, got {v!r}",
                                policy=policy)
        if not axes:
            raise ShardingError(f"policy {policy!r}: role {role!r} needs at least one mesh axis, got {v!r}", policy=policy)
        out[role] = axes
    return out


def check_roles(policy: str, roles: dict[str, tuple[str, ...]], mesh: Any, build: Any,
                labels: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """A named policy's roles, checked when it is made rather than when it first runs: every axis
    a mesh axis, none twice in a role, and no tensor sharded over one axis twice (``outer`` with
    m="y" and the default k on a 3-axis mesh gave A[S(y), S(y,z)]).  Each role's axes come back
    in mesh order — the order a layout shards in, so (y, x) and (x, y) are one program."""
    names = tuple(mesh.axis_names)
    out = {}
    for role, axes in roles.items():
        bad = [a for a in axes if a not in names]
        if bad or len(set(axes)) != len(axes):
            what = f"unknown mesh axes {bad}" if bad else "an axis twice"
            raise ShardingError(f"policy {policy!r}: role {role}={axes} names {what}; the mesh has axes {names}",
                                policy=policy)
        out[role] = tuple(a for a in names if a in axes)
    for label, lay in zip(labels, build(out)):
        used = [a for dim in lay for a in dim]
        twice = [a for a in names if used.count(a) > 1]
        if twice:
            given = ", ".join(f"{k}={'+'.join(v)}" for k, v in sorted(out.items()))
            raise ShardingError(f"policy {policy!r} with {given} shards {label} {format_layout(lay)}: mesh axis "
                                f"{twice[0]!r} used twice; give its roles disjoint axes", policy=policy)
    return out


def check_layer(what: str, layer: Any, in_shapes: Sequence[Sequence[int]], out_shape: Sequence[int] | None,
                mesh: Any) -> None:
    """Refuse to run ``layer`` (``input_layouts()``, ``output_layout()``) on shapes its layouts do
    not fit on ``mesh`` — above all a dim that does not divide by its axes' devices, which the
    per-device programs would otherwise compute on ragged pieces and get silently wrong."""
    layouts = layer.input_layouts()
    if len(in_shapes) != len(layouts):
        raise ShardingError(f"{what}: the layer takes {len(layouts)} inputs, got {len(in_shapes)} shapes")
    name = getattr(getattr(layer, "policy", None), "name", None) or getattr(layer, "name", type(layer).__name__)
    for i, (lay, shape) in enumerate(zip(layouts, in_shapes)):
        check_layout(f"input {i} of {name} ({what})", lay, tuple(shape), mesh)
    if out_shape is not None:
        check_layout(f"the output of {name} ({what})", layer.output_layout(), tuple(out_shape), mesh)


def local_shape(layout: Layout, shape: Sequence[int], mesh: Any) -> tuple[int, ...]:
    return tuple(s // axes_size(mesh, axes) for s, axes in zip(shape, layout))


def _position(mesh: Any, rank: int, axes: tuple[str, ...]) -> int:
    return mesh.group_of(rank, mesh.axes(axes)).index(rank) if axes else 0


def _block(layout: Layout, shape: Sequence[int], mesh: Any, rank: int) -> tuple[slice, ...]:
    loc = local_shape(layout, shape, mesh)
    return tuple(slice(_position(mesh, rank, axes) * n, (_position(mesh, rank, axes) + 1) * n)
                 for axes, n in zip(layout, loc))


def piece(x: np.ndarray, layout: Layout, mesh: Any, rank: int) -> np.ndarray:
    """Device ``rank``'s piece of the full array ``x`` (a contiguous copy)."""
    return np.ascontiguousarray(x[_block(layout, x.shape, mesh, rank)])


def device_piece(dev: Any, x: np.ndarray, layout: Layout) -> np.ndarray:
    """The same piece, cut on the device from a full array it holds (through the device protocol)."""
    index = []
    for axes, s in zip(layout, x.shape):
        if not axes:
            index.append(slice(None))
            continue
        n = len(dev.group(axes))
        r = dev.group_rank(axes)
        index.append(slice(r * (s // n), (r + 1) * (s // n)))
    return np.ascontiguousarray(x[tuple(index)])


def unshard(pieces: Sequence[np.ndarray], layout: Layout, shape: Sequence[int], mesh: Any) -> np.ndarray:
    """The full array from every device's piece (rank order).  Replicas must agree (NaN where the
    other has NaN: a diverging model is not a wrong program); a disagreement is a
    ``ShardingError`` naming the two ranks (it means a program is wrong)."""
    out = np.empty(tuple(shape), dtype=pieces[0].dtype)
    owner: dict[tuple, int] = {}
    for rank, p in enumerate(pieces):
        block = _block(layout, shape, mesh, rank)
        key = tuple((b.start, b.stop) for b in block)
        want = tuple(b.stop - b.start for b in block)
        if np.shape(p) != want:  # numpy would broadcast a (1, 4) piece into a (3, 4) block
            raise ShardingError(f"device {rank} {mesh.index(rank)} holds a piece of shape {np.shape(p)} where the "
                                f"declared shape {tuple(shape)} with layout {format_layout(layout)} needs {want}: the "
                                "shape given for this tensor is not the one the devices computed", ranks=(rank,))
        if key in owner:
            if not np.array_equal(out[block], p, equal_nan=p.dtype.kind in "fc"):
                raise ShardingError(f"replicas of block {key} differ between ranks {owner[key]} and {rank} "
                                    f"for layout {format_layout(layout)}", ranks=(owner[key], rank))
            continue
        owner[key] = rank
        out[block] = p
    return out
