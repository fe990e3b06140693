"""Layouts of the tensors a tensor-parallel policy consumes and produces: sharding specs.

A policy's layouts are :class:`~virtualpar.sharding.TensorSharding` specs, the one layout
vocabulary of the project: per dim the mesh axes that shard it, printed ``[S(x), R]`` (``S(x,y)``:
one dim split over two axes, major first, in the mesh's order — ``S(y,x)`` on a mesh (x, y) is
refused, not placed as ``S(x,y)``).  Pieces, shard and unshard are the sharding package's; this
module adds what is particular to policies: roles (which mesh axes a policy's ``k``, ``m``, ``t``...
take), checking a layer against shapes, and ``as_sharding`` (a spec from text or from per-dim axes).

Dims must divide evenly; anything else is a ``ShardingError`` that names the tensor, dim, shape,
axes and their size.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from ..errors import ShardingError
from ..sharding import TensorSharding

__all__ = ["Layout", "as_sharding", "format_layout", "parse_layout", "check_layout", "check_layer"]

#: a policy's layout of one tensor (the sharding package's spec)
Layout = TensorSharding


def as_sharding(layout: TensorSharding | str | Sequence[Sequence[str]]) -> TensorSharding:
    """A ``TensorSharding`` from a spec, its text (``"[R, S(x)]"``, parsed strictly) or per-dim axes
    (``((), ("x",))``)."""
    if isinstance(layout, TensorSharding):
        return layout
    if isinstance(layout, str):
        return TensorSharding.parse(layout)
    if isinstance(layout, (tuple, list)) and all(isinstance(d, (tuple, list)) for d in layout):
        return TensorSharding.from_axes(layout)
    raise ShardingError(f"a layout is a TensorSharding, its text like '[S(x), R]' or per-dim mesh axes like "
                        f"((), ('x',)); got {type(layout).__name__} {layout!r}")


def format_layout(layout: TensorSharding | Sequence[Sequence[str]]) -> str:
    """``((), ("x",))`` or its spec -> ``"[R, S(x)]"`` (``str`` of the spec)."""
    return str(as_sharding(layout))


def parse_layout(text: str) -> tuple[tuple[str, ...], ...]:
    """The per-dim axes of the spec ``text``: ``"[R, S(x)]"`` -> ``((), ("x",))`` (the strict parser
    of :meth:`TensorSharding.parse`; kept for callers that index layouts by dim)."""
    return TensorSharding.parse(text).axes


def axes_size(mesh: Any, axes: Sequence[str]) -> int:
    return math.prod(mesh.axis_size(a) for a in axes)


def role_axes(policy: str, roles: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Roles as given (an axis name, or a list or tuple of them) as tuples of names; anything else,
    and a role with no axis, is refused naming the policy and the role."""
    out = {}
    for role, v in roles.items():
        axes = (v,) if isinstance(v, str) else tuple(v) if isinstance(v, (list, tuple)) else None
        if axes is None or not all(isinstance(a, str) for a in axes):
            raise ShardingError(f"policy {policy!r}: role {role}= takes a mesh axis name or a "
                                f"tuple of them, got {v!r}",
                                policy=policy)
        if not axes:
            raise ShardingError(f"policy {policy!r}: role {role!r} needs at least one mesh axis, got {v!r}",
                                policy=policy)
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
            raise ShardingError(f"policy {policy!r}: role {role}={axes} names {what}; "
                                f"the mesh has axes {names}",
                                policy=policy)
        out[role] = tuple(a for a in names if a in axes)
    for label, lay in zip(labels, build(out)):
        used = [a for dim in lay for a in dim]
        twice = [a for a in names if used.count(a) > 1]
        if twice:
            given = ", ".join(f"{k}={'+'.join(v)}" for k, v in sorted(out.items()))
            raise ShardingError(f"policy {policy!r} with {given} shards {label} "
                                f"{format_layout(lay)}: mesh axis "
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
    name = getattr(getattr(layer, "policy", None), "name",
                   None) or getattr(layer, "name", type(layer).__name__)
    for i, (lay, shape) in enumerate(zip(layouts, in_shapes)):
        check_layout(f"input {i} of {name} ({what})", lay, tuple(shape), mesh)
    if out_shape is not None:
        check_layout(f"the output of {name} ({what})", layer.output_layout(), tuple(out_shape), mesh)


def check_layout(name: str, layout: TensorSharding | Sequence[Sequence[str]], shape: Sequence[int],
                 mesh: Any) -> None:
    """Raise ``ShardingError`` unless ``layout`` fits ``shape`` on ``mesh`` (:meth:`TensorSharding.check`
    with the tensor named): one entry per dim, known axes, no axis twice, even splits."""
    as_sharding(layout).check(tuple(shape), mesh, name=name)
