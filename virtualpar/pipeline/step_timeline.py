"""The last step of a pipelined operation as it ran: the rank × time grid that ``op.timeline()``
shows, and the refusals before reading a step back from a cluster (an operation that never ran
there, an unknown clock).  Shared by ``PipelinedOperation`` and timeline parallelism."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from .diagram import Diagram
from .timeline_grid import WIDTH, Timeline, format_timeline

__all__ = ["check_clock", "check_ran", "step_timeline"]


def check_clock(clock: str, known: tuple[str, ...]) -> None:
    if clock not in known:
        raise UsageError(f"unknown clock {clock!r}; choose one of {', '.join(map(repr, known))}")


def check_ran(op: Any, cluster: Any) -> None:
    """Refuse to fetch the weights of an operation from a cluster it never ran on."""
    if not op.is_placed_on(cluster):
        raise UsageError(f"{type(op).__name__} {op.key!r} has not run on this cluster, so it holds none of "
                         f"its weights; run a step first: cluster.execute(op, ...)")


def step_timeline(op: Any, cluster: Any = None, clock: str = "model", compute_only: bool = True,
                  width: int = WIDTH) -> Timeline:
    """``op.timeline(...)`` of a ``PipelinedOperation`` (see there): the records of its last step on
    ``cluster`` (or on any, when None) as a :class:`Timeline` on ``clock``."""
    check_clock(clock, ("model", "wall"))
    if cluster is not None:
        check_ran(op, cluster)
    records = (
        op.last_records if cluster is None else (op.state_for(cluster) or {}).get("last_records", {})
    )
    rows = {p: [(a, (m0, m1) if clock == "model" else (w0, w1)) for a, w0, w1, m0, m1 in recs]
            for p, recs in sorted(records.items())}
    # seconds, unless the modelled clock counts cost units (the demo's unit costs on a 1 FLOP/s device)
    unit = getattr(op, "clock_unit", "s") if clock == "model" else "s"
    name = op.schedule_name if op.schedule_name != "custom" else type(op).__name__
    title = f"{name}: {len(rows)} ranks, {op.microbatches} microbatches, {clock} clock"
    placement = op.placement
    return Timeline(format_timeline(rows, compute_only, width, unit),
                    lambda: Diagram.from_records(rows, placement, title, unit))
