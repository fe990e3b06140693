"""Graphs of sharded operations: a ``networkx.DiGraph`` run in topological order on the devices.

Nodes are ``ShardedOperation``s (node attribute ``op``); an edge ``u -> v`` with attribute
``port=i`` feeds u's output into v's input i; inputs with no edge are the graph's inputs, taken
from the host in the order of ``graph.graph["inputs"]`` (a list of (node, port)).  When an output's
spec differs from the consumer's input spec, the edge is redistributed on the devices by
:func:`~virtualpar.sharding.plan_redistribution` — the fewest collectives — never through the host.
The sink nodes' outputs come back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from ..errors import UsageError
from ..sharding import plan_redistribution, shard, unshard

__all__ = ["GraphOperation", "as_executable"]


@dataclass
class GraphOperation:
    graph: nx.DiGraph

    def execute_on(self, cluster: Any, *arrays: np.ndarray) -> Any:
        g = self.graph
        if not nx.is_directed_acyclic_graph(g):
            raise UsageError("a graph of operations must be acyclic")
        order = list(nx.topological_sort(g))
        inputs = g.graph.get("inputs", [])
        if len(inputs) != len(arrays):
            raise UsageError(f"the graph takes {len(inputs)} host inputs ({inputs}), got {len(arrays)}")
        shapes: dict[tuple[Any, int], tuple[int, ...]] = {}
        for (node, port), a in zip(inputs, arrays):
            spec = g.nodes[node]["op"].in_specs[port]
            for r, piece in enumerate(shard(np.asarray(a), spec, cluster.mesh)):
                cluster.put(r, f"graph/{node}/in{port}", piece, block=False)
            shapes[(node, port)] = np.shape(a)
        plans = {}
        for u, v, data in g.edges(data=True):
            port = data.get("port", 0)
            src = g.nodes[u]["op"].out_specs[0]
            dst = g.nodes[v]["op"].in_specs[port]
            plans[(u, v)] = (port, src, dst)
        sinks = [n for n in order if g.out_degree(n) == 0]
        cluster.run(_run_graph, order, {n: g.nodes[n]["op"].program for n in order},
                    {n: len(g.nodes[n]["op"].in_specs) for n in order}, plans, sinks)
        outs = []
        for n in sinks:
            spec = g.nodes[n]["op"].out_specs[0]
            outs.append(unshard([cluster.get(r, f"graph/{n}/out") for r in range(cluster.mesh.size)], spec, cluster.mesh))
        return outs[0] if len(outs) == 1 else tuple(outs)


def _run_graph(dev: Any, order: list, programs: dict, n_inputs: dict, plans: dict, sinks: list) -> None:
    outputs: dict[Any, np.ndarray] = {}
    for node in order:
        args = [dev.state.pop(f"graph/{node}/in{i}", None) for i in range(n_inputs[node])]
        for (u, v), (port, src, dst) in plans.items():
            if v == node:
                x = outputs[u]
                if src != dst:
                    x = plan_redistribution(src, dst, _global_shape(dev, x, src), dev.mesh, x.dtype).run(dev, x)
                args[port] = x
        outputs[node] = programs[node](dev, *args)
    for n in sinks:
        dev.state[f"graph/{n}/out"] = outputs[n]


def _global_shape(dev: Any, x: np.ndarray, spec: Any) -> tuple[int, ...]:
    """The global shape of a piece under ``spec`` (even splits)."""
    import math

    return tuple(n * (math.prod(dev.mesh.shape[a] for a in d.axes) if d.axes else 1) for n, d in zip(x.shape, spec.dims))


def as_executable(obj: Any) -> Any:
    """What ``cluster.execute`` runs for ``obj``: a ``networkx.DiGraph`` of operations becomes a
    ``GraphOperation``; anything else must have ``execute_on``."""
    if isinstance(obj, nx.DiGraph):
        return GraphOperation(obj)
    raise UsageError(f"cluster.execute needs an operation (with execute_on) or a networkx.DiGraph of them, "
                     f"got {type(obj).__name__}")
