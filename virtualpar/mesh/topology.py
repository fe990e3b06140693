"""Network topologies: a networkx graph of devices and switches whose links carry α (latency) and β⁻¹ (bandwidth).

A message of ``n`` bytes from device ``s`` to device ``d`` follows one route and costs

    T(n) = Σ_{links on the route} latency  +  n / min_{links on the route} bandwidth

i.e. the α–β (Hockney) model with store-and-forward latency and a cut-through bottleneck bandwidth.
Contention between concurrent messages is not modelled here (the cost model may add it).

Device nodes are the ints ``0..n-1`` (the global rank); every other node is a switch named by a
string (``"node0-switch"``, ``"core-switch"``).  Graphs are undirected: each link is full duplex with
the same figures in both directions.  A route is the minimum-total-latency path; ties go to fewer
hops, then to the lexicographically smallest path (devices before switches, ints by value, strings
by text) listed from the lower-numbered endpoint; the opposite direction reuses that path reversed,
so a route and its reverse always have equal cost.

``Link`` and ``Route`` (the values a topology hands out) live in ``route.py``; the graphs of the
presets and the NVLink / InfiniBand figures they default to, in ``presets.py``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from typing import Any

import networkx as nx
import numpy as np

from virtualpar.errors import MeshError
from virtualpar.mesh import presets
from virtualpar.mesh.presets import INFINIBAND_BANDWIDTH, INFINIBAND_LATENCY, NVLINK_BANDWIDTH, NVLINK_LATENCY
from virtualpar.mesh.route import Link, Route, check_figures, direct_figures

__all__ = [
    "Link",
    "Route",
    "Topology",
    "TOPOLOGIES",
    "NVLINK_LATENCY",
    "NVLINK_BANDWIDTH",
    "INFINIBAND_LATENCY",
    "INFINIBAND_BANDWIDTH",
]


def _is_device(node: Hashable) -> bool:
    return isinstance(node, int) and not isinstance(node, bool)


def _node_key(node: Hashable) -> tuple[int, Any]:
    """Total order on mixed int/str nodes: devices (by value) before switches (by name)."""
    return (0, node) if _is_device(node) else (1, node)


class Topology:
    """An immutable network of ``num_devices`` devices (int nodes) and switches (str nodes).

    ``Topology(graph, name=...)`` copies and freezes ``graph`` (an undirected ``networkx.Graph``
    whose every edge has ``latency`` and ``bandwidth``) and checks that all devices are connected.
    Equality and hashing are by structure (nodes, edges and their figures), not by name.
    """

    def __init__(self, graph: nx.Graph, *, name: str | None = None) -> None:
        if not isinstance(graph, nx.Graph) or graph.is_directed() or graph.is_multigraph():
            raise MeshError(f"a topology needs an undirected networkx.Graph; got {type(graph).__name__}")
        devices = sorted(n for n in graph.nodes if _is_device(n))
        n = len(devices)
        if n == 0 or devices != list(range(n)):
            raise MeshError(f"topology device nodes must be the ints 0..n-1 with n >= 1; got {devices}")
        others = [v for v in graph.nodes if not _is_device(v)]
        bad = [v for v in others if not isinstance(v, str)]
        if bad:
            raise MeshError(f"topology switch nodes must be strings; got {bad!r}")
        g = nx.Graph()
        g.add_nodes_from(devices)
        g.add_nodes_from(sorted(others))
        # one pass: check and copy the edges; build routing's plain adjacency (in the driver, once)
        adj: dict[Hashable, dict[Hashable, tuple[tuple, float]]] = {v: {} for v in g.nodes}
        edges: dict[tuple[float, float], list] = {}
        direct, min_latency = direct_figures(n), math.inf
        for u, v, data in graph.edges(data=True):
            if u == v:
                raise MeshError(f"topology has a self-loop on node {u!r}")
            if "latency" not in data or "bandwidth" not in data:
                raise MeshError(f"topology edge ({u!r}, {v!r}) needs 'latency' and 'bandwidth' "
                                f"attributes; got {sorted(data)}")
            lat, bw = check_figures(f"topology edge ({u!r}, {v!r})", data["latency"], data["bandwidth"])
            edges.setdefault((lat, bw), []).append((u, v))  # no dict per edge: few distinct figures
            adj[u][v], adj[v][u] = (_node_key(v), lat), (_node_key(u), lat)
            min_latency = min(min_latency, lat)
            if _is_device(u) and _is_device(v):
                direct[0][u, v] = direct[0][v, u] = lat
                direct[1][u, v] = direct[1][v, u] = bw
        for (lat, bw), pairs in edges.items():
            g.add_edges_from(pairs, latency=lat, bandwidth=bw)
        component = nx.node_connected_component(g, 0)
        missing = [d for d in devices if d not in component]
        if missing:
            raise MeshError(f"topology {name or 'graph'} is disconnected: no path between device 0 and "
                            f"device {missing[0]} (unreachable devices: {missing})")
        min_latency = 0.0 if min_latency == math.inf else min_latency
        longer = direct[0] > 2 * min_latency  # a detour may be shorter: route() decides those
        direct[0][longer] = direct[1][longer] = np.nan
        for key, value in (("_graph", nx.freeze(g)), ("_n", n), ("_name", name or f"custom({n})"), ("_routes", {}),
                           ("_figures", {}), ("_key", None), ("_adj", (adj, min_latency)), ("_direct", direct)):
            object.__setattr__(self, key, value)  # _direct: what devices read (see route.direct_figures)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Topology is immutable; cannot set {key!r}")

    # -- pickling: drop the caches, keep the graph and the name -----------------------------------
    def __reduce__(self):
        return (_rebuild_topology, (nx.Graph(self._graph), self._name))

    # -- properties -------------------------------------------------------------------------------
    @property
    def graph(self) -> nx.Graph:
        """The frozen graph (modifying it raises ``networkx.NetworkXError``)."""
        return self._graph

    @property
    def num_devices(self) -> int:
        return self._n

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(range(self._n))

    @property
    def name(self) -> str:
        return self._name

    def _check_device(self, node: Any, role: str) -> int:
        if not _is_device(node) or not 0 <= node < self._n:
            raise MeshError(f"route {role} must be a device 0..{self._n - 1} of topology {self._name}; got {node!r}")
        return node

    def link(self, u: Hashable, v: Hashable) -> Link:
        """The figures of the direct link between nodes ``u`` and ``v``."""
        if not self._graph.has_edge(u, v):
            raise MeshError(f"topology {self._name} has no link between {u!r} and {v!r}")
        data = self._graph.edges[u, v]
        return Link(data["latency"], data["bandwidth"])

    def route(self, src: int, dst: int) -> Route:
        """The minimum-latency route from device ``src`` to device ``dst`` (cached, deterministic)."""
        self._check_device(src, "source")
        self._check_device(dst, "destination")
        if (src, dst) in self._routes:
            return self._routes[(src, dst)]
        if src == dst:
            route = Route(src, dst, (src,), (), 0.0, math.inf)
        else:
            lo, hi = min(src, dst), max(src, dst)
            path = self._best_path(lo, hi)
            if src != lo:
                path = path[::-1]
            links = tuple(zip(path[:-1], path[1:]))
            latency = 0.0
            for u, v in links:  # summed in path order, as the search did, so ties stay exact
                latency += self._graph.edges[u, v]["latency"]
            bandwidth = min(self._graph.edges[u, v]["bandwidth"] for u, v in links)
            route = Route(src, dst, path, links, latency, bandwidth)
        self._routes[(src, dst)] = route
        return route

    def figures(self, src: int, dst: int) -> tuple[float, float]:
        """``(latency, bandwidth)`` of the route ``src -> dst`` without a :class:`Route` (a replay asks n·⌈log2 n⌉)."""
        if _is_device(src) and _is_device(dst) and 0 <= src < self._n and 0 <= dst < self._n:
            lat, bw = self._direct
            latency = lat.item(src, dst)
            if latency == latency:  # not NaN: the direct link is the route
                return latency, bw.item(src, dst)
        key = (src, dst)
        cached = self._figures.get(key)
        if cached is None:
            route = self.route(src, dst)
            cached = self._figures[key] = (route.latency, route.bandwidth)
        return cached

    def _best_path(self, src: int, dst: int) -> tuple[Hashable, ...]:
        """Dijkstra on the label (latency, hops, path keys): lexicographic, so ties are deterministic.
        A direct link no longer than twice the smallest link latency wins outright (O(1)); else a
        label is pushed only if it beats its node's best, and a node whose cheapest extension is
        worse than dst's label is not expanded (64 fully connected devices: O(degree·log) a route)."""
        adj, min_latency = self._adj
        direct = adj[src].get(dst)
        if direct is not None and direct[1] <= 2 * min_latency:
            return (src, dst)
        best: dict[Hashable, tuple] = {src: (0.0, 0, (_node_key(src),))}
        heap: list[tuple[float, int, tuple, tuple]] = [(0.0, 0, (_node_key(src),), (src,))]
        settled: set[Hashable] = set()
        while heap:
            lat, hops, keys, path = heapq.heappop(heap)
            node = path[-1]
            if node in settled:
                continue
            settled.add(node)
            if node == dst:
                return path
            target = best.get(dst)
            if target is not None and (lat + min_latency, hops + 1) > target[:2]:
                continue  # nothing through this node can reach dst with a better label
            for nbr, (key, latency) in adj[node].items():
                if nbr in settled:
                    continue
                label = (lat + latency, hops + 1, keys + (key,))
                known = best.get(nbr)
                if known is None or label < known:
                    best[nbr] = label
                    heapq.heappush(heap, (*label, path + (nbr,)))
        raise MeshError(f"topology {self._name} has no path between device {src} and device {dst}")

    # -- value semantics ----------------------------------------------------------------------------
    def _structure(self) -> tuple:
        if self._key is None:
            edges = []
            for u, v, d in self._graph.edges(data=True):
                a, b = sorted((_node_key(u), _node_key(v)))
                edges.append((a, b, d["latency"], d["bandwidth"]))
            switches = tuple(sorted(v for v in self._graph.nodes if not _is_device(v)))
            object.__setattr__(self, "_key", (self._n, switches, tuple(sorted(edges))))
        return self._key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self is other or self._structure() == other._structure()

    def __hash__(self) -> int:
        return hash(self._structure())

    def __repr__(self) -> str:
        return f"Topology<{self._name}: {self._n} devices, {self._graph.number_of_edges()} links>"

    # -- presets ------------------------------------------------------------------------------------
    @classmethod
    def fully_connected(cls, n: int, latency: float = NVLINK_LATENCY,
                        bandwidth: float = NVLINK_BANDWIDTH) -> Topology:
        """A direct link between every pair of ``n`` devices (one NVSwitch node): every route is 1 hop."""
        graph, name = presets.fully_connected(n, latency, bandwidth)
        return cls(graph, name=name)

    @classmethod
    def ring(cls, n: int, latency: float = NVLINK_LATENCY, bandwidth: float = NVLINK_BANDWIDTH) -> Topology:
        """A bidirectional ring i -- (i+1) mod n; route i->j takes min(|i-j|, n-|i-j|) hops.

        n=1 has no links; n=2 has a single link (not two parallel ones).
        """
        graph, name = presets.ring(n, latency, bandwidth)
        return cls(graph, name=name)

    @classmethod
    def torus2d(cls, rows: int, cols: int, latency: float = NVLINK_LATENCY,
                bandwidth: float = NVLINK_BANDWIDTH) -> Topology:
        """A rows x cols torus (TPU-style ICI): device r sits at (r // cols, r % cols) with wrap-around links.

        Hops between (a, b) and (c, d): min(|a-c|, rows-|a-c|) + min(|b-d|, cols-|b-d|).  A dimension
        of size 1 has no links and one of size 2 has a single link per pair (no self-loops, no
        doubled edges; the doubled bandwidth of a real size-2 wrap is not modelled).
        """
        graph, name = presets.torus2d(rows, cols, latency, bandwidth)
        return cls(graph, name=name)

    @classmethod
    def hierarchical(cls, nodes: int, devices_per_node: int,
                     intra_latency: float = NVLINK_LATENCY, intra_bandwidth: float = NVLINK_BANDWIDTH,
                     inter_latency: float = INFINIBAND_LATENCY,
                     inter_bandwidth: float = INFINIBAND_BANDWIDTH) -> Topology:
        """``nodes`` machines of ``devices_per_node`` GPUs: NVLink inside, a two-level network between.

        Device r lives in node ``r // devices_per_node``.  Inside a node every pair has a direct
        intra link.  Each device also has an inter link to ``"node{i}-switch"`` (its NIC / leaf
        switch), and every node switch has an inter link to ``"core-switch"``.  So::

            same node:   r -> s                                        1 hop,  α_intra, β_intra
            cross node:  r -> node{i}-switch -> core-switch -> node{j}-switch -> s
                                                                       4 hops, 4·α_inter, β_inter

        (with the minimum-latency rule a same-node route goes through the switch only if
        2·α_inter < α_intra).
        """
        graph, name = presets.hierarchical(nodes, devices_per_node, intra_latency, intra_bandwidth,
                                           inter_latency, inter_bandwidth)
        return cls(graph, name=name)


def _rebuild_topology(graph: nx.Graph, name: str) -> Topology:
    return Topology(graph, name=name)


#: Preset builders by name; ``TOPOLOGIES["ring"](8)``.  Unknown names raise ``KeyError`` (plain dict).
TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "fully_connected": Topology.fully_connected,
    "ring": Topology.ring,
    "torus2d": Topology.torus2d,
    "hierarchical": Topology.hierarchical,
}
