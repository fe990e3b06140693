"""The unified work → worker scheme: every training strategy as two functions plus a priority.

    from virtualpar.strategies import simulate, GPipe, DistributedDataParallel, to_text
    run = simulate(num_workers=4, num_stages=4, num_batches=8, strategy=GPipe)
    print(run.latency, run.throughput, run.peak_activations)
    print(to_text(run))
"""

from __future__ import annotations

from .actions import action_of, to_actions
from .lowering import StrategyOperation, count_transfers, lower_strategy
from .render import to_html, to_text
from .simulate import OldestBatchFirst, OldestStageFirst, ScheduledWork, StrategyRun, simulate
from .work import (STRATEGIES, ComputeAndWeightWorkers, Cuckoo, Direction, DistributedDataParallel,
                   FullyShardedDataParallel, FullyShardedLoopedPipeline, GPipe, LoopedPipeline, Strategy,
                   Work)

__all__ = [
    "Work", "Direction", "ComputeAndWeightWorkers", "Strategy", "DistributedDataParallel",
    "FullyShardedDataParallel", "GPipe", "LoopedPipeline", "FullyShardedLoopedPipeline", "Cuckoo",
    "STRATEGIES", "simulate", "StrategyRun", "ScheduledWork", "OldestBatchFirst", "OldestStageFirst",
    "to_text", "to_html", "StrategyOperation", "lower_strategy", "count_transfers", "action_of",
    "to_actions",
]
