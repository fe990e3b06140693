"""``shard`` and ``unshard``: a global array to every device's piece and back (host side)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..collectives.ops import REDUCE_OPS
from ..errors import ShardingError
from .spec import TensorSharding

__all__ = ["shard", "unshard"]


def shard(x: np.ndarray, spec: TensorSharding, mesh: Any, uneven: str = "error") -> list[np.ndarray]:
    """Each device's piece of ``x`` (rank order).  A partial spec (``P(op)``) puts the whole value
    on the first device of each reduction group and the op's identity elsewhere (for ``avg``, the
    value on every device), so reducing the pieces over the group gives ``x`` back."""
    x = np.asarray(x)
    spec.check(x.shape, mesh, uneven)
    pieces = [np.ascontiguousarray(x[spec.block(x.shape, mesh, r)]) for r in range(mesh.size)]
    if spec.partial and spec.partial != "avg":
        axes = mesh.axes(spec.partial_axes(mesh)) if spec.partial_axes(mesh) else ()
        identity = _identity(spec.partial, x.dtype)
        for r in range(mesh.size):
            if axes and mesh.group_of(r, axes).index(r) != 0:
                pieces[r] = np.full_like(pieces[r], identity)
    return pieces


def unshard(pieces: Sequence[np.ndarray], spec: TensorSharding, mesh: Any,
            shape: Sequence[int] | None = None) -> np.ndarray:
    """The global array from every device's piece (a partial spec is reduced over its group).

    Pieces must fit their blocks, and devices holding copies of one block (replicated over an
    axis) must agree exactly (NaN matching NaN): a disagreement means the program forgot a
    collective, and is a ``ShardingError`` naming both devices, never one copy silently kept."""
    if len(pieces) != mesh.size:
        raise ShardingError(f"unshard needs one piece per device ({mesh.size}), got {len(pieces)}")
    # numpy scalars are 0-d arrays
    pieces = [np.asarray(p) if isinstance(p, np.generic) else p for p in pieces]
    for r, p in enumerate(pieces):
        if not isinstance(p, np.ndarray):
            raise ShardingError(f"device {r} {mesh.index(r)} holds a {type(p).__name__} "
                                f"where spec {spec} needs an "
                                "array", ranks=(r,))
    if shape is None:
        shape = tuple(sum(pieces[r].shape[d] for r in _along(spec, mesh, d)) if spec.dims[d].axes
                      else pieces[0].shape[d] for d in range(len(spec.dims)))
    out = np.empty(shape, dtype=pieces[0].dtype)
    if spec.partial:
        ufunc = REDUCE_OPS[spec.partial].ufunc
        filled = np.zeros(shape, bool)
        folded = np.zeros(shape, np.int64)  # values reduced per element (avg divides their sum by it)
        used, pending = set(spec.used_axes()), set(spec.partial_axes(mesh))
        copies = mesh.axes([a for a in mesh.axis_names if a not in used and a not in pending])
        for r in range(mesh.size):
            block = spec.block(shape, mesh, r)
            _fits(pieces, r, block, shape, spec, mesh)
            rep = mesh.group_of(r, copies)[0] if copies else r
            if rep != r:  # a copy of another device's partial value: count each value once, if they agree
                if not np.array_equal(pieces[rep], pieces[r], equal_nan=pieces[r].dtype.kind in "fc"):
                    raise ShardingError(f"devices {rep} {mesh.index(rep)} and {r} "
                                        f"{mesh.index(r)} hold different "
                                        f"copies of one partial value of spec {spec}: copies must be equal",
                                        ranks=(rep, r))
                continue
            if filled[block].all():
                ufunc(out[block], pieces[r], out=out[block])
            else:
                out[block] = pieces[r]
                filled[block] = True
            folded[block] += 1
        if spec.partial == "avg":  # as the devices' all_reduce(op="avg") would (the sum was never divided)
            out = (out / folded).astype(out.dtype) if out.dtype.kind in "fc" else out / folded
        return out
    first: dict[tuple, int] = {}
    for r in range(mesh.size):
        block = spec.block(shape, mesh, r)
        key = tuple((b.start, b.stop) for b in block)
        _fits(pieces, r, block, shape, spec, mesh)
        if key in first:
            if not np.array_equal(out[block], pieces[r], equal_nan=pieces[r].dtype.kind in "fc"):
                raise ShardingError(f"devices {first[key]} {mesh.index(first[key])} and "
                                    f"{r} {mesh.index(r)} hold "
                                    f"different copies of block {key} of spec {spec}: a "
                                    "replicated output must be "
                                    "equal everywhere (a missing all_reduce?)", ranks=(first[key], r))
            continue
        first[key] = r
        out[block] = pieces[r]
    return out


def _fits(pieces: Sequence[np.ndarray], r: int, block: tuple, shape: Sequence[int], spec: TensorSharding,
          mesh: Any) -> None:
    """Device ``r``'s piece has its block's shape (numpy would broadcast a smaller one into it)."""
    want = tuple(len(range(*b.indices(n))) for b, n in zip(block, shape))
    if pieces[r].shape != want:
        raise ShardingError(f"device {r} {mesh.index(r)} holds a piece of shape {pieces[r].shape} where spec "
                            f"{spec} of shape {tuple(shape)} needs {want}", ranks=(r,))


def _along(spec: TensorSharding, mesh: Any, d: int) -> tuple[int, ...]:
    """The ranks of device 0's group along dim ``d``'s axes (one piece per block of dim d)."""
    return mesh.group_of(0, mesh.axes(spec.dims[d].axes))


def _identity(op: str, dtype: np.dtype) -> Any:
    """The value that leaves ``op`` unchanged: for max and min of floats ±inf (the largest finite
    float turned -inf, a masked logit, into -1.8e308), of booleans False/True."""
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if dtype.kind in "fc":
        return -np.inf if op == "max" else np.inf
    if dtype.kind == "b":
        return op == "min"
    info = np.iinfo(dtype)
    return info.min if op == "max" else info.max
