"""The greedy, tickless scheduler of the unified scheme, and its statistics.

The scheduler chooses the order of the work items; the times it reports are the pipeline's:
the order is lowered to ``Action`` lists (:mod:`.actions`) and timed by the one timing engine,
:func:`virtualpar.pipeline.simulate`, which times every schedule.

Each batch runs forward through stages 0…S−1, then backward from S−1 to 0.  At every decision the
scheduler looks at the next work item of every unfinished batch and starts the one that can start
earliest: at the later of when its predecessor ends (plus ``activation_cost`` if the predecessor ran
on another worker) and when its compute worker is free, plus ``weight_cost`` when its weights live
on another worker — the fetch starts once the worker is free and the input is there (no prefetch),
so ``start = max(free, pred + ac) + wc``.  Ties go by the ``policy``: ``OldestBatchFirst`` (lowest
batch, then furthest along) or ``OldestStageFirst`` (furthest along its pipeline, then lowest
batch).  With ``max_activations`` a worker holding that many stashed activations starts no forward
until a backward frees one — which is how 1F1B emerges from the GPipe mapping.  A batch that runs
k > 1 forwards on one worker (looped strategies: stages 0, 2, 4 on one worker) reserves all k
slots there at its first forward on it: taking them one at a time, two batches could each hold some
of that worker's slots and wait for the rest forever (with the cap at exactly k, as one batch
needs).  A batch needing more slots on one worker than the cap is refused with the worker and the
count.

The statistics of a run are :class:`~.run.StrategyRun`'s (:mod:`.run`).
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from ..errors import UsageError
from .actions import time_items
from .run import ScheduledWork, StrategyRun, activation_stats
from .work import ComputeAndWeightWorkers, Direction, Strategy, Work

__all__ = ["simulate", "StrategyRun", "ScheduledWork", "OldestBatchFirst", "OldestStageFirst"]


def OldestBatchFirst(batch: int, position: int) -> tuple:
    """Tie-break key (smaller first) of a batch's next item, ``position`` its index in the batch's 2S items:
    the lowest batch, then the furthest along."""
    return (batch, -position)


def OldestStageFirst(batch: int, position: int) -> tuple:
    """Tie-break key (smaller first): the item furthest along its batch's 2S items, then the lowest batch."""
    return (-position, batch)


def _sequence(stages: int, batch: int) -> list[Work]:
    return ([Work(s, batch, Direction.FORWARD) for s in range(stages)]
            + [Work(s, batch, Direction.BACKWARD) for s in reversed(range(stages))])


def simulate(num_workers: int, num_stages: int, num_batches: int, strategy: Strategy, policy=OldestBatchFirst,
             forward_cost: float = 1.0, backward_cost: float = 2.0, activation_cost: float = 0.0,
             weight_cost: float = 0.0, max_activations: int | None = None) -> StrategyRun:
    """Schedule every batch's 2S work items greedily (see the module doc)."""
    for name, v in (("num_workers", num_workers), ("num_stages", num_stages), ("num_batches", num_batches),
                    ("max_activations", 1 if max_activations is None else max_activations)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"simulate: {name} must be a positive int, got {v!r}")
    for name, v in (("forward_cost", forward_cost), ("backward_cost", backward_cost),
                    ("activation_cost", activation_cost), ("weight_cost", weight_cost)):
        if isinstance(v, bool) or not isinstance(v, Real) or not 0 <= v < math.inf:
            raise UsageError(f"simulate: {name} must be a finite number >= 0, got {v!r}")
    _check_callables(strategy, policy)
    seqs = [_sequence(num_stages, b) for b in range(num_batches)]
    pos = [0] * num_batches
    done_at = [0.0] * num_batches
    last_worker: list[int | None] = [None] * num_batches
    free = [0.0] * num_workers
    held: list[list[float]] = [[] for _ in range(num_workers)]  # release times (inf until the B is placed)
    stash: dict[tuple[int, int], tuple[int, int]] = {}  # (stage, batch) -> (worker, index in held)
    reserved: dict[tuple[int, int], list[int]] = {}  # (batch, worker) -> its slots in held, not used yet
    need = [_forwards_per_worker(seqs[b], strategy, num_workers) for b in range(num_batches)] \
        if max_activations is not None else []
    items: list[ScheduledWork] = []
    freed_by: dict[tuple[int, int], Work] = {}  # (worker, index in held) -> the backward that frees it
    waits: dict[Work, Work] = {}  # a forward that waited for room -> the backward that made it
    act_tx = w_tx = g_tx = 0
    remaining = 2 * num_stages * num_batches
    while remaining:
        best = None
        for b in range(num_batches):
            if pos[b] == len(seqs[b]):
                continue
            w = seqs[b][pos[b]]
            cw = _workers(strategy(w), w, num_workers)
            start = max(
                free[cw.compute],
                done_at[b] + (activation_cost if last_worker[b] not in (None, cw.compute) else 0.0),
            )
            if cw.weight != cw.compute:
                start += weight_cost
            if (
                w.direction is Direction.FORWARD
                and max_activations is not None
                and (b, cw.compute) not in reserved
            ):
                # the batch's first forward on this worker reserves all it needs there
                k = need[b][cw.compute]
                if k > max_activations:
                    raise UsageError(
                        f"simulate: batch {b} runs {k} forwards on worker {cw.compute}, whose "
                        f"activations are held at once; max_activations={max_activations} is too "
                        f"small for this strategy (at least {k})"
                    )
                slot = _slot_free_at(held[cw.compute], max_activations, k)
                if slot is None:
                    continue
                start = max(start, slot)
                freer = next((freed_by[(cw.compute, j)] for j, t in enumerate(held[cw.compute])
                              if t == slot and (cw.compute, j) in freed_by), None) if slot > 0 else None
            else:
                freer = None
            key = (start, *policy(b, pos[b]))
            if best is None or key < best[0]:
                best = (key, b, w, cw, start, freer)
        if best is None:
            raise UsageError(f"simulate: every next work item waits for activation room that only another "
                             f"waiting item would free (max_activations={max_activations}): a cycle of waits "
                             "this strategy's mapping creates at this limit")
        _, b, w, cw, start, freer = best
        if freer is not None:
            waits[w] = freer
        cost = forward_cost if w.direction is Direction.FORWARD else backward_cost
        end = start + cost
        items.append(ScheduledWork(w, cw, start, end))
        if last_worker[b] is not None and last_worker[b] != cw.compute:
            act_tx += 1
        if cw.weight != cw.compute:
            w_tx += 1
            g_tx += w.direction is Direction.BACKWARD
        if w.direction is Direction.FORWARD:
            if max_activations is None:
                stash[(w.stage, b)] = (cw.compute, len(held[cw.compute]))
                held[cw.compute].append(float("inf"))
            else:
                if (b, cw.compute) not in reserved:
                    k = need[b][cw.compute]
                    reserved[(b, cw.compute)] = list(range(len(held[cw.compute]), len(held[cw.compute]) + k))
                    held[cw.compute] += [float("inf")] * k
                stash[(w.stage, b)] = (cw.compute, reserved[(b, cw.compute)].pop())
        else:
            worker, idx = stash.pop((w.stage, b))
            held[worker][idx] = end
            freed_by[(worker, idx)] = w
        free[cw.compute], done_at[b], last_worker[b] = end, end, cw.compute
        pos[b] += 1
        remaining -= 1
    items, busy = time_items(items, num_workers, num_stages, num_batches, forward_cost, backward_cost,
                             activation_cost, weight_cost, waits)
    peak, mean = activation_stats(items, num_workers)
    return StrategyRun(
        num_workers,
        num_stages,
        num_batches,
        items,
        forward_cost,
        backward_cost,
        act_tx,
        w_tx,
        g_tx,
        peak,
        mean,
        busy,
    )


