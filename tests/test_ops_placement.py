"""``PlacedOperation``: the one record of which clusters hold an operation's state (no process needed:
any object that can be weakly referenced stands for a cluster here)."""

from __future__ import annotations

import copy
import gc
import pickle
from dataclasses import dataclass, replace

from virtualpar.ops import ClusterState, PlacedOperation, ShardedOperation
from virtualpar.sharding import TensorSharding


class _Cluster:
    """Stands for a cluster: hashable by identity and weakly referenceable, as VirtualCluster is."""


class _Plain(PlacedOperation):
    def __init__(self, name: str) -> None:
        self.name = name


@dataclass(frozen=True)
class _Frozen(PlacedOperation):
    name: str


def test_state_is_per_cluster_and_made_only_by_hold():
    op, a, b = _Plain("op"), _Cluster(), _Cluster()
    assert op.state_for(a) is None and not op.is_placed_on(a) and op.placed_clusters() == []
    state = op.hold(a, steps=0)
    state["steps"] += 1
    assert op.state_for(a) == {"steps": 1} and op.is_placed_on(a) and not op.is_placed_on(b)
    assert op.hold(a, staged=True) is state and state == {"steps": 1, "staged": True}  # updated, not replaced
    assert op.placed_clusters() == [a]
    assert op.forget(a) == {"steps": 1, "staged": True} and not op.is_placed_on(a) and op.forget(a) is None


def test_a_cluster_that_is_gone_drops_out_by_itself():
    op, c = _Plain("op"), _Cluster()
    op.hold(c, x=1)
    del c
    gc.collect()
    assert op.placed_clusters() == []  # a closed cluster's id may be reused: never mistaken for it


def test_copies_and_pickles_start_with_no_clusters():
    for op in (_Plain("p"), _Frozen("f")):
        c = _Cluster()
        op.hold(c, weights="resident")
        for twin in (copy.copy(op), copy.deepcopy(op), pickle.loads(pickle.dumps(op))):
            assert twin.name == op.name and not twin.is_placed_on(c)
            twin.hold(c, weights="other")
            assert op.state_for(c) == {"weights": "resident"}  # the original's record untouched
        assert not replace(op, name="g").is_placed_on(c) if isinstance(op, _Frozen) else True
        assert op == copy.copy(op) if isinstance(op, _Frozen) else True  # the record is no field


def test_every_operation_class_uses_the_one_base():
    from virtualpar.ops import GraphOperation
    from virtualpar.pipeline import PipelinedOperation
    from virtualpar.strategies.lowering import StrategyOperation
    from virtualpar.tensor_parallel import FeedForward, MatMul
    from virtualpar.tensor_parallel.execute import TensorParallelOp
    from virtualpar.timeline.run import TimelineParallel

    for cls in (ShardedOperation, GraphOperation, TensorParallelOp, MatMul, FeedForward, PipelinedOperation,
                StrategyOperation, TimelineParallel):
        assert issubclass(cls, PlacedOperation), cls
    op = ShardedOperation(lambda dev, x: x, [TensorSharding.replicated(1)], [TensorSharding.replicated(1)])
    assert not any(isinstance(v, ClusterState) for v in vars(copy.copy(op)).values())
