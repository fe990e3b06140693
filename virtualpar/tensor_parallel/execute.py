"""``cluster.execute(op, *activations)`` for a sharded layer, with its weights resident on devices.

``TensorParallelOp(layer, shapes, weights=(1,))`` wraps a layer of :mod:`.matmul` / :mod:`.ffn`.
``op.place_weights(cluster, *weights)`` sends each device its pieces once; they stay in
``dev.state`` across calls.  ``cluster.execute(op, *activations)`` sends each device its pieces of
the activations (and of the weights if they were never placed), runs the forward program without
recording a backward, and gathers the output with ``cluster.get`` from one device per distinct
block, so a replicated output crosses the device→host channel once, not once per device (and
through shared memory: returning 64 MiB as a ``run`` result, pickled through the control pipe,
took 0.30 s here against 0.01 s for ``get``).

Each device limits its BLAS to ⌊cores / devices⌋ threads (at least 1) on its first call, so n
device processes on c cores do not run n × c BLAS threads (see benchmarks/bench_sharding_policies.py
for the measured effect).  Peak memory per device is measured with ``tracemalloc`` (numpy reports
its buffers to it): the resident inputs plus the peak of what the program allocated.
"""

from __future__ import annotations

import copy
import tracemalloc
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import blas_threads
from ..errors import ShardingError
from .layout import Layout, check_layer, piece, unshard

__all__ = ["TensorParallelOp", "limit_blas_threads"]

_OUT = "tp.out"


def limit_blas_threads(dev: Any) -> None:
    """Once per device process: BLAS threads = max(1, cores // devices on this machine)."""
    if dev.state.get("tp.blas") is None:
        dev.state["tp.blas"] = blas_threads.limit(dev.size)


def _block_key(layout: Layout, mesh: Any, rank: int) -> tuple[int, ...]:
    """Which block of a tensor with ``layout`` device ``rank`` holds: its position per dim."""
    return tuple(mesh.group_of(rank, mesh.axes(axes)).index(rank) if axes else 0 for axes in layout)


def _owners(layout: Layout, mesh: Any) -> frozenset[int]:
    """One rank per distinct block of the output (the lowest)."""
    seen: dict[tuple[int, ...], int] = {}
    for rank in range(mesh.size):
        seen.setdefault(_block_key(layout, mesh, rank), rank)
    return frozenset(seen.values())


def _execute_on_device(dev: Any, layer: Any, keys: tuple[str, ...], temp: tuple[str, ...], owners: frozenset[int]):
    limit_blas_threads(dev)
    dev.state.pop(_OUT, None)  # the last output, fetched already: kept, it held a receive buffer the next call re-made
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


def _peak_on_device(dev: Any) -> int:
    return int(dev.state.get("tp.peak_bytes", 0))


@dataclass
class TensorParallelOp:
    """A layer with input shapes; inputs at positions ``weights`` may be placed once and kept."""

    layer: Any
    shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]
    weights: tuple[int, ...] = ()
    # its own name on the devices: a copy (copy, deepcopy, dataclasses.replace) gets a new one and
    # no placed weights, so it can neither overwrite the original's nor run on them unplaced
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8], init=False)
    # the clusters holding the weights (they live on its devices); weakly, as a closed cluster's id can recur
    placed_on: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False, compare=False, init=False)

    def __copy__(self) -> "TensorParallelOp":
        return TensorParallelOp(self.layer, self.shapes, self.out_shape, self.weights)

    def __deepcopy__(self, memo: dict) -> "TensorParallelOp":
        return TensorParallelOp(copy.deepcopy(self.layer, memo), self.shapes, self.out_shape, self.weights)

    def _key(self, i: int) -> str:
        return f"tp.{self.token}.{i}"

    def place_weights(self, cluster: Any, *weights: np.ndarray) -> int:
        """Send every device its pieces of the weights; returns host→device bytes."""
        if len(weights) != len(self.weights):
            raise ShardingError(f"place_weights: expected {len(self.weights)} weights (inputs {self.weights}), got {len(weights)}")
        check_layer("place_weights", self.layer, self.shapes, self.out_shape, cluster.mesh)
        layouts = self.layer.input_layouts()
        weights = tuple(np.asarray(w) for w in weights)
        for i, w in zip(self.weights, weights):  # every weight checked before any is sent: all or none
            if w.shape != self.shapes[i]:
                raise ShardingError(f"place_weights: input {i} has shape {w.shape}, expected {self.shapes[i]}")
        total = 0
        for i, w in zip(self.weights, weights):
            for rank in range(cluster.size):
                p = piece(w, layouts[i], cluster.mesh, rank)
                cluster.put(rank, self._key(i), p, block=False)
                total += p.nbytes
        self.placed_on.add(cluster)
        return total

    def execute_on(self, cluster: Any, *arrays: np.ndarray) -> np.ndarray:
        """Run the forward on ``cluster``: ``arrays`` are the activations if the weights are placed,
        else every input; returns the full output on the host."""
        n_in = len(self.shapes)
        placed = cluster in self.placed_on
        positions = [i for i in range(n_in) if not (placed and i in self.weights)]
        check_layer("execute", self.layer, self.shapes, self.out_shape, cluster.mesh)  # (the mesh first: a wrong one
        if len(arrays) != len(positions):                                     # explains a wrong count too)
            unplaced = f"; the weights (inputs {sorted(self.weights)}) are not on this cluster: call " \
                f"place_weights(cluster, ...) first, or pass every input" if self.weights and not placed else ""
            raise ShardingError(f"execute: expected {len(positions)} arrays (inputs {positions}), got {len(arrays)}"
                                f"{unplaced}")
        layouts = self.layer.input_layouts()
        for i, x in zip(positions, arrays):
            x = np.asarray(x)
            if x.shape != self.shapes[i]:
                raise ShardingError(f"execute: input {i} has shape {x.shape}, expected {self.shapes[i]}")
            for rank in range(cluster.size):
                cluster.put(rank, self._key(i), piece(x, layouts[i], cluster.mesh, rank), block=False)
        keys = tuple(self._key(i) for i in range(n_in))
        temp = tuple(self._key(i) for i in positions)
        out_layout = self.layer.output_layout()
        owners = _owners(out_layout, cluster.mesh)
        cluster.run(_execute_on_device, self.layer, keys, temp, owners)
        pieces = [cluster.get(r, _OUT) if r in owners else None for r in range(cluster.size)]
        return _assemble(pieces, out_layout, self.out_shape, cluster.mesh)

    def peak_bytes(self, cluster: Any) -> list[int]:
        """Each device's measured peak memory during the last execute (bytes)."""
        return cluster.run(_peak_on_device)


def _assemble(pieces: list[Any], layout: Layout, shape: Sequence[int], mesh: Any) -> np.ndarray:
    """The full output from the owners' pieces (non-owners returned None)."""
    by_block = {_block_key(layout, mesh, r): p for r, p in enumerate(pieces) if p is not None}
    return unshard([by_block[_block_key(layout, mesh, r)] for r in range(mesh.size)], layout, shape, mesh)
