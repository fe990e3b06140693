"""Check a schedule before anything runs it; errors show the rank × step grid with the bad step.

Rules: every (stage, F/B-or-I+W, microbatch) of S stages × M microbatches appears exactly once;
an action runs on the rank that holds its stage; on a rank, a microbatch's F comes before its B
(or I), and its I before its W; a stage uses either B or the split I + W for a microbatch, not
both.  Cross-rank dependencies (F of stage s needs F of stage s−1, a backward needs the next
stage's backward) are checked by running the schedule in the simulator, which names who waits
for what if the per-rank orders cannot all finish.
"""

from __future__ import annotations

from ..errors import UsageError
from ..trace.fmt import WIDTH
from .actions import COMPUTE, Action, Schedule
from .placement import Placement

__all__ = ["ScheduleError", "validate", "format_grid"]


class ScheduleError(UsageError):
    """A schedule that breaks a rule; ``str()`` holds the grid with ``<-- ERROR HERE``."""


def format_grid(schedule: Schedule, mark: tuple[int, int] | None = None, width: int | None = None,
                line_width: int = WIDTH) -> str:
    """Rank × step text grid (``.`` for an idle step); ``mark=(rank, step)`` flags one cell.

    Cells are ``width`` characters (default: the longest label), one space apart.  A grid wider
    than ``line_width`` columns is folded: its steps are shown as many at a time as fit, each
    block under its own header of step numbers, blocks separated by a blank line, so every action
    is shown and no line is wider than ``line_width`` (the ``<-- ERROR HERE`` note excepted).
    """
    steps = max((len(a) for a in schedule.values()), default=0)
    labels = {r: [str(a) if a is not None else "." for a in schedule[r]] for r in schedule}
    cell = width or max([3, len(str(max(steps - 1, 0)))] + [len(t) for row in labels.values() for t in row])
    head = "rank | "
    per_block = max(1, (line_width - len(head) + 1) // (cell + 1))
    blocks = []
    for first in range(0, max(steps, 1), per_block):
        last = min(steps, first + per_block)
        lines = [(head + " ".join(f"{i:>{cell}}" for i in range(first, last))).rstrip()]
        for r in sorted(schedule):
            line = f"{r:>4} | " + " ".join(f"{t:>{cell}}" for t in labels[r][first:last])
            if mark is not None and mark[0] == r and first <= mark[1] < max(last, first + 1):
                line += f"   <-- ERROR HERE (step {mark[1]}: {schedule[r][mark[1]]})"
            lines.append(line.rstrip())
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def validate(schedule: Schedule, placement: Placement, microbatches: int) -> None:
    """Raise ``ScheduleError`` (with the grid) for the first broken rule; return None if it holds."""
    S, M = placement.stages, microbatches
    seen: dict[tuple[int, str, int], tuple[int, int]] = {}
    if isinstance(M, bool) or not isinstance(M, int) or M < 1:
        raise ScheduleError(f"microbatches must be an int >= 1, got {M!r}")
    if not isinstance(schedule, dict):
        raise ScheduleError(f"a schedule is a dict {{rank: [Action, ...]}}, got {type(schedule).__name__}")
    bad_keys = [
        k for k in schedule if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k < placement.ranks
    ]
    if bad_keys or set(schedule) != set(range(placement.ranks)):  # "0" from JSON said "runs on rank 0, not 0"
        raise ScheduleError("a schedule has one list per rank, keyed by the int ranks "
                            f"0..{placement.ranks - 1} (an "
                            f"idle rank gets []); got keys {sorted(schedule, key=repr)}")

    def fail(msg: str, rank: int, step: int) -> None:
        raise ScheduleError(f"{msg}\n{format_grid(schedule, (rank, step))}")

    for r, actions in sorted(schedule.items()):
        for i, a in enumerate(actions):
            if a is None:
                continue
            if not isinstance(a, Action):
                fail(f"rank {r} step {i}: {a!r} is a {type(a).__name__}, not an "
                     "Action: write Action.from_str("
                     f"{str(a)!r}) or Action(stage, kind, microbatch)", r, i)
            if a.kind not in COMPUTE:
                fail(f"rank {r} step {i}: {a!r} is not a compute action (F, B, I, W)", r, i)
            if not (0 <= a.stage < S and 0 <= a.microbatch < M):
                fail(f"rank {r} step {i}: {a} is out of range: stages 0..{S - 1}, microbatches 0..{M - 1}", r,
                     i)
            if placement.rank_of(a.stage, a.microbatch) != r:
                fail(f"rank {r} step {i}: stage {a.stage} of microbatch {a.microbatch} runs on rank "
                     f"{placement.rank_of(a.stage, a.microbatch)}, not {r}", r, i)
            key = (a.stage, a.kind, a.microbatch)
            if key in seen:
                fail(f"rank {r} step {i}: {a} appears twice (first at rank {seen[key][0]} "
                     f"step {seen[key][1]})", r, i)
            seen[key] = (r, i)
            s, m = a.stage, a.microbatch
            if a.kind in ("B", "I") and (s, "F", m) not in seen:
                fail(f"rank {r} step {i}: {a} comes before its forward {Action(s, 'F', m)}", r, i)
            if a.kind == "W" and (s, "B", m) in seen:
                fail(f"rank {r} step {i}: stage {s} microbatch {m} has both B and the split I/W", r, i)
            if a.kind == "W" and (s, "I", m) not in seen:
                fail(f"rank {r} step {i}: {a} comes before its input backward {Action(s, 'I', m)}", r, i)
            if a.kind == "B" and (s, "I", m) in seen or a.kind == "I" and (s, "B", m) in seen:
                fail(f"rank {r} step {i}: stage {s} microbatch {m} has both B and the split I/W", r, i)
    for s in range(S):
        for m in range(M):
            r = placement.rank_of(s, m)
            if (s, "F", m) not in seen:
                raise ScheduleError(f"{Action(s, 'F', m)} is missing from rank {r}\n{format_grid(schedule)}")
            if (s, "B", m) not in seen and not ((s, "I", m) in seen and (s, "W", m) in seen):
                raise ScheduleError(f"stage {s} microbatch {m} has no backward (B, or I and W) on rank {r}\n"
                                    f"{format_grid(schedule)}")
