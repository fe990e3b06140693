"""Time any schedule without processes: makespan, bubble, utilisation, activations, memory.

Each rank runs its actions in order; an action starts when its rank is free and its inputs are
there: F(s, m) needs F(s−1, m), a backward B/I(s, m) needs F(s, m) and the backward of stage s+1
(the last stage's backward starts from its own loss), W(s, m) needs I(s, m).  A value that crosses
ranks arrives ``comm`` later.  An action on a rank that does not keep its stage's weights (the
placement's weight rank, or a copy) first fetches them for ``fetch``: ``start = max(free, inputs) +
fetch`` — no prefetch, as the unified strategies' scheme has it.  This is the one timing engine:
pipeline schedules and the unified strategies (lowered to these actions) are timed here.  Start
times are a dataflow fixpoint, computed in one pass over the actions with a work list (each rank's
next action waits on at most two others), so 1F1B at S = 32, M = 1024 (65 536 actions) takes well
under a second.

- ``bubble`` = 1 − Σ busy / (ranks × makespan): the idle fraction of the ranks × time rectangle.
- ``peak_activations[s]``: most microbatches whose forward at stage s has run and whose backward
  has not yet freed the stash (B frees it; with the split, W does — W needs the input).
- ``memory`` ledger per stage over time, in units given by the caller: parameters, gradients and
  optimizer state are constant, stashed activations follow ``peak_activations``' curve.

A schedule whose per-rank orders cannot all finish raises ``PipelineDeadlock`` naming each
blocked rank's next action and what it waits for; it never hangs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Iterable, Mapping

from .._words import plural
from ..errors import UsageError
from .actions import COMPUTE, Action, Schedule
from .placement import Placement

__all__ = ["Simulation", "simulate", "PipelineDeadlock", "DEFAULT_COSTS", "check_costs"]

DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}


def check_costs(costs: Mapping[str, Any] | None, where: str, stages: int | None = None,
                needed: Iterable[str] = ()) -> None:
    """Refuse costs that would silently time the wrong thing: a kind that is not F, B, I or W (a
    typo would otherwise be ignored), a cost that is not a finite number >= 0, a per-stage mapping
    (allowed when ``stages`` is given) that misses a stage, or a kind in ``needed`` left out."""
    if costs is None:
        return
    where = f"{where}: " if where else ""
    if not isinstance(costs, Mapping):
        raise UsageError(
            f"{where}costs must be a mapping such as {{'F': 1, 'B': 2}}, got {type(costs).__name__}"
        )
    unknown = sorted(set(costs) - set(COMPUTE), key=str)
    if unknown:
        raise UsageError(f"{where}costs name {', '.join(map(repr, unknown))}, not an action kind; "
                         f"the kinds are {', '.join(COMPUTE)}")
    missing = [k for k in COMPUTE if k in set(needed) and k not in costs]
    if missing:
        raise UsageError(f"{where}the schedule runs {', '.join(missing)} actions but costs give no "
                         f"{' or '.join(missing)} (given: {', '.join(costs) or 'none'})")
    for kind, c in costs.items():
        per_stage = isinstance(c, Mapping)
        if per_stage and stages is None:
            raise UsageError(f"{where}costs[{kind!r}] must be a number, got a mapping")
        if per_stage and set(range(stages)) - set(c):
            missing = sorted(set(range(stages)) - set(c))
            raise UsageError(
                f"{where}costs[{kind!r}] gives no cost for {plural(len(missing), 'stage')} {missing} "
                f"of {stages}"
            )
        for v in (c.values() if per_stage else [c]):
            if isinstance(v, bool) or not isinstance(v, Real) or not 0 <= v < math.inf:
                raise UsageError(f"{where}costs[{kind!r}] must be a finite number >= 0, got {v!r}")


class PipelineDeadlock(UsageError):
    """The schedule's orders cannot all finish; the message names who waits for what."""


