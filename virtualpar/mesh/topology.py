"""Network topologies: a networkx graph of devices and switches whose links carry α (latency) and β⁻¹
(bandwidth).

A message of ``n`` bytes from device ``s`` to device ``d`` follows one route and costs

    T(n) = Σ_{links on the route} latency  +  n / min_{links on the route} bandwidth

i.e. the α–β (Hockney) model with store-and-forward latency and a cut-through bottleneck bandwidth
(contention between concurrent messages is not modelled here; the cost model may add it).

Device nodes are the ints ``0..n-1`` (the global rank); every other node is a switch named by a
string (``"node0-switch"``, ``"core-switch"``).  Graphs are undirected: each link is full duplex with
the same figures in both directions.  A route is the minimum-total-latency path; ties go to fewer
hops, then to the lexicographically smallest path (devices before switches, ints by value, strings
by text) listed from the lower-numbered endpoint; the opposite direction reuses that path reversed,
so a route and its reverse always have equal cost.

``Link``, ``Route`` and the route search live in ``route.py``; the presets' graphs and the
NVLink / InfiniBand figures they default to, in ``presets.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import Any

import networkx as nx
import numpy as np

from virtualpar.errors import MeshError
from virtualpar.mesh import presets
from virtualpar.mesh.presets import INFINIBAND_BANDWIDTH, INFINIBAND_LATENCY, NVLINK_BANDWIDTH, NVLINK_LATENCY
from virtualpar.mesh.route import (
    Link,
    Route,
    best_path,
    check_figures,
    direct_figures,
    gather_figures,
    is_device,
    node_key,
    routing_tables,
)

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


class Topology:
    """An immutable network of ``num_devices`` devices (int nodes) and switches (str nodes).

    ``Topology(graph, name=...)`` copies and freezes ``graph`` (an undirected ``networkx.Graph``
    whose every edge has ``latency`` and ``bandwidth``) and checks that all devices are connected.
    Equality and hashing are by structure (nodes, edges and their figures), not by name.
    """

    def __init__(self, graph: nx.Graph, *, name: str | None = None) -> None:
        n, g, adj, min_latency, direct = routing_tables(graph, name)
        self._set_fields(n, name or f"custom({n})", direct, nx.freeze(g), (adj, min_latency), None)

    def _set_fields(self, n: int, name: str, direct: tuple, graph: Any, adj: Any, recipe: Any) -> None:
        for key, value in (("_graph", graph), ("_n", n), ("_name", name), ("_routes", {}), ("_figures", {}),
                           ("_key", None), ("_adj", adj), ("_direct", direct), ("_recipe", recipe)):
            object.__setattr__(self, key, value)  # _direct: what devices read (see route.direct_figures)

    def _full(self) -> "Topology":
        """Self, with its graph and routing tables: a preset built without them (``_recipe``) builds
        them on first use, exactly as ``Topology(graph)`` would have."""
        if self._graph is None:
            preset, args = self._recipe
            built = Topology(getattr(presets, preset)(*args)[0], name=self._name)
            for key in ("_adj", "_graph"):
                object.__setattr__(self, key, getattr(built, key))
        return self

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Topology is immutable; cannot set {key!r}")

    # -- pickling: drop the caches, keep the graph (or the preset's recipe) and the name -------------
    def __reduce__(self):
        return (_preset_topology, self._recipe) if self._recipe else (_rebuild_topology,
                                                                      (nx.Graph(self._graph), self._name))

    # -- properties -------------------------------------------------------------------------------
    @property
    def graph(self) -> nx.Graph:
        """The frozen graph (modifying it raises ``networkx.NetworkXError``)."""
        return self._full()._graph

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
        if not is_device(node) or not 0 <= node < self._n:
            raise MeshError(f"route {role} must be a device 0..{self._n - 1} of topology "
                            f"{self._name}; got {node!r}")
        return node

    def link(self, u: Hashable, v: Hashable) -> Link:
        """The figures of the direct link between nodes ``u`` and ``v``."""
        direct = self._direct_pair(u, v)
        if direct is not None:
            return Link(*direct)
        graph = self.graph
        if not graph.has_edge(u, v):
            raise MeshError(f"topology {self._name} has no link between {u!r} and {v!r}")
        data = graph.edges[u, v]
        return Link(data["latency"], data["bandwidth"])

    def route(self, src: int, dst: int) -> Route:
        """The minimum-latency route from device ``src`` to device ``dst`` (cached, deterministic)."""
        self._check_device(src, "source")
        self._check_device(dst, "destination")
        if (src, dst) in self._routes:
            return self._routes[(src, dst)]
        direct = self._direct_pair(src, dst)
        if src == dst:
            route = Route(src, dst, (src,), (), 0.0, math.inf)
        elif direct is not None:  # the direct link is the route (what _best_path finds, without the graph)
            route = Route(src, dst, (src, dst), ((src, dst),), *direct)
        else:
            lo, hi = min(src, dst), max(src, dst)
            path = self._best_path(lo, hi)
            if src != lo:
                path = path[::-1]
            links = tuple(zip(path[:-1], path[1:]))
            latency, edges = 0.0, self.graph.edges
            for u, v in links:  # summed in path order, as the search did, so ties stay exact
                latency += edges[u, v]["latency"]
            bandwidth = min(edges[u, v]["bandwidth"] for u, v in links)
            route = Route(src, dst, path, links, latency, bandwidth)
        self._routes[(src, dst)] = route
        return route

    def _direct_pair(self, u: Hashable, v: Hashable) -> tuple[float, float] | None:
        """(latency, bandwidth) of devices u, v's direct link if it is their route (not NaN), else None."""
        if is_device(u) and is_device(v) and 0 <= u < self._n and 0 <= v < self._n:
            latency = self._direct[0].item(u, v)
            return (latency, self._direct[1].item(u, v)) if latency == latency else None
        return None

    def figures(self, src: int, dst: int) -> tuple[float, float]:
        """``(latency, bandwidth)`` of the route ``src -> dst`` without a :class:`Route` (a replay asks
        n·⌈log2 n⌉)."""
        direct = self._direct_pair(src, dst)
        if direct is not None:
            return direct
        key = (src, dst)
        cached = self._figures.get(key)
        if cached is None:
            route = self.route(src, dst)
            cached = self._figures[key] = (route.latency, route.bandwidth)
        return cached

    def figures_many(self, src: Any, dst: Any) -> tuple[np.ndarray, np.ndarray]:
        """``figures`` of the pairs ``(src[i], dst[i])`` as two arrays: one lookup of the direct tables."""
        return gather_figures(self._direct, self.figures, self._n, src, dst)

    def _best_path(self, src: int, dst: int) -> tuple[Hashable, ...]:
        adj, min_latency = self._full()._adj
        return best_path(adj, min_latency, src, dst, self._name)

    # -- value semantics ----------------------------------------------------------------------------
    def _structure(self) -> tuple:
        if self._key is None:
            edges = []
            for u, v, d in self.graph.edges(data=True):
                a, b = sorted((node_key(u), node_key(v)))
                edges.append((a, b, d["latency"], d["bandwidth"]))
            switches = tuple(sorted(v for v in self.graph.nodes if not is_device(v)))
            object.__setattr__(self, "_key", (self._n, switches, tuple(sorted(edges))))
        return self._key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return self is other or self._structure() == other._structure()

    def __hash__(self) -> int:
        return hash(self._structure())

    def __repr__(self) -> str:
        links = self._n * (self._n - 1) // 2 if self._graph is None else self._graph.number_of_edges()
        return f"Topology<{self._name}: {self._n} devices, {links} links>"

    # -- presets ------------------------------------------------------------------------------------
    @classmethod
    def fully_connected(cls, n: int, latency: float = NVLINK_LATENCY,
                        bandwidth: float = NVLINK_BANDWIDTH) -> Topology:
        """A direct link between every pair of ``n`` devices (one NVSwitch node): every route is 1 hop.

        Built without its n(n−1)/2-edge graph, which ``graph``, ``link``, ``route`` and equality
        build on first use: devices read only the direct-link tables (256 devices: the graph took
        0.25 s and 31 MB of the driver, which every device fork then paid ~1 ms to copy)."""
        presets.check_size("fully_connected: n", n)
        lat, bw = check_figures("fully_connected", latency, bandwidth)
        direct, off = direct_figures(n), ~np.eye(n, dtype=bool)
        direct[0][off], direct[1][off] = lat, bw
        topo = object.__new__(cls)
        topo._set_fields(n, f"fully_connected({n})", direct, None, None, ("fully_connected", (n, lat, bw)))
        return topo

    @classmethod
    def ring(cls, n: int, latency: float = NVLINK_LATENCY, bandwidth: float = NVLINK_BANDWIDTH) -> Topology:
        """A bidirectional ring i -- (i+1) mod n; route i->j takes min(|i-j|, n-|i-j|) hops (n=1: no
        links; n=2: a single link, not two parallel ones)."""
        graph, name = presets.ring(n, latency, bandwidth)
        return cls(graph, name=name)

    @classmethod
    def torus2d(cls, rows: int, cols: int, latency: float = NVLINK_LATENCY,
                bandwidth: float = NVLINK_BANDWIDTH) -> Topology:
        """A rows x cols torus (TPU-style ICI): device r sits at (r // cols, r % cols) with wrap-around links.
        Hops between (a, b) and (c, d): min(|a-c|, rows-|a-c|) + min(|b-d|, cols-|b-d|).  A dimension
        of size 1 has no links and one of size 2 a single link per pair (the doubled bandwidth of a
        real size-2 wrap is not modelled)."""
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


def _preset_topology(preset: str, args: tuple) -> Topology:
    return TOPOLOGIES[preset](*args)


#: Preset builders by name; ``TOPOLOGIES["ring"](8)``.  Unknown names raise ``KeyError`` (plain dict).
TOPOLOGIES: dict[str, Callable[..., Topology]] = {
    "fully_connected": Topology.fully_connected,
    "ring": Topology.ring,
    "torus2d": Topology.torus2d,
    "hierarchical": Topology.hierarchical,
}
