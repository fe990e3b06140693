"""A link and a route: the α–β (Hockney) cost of moving bytes over a topology.

``Link``: one full-duplex link, ``time(n) = α + n/β``.  ``Route``: the path a message takes, with
``latency`` = Σ α over its links and ``bandwidth`` = min β (the bottleneck), so that
``time(n) = Σα + n / min β`` (store-and-forward latency, cut-through bandwidth).  ``routing_tables``
checks a topology's graph and builds what the route search (``best_path``) reads.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from virtualpar.errors import MeshError

__all__ = ["Link", "Route", "check_figures", "direct_figures", "gather_figures", "best_path", "is_device",
           "node_key", "routing_tables"]


def is_device(node: Hashable) -> bool:
    return isinstance(node, int) and not isinstance(node, bool)


def node_key(node: Hashable) -> tuple[int, Any]:
    """Total order on mixed int/str nodes: devices (by value) before switches (by name)."""
    return (0, node) if is_device(node) else (1, node)


def check_figures(where: str, latency: float, bandwidth: float) -> tuple[float, float]:
    """Validate one link's figures: finite latency >= 0 s, bandwidth > 0 B/s (inf allowed)."""
    try:
        lat, bw = float(latency), float(bandwidth)
    except (TypeError, ValueError):
        raise MeshError(f"{where}: latency and bandwidth must be numbers; got latency={latency!r}, "
                        f"bandwidth={bandwidth!r}") from None
    if not (math.isfinite(lat) and lat >= 0.0):
        raise MeshError(f"{where}: latency must be a finite number of seconds >= 0; got {latency!r}")
    if not bw > 0.0:  # also rejects NaN
        raise MeshError(f"{where}: bandwidth must be > 0 bytes/second; got {bandwidth!r}")
    return lat, bw


def direct_figures(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Empty (NaN) n×n tables of ``(latency, bandwidth)`` for the device pairs whose route is their
    direct link, for ``Topology`` to fill: devices read them instead of the routing dicts, whose
    reference counts would copy the driver's pages into every device process (256 devices: 8 MiB
    each on their first barrier)."""
    return np.full((n, n), np.nan), np.full((n, n), np.nan)


def gather_figures(direct: tuple[np.ndarray, np.ndarray], figures: Any, n: int, src: Any, dst: Any
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``(latency, bandwidth)`` arrays of the routes ``src[i] -> dst[i]``: the direct tables read by
    one numpy index, ``figures(s, d)`` for the pairs whose route is not their direct link (NaN) —
    the same floats as asking ``figures`` pair by pair (a modelled schedule at 64 devices asked
    it 768 times in Python on its first call)."""
    s, d = np.asarray(src, dtype=np.intp), np.asarray(dst, dtype=np.intp)
    if s.shape != d.shape or s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= n):
        raise MeshError(f"figures_many: expected equal-length sequences of devices 0..{n - 1}; "
                        f"got {src!r} and {dst!r}")
    lat, bw = direct[0][s, d], direct[1][s, d]
    for i in np.flatnonzero(np.isnan(lat)).tolist():
        lat[i], bw[i] = figures(int(s[i]), int(d[i]))
    return lat, bw


def routing_tables(graph: Any, name: str | None
                   ) -> tuple[int, nx.Graph, dict, float, tuple[np.ndarray, np.ndarray]]:
    """Check ``graph`` as a topology's and build what routing reads: ``(n, graph, adj, min_latency,
    direct)``.

    ``graph`` is a canonical copy (devices, then switches sorted; edges grouped by figures);
    ``adj[u][v] = (node_key(v), latency)``, routing's plain adjacency; ``direct`` the device pairs'
    figures where a direct link is surely the route (``NaN`` where a detour may be shorter, for
    ``best_path`` to decide).  One pass over the edges, in the driver, once.
    """
    if not isinstance(graph, nx.Graph) or graph.is_directed() or graph.is_multigraph():
        raise MeshError(f"a topology needs an undirected networkx.Graph; got {type(graph).__name__}")
    devices = sorted(n for n in graph.nodes if is_device(n))
    n = len(devices)
    if n == 0 or devices != list(range(n)):
        raise MeshError(f"topology device nodes must be the ints 0..n-1 with n >= 1; got {devices}")
    others = [v for v in graph.nodes if not is_device(v)]
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
        adj[u][v], adj[v][u] = (node_key(v), lat), (node_key(u), lat)
        min_latency = min(min_latency, lat)
        if is_device(u) and is_device(v):
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
    return n, g, adj, min_latency, direct


@dataclass(frozen=True)
class Link:
    """One full-duplex link: ``latency`` in seconds, ``bandwidth`` in bytes/second per direction."""

    latency: float
    bandwidth: float

    def time(self, nbytes: int) -> float:
        """α + n/β: seconds to push ``nbytes`` across this link alone."""
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Route:
    """The path a message takes from device ``src`` to device ``dst``.

    ``latency`` = Σ link latencies along ``links``; ``bandwidth`` = min link bandwidth (the
    bottleneck).  A device's route to itself has no hops, latency 0 and bandwidth inf.
    """

    src: int
    dst: int
    path: tuple[Hashable, ...]
    links: tuple[tuple[Hashable, Hashable], ...]
    latency: float
    bandwidth: float

    @property
    def hops(self) -> int:
        return len(self.links)

    def time(self, nbytes: int) -> float:
        """T(n) = latency + n / bandwidth seconds (0 for a self-route)."""
        if nbytes < 0:
            raise MeshError(f"route {self.src}->{self.dst}: nbytes must be >= 0; got {nbytes!r}")
        return self.latency + (nbytes / self.bandwidth if nbytes else 0.0)


def best_path(adj: dict, min_latency: float, src: int, dst: int, name: str) -> tuple[Hashable, ...]:
    """Dijkstra on the label (latency, hops, path keys): lexicographic, so ties are deterministic.
    A direct link no longer than twice the smallest link latency wins outright (O(1)); else a
    label is pushed only if it beats its node's best, and a node whose cheapest extension is
    worse than dst's label is not expanded (64 fully connected devices: O(degree·log) a route)."""
    direct = adj[src].get(dst)
    if direct is not None and direct[1] <= 2 * min_latency:
        return (src, dst)
    best: dict[Hashable, tuple] = {src: (0.0, 0, (node_key(src),))}
    heap: list[tuple[float, int, tuple, tuple]] = [(0.0, 0, (node_key(src),), (src,))]
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
    raise MeshError(f"topology {name} has no path between device {src} and device {dst}")
