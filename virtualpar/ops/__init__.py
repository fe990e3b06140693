"""Operations that declare their costs, sharded operations, and graphs of them."""

from __future__ import annotations

from .graph import GraphOperation, as_executable
from .operation import MATMUL, Operation, ShardedOperation
from .placement import ClusterState, PlacedOperation

__all__ = ["Operation", "ShardedOperation", "MATMUL", "GraphOperation", "as_executable",
           "PlacedOperation", "ClusterState"]
