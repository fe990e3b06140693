"""A strategy's scheduled work as the pipeline's vocabulary: ``Action`` lists and a ``Placement``.

Work item ``f2`` of batch 5 (the forward of stage 2) is ``Action(2, "F", 5)``, ``b2`` is
``Action(2, "B", 5)``: the scheme's batches are the pipeline's microbatches.  Each worker's items,
in the order the scheduler started them, become that rank's action list.  The placement says
where each (stage, batch) computes (its forward's worker) and where each stage's weights live:
one weight worker, or — a stage whose items name several weight workers, as data parallelism
does — a copy on each of them.  The one timing engine (:func:`virtualpar.pipeline.simulate`)
times these lists (:func:`time_items`); the executor runs them after
:func:`~.lowering.lower_strategy` has checked that it can.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..pipeline import Action, Placement, simulate
from .run import ScheduledWork
from .work import Direction, Work

__all__ = ["action_of", "to_actions", "time_items"]


def action_of(work: Work) -> Action:
    """The pipeline action of a unit of work: ``Action(stage, "F" | "B", batch)``."""
    return Action(work.stage, "F" if work.direction is Direction.FORWARD else "B", work.batch)


def to_actions(items: Iterable[Any], num_workers: int, num_stages: int
               ) -> tuple[dict[int, list[Action]], Placement]:
    """``(schedule, placement)`` of scheduled items (anything with ``.work``, ``.workers`` and
    ``.start``), each worker's actions in start order (see the module doc)."""
    items = list(items)
    order = sorted(items, key=lambda i: (i.workers.compute, i.start))
    schedule: dict[int, list[Action]] = {w: [] for w in range(num_workers)}
    for item in order:
        schedule[item.workers.compute].append(action_of(item.work))
    compute = {(i.work.stage, i.work.batch): i.workers.compute for i in items
               if i.work.direction is Direction.FORWARD}
    weights: dict[int, set[int]] = {}
    for i in items:
        weights.setdefault(i.work.stage, set()).add(i.workers.weight)
    replicated = tuple((s, tuple(sorted(weights[s]))) for s in range(num_stages) if len(weights[s]) > 1)
    placement = Placement(num_workers, tuple(compute[(s, 0)] for s in range(num_stages)),
                          tuple(sorted(compute.items())), tuple(min(weights[s]) for s in range(num_stages)),
                          replicated)
    return schedule, placement


def time_items(items: list[ScheduledWork], workers: int, stages: int, batches: int, f: float, b: float,
               activation_cost: float, weight_cost: float, waits: dict[Work, Work]
               ) -> tuple[list[ScheduledWork], list[float]]:
    """The scheduler's order, timed by the one timing engine: the items become pipeline actions
    (:func:`~.actions.to_actions`) and :func:`virtualpar.pipeline.simulate` gives every start and
    end (F costs ``f``, B ``b``, a value crossing workers ``activation_cost``, a weight fetch
    ``weight_cost``, a forward that waited for activation room the end of the backward that
    made it: ``waits``).  The scheduler's own clock only chose the order; the two agree on every
    built-in strategy (tests/test_strategies_actions.py)."""
    schedule, placement = to_actions(items, workers, stages)
    sim = simulate(schedule, placement, batches, costs={"F": f, "B": b}, comm=activation_cost,
                   fetch=weight_cost, waits={action_of(w): (action_of(r),) for w, r in waits.items()})
    timed = []
    for i in items:
        _, start, end = sim.times[action_of(i.work)]
        timed.append(ScheduledWork(i.work, i.workers, start, end))
    return timed, list(sim.busy)