@dataclass
class Simulation:
    """What ``simulate`` returns for ``ranks``, ``stages`` and ``microbatches``: ``times``, action →
    (rank, start, end); ``makespan``, the last end; ``busy``, per rank the sum of its actions'
    durations; per stage, ``peak_activations`` and ``activation_curve`` ((time, microbatches
    stashed) steps).  ``bubble``, ``utilisation`` (busy / makespan per rank), ``grid`` and
    ``memory`` derive from these."""

    ranks: int
    stages: int
    microbatches: int
    times: dict[Action, tuple[int, float, float]]  # action -> (rank, start, end)
    makespan: float
    busy: list[float]
    peak_activations: list[int]
    activation_curve: list[list[tuple[float, int]]] = field(repr=False)  # per stage: (time, in flight)

    @property
    def bubble(self) -> float:
        total = self.ranks * self.makespan
        return 1.0 - sum(self.busy) / total if total else 0.0

    @property
    def utilisation(self) -> list[float]:
        return [b / self.makespan if self.makespan else 0.0 for b in self.busy]

    def grid(self, step: float | None = None) -> dict[int, list[Action | None]]:
        """The schedule laid out in time, one cell per ``step`` (default: the shortest action), when
        every action starts and ends on a cell boundary and the grid stays readable (at most 400
        cells); otherwise one column per distinct start, in order, so that every action shows
        (rounding to cells hid some, and a tiny cost made millions of cells)."""
        durations = [e - s for _, s, e in self.times.values() if e > s]
        step = step or (min(durations) if durations else 0.0)
        on_cells = (
            step > 0
            and self.makespan / step <= 400
            and all(abs(t / step - round(t / step)) < 1e-9 for _, s, e in self.times.values() for t in (s, e))
            and all(e > s for _, s, e in self.times.values())
        )
        if on_cells:
            cells = int(round(self.makespan / step))
            grid: dict[int, list[Action | None]] = {r: [None] * cells for r in range(self.ranks)}
            for a, (r, s, e) in self.times.items():
                for c in range(int(round(s / step)), int(round(e / step))):
                    grid[r][c] = a
            return grid
        # the k-th action of a rank to start at one instant (a zero-cost one) gets its own column
        keyed, seen = [], {}
        for a, (r, s, _) in sorted(self.times.items(), key=lambda kv: (kv[1][1], kv[1][0])):
            k = seen[(r, s)] = seen.get((r, s), -1) + 1
            keyed.append(((s, k), r, a))
        column = {key: i for i, key in enumerate(sorted({key for key, _, _ in keyed}))}
        grid = {r: [None] * len(column) for r in range(self.ranks)}
        for key, r, a in keyed:
            grid[r][column[key]] = a
        return grid

    def memory(self, params: Mapping[int, float], grads: Mapping[int, float] | None = None,
               optimizer: Mapping[int, float] | None = None, activation: Mapping[int, float] | None = None
               ) -> dict[int, list[tuple[float, float]]]:
        """Per stage, (time, bytes) steps: params + grads + optimizer state + stashed activations."""
        for name, given in (
            ("params", params),
            ("grads", grads),
            ("optimizer", optimizer),
            ("activation", activation),
        ):
            if given is not None and set(range(self.stages)) - set(given):
                missing = sorted(set(range(self.stages)) - set(given))
                raise UsageError(
                    f"Simulation.memory: {name} gives no figure for {plural(len(missing), 'stage')} "
                    f"{missing} of {self.stages}"
                )
        grads = grads or params
        optimizer = optimizer or {s: 0.0 for s in params}
        activation = activation or {s: 1.0 for s in params}
        return {
            s: [
                (t, params[s] + grads[s] + optimizer[s] + n * activation[s])
                for t, n in self.activation_curve[s]
            ]
            for s in range(self.stages)
        }


def _deps(a: Action, last: int) -> list[Action]:
    s, k, m = a
    if k == "F":
        return [Action(s - 1, "F", m)] if s > 0 else []
    if k == "W":
        return [Action(s, "I", m)]
    own = [Action(s, "F", m)]
    if s == last:
        return own
    return own + [Action(s + 1, "B", m), Action(s + 1, "I", m)]  # whichever the next stage uses


