"""``MatMul`` and ``FeedForward`` as operations: ``cluster.execute(layer, *inputs)``, shapes from the inputs.

    c = cluster.execute(MatMul("matched_inner"), a, b)      # any policy, by name or as a policy
    op = MatMul("column")
    op.place(cluster, b=B)                                    # B's pieces stay on the devices
    c1, c2 = cluster.execute(op, a1), cluster.execute(op, a2) # only A crosses host → device

A policy given by name takes its mesh axes from the cluster's mesh (``MatMulShardingPolicy.named``
defaults); ``layer.bind(mesh)`` does the same without a cluster.  Inputs are named
(``input_names``: ``a, b`` for MatMul; ``x, w1, b1, w2, b2`` for FeedForward) so that ``place``
can keep any of them resident; ``execute`` then takes the others, in order — or every input, which
runs on those and leaves the resident ones untouched.  Each input is sharded by its layout
(:func:`~virtualpar.sharding.shard`), the forward runs on every device (see :mod:`.execute`), and the
output is unsharded on the host.  Which clusters hold resident inputs is :class:`PlacedOperation`'s
bookkeeping: a copy of the layer, or another cluster, starts with none.
"""

from __future__ import annotations

import uuid
from typing import Any, Sequence

import numpy as np

from ..errors import ShardingError
from ..ops.placement import PlacedOperation
from .execute import peak_on_device, put_pieces, run_layer
from .layout import check_layer

__all__ = ["ShardedLayer"]


class ShardedLayer(PlacedOperation):
    """Mixin of the layers that run as operations.  A subclass has ``input_names`` (class attribute),
    ``bind(mesh)`` (itself with a concrete policy), ``output_shape(shapes)`` (checks the inputs'
    shapes agree, returns the output's), and the layer protocol: ``input_layouts()``,
    ``output_layout()``, ``forward(dev, *inputs)``."""

    input_names: tuple[str, ...] = ()

    def bind(self, mesh: Any) -> Any:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def output_shape(self, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:  # pragma: no cover
        raise NotImplementedError

    def _label(self) -> str:
        policy = getattr(self, "policy", None)
        return f"{type(self).__name__}({getattr(policy, 'name', policy)!r})"

    def _keys(self, cluster: Any) -> str:
        state = self.state_for(cluster)
        return state["token"] if state else "tp.run"

    # -- resident inputs ----------------------------------------------------------------------------
    def place(self, cluster: Any, **inputs: np.ndarray) -> int:
        """Put the named inputs (``b=B``) on the devices now and keep them there; returns host→device
        bytes.  Every input is checked against its layout before any is sent: all or none."""
        names = self.input_names
        unknown = sorted(set(inputs) - set(names))
        if unknown or not inputs:
            raise ShardingError(f"{self._label()}.place: takes inputs by name, some of {list(names)}; got "
                                f"{sorted(inputs) if inputs else 'none'}")
        layer = self.bind(cluster.mesh)
        layouts = layer.input_layouts()
        arrays = {names.index(k): np.asarray(v) for k, v in inputs.items()}
        for i, x in sorted(arrays.items()):
            layouts[i].check(x.shape, cluster.mesh, name=f"input {names[i]} of {self._label()} (place)")
        state = self.state_for(cluster) or self.hold(cluster, token=f"tp.{uuid.uuid4().hex[:8]}", shapes={})
        token = state["token"]
        total = sum(put_pieces(cluster, f"{token}.{i}", x, layouts[i]) for i, x in sorted(arrays.items()))
        state["shapes"].update({i: x.shape for i, x in arrays.items()})
        return total

    def resident(self, cluster: Any) -> tuple[str, ...]:
        """The names of the inputs kept on ``cluster``'s devices."""
        state = self.state_for(cluster)
        return tuple(self.input_names[i] for i in sorted(state["shapes"])) if state else ()

    # -- running ------------------------------------------------------------------------------------
    def execute_on(self, cluster: Any, *arrays: np.ndarray) -> np.ndarray:
        """The forward on ``cluster``: ``arrays`` are the inputs not placed (in order), or every input."""
        names, n = self.input_names, len(self.input_names)
        state = self.state_for(cluster) or {"token": "tp.run", "shapes": {}}
        placed = state["shapes"]
        if len(arrays) == n:
            positions = list(range(n))
        elif len(arrays) == n - len(placed):
            positions = [i for i in range(n) if i not in placed]
        else:
            kept = f"; {', '.join(names[i] for i in sorted(placed))} kept on the devices" if placed else ""
            wanted = ", ".join(names[i] for i in range(n) if i not in placed)
            raise ShardingError(f"{self._label()}: expected {n - len(placed)} inputs ({wanted}){kept} or all "
                                f"{n} ({', '.join(names)}), got {len(arrays)}")
        given = {i: np.asarray(x) for i, x in zip(positions, arrays)}
        shapes = [given[i].shape if i in given else placed[i] for i in range(n)]
        layer = self.bind(cluster.mesh)
        out_shape = layer.output_shape(shapes)
        check_layer("execute", layer, shapes, out_shape, cluster.mesh)
        token = state["token"]
        layouts = layer.input_layouts()
        for i, x in given.items():
            put_pieces(cluster, f"{token}.in{i}", x, layouts[i])
        keys = tuple(f"{token}.in{i}" if i in given else f"{token}.{i}" for i in range(n))
        return run_layer(cluster, layer, keys, tuple(f"{token}.in{i}" for i in given), out_shape)

    def peak_bytes(self, cluster: Any) -> list[int]:
        """Each device's measured peak memory during the last execute (bytes)."""
        return cluster.run(peak_on_device)
