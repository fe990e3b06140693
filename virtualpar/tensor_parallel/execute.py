"""Running a sharded layer's forward on a cluster, with its weights resident on the devices.

A *layer* (``MatMul``, ``FeedForward``, the explorer's ``DerivedMatMul``) has ``input_layouts()``,
``output_layout()`` (sharding specs) and ``forward(dev, *inputs)``.  The host sends each device its
pieces of the inputs (:func:`~virtualpar.sharding.shard`), every device runs the forward without
recording a backward, and the output comes back with ``cluster.get`` from one device per distinct
block, so a replicated output crosses the device→host channel once, not once per device (and
through shared memory: returning 64 MiB as a ``run`` result, pickled through the control pipe,
took 0.30 s here against 0.01 s for ``get``); :func:`~virtualpar.sharding.unshard` assembles it.

``MatMul`` and ``FeedForward`` are operations themselves (``cluster.execute(MatMul("column"), a, b)``,
shapes from the inputs; :mod:`.layer_op`).  ``TensorParallelOp(layer, shapes, out_shape, weights=(1,))``
is the older form with declared shapes: ``op.place_weights(cluster, *weights)`` sends each device
its pieces once; they stay in ``dev.state`` across calls.

Each device limits its BLAS to ⌊cores / devices⌋ threads (at least 1) on its first call, so n
device processes on c cores do not run n × c BLAS threads (see benchmarks/bench_sharding_policies.py
for the measured effect).  Peak memory per device is measured with ``tracemalloc`` (numpy reports
its buffers to it): the resident inputs plus the peak of what the program allocated.
"""

from __future__ import annotations

import copy
import tracemalloc
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import blas_threads
from ..errors import ShardingError
from ..ops.placement import PlacedOperation
from ..sharding import TensorSharding, shard, unshard
from .layout import check_layer

__all__ = ["TensorParallelOp", "limit_blas_threads", "put_pieces", "run_layer"]

_OUT = "tp.out"


def limit_blas_threads(dev: Any) -> None:
    """Once per device process: BLAS threads = max(1, cores // devices on this machine)."""
    if dev.state.get("tp.blas") is None:
        dev.state["tp.blas"] = blas_threads.limit(dev.size)


def put_pieces(cluster: Any, key: str, x: np.ndarray, spec: TensorSharding) -> int:
    """Every device's piece of ``x`` under ``spec`` into ``dev.state[key]``; returns host→device bytes."""
    total = 0
    for rank, p in enumerate(shard(np.asarray(x), spec, cluster.mesh)):
        cluster.put(rank, key, p, block=False)
        total += p.nbytes
    return total


def _block_key(spec: TensorSharding, shape: Sequence[int], mesh: Any, rank: int) -> tuple:
    """Which block of a tensor under ``spec`` device ``rank`` holds: (start, stop) per dim."""
    return tuple(b.indices(n)[:2] for b, n in zip(spec.block(shape, mesh, rank), shape))


def _owners(spec: TensorSharding, shape: Sequence[int], mesh: Any) -> frozenset[int]:
    """One rank per distinct block of the output (the lowest)."""
    seen: dict[tuple, int] = {}
    for rank in range(mesh.size):
        seen.setdefault(_block_key(spec, shape, mesh, rank), rank)
    return frozenset(seen.values())


