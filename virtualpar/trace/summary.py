"""Figures from a trace: busy / comm / idle time per device, bytes per link, the critical path.

Definitions, per device ``r`` on one clock, with ``|X|`` the total length of a union of intervals
and ``span = t1 - t0`` the makespan of the whole trace (earliest start to latest end, all devices)::

    C_r   = union of r's compute intervals
    M_r   = union of r's send, recv and collective intervals
    busy  = |C_r|
    comm  = |M_r \\ C_r|          communication not hidden behind compute (overlap counts as busy)
    idle  = span - busy - comm   everything else, "wait" events included

A time below a millionth of ``span`` is rounding of the devices' clocks (each sums its own ops'
costs, in its own order), not time, and is reported as 0 (else an idle device shows "0.03556 ns").

Bytes: each send event adds its ``nbytes`` to the directed link ``(rank, peer)``; ``total_bytes``
adds every send, with or without a peer.  Collectives that move data through shared memory (the
shm all_reduce reads its peers' scratch) send no messages: ``shared_bytes`` adds, per collective
event, its ``nbytes`` minus the bytes of the sends that device made inside it (so a ring
collective, whose steps are sends, adds nothing twice).

Critical path: start from the event that ends last (the innermost one when several end together)
and walk backwards.  The predecessor of an event ``e`` on device ``r`` is

* local: the event of ``r`` that ended last at or before ``e`` started (an enclosing collective
  has not ended yet, so this reaches into the previous op or the previous step of the same
  collective; at equal ends the innermost wins, so the walk goes through send/recv detail);
* remote, for a recv only: its matching send (same ``flow``);

whichever ended later -- that is the one ``e`` had to wait for (a tie stays on the device).  The
walk stops at an event with no predecessor.  Its length counts the time the chain spent working:
``sum_i max(0, end_i - max(start_i, F_i))`` with ``F_i`` the latest end among the events before
``i`` on the chain (``F_0 = start_0``); it is the makespan minus the gaps where the chain waited on
nothing recorded (when a recv waited on a late send, only its tail after the send ended counts),
and never exceeds the makespan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from virtualpar.trace.event import Event, check_clock
from virtualpar.trace.fmt import WIDTH, fit, nbytes
from virtualpar.trace.fmt import seconds as format_seconds

if TYPE_CHECKING:  # the views take a Trace; events.Trace's methods call the views
    from virtualpar.trace.events import Trace

__all__ = ["Summary", "summarize", "critical_path", "format_bytes"]

_COMM = frozenset({"send", "recv", "collective"})


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def _length(merged: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in merged)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two merged, sorted interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


#: ``n`` bytes in binary units (the one spelling of :mod:`virtualpar.trace.fmt`).
format_bytes = nbytes


def critical_path(trace: Trace, clock: str = "model") -> tuple[tuple[Event, ...], float]:
    """``(events in time order, length)`` of the critical path (see the module doc for the rules)."""
    check_clock(clock, "critical_path")
    events = trace.events
    if not events:
        return (), 0.0
    t0, t1 = trace.bounds(clock)
    tol = (t1 - t0) * 1e-9  # float slack for "ended at or before this started"
    start = [e.start(clock) for e in events]
    end = [e.end(clock) for e in events]

    # Per rank: event indices sorted by (end, start, index), so that "the latest (end, start) among
    # events ending by time t and ordered before e" is one bisection away.
    keys: dict[int, list[tuple[float, float, int]]] = {}
    for i, e in enumerate(events):
        keys.setdefault(e.rank, []).append((end[i], start[i], i))
    ends: dict[int, list[float]] = {}
    for r, ks in keys.items():
        ks.sort()
        ends[r] = [k[0] for k in ks]
    sends: dict[str, int] = {}
    for i, e in enumerate(events):
        if e.kind == "send" and e.flow is not None:
            sends.setdefault(e.flow, i)

    def local(i: int) -> int | None:
        ks = keys[events[i].rank]
        p = min(bisect_left(ks, (end[i], start[i], i)), bisect_right(ends[events[i].rank], start[i] + tol))
        return ks[p - 1][2] if p > 0 else None

    cur: int | None = max(range(len(events)), key=lambda i: (end[i], start[i], -i))
    path: list[int] = []
    seen: set[int] = set()
    while cur is not None and cur not in seen:
        path.append(cur)
        seen.add(cur)
        pred = local(cur)
        e = events[cur]
        if e.kind == "recv" and e.flow in sends:
            remote = sends[e.flow]
            if remote not in seen and (pred is None or end[remote] > end[pred]):
                pred = remote
        cur = pred
    path.reverse()

    length, frontier = 0.0, start[path[0]]
    for i in path:
        length += max(0.0, end[i] - max(start[i], frontier))
        frontier = max(frontier, end[i])  # a send ending after its recv must not count twice
    return tuple(events[i] for i in path), length


@dataclass(frozen=True)
class Summary:
    """The figures of one trace on one clock (seconds; see the module doc for the definitions)."""

    clock: str
    start: float
    end: float
    span: float
    ranks: tuple[int, ...]
    device_names: dict[int, str]
    busy: dict[int, float]
    comm: dict[int, float]
    idle: dict[int, float]
    link_bytes: dict[tuple[int, int], int]
    link_messages: dict[tuple[int, int], int]
    total_bytes: int
    messages: int
    critical_path: tuple[Event, ...] = field(repr=False)
    critical_path_length: float
    shared_bytes: int = 0

    def format(self, max_path: int = 20, width: int = WIDTH) -> str:
        """A readable table: per-device times, bytes per link, the critical path (``max_path`` rows);
        the opening sentence wraps at ``width`` columns."""
        n = len(self.ranks)
        plural = "s" if self.messages != 1 else ""
        sent = f"{format_bytes(self.total_bytes)} sent in {self.messages} message{plural}"
        if self.shared_bytes:
            sent = (f"{format_bytes(self.total_bytes + self.shared_bytes)} moved: {sent}, "
                    f"{format_bytes(self.shared_bytes)} through shared memory by collectives")
        lines = fit(f"summary ({self.clock} clock): {n} device{'s' if n != 1 else ''}, "
                    f"span {format_seconds(self.span)}, {sent}", width)
        if not self.ranks:
            return "\n".join(lines)
        pad = max(6, *(len(self.device_names[r]) for r in self.ranks))
        lines.append(f"{'device':<{pad}}  {'busy':>10}  {'comm':>10}  {'idle':>10}  {'busy%':>6}")
        for r in self.ranks:
            pct = 100.0 * self.busy[r] / self.span if self.span > 0 else 0.0
            lines.append(f"{self.device_names[r]:<{pad}}  {format_seconds(self.busy[r]):>10}  "
                         f"{format_seconds(self.comm[r]):>10}  "
                         f"{format_seconds(self.idle[r]):>10}  {pct:>5.1f}%")
        if self.link_bytes:
            lines.append("links (bytes sent):")
            for (src, dst), sent in sorted(self.link_bytes.items()):
                k = self.link_messages[(src, dst)]
                lines.append(f"  {src} -> {dst}  {format_bytes(sent):>10} in {k} "
                             f"message{'s' if k != 1 else ''}")
        path = self.critical_path
        lines.append(f"critical path: {format_seconds(self.critical_path_length)} "
                     f"of {format_seconds(self.span)} in {len(path)} events")
        shown: list[tuple[int, Event | None]] = list(enumerate(path))
        half = max(1, max_path // 2)
        if len(path) > max_path:
            shown = shown[:half] + [(-1, None)] + shown[-half:]
        for k, e in shown:
            if e is None:
                lines.append(f"  ... {len(path) - 2 * half} more")
                continue
            peer = f" peer {e.peer}" if e.peer is not None else ""
            lines.append(f"  {k:>3}  rank {e.rank:<3} {e.kind:<10} {e.name:<16} "
                         f"{format_seconds(e.start(self.clock))} .. "
                         f"{format_seconds(e.end(self.clock))}{peer}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def summarize(trace: Trace, clock: str = "model") -> Summary:
    """The :class:`Summary` of ``trace`` on ``clock`` ("model" or "wall")."""
    check_clock(clock, "summarize")
    t0, t1 = trace.bounds(clock)
    span = t1 - t0
    busy: dict[int, float] = {}
    comm: dict[int, float] = {}
    idle: dict[int, float] = {}
    for rank, events in trace.by_rank().items():
        compute = _union([(e.start(clock), e.end(clock)) for e in events if e.kind == "compute"])
        talk = _union([(e.start(clock), e.end(clock)) for e in events if e.kind in _COMM])
        residue = span * 1e-6
        busy[rank] = _snap(_length(compute), residue)
        comm[rank] = _snap(_length(talk) - _overlap(talk, compute), residue)
        idle[rank] = _snap(span - busy[rank] - comm[rank], residue)
    link_bytes: dict[tuple[int, int], int] = {}
    link_messages: dict[tuple[int, int], int] = {}
    total = messages = 0
    for e in trace.events:
        if e.kind != "send":
            continue
        total += int(e.nbytes)
        messages += 1
        if e.peer is not None:
            link = (int(e.rank), int(e.peer))
            link_bytes[link] = link_bytes.get(link, 0) + int(e.nbytes)
            link_messages[link] = link_messages.get(link, 0) + 1
    shared = _shared_bytes(trace)
    path, length = critical_path(trace, clock)
    return Summary(
        clock=clock, start=t0, end=t1, span=span, ranks=trace.ranks, device_names=trace.device_names,
        busy=busy, comm=comm, idle=idle, link_bytes=dict(sorted(link_bytes.items())),
        link_messages=dict(sorted(link_messages.items())), total_bytes=total, messages=messages,
        critical_path=path, critical_path_length=length, shared_bytes=shared,
    )


def _snap(t: float, residue: float) -> float:
    """``t``, or 0.0 if it is float residue (``|t| <= residue``)."""
    return 0.0 if t <= residue else t


def _shared_bytes(trace: Trace) -> int:
    """Bytes collectives moved without messages (see the module doc), nested sends found on the wall clock."""
    total = 0
    for rank, events in trace.by_rank().items():
        sends = [(e.wall_start, e.wall_end, int(e.nbytes)) for e in events if e.kind == "send"]
        for c in events:
            if c.kind != "collective" or not c.nbytes:
                continue
            inner = sum(n for s, t, n in sends if s >= c.wall_start and t <= c.wall_end)
            total += max(0, int(c.nbytes) - inner)
    return total
