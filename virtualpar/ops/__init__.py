"""Operations that declare their costs, sharded operations, graphs of them, and ``PlacedOperation``:
the one record, for every operation of the project, of the clusters that hold its state."""

from __future__ import annotations

from .graph import GraphOperation, as_executable
from .operation import MATMUL, Operation, ShardedOperation
from .placement import ClusterState, PlacedOperation

__all__ = ["Operation", "ShardedOperation", "MATMUL", "GraphOperation", "as_executable",
           "PlacedOperation", "ClusterState"]