def _execute_on_device(dev: Any, layer: Any, keys: tuple[str, ...], temp: tuple[str, ...],
                       owners: frozenset[int]):
    limit_blas_threads(dev)
    # the last output, fetched already: kept, it held a receive buffer the next call re-made
    dev.state.pop(_OUT, None)
    inputs = [dev.state[k] for k in keys]
    resident = sum(x.nbytes for x in inputs)
    tracemalloc.start()
    try:
        out = layer.forward(dev, *inputs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for k in temp:
        dev.state.pop(k, None)
    dev.state["tp.peak_bytes"] = resident + peak
    if dev.rank in owners:
        dev.state[_OUT] = out  # fetched with cluster.get: the host channel's shared memory, not a pickle


def peak_on_device(dev: Any) -> int:
    return int(dev.state.get("tp.peak_bytes", 0))


def run_layer(cluster: Any, layer: Any, keys: tuple[str, ...], temp: tuple[str, ...],
              out_shape: Sequence[int]) -> np.ndarray:
    """Run ``layer``'s forward on inputs already on the devices under ``keys`` (``temp`` are dropped
    after), and return the output of global shape ``out_shape`` on the host."""
    spec = layer.output_layout()
    owners = _owners(spec, out_shape, cluster.mesh)
    cluster.run(_execute_on_device, layer, keys, temp, owners)
    pieces = {r: cluster.get(r, _OUT) for r in sorted(owners)}
    mesh = cluster.mesh
    for r, p in pieces.items():  # the declared shape against what the devices computed (else: broadcast)
        want = spec.local_shape(out_shape, mesh, r)
        if np.shape(p) != want:
            raise ShardingError(f"device {r} {mesh.index(r)} holds a piece of shape {np.shape(p)} where the "
                                f"declared shape {tuple(out_shape)} with layout {spec} needs {want}: the "
                                "shape given for this tensor is not the one the devices computed", ranks=(r,))
    by_block = {_block_key(spec, out_shape, mesh, r): p for r, p in pieces.items()}
    return unshard([by_block[_block_key(spec, out_shape, mesh, r)] for r in range(mesh.size)], spec, mesh,
                   tuple(out_shape))


@dataclass
class TensorParallelOp(PlacedOperation):
    """A layer with declared input shapes; inputs at positions ``weights`` may be placed once and kept.

    The form that predates ``MatMul``/``FeedForward`` being operations themselves (which take their
    shapes from the inputs); kept for the callers that declare shapes, e.g. the explorer's layers."""

    layer: Any
    shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    weights: tuple[int, ...] = ()
    # its own name on the devices: a copy (copy, deepcopy, dataclasses.replace) gets a new one and
    # no placed weights (PlacedOperation), so it can neither overwrite the original's nor run on them unplaced
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8], init=False)

    def __copy__(self) -> "TensorParallelOp":
        return TensorParallelOp(self.layer, self.shapes, self.out_shape, self.weights)

    def __deepcopy__(self, memo: dict) -> "TensorParallelOp":
        return TensorParallelOp(copy.deepcopy(self.layer, memo), self.shapes, self.out_shape, self.weights)

    def _key(self, i: int) -> str:
        return f"tp.{self.token}.{i}"

    def _layer(self, mesh: Any) -> Any:
        bind = getattr(self.layer, "bind", None)  # MatMul("column"): the policy's axes come from the mesh
        return bind(mesh) if bind is not None else self.layer

    def place_weights(self, cluster: Any, *weights: np.ndarray) -> int:
        """Send every device its pieces of the weights; returns host→device bytes."""
        if len(weights) != len(self.weights):
            raise ShardingError(f"place_weights: expected {len(self.weights)} weights (inputs "
                                f"{self.weights}), got {len(weights)}")
        layer = self._layer(cluster.mesh)
        check_layer("place_weights", layer, self.shapes, self.out_shape, cluster.mesh)
        layouts = layer.input_layouts()
        weights = tuple(np.asarray(w) for w in weights)
        for i, w in zip(self.weights, weights):  # every weight checked before any is sent: all or none
            if w.shape != self.shapes[i]:
                raise ShardingError(f"place_weights: input {i} has shape {w.shape}, "
                                    f"expected {self.shapes[i]}")
        total = sum(put_pieces(cluster, self._key(i), w, layouts[i]) for i, w in zip(self.weights, weights))
        self.hold(cluster)
        return total

    def execute_on(self, cluster: Any, *arrays: np.ndarray) -> np.ndarray:
        """Run the forward on ``cluster``: ``arrays`` are the activations if the weights are placed,
        else every input; returns the full output on the host."""
        n_in = len(self.shapes)
        placed = self.is_placed_on(cluster)
        positions = [i for i in range(n_in) if not (placed and i in self.weights)]
        layer = self._layer(cluster.mesh)
        # the mesh first: a wrong one explains a wrong count too
        check_layer("execute", layer, self.shapes, self.out_shape, cluster.mesh)
        if len(arrays) != len(positions):
            unplaced = (
                f"; the weights (inputs {sorted(self.weights)}) are not on this cluster: call "
                f"place_weights(cluster, ...) first, or pass every input"
                if self.weights and not placed
                else ""
            )
            raise ShardingError(f"execute: expected {len(positions)} arrays (inputs "
                                f"{positions}), got {len(arrays)}"
                                f"{unplaced}")
        layouts = layer.input_layouts()
        arrays = tuple(np.asarray(x) for x in arrays)
        for i, x in zip(positions, arrays):
            if x.shape != self.shapes[i]:
                raise ShardingError(f"execute: input {i} has shape {x.shape}, expected {self.shapes[i]}")
        for i, x in zip(positions, arrays):
            put_pieces(cluster, self._key(i), x, layouts[i])
        keys = tuple(self._key(i) for i in range(n_in))
        return run_layer(cluster, layer, keys, tuple(self._key(i) for i in positions), self.out_shape)

    def peak_bytes(self, cluster: Any) -> list[int]:
        """Each device's measured peak memory during the last execute (bytes)."""
        return cluster.run(peak_on_device)
