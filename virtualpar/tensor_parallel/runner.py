"""Run a sharded layer's forward and backward on a cluster and measure each phase.

Differentiation is ``virtualpar.nn.vjp`` (forward now, backward later).  A *layer* here is anything with
``input_layouts()`` (one layout per differentiable input, in order), ``output_layout()`` and ``forward(dev,
*inputs)`` written with :mod:`.autodiff`.  The host places each device's input pieces in ``dev.state`` (they
stay there: weights placed once are resident), runs the forward, which keeps its vjp on the device, and later
the backward with the output cotangent in the output's layout ("forward now, backward later").  Each phase is
measured from the cluster itself: bytes from ``cluster.stats()``, collectives and FLOPs from the trace's
collective and compute events, wall time on this machine, modelled time from the clocks.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import nn

from ..errors import ShardingError, UsageError
from ..sharding import unshard
from .execute import put_pieces
from .layout import Layout, check_layer
from .matmul import MatMul

__all__ = ["Phase", "place", "run_forward", "run_backward"]

_IN, _VJP, _DY = "tp.in.", "tp.vjp", "tp.dy"


@dataclass(frozen=True)
class Phase:
    """What one phase did, per device (rank order) unless said otherwise."""

    collectives: tuple[tuple[str, ...], ...]  # per device: collective names in call order
    groups: tuple[tuple[tuple[int, ...], ...], ...]  # per device: each collective's group (ranks)
    bytes_sent: tuple[int, ...]               # device -> device payload
    host_to_device: tuple[int, ...]
    device_to_host: tuple[int, ...]
    flops: tuple[float, ...]
    wall: float                               # seconds on this machine (driver side)
    model: float                              # modelled seconds: slowest device's clock advance


def place(cluster: Any, arrays: Sequence[np.ndarray], layouts: Sequence[Layout],
          keys: Sequence[str] | None = None) -> int:
    """Put every device's piece of each array in ``dev.state`` (under ``tp.in.<i>`` or ``keys``).
    Returns the host->device bytes sent."""
    return sum(put_pieces(cluster, keys[i] if keys else f"{_IN}{i}", x, lay)
               for i, (x, lay) in enumerate(zip(arrays, layouts)))


def _forward_on_device(dev: Any, layer: Any, keys: tuple[str, ...]) -> np.ndarray:
    # nn.vjp: the one differentiation mechanism of the project; every input of the layer (weights
    # included) is an input here, so the backward returns one gradient per input, in order
    rec = nn.vjp(lambda params, *xs: layer.forward(dev, *xs), *(dev.state[k] for k in keys), params={})
    dev.state[_VJP] = rec
    return rec.output


def _backward_on_device(dev: Any) -> tuple[np.ndarray, ...]:
    rec = dev.state.pop(_VJP)  # run_backward checked that this cluster's devices hold one
    grads = rec.backward_input(dev.state.pop(_DY))
    return grads if isinstance(grads, tuple) else (grads,)


def _measure(cluster: Any, fn: Any, *args: Any) -> tuple[list[Any], Phase]:
    cluster.reset_stats()
    cluster.clear_trace()
    before = cluster.clocks()
    t0 = time.perf_counter()
    results = cluster.run(fn, *args)
    wall = time.perf_counter() - t0
    after = cluster.clocks()
    st = cluster.stats()
    n = cluster.size
    names: list[list[str]] = [[] for _ in range(n)]
    groups: list[list[tuple[int, ...]]] = [[] for _ in range(n)]
    flops = [0.0] * n
    for e in cluster.trace():
        if e.kind == "collective":
            names[e.rank].append(e.name)
            groups[e.rank].append(tuple(e.group or ()))
        elif e.kind == "compute":
            flops[e.rank] += float(e.arg("flops", 0.0))
    phase = Phase(tuple(map(tuple, names)), tuple(map(tuple, groups)), tuple(st.sent(r) for r in range(n)),
                  tuple(int(v) for v in st.host_to_device), tuple(int(v) for v in st.device_to_host),
                  tuple(flops), wall, max(after) - max(before))
    return results, phase


def run_forward(cluster: Any, layer: Any, inputs: Sequence[np.ndarray], out_shape: Sequence[int],
                keys: Sequence[str] | None = None,
                placed: bool = False) -> tuple[np.ndarray, list[np.ndarray], Phase]:
    """Forward on every device: (full output, output pieces in rank order, the phase measured).

    ``placed``: the inputs are already resident under ``keys`` (nothing is sent from the host).
    A layer whose policy is given by name (``MatMul("column")``) takes its axes from the cluster's mesh."""
    layer = _bind(layer, cluster.mesh)
    if not placed:
        check_layer("run_forward", layer, [np.shape(x) for x in inputs], out_shape, cluster.mesh)
        _check_matmul_shapes(layer, inputs, out_shape)
    keys = tuple(keys or (f"{_IN}{i}" for i in range(len(layer.input_layouts()))))
    if not placed:
        place(cluster, inputs, layer.input_layouts(), keys)
    _LAST_FORWARD.pop(cluster, None)  # a forward that fails leaves no forward to go back through
    pieces, phase = _measure(cluster, _forward_on_device, layer, keys)
    _LAST_FORWARD[cluster] = _program(layer)
    return unshard(pieces, layer.output_layout(), cluster.mesh, tuple(out_shape)), pieces, phase


