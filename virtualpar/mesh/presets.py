"""The graphs of ``Topology``'s presets, with the link figures they default to.

Each builder validates its arguments and returns ``(graph, name)`` for ``Topology(graph, name=name)``;
the classmethods of :class:`~virtualpar.mesh.topology.Topology` (``Topology.ring(8)``...) document
the shapes and hop counts.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from virtualpar.errors import MeshError
from virtualpar.mesh.route import check_figures

__all__ = ["fully_connected", "ring", "torus2d", "hierarchical",
           "NVLINK_LATENCY", "NVLINK_BANDWIDTH", "INFINIBAND_LATENCY", "INFINIBAND_BANDWIDTH"]

# NVLink 4 (H100 SXM, DGX H100): 18 links x 25 GB/s = 450 GB/s per direction per GPU (900 GB/s
# bidirectional; NVIDIA H100 datasheet).  Through NVSwitch any pair of the 8 GPUs can use the full
# per-GPU figure, so we use it per device pair.  Small-message GPU-to-GPU latency over NVLink as
# measured by nccl-tests / OSU on DGX systems is a few microseconds; we take 2 us per hop.
NVLINK_LATENCY: float = 2e-6
NVLINK_BANDWIDTH: float = 450e9

# InfiniBand NDR (ConnectX-7 / Quantum-2): 400 Gb/s = 50 GB/s per direction per port.  End-to-end
# MPI latency across one switch is ~1-5 us; in ``hierarchical`` a cross-node message takes 4 hops
# (device -> node switch -> core -> node switch -> device), so 1 us per hop gives 4 us end to end.
INFINIBAND_LATENCY: float = 1e-6
INFINIBAND_BANDWIDTH: float = 50e9


def check_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MeshError(f"{name} must be a positive integer; got {value!r}")
    return value


def fully_connected(n: int, latency: float, bandwidth: float) -> tuple[nx.Graph, str]:
    """The graph of ``Topology.fully_connected``."""
    check_size("fully_connected: n", n)
    lat, bw = check_figures("fully_connected", latency, bandwidth)
    g = nx.complete_graph(n)
    nx.set_edge_attributes(g, lat, "latency")
    nx.set_edge_attributes(g, bw, "bandwidth")
    return g, f"fully_connected({n})"


def ring(n: int, latency: float, bandwidth: float) -> tuple[nx.Graph, str]:
    """The graph of ``Topology.ring``."""
    check_size("ring: n", n)
    lat, bw = check_figures("ring", latency, bandwidth)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for i in range(n):
        j = (i + 1) % n
        if i != j:  # n=2 adds (0,1) twice; nx.Graph keeps one edge
            g.add_edge(i, j, latency=lat, bandwidth=bw)
    return g, f"ring({n})"


def torus2d(rows: int, cols: int, latency: float, bandwidth: float) -> tuple[nx.Graph, str]:
    """The graph of ``Topology.torus2d``."""
    check_size("torus2d: rows", rows)
    check_size("torus2d: cols", cols)
    lat, bw = check_figures("torus2d", latency, bandwidth)
    g = nx.Graph()
    g.add_nodes_from(range(rows * cols))
    for r in range(rows):
        for c in range(cols):
            me = r * cols + c
            for nbr in (r * cols + (c + 1) % cols, ((r + 1) % rows) * cols + c):
                if nbr != me:
                    g.add_edge(me, nbr, latency=lat, bandwidth=bw)
    return g, f"torus2d({rows}x{cols})"


def hierarchical(nodes: int, devices_per_node: int, intra_latency: float, intra_bandwidth: float,
                 inter_latency: float, inter_bandwidth: float) -> tuple[nx.Graph, str]:
    """The graph of ``Topology.hierarchical``."""
    check_size("hierarchical: nodes", nodes)
    check_size("hierarchical: devices_per_node", devices_per_node)
    ia, ib = check_figures("hierarchical intra", intra_latency, intra_bandwidth)
    ea, eb = check_figures("hierarchical inter", inter_latency, inter_bandwidth)
    g = nx.Graph()
    g.add_nodes_from(range(nodes * devices_per_node))
    for i in range(nodes):
        members = range(i * devices_per_node, (i + 1) * devices_per_node)
        for a in members:
            for b in members:
                if a < b:
                    g.add_edge(a, b, latency=ia, bandwidth=ib)
            g.add_edge(a, f"node{i}-switch", latency=ea, bandwidth=eb)
        g.add_edge(f"node{i}-switch", "core-switch", latency=ea, bandwidth=eb)
    return g, f"hierarchical({nodes}x{devices_per_node})"