def _check_callables(strategy: Any, policy: Any) -> None:
    """Name the argument at the call: a policy is the key function itself (``OldestStageFirst``),
    and the seed notebook's ``OldestStageFirst(num_stages, num_batches)`` calls it, giving a tuple
    that failed deep inside as "'tuple' object is not callable"."""
    if not callable(strategy):
        raise UsageError(
            f"simulate: strategy must be a function Work -> ComputeAndWeightWorkers (e.g. GPipe, "
            f"or STRATEGIES[name](W, S, B)), got {type(strategy).__name__} {strategy!r}"
        )
    if not callable(policy):
        hint = (" — pass the policy itself, OldestStageFirst or OldestBatchFirst, not a call of it such as "
                "OldestStageFirst(6, 12)") if isinstance(policy, tuple) else ""
        raise UsageError(
            f"simulate: policy must be a function (batch, position) -> sort key, such as "
            f"OldestBatchFirst or OldestStageFirst; got {type(policy).__name__} {policy!r}{hint}"
        )


def _slot_free_at(releases: list[float], cap: int, k: int = 1) -> float | None:
    """Earliest time at which at most ``cap − k`` of these activations are still held, so ``k``
    more fit (None: not known yet, because too many wait for a backward not yet placed)."""
    alive = sorted(releases, reverse=True)
    if len(alive) <= cap - k:
        return 0.0
    t = alive[cap - k]
    return None if t == float("inf") else t


def _forwards_per_worker(seq: list[Work], strategy: Strategy, workers: int) -> list[int]:
    """How many forwards of one batch's items run on each worker."""
    count = [0] * workers
    for w in seq:
        if w.direction is Direction.FORWARD:
            count[_workers(strategy(w), w, workers).compute] += 1
    return count


def _workers(cw: Any, w: Work, n: int) -> ComputeAndWeightWorkers:
    """The strategy's answer as ``ComputeAndWeightWorkers`` of two ints in 0..n−1 (a plain pair and
    numpy ints are taken as such); anything else is refused, naming the work item."""
    if (
        isinstance(cw, tuple)
        and len(cw) == 2
        and all(isinstance(x, Integral) and not isinstance(x, bool) for x in cw)
    ):
        if all(0 <= x < n for x in cw):
            return cw if type(cw) is ComputeAndWeightWorkers and all(type(x) is int for x in cw) else \
                ComputeAndWeightWorkers(int(cw[0]), int(cw[1]))
        raise UsageError(
            f"the strategy mapped {w} (stage {w.stage}, batch {w.batch}) to workers {tuple(map(int, cw))}; "
            f"there are {n} workers, 0..{n - 1}"
        )
    raise UsageError(f"the strategy mapped {w} (stage {w.stage}, batch {w.batch}) to {cw!r}; expected "
                     f"ComputeAndWeightWorkers(compute, weight), two ints in 0..{n - 1}")
