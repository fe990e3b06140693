"""Mesh and topology: named device axes (row-major ranks) laid on a latency/bandwidth network graph.

Pure and process-free: ``Mesh`` maps ranks <-> named coordinates and enumerates collective groups;
``Topology`` routes messages over a ``networkx`` graph whose links carry α (s) and β⁻¹ (B/s).
"""

from __future__ import annotations

from virtualpar.mesh.index import MeshIndex
from virtualpar.mesh.mesh import Mesh
from virtualpar.mesh.route import Link, Route
from virtualpar.mesh.topology import TOPOLOGIES, Topology

__all__ = ["Mesh", "MeshIndex", "Topology", "Link", "Route", "TOPOLOGIES"]
