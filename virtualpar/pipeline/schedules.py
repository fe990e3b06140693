"""Schedule builders: each returns ``(schedule, placement)``; a ``SCHEDULES`` registry by name.

``R`` pipeline ranks, ``M`` microbatches, ``V`` model chunks per rank (``S = V·R`` stages).
Builders only build lists; :mod:`.validate` checks them, :mod:`.simulate` times them and
:mod:`.executor` runs them.

- ``gpipe`` (Huang et al. 2019): every forward, then every backward.  Peak in flight at stage s: M.
- ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021): rank r warms up with min(R−r−1, M) forwards,
  then alternates one forward and one backward, then drains.  Peak in flight at stage s: min(R−s, M).
  Under unit costs both take 2(M+R−1) steps; bubble (R−1)/(M+R−1).
- ``interleaved_1f1b`` (Megatron-LM, Narayanan et al. 2021): V chunks per rank, microbatches taken
  in groups of R through each chunk; needs M a multiple of R.  Bubble (R−1)/(V·M+R−1).
- ``looped_bfs`` (Lamy-Poirier 2023, breadth-first): each chunk's forwards for all microbatches,
  chunk by chunk, then the backwards in reverse.
- ``zb_h1`` (Qi et al. 2023): 1F1B's order with B split into I and W; a rank runs I first, then F
  (keeping 1F1B's activation cap min(R−r, M)), and a W only when nothing else can run, so the W's
  fill the bubbles 1F1B leaves — a smaller bubble at the same peak memory.  Because it keeps
  1F1B's cap exactly, counting an activation as held until its W, its bubble at F = I = W is 2/3
  of 1F1B's (idle per rank 2(R−1) against 3(R−1)); the paper's ZB-H1 reaches 1/3 (R−1) under its
  own memory accounting.
- ``zbv``: the same rule on the V-shaped placement (two chunks per rank, the first and last stage
  on rank 0), with a cap of 2R chunk activations per rank.

The zero-bubble builders choose their order with a greedy list scheduler under unit costs
(F = I = W = 1): the order, not the times, is what they hand on.
"""

from __future__ import annotations

import inspect
from typing import Callable

from ..errors import UsageError
from .actions import Action, Schedule
from .placement import Placement

__all__ = ["SCHEDULES", "build", "default_virtual", "gpipe", "one_f_one_b", "interleaved_1f1b", "looped_bfs", "zb_h1", "zbv"]


def _check(name: str, ranks: int, microbatches: int, virtual: int, allowed_virtual: Callable[[int], bool]) -> None:
    for what, v in (("ranks", ranks), ("microbatches", microbatches), ("virtual", virtual)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name}: {what} must be a positive int, got {v!r}")
    if not allowed_virtual(virtual):
        hint = "zbv takes virtual=2 (two chunks per rank, in a V)" if name == "zbv" else \
            "use interleaved_1f1b or looped_bfs (any number of chunks per rank) or zbv (two)"
        raise UsageError(f"{name} does not take virtual={virtual}; {hint}")


def gpipe(ranks: int, microbatches: int, virtual: int = 1) -> tuple[Schedule, Placement]:
    _check("gpipe", ranks, microbatches, virtual, lambda v: v == 1)
    sched = {r: [Action(r, "F", m) for m in range(microbatches)] + [Action(r, "B", m) for m in range(microbatches)]
             for r in range(ranks)}
    return sched, Placement.loop(ranks)


def one_f_one_b(ranks: int, microbatches: int, virtual: int = 1) -> tuple[Schedule, Placement]:
    _check("1f1b", ranks, microbatches, virtual, lambda v: v == 1)
    sched: Schedule = {}
    for r in range(ranks):
        warm = min(ranks - r - 1, microbatches)
        acts = [Action(r, "F", m) for m in range(warm)]
        for i in range(microbatches - warm):
            acts += [Action(r, "F", warm + i), Action(r, "B", i)]
        acts += [Action(r, "B", m) for m in range(microbatches - warm, microbatches)]
        sched[r] = acts
    return sched, Placement.loop(ranks)