def _bind(layer: Any, mesh: Any) -> Any:
    bind = getattr(layer, "bind", None)
    return bind(mesh) if bind is not None else layer


# the program of the forward each cluster's devices hold (each device keeps one, for one backward)
_LAST_FORWARD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _program(layer: Any) -> str:
    return f"{type(layer).__name__} {getattr(layer, 'policy', layer)}"


def run_backward(cluster: Any, layer: Any, dy: np.ndarray, in_shapes: Sequence[Sequence[int]]
                 ) -> tuple[list[np.ndarray], list[list[np.ndarray]], Phase]:
    """Backward of the last forward: (full input gradients, their pieces per input, the phase).
    ``layer`` must be the one that forward ran (the devices hold its saved values, nothing else's)."""
    layer = _bind(layer, cluster.mesh)
    last = _LAST_FORWARD.get(cluster)
    if last is None:
        raise UsageError("run_backward has no forward to go back through on this "
                         "cluster: call run_forward first "
                         "(each forward is gone back through once)")
    if last != _program(layer):
        raise UsageError(f"run_backward({_program(layer)}) after a forward of {last}: the devices hold that "
                         "forward's saved values; run the forward of this layer first")
    check_layer("run_backward", layer, in_shapes, np.shape(dy), cluster.mesh)
    del _LAST_FORWARD[cluster]  # the devices drop it below, whatever happens
    place(cluster, [dy], [layer.output_layout()], [_DY])
    per_device, phase = _measure(cluster, _backward_on_device)
    grads, pieces = [], []
    for i, (lay, shape) in enumerate(zip(layer.input_layouts(), in_shapes)):
        ps = [g[i] for g in per_device]
        pieces.append(ps)
        grads.append(unshard(ps, lay, cluster.mesh, tuple(shape)))
    return grads, pieces, phase


def _check_matmul_shapes(layer: Any, inputs: Sequence[np.ndarray], out_shape: Sequence[int]) -> None:
    """A MatMul's global shapes, checked on the host: A (m, k) @ B (k, n) -> (m, n); a mismatch
    was reported by a device in its shards' shapes ((8, 4) @ (3, 16) for (8, 16) @ (12, 16))."""
    if isinstance(layer, MatMul) and len(inputs) == 2:
        a, b = (np.shape(x) for x in inputs)
        if len(a) == 2 and len(b) == 2 and (a[1] != b[0] or tuple(out_shape) != (a[0], b[1])):
            raise ShardingError(f"run_forward: MatMul of A {a} @ B {b} gives "
                                f"{(a[0], b[1]) if a[1] == b[0] else 'nothing'}"
                                f"{'' if a[1] == b[0] else f' (inner dimensions {a[1]} and {b[0]} differ)'}; "
                                f"out_shape is {tuple(out_shape)}")
