"""Run a strategy for real: lower its simulated schedule to the pipeline's actions.

The simulator's items, per worker in start order, become ``Action(stage, F|B, batch)`` lists; the
strategy's compute worker of each (stage, batch) and weight worker of each stage become a
:class:`~virtualpar.pipeline.Placement`, and the pipeline's lowering adds every transfer: an
activation forward or a gradient backward between compute workers (``SF``/``SB``), a stage's
weights to a compute worker that does not keep them (``SW``/``RW``, for each forward and
backward, as FSDP gathers them) and the weight gradient back (``SG``/``RG``).  The same executor
then runs it, so the counted transmissions are the simulator's and the trained weights are
one process's.

The batches of the scheme are the executor's microbatches: one step takes a batch of rows,
splits it into ``num_batches`` equal parts, and applies one optimizer step with their mean
gradient, like :func:`virtualpar.nn.reference_train` with ``microbatches=num_batches``.

A stage kept by several weight workers (DDP) becomes a replicated stage: every worker keeps a
copy and the copies' gradients are summed before the step (the scheme does not count that
synchronisation as a weight transmission, and neither does :func:`count_transfers`).

A strategy whose backward of (s, b) runs on another worker than its forward (Cuckoo) would need
the stashed activation moved too; it can be simulated but is refused here.
"""

from __future__ import annotations

from typing import Any

from .. import nn
from ..errors import UsageError
from ..pipeline import Action, Pipeline, PipelinedOperation, Placement
from .actions import to_actions
from .simulate import StrategyRun, simulate
from .work import Direction, Strategy

__all__ = ["lower_strategy", "StrategyOperation", "count_transfers"]


def lower_strategy(run: StrategyRun) -> tuple[dict[int, list[Action]], Placement]:
    """The simulated ``run`` as a pipeline ``(schedule, placement)`` (:func:`~.actions.to_actions`):
    each worker's items in start order as ``Action(stage, F|B, batch)``, and each item's compute and
    weight workers.  Refuses what the executor cannot run: a backward on another worker than its
    forward, or a replicated stage kept by a worker that does not compute it."""
    forward_on = {(i.work.stage, i.work.batch): i.workers.compute for i in run.items
                  if i.work.direction is Direction.FORWARD}
    weights: dict[int, set[int]] = {}
    local: dict[int, bool] = {}
    for item in sorted(run.items, key=lambda i: (i.workers.compute, i.start)):
        w = item.work
        if forward_on[(w.stage, w.batch)] != item.workers.compute:  # a backward away from its forward
            raise UsageError(f"stage {w.stage} of batch {w.batch} runs its forward on worker "
                             f"{forward_on[(w.stage, w.batch)]} and its backward on worker "
                             f"{item.workers.compute}: moving the stashed activation is not supported by "
                             "the executor (simulate this strategy instead)")
        weights.setdefault(w.stage, set()).add(item.workers.weight)
        local[w.stage] = local.get(w.stage, True) and item.workers.weight == item.workers.compute
    for s in range(run.num_stages):  # several weight workers: copies, as data parallelism keeps them
        if len(weights[s]) > 1 and not local[s]:
            raise UsageError(f"stage {s}'s weights are mapped to workers {sorted(weights[s])}, some of which "
                             "do not compute with them: the executor keeps a stage's weights on one "
                             "worker, or a copy on each worker that computes with its own copy")
    return to_actions(run.items, run.num_workers, run.num_stages)


def count_transfers(op: PipelinedOperation) -> dict[str, int]:
    """Transfers the last executed step made, counted from what every rank ran."""
    kinds = [a.kind for recs in op.all_records.values() for a, *_ in recs]
    return {"activation": kinds.count("SF") + kinds.count("SB"), "weight": kinds.count("SW"),
            "gradient": kinds.count("SG")}


class StrategyOperation(PipelinedOperation):
    """A ``PipelinedOperation`` whose schedule and placement come from a strategy: its scheduler
    orders the work, the pipeline's one timing engine times it (``self.run``), and the pipeline's
    executor runs the same actions."""

    def __init__(
        self,
        pipeline: Pipeline,
        strategy: Strategy,
        num_workers: int,
        num_batches: int,
        loss: Any = nn.mse_loss,
        optimizer: nn.Optimizer | None = None,
        axis: Any = None,
        **sim: Any,
    ) -> None:
        self.run = simulate(num_workers, len(pipeline), num_batches, strategy, **sim)
        super().__init__(pipeline, lower_strategy(self.run), microbatches=num_batches, loss=loss,
                         optimizer=optimizer, axis=axis)