def interleaved_1f1b(ranks: int, microbatches: int, virtual: int = 2) -> tuple[Schedule, Placement]:
    _check("interleaved_1f1b", ranks, microbatches, virtual, lambda v: True)
    if microbatches % ranks:
        raise UsageError(f"interleaved_1f1b takes microbatches in groups of the {ranks} pipeline ranks through each "
                         f"chunk, so microbatches must be a multiple of {ranks}; got {microbatches} "
                         f"(use {microbatches + ranks - microbatches % ranks}, or 1f1b / looped_bfs)")
    total = microbatches * virtual

    def unit(k: int, backward: bool) -> tuple[int, int]:
        chunk = (k // ranks) % virtual
        return (virtual - 1 - chunk if backward else chunk), (k // (ranks * virtual)) * ranks + k % ranks

    sched: Schedule = {}
    for r in range(ranks):
        warm = min((ranks - r - 1) * 2 + (virtual - 1) * ranks, total)
        fwd = [Action(c * ranks + r, "F", m) for c, m in (unit(k, False) for k in range(total))]
        bwd = [Action(c * ranks + r, "B", m) for c, m in (unit(k, True) for k in range(total))]
        acts = fwd[:warm]
        for i in range(total - warm):
            acts += [fwd[warm + i], bwd[i]]
        sched[r] = acts + bwd[total - warm:]
    return sched, Placement.loop(ranks, virtual)


def looped_bfs(ranks: int, microbatches: int, virtual: int = 2) -> tuple[Schedule, Placement]:
    _check("looped_bfs", ranks, microbatches, virtual, lambda v: True)
    sched: Schedule = {}
    for r in range(ranks):
        acts = [Action(c * ranks + r, "F", m) for c in range(virtual) for m in range(microbatches)]
        acts += [Action(c * ranks + r, "B", m) for c in reversed(range(virtual)) for m in range(microbatches)]
        sched[r] = acts
    return sched, Placement.loop(ranks, virtual)


def zb_h1(ranks: int, microbatches: int, virtual: int = 1) -> tuple[Schedule, Placement]:
    _check("zb_h1", ranks, microbatches, virtual, lambda v: v == 1)
    placement = Placement.loop(ranks)
    return _greedy(placement, microbatches, [min(ranks - r, microbatches) for r in range(ranks)]), placement


def zbv(ranks: int, microbatches: int, virtual: int = 2) -> tuple[Schedule, Placement]:
    _check("zbv", ranks, microbatches, virtual, lambda v: v == 2)
    placement = Placement.vee(ranks)
    return _greedy(placement, microbatches, [min(2 * ranks, 2 * microbatches)] * ranks), placement


def _greedy(placement: Placement, microbatches: int, cap: list[int]) -> Schedule:
    """List-schedule F, I, W under unit costs: per free rank, an I if one is ready, else the next F
    (oldest microbatch, earliest stage) if the rank holds fewer than ``cap[rank]`` activations,
    else the oldest W.  An activation is held from its F until its W."""
    S, M, R = placement.stages, microbatches, placement.ranks
    done: dict[tuple[int, str, int], int] = {}  # (stage, kind, mb) -> end time
    held = [0] * R
    next_f = {s: 0 for s in range(S)}
    pending_w: list[list[tuple[int, int]]] = [[] for _ in range(R)]
    order: Schedule = {r: [] for r in range(R)}
    free_at = [0] * R
    remaining = 3 * S * M
    t = 0
    while remaining:
        progressed = False
        for r in range(R):
            if free_at[r] > t:
                continue
            pick = _ready_i(placement, r, done, t, M) or _ready_f(placement, r, done, t, next_f, M, held[r] < cap[r])
            if pick is None and pending_w[r]:
                pick = Action(pending_w[r][0][0], "W", pending_w[r][0][1])
            if pick is None:
                continue
            s, kind, m = pick
            if kind == "F":
                next_f[s] += 1
                held[r] += 1
            elif kind == "I":
                pending_w[r].append((s, m))
            else:
                pending_w[r].pop(0)
                held[r] -= 1
            done[(s, kind, m)] = t + 1
            free_at[r] = t + 1
            order[r].append(pick)
            remaining -= 1
            progressed = True
        t += 1
        if not progressed and t > 4 * (remaining + S * M) + 16:  # cannot happen for these placements
            raise UsageError("zero-bubble builder made no progress (cap too small for this placement)")
    return order


def _ready_i(placement: Placement, r: int, done: dict, t: int, M: int) -> Action | None:
    best = None
    for s in placement.stages_of(r):
        for m in range(M):
            if (s, "I", m) in done or done.get((s, "F", m), t + 1) > t:
                continue
            if s + 1 < placement.stages and done.get((s + 1, "I", m), t + 1) > t:
                continue
            cand = Action(s, "I", m)
            if best is None or (m, -s) < (best.microbatch, -best.stage):
                best = cand
            break  # later microbatches of this stage come after this one
    return best


def _ready_f(placement: Placement, r: int, done: dict, t: int, next_f: dict, M: int, room: bool) -> Action | None:
    if not room:
        return None
    best = None
    for s in placement.stages_of(r):
        m = next_f[s]
        if m >= M:
            continue
        if s > 0 and done.get((s - 1, "F", m), t + 1) > t:
            continue
        if best is None or (m, s) < (best.microbatch, best.stage):
            best = Action(s, "F", m)
    return best


def default_virtual(name: str) -> int:
    """The model chunks per rank schedule ``name`` takes when ``virtual`` is not given (1 or 2)."""
    if name not in SCHEDULES:
        raise UsageError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    param = inspect.signature(SCHEDULES[name]).parameters["virtual"]
    return int(param.default)


def build(name: str, ranks: int, microbatches: int, virtual: int | None = None) -> tuple[Schedule, Placement]:
    """``SCHEDULES[name](ranks, microbatches, virtual)``; unknown names list the known ones."""
    try:
        builder = SCHEDULES[name]
    except KeyError:
        raise UsageError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}") from None
    if name in ("gpipe", "1f1b", "zb_h1") and virtual in (None, 1):
        return builder(ranks, microbatches)
    if virtual is None:
        return builder(ranks, microbatches)
    return builder(ranks, microbatches, virtual)


SCHEDULES: dict[str, Callable[..., tuple[Schedule, Placement]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "looped_bfs": looped_bfs,
    "zb_h1": zb_h1,
    "zbv": zbv,
}
