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
- ``zb_h1`` (ZB-H1, Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B's order with B split
  into I (gradient of the input) and W (gradient of the weights); rank r runs R−1−r warm-up
  forwards, then per microbatch F, I and a W that trails r microbatches behind, so the W's fill
  the tail that 1F1B leaves idle.  Every rank holds at most R microbatches from F to W: the peak
  of 1F1B's first rank (the paper's memory accounting).  Under costs F, I, W with W ≤ F and
  free links, exactly::

      makespan = M(F+I+W) + (R−1)(F + max(0, I−W)) + max(0, R−M)·min(I, W)

  For W ≤ I that is the paper's bubble (R−1)(F+I−W) against 1F1B's (R−1)(F+I+W) (27 against 33
  at R = 4, M = 8, F = I = W = 1); for M < R the last rank runs its M F/I pairs from (R−1)F, the
  last I drains R−1 ranks, then one W: (R−1+M)(F+I) + W, which no order beats (15 at R = 5,
  M = 3, unit costs: the last rank's six actions end at 10 at the earliest, then 4 I's and a W).
- ``zbv`` (ZB-V, Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): two chunks per
  rank in a V (rank r holds stages r and 2R−1−r, so rank 0 holds the first and the last); rank r
  runs 2(R−r)−1 forwards of chunk 0, r pairs (chunk 1, chunk 0), R−r chunk-1 F, I, W triples,
  then F, I, W of each chunk in turn, and drains the I's before the remaining W's.  At most 2R
  chunk activations per rank (1F1B's peak in chunk halves).  With per-chunk costs W ≤ F ≤ I,
  free links and M ≥ 2R − 2, exactly::

      makespan = 2M(F+I+W) + (R−1)(I + max(0, I−2W))

  (with F = I = W the paper's ZB-V picture: 6M + R − 1 units, every rank busy but for R − 1;
  with F = I it is (R−1)·max(F, F+I−2W), the paper's (p−1)(T_F+T_B−2T_W) once that is past F).
  For fewer microbatches (within one unit of the critical path at M = 1) or F > I it remains a
  valid schedule at the same peak, not claimed optimal.

``ZB_H1_REGION`` and ``ZBV_REGION`` state these conditions in code; tests check the closed forms
on grids of (R, M) and costs inside them.
"""

from __future__ import annotations

import inspect
from typing import Callable

from ..errors import UsageError
from .actions import Action, Schedule
from .placement import Placement

__all__ = ["SCHEDULES", "build", "default_virtual", "gpipe", "one_f_one_b", "interleaved_1f1b", "looped_bfs",
           "zb_h1", "zbv", "zb_h1_makespan", "zbv_makespan", "ZB_H1_REGION", "ZBV_REGION", "KINDS_RUN",
           "used_kinds", "check_size", "MAX_RANKS", "MAX_MICROBATCHES", "MAX_ACTIONS"]


def _check(name: str, ranks: int, microbatches: int, virtual: int,
           allowed_virtual: Callable[[int], bool]) -> None:
    for what, v in (("ranks", ranks), ("microbatches", microbatches), ("virtual", virtual)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name}: {what} must be a positive int, got {v!r}")
    if not allowed_virtual(virtual):
        hint = "zbv takes virtual=2 (two chunks per rank, in a V)" if name == "zbv" else \
            "use interleaved_1f1b or looped_bfs (any number of chunks per rank) or zbv (two)"
        raise UsageError(f"{name} does not take virtual={virtual}; {hint}")


def gpipe(ranks: int, microbatches: int, virtual: int = 1) -> tuple[Schedule, Placement]:
    _check("gpipe", ranks, microbatches, virtual, lambda v: v == 1)
    sched = {r: [Action(r, "F",
                        m) for m in range(microbatches)] + [Action(r, "B", m) for m in range(microbatches)]
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
        raise UsageError(f"interleaved_1f1b takes microbatches in groups of the {ranks} "
                         "pipeline ranks through each "
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
    R, M = ranks, microbatches
    sched: Schedule = {}
    for r in range(R):
        warm = min(R - 1 - r, M)
        acts = [Action(r, "F", m) for m in range(warm)]
        f, i, w = warm, 0, 0
        while i < M:
            if f < M:
                acts.append(Action(r, "F", f))
                f += 1
            acts.append(Action(r, "I", i))
            i += 1
            if i - w > r:  # rank r keeps r W's waiting: they fill its share of the drain
                acts.append(Action(r, "W", w))
                w += 1
        sched[r] = acts + [Action(r, "W", k) for k in range(w, M)]
    return sched, Placement.loop(R)


def zb_h1_makespan(ranks: int, microbatches: int, F: float, I: float, W: float) -> float:
    """ZB-H1's makespan on free links when ``W <= F`` (see the module doc)."""
    R, M = ranks, microbatches
    return M * (F + I + W) + (R - 1) * (F + max(0, I - W)) + max(0, R - M) * min(I, W)


def ZB_H1_REGION(ranks: int, microbatches: int, F: float, I: float, W: float) -> bool:
    """Where :func:`zb_h1_makespan` is exact: W no longer than F (the paper takes W ≤ F, I)."""
    return W <= F


def zbv(ranks: int, microbatches: int, virtual: int = 2) -> tuple[Schedule, Placement]:
    _check("zbv", ranks, microbatches, virtual, lambda v: v == 2)
    R, M = ranks, microbatches
    sched: Schedule = {}
    for r in range(R):
        sched[r] = _vee_rank(R, M, r)
    return sched, Placement.vee(R)


def _vee_rank(R: int, M: int, r: int) -> list[Action]:
    """Rank r's order in ZB-V (module doc); each step is skipped when its inputs on this rank are
    not there yet (a chunk-1 F needs its chunk-0 F, a chunk-0 I its chunk-1 I, a W its I)."""
    lo, hi = r, 2 * R - 1 - r  # chunk 0 and chunk 1
    acts: list[Action] = []
    n = {"F0": 0, "F1": 0, "I0": 0, "I1": 0, "W0": 0, "W1": 0}
    limit = {"F0": lambda: M, "F1": lambda: n["F0"], "I1": lambda: n["F1"], "I0": lambda: n["I1"],
             "W1": lambda: n["I1"], "W0": lambda: n["I0"]}

    def step(*keys: str) -> None:
        for key in keys:
            if n[key] < limit[key]():
                acts.append(Action(lo if key[1] == "0" else hi, key[0], n[key]))
                n[key] += 1

    for _ in range(2 * (R - r) - 1):
        step("F0")
    for _ in range(r):
        step("F1", "F0")
    for _ in range(R - r):
        step("F1", "I1", "W1")
    while n["F0"] < M or n["F1"] < M:
        step("F0", "I0", "W0", "F1", "I1", "W1")
    for _ in range(r):
        step("I0", "I1")
    for _ in range(R - r):
        step("I0", "W0")
    while n["I1"] < M:
        step("I1")
    while n["I0"] < M:
        step("I0", "W0")
    while n["W1"] < M:
        step("W1")
    while n["W0"] < M:
        step("W0")
    return acts


def zbv_makespan(ranks: int, microbatches: int, F: float, I: float, W: float) -> float:
    """ZB-V's makespan on free links, per-chunk costs, inside :func:`ZBV_REGION` (module doc)."""
    return 2 * microbatches * (F + I + W) + (ranks - 1) * (I + max(0, I - 2 * W))


def ZBV_REGION(ranks: int, microbatches: int, F: float, I: float, W: float) -> bool:
    """Where :func:`zbv_makespan` is exact: W <= F <= I and M >= 2R − 2."""
    return W <= F <= I and microbatches >= 2 * ranks - 2


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

#: The compute kinds each named schedule runs: B whole, or split into I and W.
KINDS_RUN: dict[str, tuple[str, ...]] = {
    "gpipe": ("F", "B"), "1f1b": ("F", "B"), "interleaved_1f1b": ("F", "B"), "looped_bfs": ("F", "B"),
    "zb_h1": ("F", "I", "W"), "zbv": ("F", "I", "W"),
}


def used_kinds(name: str) -> tuple[str, ...]:
    """The compute kinds schedule ``name`` runs (F and B, or F, I and W)."""
    if name not in KINDS_RUN:
        raise UsageError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return KINDS_RUN[name]


#: Sizes the commands accept (the library itself takes any): more ranks than a grid or a picture
#: can show, or more actions than the simulator times in a few seconds (~11 µs and ~300 bytes
#: each), are refused before anything is built.
MAX_RANKS, MAX_MICROBATCHES, MAX_ACTIONS = 512, 4096, 1 << 18


def check_size(name: str, ranks: int, microbatches: int, virtual: int | None = None,
               flags: tuple[str, str] = ("--stages", "--microbatches")) -> None:
    """Refuse sizes past :data:`MAX_RANKS`, :data:`MAX_MICROBATCHES` or :data:`MAX_ACTIONS` with
    the limit and why, in O(1): nothing is built.  ``flags`` name the options in the message."""
    v = virtual or (default_virtual(name) if name in SCHEDULES else 1)
    kinds = len(KINDS_RUN.get(name, ("F", "B")))
    if ranks > MAX_RANKS:
        raise UsageError(f"{flags[0]} {ranks}: at most {MAX_RANKS} pipeline ranks (a grid or picture of more "
                         f"is unreadable, and {name} would time "
                         f"{ranks * v * microbatches * kinds:,} actions)")
    if microbatches > MAX_MICROBATCHES:
        raise UsageError(f"{flags[1]} {microbatches}: at most {MAX_MICROBATCHES} microbatches (the bubble is "
                         f"(R-1)/(M+R-1) < {1 / MAX_MICROBATCHES:.1e} per rank long before)")
    actions = ranks * v * microbatches * kinds
    if actions > MAX_ACTIONS:
        raise UsageError(f"{flags[0]} {ranks} {flags[1]} {microbatches}: {name} would time {actions:,} "
                         f"actions ({ranks} ranks x {v} chunks x {microbatches} microbatches x {kinds} "
                         f"kinds); at most {MAX_ACTIONS:,} (about 3 s and 100 MB to simulate)")
