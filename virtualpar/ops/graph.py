"""Graphs of sharded operations: a ``networkx.DiGraph`` run in topological order on the devices.

Nodes are ``ShardedOperation``s (node attribute ``op``); an edge ``u -> v`` with attribute
``port=i`` feeds u's output into v's input i; inputs with no edge are the graph's inputs, taken
from the host in the order of ``graph.graph["inputs"]`` (a list of (node, port)).  When an output's
spec differs from the consumer's input spec, the edge is redistributed on the devices by
:func:`~virtualpar.sharding.plan_redistribution` — the fewest collectives — never through the host.
The sink nodes' outputs come back to the host, in the order the nodes were added to the graph.

Every input port of every node is fed exactly once — by one edge or by one host input — and every
node has one output: a graph that breaks this is refused before anything runs, naming the node and
port (an unfed port once took whatever an earlier, failed run had left on the devices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from ..errors import ShardingError, UsageError, VirtualParError
from ..executable import as_executable as _as_executable, register_executable
from ..sharding import plan_redistribution, shard, unshard
from .placement import PlacedOperation

__all__ = ["GraphOperation", "as_executable"]


@dataclass
class GraphOperation(PlacedOperation):
    """A ``graph`` of ``ShardedOperation``s (see the module doc) run by ``cluster.execute(op, *host_arrays)``:
    the host arrays feed ``graph.graph["inputs"]`` in order; returns the sink nodes' outputs (one, or a
    tuple).
    It keeps nothing on a cluster between runs (every input is fed each time), so its record of
    clusters (``PlacedOperation``) stays empty; its nodes keep their own."""

    graph: nx.DiGraph

    def execute_on(self, cluster: Any, *arrays: np.ndarray) -> Any:
        g = self.graph
        if isinstance(g, nx.MultiGraph):
            raise UsageError("a graph of operations is a networkx.DiGraph (one edge per "
                             "pair of nodes, its port an "
                             "attribute), not a MultiDiGraph")
        if not nx.is_directed_acyclic_graph(g):
            raise UsageError("a graph of operations must be acyclic")
        order = list(nx.topological_sort(g))
        inputs = [tuple(i) for i in g.graph.get("inputs",
                                                [])] if isinstance(g.graph.get("inputs", []), list) else None
        if inputs is None or any(len(i) != 2 for i in inputs):
            raise UsageError("graph.graph['inputs'] must be a list of (node, port) pairs, "
                             f"got {g.graph['inputs']!r}")
        _check_wiring(g, inputs)
        if len(inputs) != len(arrays):
            raise UsageError(f"the graph takes {len(inputs)} host inputs ({inputs}), got {len(arrays)}")
        shapes: dict[tuple[Any, int], tuple[int, ...]] = {}
        for (node, port), a in zip(inputs, arrays):
            spec = g.nodes[node]["op"].in_specs[port]
            try:
                pieces = shard(np.asarray(a), spec, cluster.mesh)
            except ShardingError as exc:
                raise ShardingError(f"graph input {(node, port)}: {exc}") from None
            for r, piece in enumerate(pieces):
                cluster.put(r, f"graph/{node}/in{port}", piece, block=False)
            shapes[(node, port)] = np.shape(a)
        _check_specs(g, cluster.mesh)
        plans = {}
        for u, v, data in g.edges(data=True):
            port = data.get("port", 0)
            src = g.nodes[u]["op"].out_specs[0]
            dst = g.nodes[v]["op"].in_specs[port]
            if len(src.dims) != len(dst.dims):
                raise UsageError(f"the edge {u!r} -> {v!r} (port {port}) carries "
                                 f"{len(src.dims)}-d values ({src}) into "
                                 f"a {len(dst.dims)}-d input spec ({dst})")
            plans[(u, v)] = (port, src, dst)
        sinks = [n for n in g.nodes if g.out_degree(n) == 0]  # in the order the nodes were added
        cluster.run(_run_graph, order, {n: g.nodes[n]["op"].program for n in order},
                    {n: len(g.nodes[n]["op"].in_specs) for n in order}, plans, sinks)
        outs = []
        for n in sinks:
            spec = g.nodes[n]["op"].out_specs[0]
            outs.append(unshard([cluster.get(r, f"graph/{n}/out") for r in range(cluster.mesh.size)], spec,
                                cluster.mesh))
        return outs[0] if len(outs) == 1 else tuple(outs)


def _check_specs(g: nx.DiGraph, mesh: Any) -> None:
    """Every spec names axes of this mesh: refused on the host, naming the node, before anything runs."""
    for n, data in g.nodes(data=True):
        op = data["op"]
        specs = [(f"input {i}", s) for i, s in enumerate(op.in_specs)] + [("output", op.out_specs[0])]
        for which, spec in specs:
            try:
                mesh.axes(list(spec.used_axes()))
                spec.partial_axes(mesh)
            except VirtualParError as exc:
                raise UsageError(f"node {n!r}, {which} spec {spec}: {exc.message}") from None


def _check_wiring(g: nx.DiGraph, inputs: list[tuple[Any, int]]) -> None:
    """Every node an operation with one output; every input port fed exactly once (see the module doc)."""
    fed: dict[tuple[Any, int], str] = {}

    def feed(node: Any, port: Any, by: str) -> None:
        if node not in g:
            raise UsageError(f"{by} feeds node {node!r}, which is not in the graph")
        n_in = len(g.nodes[node]["op"].in_specs)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < n_in:
            raise UsageError(f"{by} feeds port {port!r} of node {node!r}, which has ports 0..{n_in - 1}")
        if (node, port) in fed:
            raise UsageError(f"port {port} of node {node!r} is fed twice: by {fed[(node, port)]} and by {by}")
        fed[(node, port)] = by

    for n, data in g.nodes(data=True):
        op = data.get("op")
        if op is None or not all(hasattr(op, a) for a in ("program", "in_specs", "out_specs")):
            raise UsageError(f"node {n!r} needs an 'op' attribute that is a ShardedOperation, got {op!r}")
        if len(op.out_specs) != 1:
            raise UsageError(f"node {n!r} has {len(op.out_specs)} outputs; a node of a graph has one")
    for node, port in inputs:
        feed(node, port, f"host input {(node, port)}")
    for u, v, data in g.edges(data=True):
        feed(v, data.get("port", 0), f"the edge {u!r} -> {v!r}")
    for n, data in g.nodes(data=True):
        for port in range(len(data["op"].in_specs)):
            if (n, port) not in fed:
                raise UsageError(f"port {port} of node {n!r} is fed by nothing: give it "
                                 f"an edge (port={port}) or "
                                 f"list {(n, port)} in graph.graph['inputs'] (op.place() "
                                 "does not apply in graphs)")


def _run_graph(dev: Any, order: list, programs: dict, n_inputs: dict, plans: dict, sinks: list) -> None:
    outputs: dict[Any, np.ndarray] = {}
    for node in order:
        fed = {port for (u, v), (port, _, _) in plans.items() if v == node}
        args = [None if i in fed else dev.state.pop(f"graph/{node}/in{i}") for i in range(n_inputs[node])]
        for (u, v), (port, src, dst) in plans.items():
            if v == node:
                x = outputs[u]
                if src != dst:
                    try:
                        x = plan_redistribution(src, dst, _global_shape(dev, x, src), dev.mesh,
                                                x.dtype).run(dev, x)
                    except VirtualParError as exc:  # say which edge
                        raise _located(dev, exc, f"on the edge {u!r} -> {node!r} (port {port})") from None
                args[port] = x
        try:
            outputs[node] = programs[node](dev, *args)
        except Exception as exc:
            if isinstance(exc, VirtualParError):
                raise _located(dev, exc, f"in graph node {node!r}") from None
            exc.add_note(f"(in graph node {node!r})")
            raise
    for n in sinks:
        dev.state[f"graph/{n}/out"] = outputs[n]


def _located(dev: Any, exc: VirtualParError, where: str) -> VirtualParError:
    """``exc`` saying ``where`` it happened, after the device's name if it starts with it, and
    keeping its traceback (the user's program's frames)."""
    head = f"{dev.name}: "
    msg = exc.message
    text = head + f"{where}: " + msg[len(head):] if msg.startswith(head) else f"{where}: {msg}"
    return exc.replace(text).with_traceback(exc.__traceback__)


def _global_shape(dev: Any, x: np.ndarray, spec: Any) -> tuple[int, ...]:
    """The global shape of a piece under ``spec`` (even splits)."""
    return tuple(n * (math.prod(dev.mesh.shape[a] for a in d.axes) if d.axes else 1)
                 for n, d in zip(x.shape, spec.dims))


def as_executable(obj: Any) -> Any:
    """What ``cluster.execute`` runs for ``obj``: a ``networkx.DiGraph`` of operations becomes a
    ``GraphOperation``; anything else must have ``execute_on`` (see :mod:`virtualpar.executable`)."""
    return _as_executable(obj)


# cluster.execute(graph, ...), without the runtime importing this layer
register_executable(nx.DiGraph, GraphOperation)
