"""``Operation`` and ``ShardedOperation``: kernels that declare their costs, run sharded on a cluster.

An ``Operation`` is a numpy kernel with its FLOPs and bytes declared once, as functions of the
input shapes; calling it on a device computes and charges the device's modelled clock with those
numbers (``dev.compute``), so the clock, tables and benchmarks read the same figures.

A ``ShardedOperation`` is a per-device program with the ``TensorSharding`` of every input and
output.  ``cluster.execute(op, *host_arrays)`` shards the inputs by their specs and puts each
device's piece in its state (host → device), runs the program everywhere, and fetches the output
pieces (device → host) to unshard them.  ``op.place(cluster, i, array)`` places input ``i`` once
— weights — and later calls do not send it again; which clusters hold placed inputs is
:class:`~virtualpar.ops.placement.PlacedOperation`'s record, so a copy or another cluster holds none.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ShardingError, UsageError
from ..kernels import matmul_cost
from ..sharding import TensorSharding, shard, unshard
from .placement import PlacedOperation

__all__ = ["Operation", "ShardedOperation", "MATMUL"]

_IDS = itertools.count()


@dataclass(frozen=True)
class Operation:
    """A numpy ``kernel`` named ``name`` with its costs as functions of the input shapes: ``flops`` and
    ``bytes`` (in elements, times the output's itemsize).  ``op(dev, *xs)`` runs the kernel and charges
    ``dev.compute(flops, bytes)``, i.e. ``max(flops / peak, bytes / memory bandwidth)`` on the modelled
    clock."""

    name: str
    kernel: Callable[..., np.ndarray]
    flops: Callable[..., float]  # of the input shapes
    bytes: Callable[..., float] = lambda *shapes: 0.0

    def __call__(self, dev: Any, *xs: np.ndarray) -> np.ndarray:
        began = dev.wall
        out = self.kernel(*xs)
        shapes = [np.shape(x) for x in xs]
        dev.compute(flops=self.flops(*shapes), bytes=self.bytes(*shapes) * out.itemsize, dtype=out.dtype,
                    name=self.name, since=began)  # the trace's wall slice covers the kernel
        return out


#: C = A @ B for A (..., m, k), B (k, n): 2mnk FLOPs per batch entry (all of them counted); reads A
#: and B, writes C.
MATMUL = Operation("matmul", lambda a, b: a @ b, lambda a, b: matmul_cost(a, b, 1)[0],
                   lambda a, b: matmul_cost(a, b, 1)[1])  # the figures dev.matmul charges (elements here)


@dataclass
class ShardedOperation(PlacedOperation):
    """``program(dev, *local_inputs) -> local output (or tuple)`` with the specs of every input/output."""

    program: Callable[..., Any]
    in_specs: Sequence[TensorSharding]
    out_specs: Sequence[TensorSharding]
    name: str = "sharded_op"
    # where its inputs live on the devices, and which are placed there: every copy gets its own
    # (not init fields, so dataclasses.replace makes new ones; copy and deepcopy below too) — a copy
    # sharing them overwrote the original's placed weights
    # (the clusters holding placed inputs: PlacedOperation, state "inputs" = {input index: shape})
    key: str = field(default_factory=lambda: f"op/{next(_IDS)}", init=False)

    def __copy__(self) -> "ShardedOperation":
        return ShardedOperation(self.program, self.in_specs, self.out_specs, self.name)

    def __deepcopy__(self, memo: dict) -> "ShardedOperation":
        return ShardedOperation(self.program, copy.deepcopy(list(self.in_specs), memo),
                                copy.deepcopy(list(self.out_specs), memo), self.name)

    def place(self, cluster: Any, index: int, array: np.ndarray) -> None:
        """Put input ``index`` on the devices now and keep it there (weights)."""
        n = len(self.in_specs)
        if isinstance(index, bool) or not isinstance(index, Integral) or not 0 <= index < n:
            raise UsageError(f"{self.name}.place: index must be an input position 0..{n - 1}, got {index!r}")
        index = int(index)
        array = np.asarray(array)
        self._put(cluster, index, array)
        self.hold(cluster).setdefault("inputs", {})[index] = array.shape

    def _put(self, cluster: Any, index: int, array: np.ndarray) -> None:
        spec = self.in_specs[index]
        try:
            pieces = shard(array, spec, cluster.mesh)
        except ShardingError as exc:
            raise ShardingError(f"{self.name}, input {index}: {exc}") from None
        for r, piece in enumerate(pieces):
            cluster.put(r, f"{self.key}/in{index}", piece, block=False)

    def execute_on(self, cluster: Any, *arrays: np.ndarray) -> Any:
        n_in = len(self.in_specs)
        given = iter(arrays)
        shapes = []
        placed = (self.state_for(cluster) or {}).get("inputs", {})
        for i in range(n_in):
            if i in placed:
                shapes.append(placed[i])
                continue
            try:
                a = np.asarray(next(given))
            except StopIteration:
                raise UsageError(f"{self.name}: expected {n_in - len(placed)} host inputs, got "
                                 f"{len(arrays)}") from None
            self._put(cluster, i, a)
            shapes.append(a.shape)
        if len(arrays) != n_in - len(placed):  # more arrays than inputs: a mistake, never silently dropped
            raise UsageError(f"{self.name}: expected {n_in - len(placed)} host inputs, got {len(arrays)}")
        cluster.run(_run, self.key, self.name, self.program, n_in, len(self.out_specs))
        outs = []
        for j, spec in enumerate(self.out_specs):
            pieces = [cluster.get(r, f"{self.key}/out{j}") for r in range(cluster.mesh.size)]
            try:
                outs.append(unshard(pieces, spec, cluster.mesh))
            except ShardingError as exc:
                raise exc.replace(f"{self.name}, output {j}: {exc}") from None
        return outs[0] if len(outs) == 1 else tuple(outs)


def _run(dev: Any, key: str, name: str, program: Callable[..., Any], n_in: int, n_out: int) -> None:
    xs = [dev.state[f"{key}/in{i}"] for i in range(n_in)]
    out = program(dev, *xs)
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != n_out:
        raise UsageError(f"{name}: the program returned {len(outs)} outputs, its specs declare {n_out}")
    for j, o in enumerate(outs):
        if not isinstance(o, (np.ndarray, np.generic)):  # a numpy scalar (np.sum's) is a 0-d array
            raise UsageError(f"{name}: the program's output {j} is a {type(o).__name__}, not an array")
        dev.state[f"{key}/out{j}"] = np.asarray(o)