def simulate(schedule: Schedule, placement: Placement, microbatches: int,
             costs: Mapping[str, float | Mapping[int, float]] | None = None, comm: float = 0.0,
             fetch: float = 0.0, waits: Mapping[Action, Iterable[Action]] | None = None) -> Simulation:
    """Times of every action of ``schedule`` (see the module doc).  ``costs[kind]`` is a number or
    a per-stage mapping; missing kinds take ``DEFAULT_COSTS``.  ``comm``: time for a value to cross
    ranks; ``fetch``: time to bring a stage's weights to a rank that does not keep them;
    ``waits[a]``: actions whose end ``a`` also waits for, on any rank and with no transfer (the
    backward that frees the activation memory a forward needs, as a capped scheduler decided)."""
    check_costs(costs, "simulate", stages=placement.stages)
    for name, value in (("comm", comm), ("fetch", fetch)):  # nan dropped every edge
        if isinstance(value, bool) or not isinstance(value, Real) or not 0 <= value < math.inf:
            raise UsageError(f"simulate: {name} must be a finite number >= 0 (seconds per transfer), got "
                             f"{value!r}")
    keepers = {
        s: set(placement.copies.get(s, ())) or {placement.weight_rank(s)} for s in range(placement.stages)
    }
    costs = {**DEFAULT_COSTS, **(costs or {})}
    last = placement.stages - 1
    orders = {r: [a for a in acts if a is not None] for r, acts in schedule.items()}
    present = {a for acts in orders.values() for a in acts}
    times: dict[Action, tuple[int, float, float]] = {}
    pos = {r: 0 for r in orders}
    free = {r: 0.0 for r in orders}
    busy = {r: 0.0 for r in orders}
    waiting: dict[Action, list[int]] = {}
    work = list(orders)
    while work:
        r = work.pop()
        while pos[r] < len(orders[r]):
            a = orders[r][pos[r]]
            deps = [d for d in _deps(a, last) if d in present]
            extra = [d for d in waits.get(a, ()) if d in present] if waits else []
            missing = next((d for d in deps + extra if d not in times), None)
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                break
            start = free[r]
            for d in deps:
                dr, _, de = times[d]
                start = max(start, de + (comm if dr != r else 0.0))
            if fetch and a.is_compute and r not in keepers[a.stage]:
                start += fetch
            for d in extra:  # the weights may arrive while it waits for room
                start = max(start, times[d][2])
            c = costs[a.kind]
            dur = float(c[a.stage] if isinstance(c, Mapping) else c)
            times[a] = (r, start, start + dur)
            free[r] = start + dur
            busy[r] += dur
            pos[r] += 1
            work.extend(waiting.pop(a, []))
    blocked = [r for r in orders if pos[r] < len(orders[r])]
    if blocked:
        lines = []
        for r in blocked:
            a = orders[r][pos[r]]
            need = [
                d for d in [*_deps(a, last), *(waits or {}).get(a, ())] if d in present and d not in times
            ]
            lines.append(f"rank {r} waits at {a} for {', '.join(map(str, need)) or 'an action no rank runs'}")
        raise PipelineDeadlock("the schedule cannot finish:\n  " + "\n  ".join(lines))
    makespan = max((e for _, _, e in times.values()), default=0.0)
    if not math.isfinite(makespan):  # each cost finite, their sum past the largest float
        raise UsageError(
            f"simulate: the costs add up past the largest float (makespan {makespan}); use smaller units"
        )
    curve, peak = _activations(times, placement.stages)
    return Simulation(placement.ranks, placement.stages, microbatches, times, makespan,
                      [busy[r] for r in range(placement.ranks)], peak, curve)


def _activations(times: dict[Action, tuple[int, float, float]], stages: int) -> tuple[list, list[int]]:
    """Per stage, microbatches stashed over time: +1 when an F starts, −1 when the B or W that
    frees it ends (a stage using the split frees at W)."""
    events: list[list[tuple[float, int, int]]] = [[] for _ in range(stages)]
    split = {(a.stage, a.microbatch) for a in times if a.kind == "W"}
    for i, (a, (_, s, e)) in enumerate(times.items()):  # ``times`` is in the order the actions ran
        if a.kind == "F":
            events[a.stage].append((s, i, 1))
        elif a.kind == "W" or a.kind == "B" or (a.kind == "I" and (a.stage, a.microbatch) not in split):
            events[a.stage].append((e, i, -1))
    curves, peaks = [], []
    for ev in events:
        # at one instant, in the order the actions ran: a B ending as the next F starts frees first,
        # and a zero-cost F and its own B stash before they free (frees first drove the count negative)
        ev.sort()
        n, best, curve = 0, 0, [(0.0, 0)]
        for t, _, d in ev:
            n += d
            best = max(best, n)
            curve.append((t, n))
        curves.append(curve)
        peaks.append(best)
    return curves, peaks
