"""A text timeline of a trace, for terminals, logs and error messages.

One row per device, time on the x axis, every line at most ``width`` characters (default 100):
the grid gets what the device labels leave, ``cols = width - len(label) - 3``.  The trace's span
``[t0, t1]`` (earliest start to latest end) is cut into ``cols`` equal columns of
``(t1 - t0) / cols`` seconds, and an event covers every column its interval ``[start, end)``
touches -- at least one, so a zero-length event still shows.  Under the grid a time axis marks
round times (steps of 1, 2 or 5 × 10^k seconds, as many as fit their labels)::

    timeline (model clock): 2 devices, 0 s .. 4 ms, 1 column = 100 µs
    device 0 |####################>>>>>>>>>>..........|
    device 1 |..........<<<<<<<<<<<<<<<<<<<<##########|
             +---------+---------+---------+---------+
             0 s       1 ms      2 ms      3 ms      4 ms
    legend (by priority): # compute  = collective  x send+recv  > send  < recv  ~ wait  . idle

Several events in one column: the symbol of the highest priority wins, in this order::

    #  compute      (what the device computes matters most: comm behind it is overlapped)
    =  collective   (a whole collective reads as one block; its send/recv detail is in Chrome)
    x  send+recv    (both directions in the same column, e.g. a ring step)
    >  send, <  recv
    ~  wait
    .  idle

An action shorter than one column cannot show its length, and may be hidden by a higher-priority
neighbour in its column: every such action is listed below the grid (device, kind, name, start,
duration), in time order, at most :data:`MAX_SHORT` of them, then how many more.  The sends and
receives a collective is made of are its steps, not actions of their own: they are not listed.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from typing import TYPE_CHECKING, Callable

from virtualpar.errors import UsageError
from virtualpar.trace.event import Event, check_clock
from virtualpar.trace.fmt import WIDTH, fit, seconds

if TYPE_CHECKING:  # the views take a Trace; events.Trace's methods call the views
    from virtualpar.trace.events import Trace

__all__ = ["to_text", "format_seconds", "time_axis", "SYMBOLS", "LEGEND", "MAX_SHORT"]

#: The symbol of each event kind (``x`` marks a column holding both a send and a recv).
SYMBOLS: dict[str, str] = {"compute": "#", "collective": "=", "send": ">", "recv": "<", "wait": "~"}
LEGEND = "legend (by priority): # compute  = collective  x send+recv  > send  < recv  ~ wait  . idle"
MAX_SHORT = 12  # short actions listed below the grid, at most

_BIT = {"compute": 1, "collective": 2, "send": 4, "recv": 8, "wait": 16}
_MIN_GRID = 10  # columns the grid keeps however long the labels are

#: ``t`` seconds in a readable unit (the one spelling of :mod:`virtualpar.trace.fmt`).
format_seconds = seconds


def _symbol(mask: int) -> str:
    if mask & 1:
        return "#"
    if mask & 2:
        return "="
    if mask & 12 == 12:
        return "x"
    if mask & 4:
        return ">"
    if mask & 8:
        return "<"
    if mask & 16:
        return "~"
    return "."


def time_axis(t0: float, t1: float, cols: int, label: Callable[[float], str] = seconds) -> tuple[str, str]:
    """The two lines under a grid of ``cols`` columns spanning ``[t0, t1]``: tick marks (``+`` at
    each round time, ``-`` between) and their labels, each label starting at its tick.  The step
    is the smallest 1, 2 or 5 × 10^k seconds whose labels do not run into each other.  ``label``
    writes a time (default :func:`~virtualpar.trace.fmt.seconds`; :func:`~virtualpar.trace.fmt.number`
    for a clock that counts cost units)."""
    span = t1 - t0
    if span <= 0 or cols < 2:
        return "+" + "-" * (cols - 1), label(t0)
    col = span / cols
    step = 0.0
    exp = math.floor(math.log10(col)) - 1
    while not step:
        for m in (1, 2, 5):
            s = m * 10.0 ** exp
            first, last = math.ceil(t0 / s - 1e-9), math.floor(t1 / s + 1e-9)
            widest = max((len(label(k * s)) for k in range(first, last + 1)), default=1) + 2
            if s / col >= widest:
                step = s
                break
        exp += 1
    marks = ["-"] * (cols + 1)
    labels = [" "] * (cols + 1)
    k = math.ceil(t0 / step - 1e-9)
    while k * step <= t1 + step * 1e-9:
        x = round((k * step - t0) / col)
        if 0 <= x <= cols:
            marks[x] = "+"
            text = label(k * step)
            at = min(x, cols + 1 - len(text))  # the last label ends at the grid's end, not past it
            if at >= 0 and all(c == " " for c in labels[max(0, at - 1):at + len(text) + 1]):
                labels[at:at + len(text)] = text
        k += 1
    return "".join(marks), "".join(labels).rstrip()


def _short(trace: Trace, clock: str, col: float) -> list[Event]:
    """The actions shorter than one column, collective steps excepted (see the module doc)."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for e in trace.events:
        if e.kind == "collective":
            spans.setdefault(e.rank, []).append((e.wall_start, e.wall_end))
    for ranges in spans.values():
        ranges.sort()
    out = []
    for e in trace.events:
        if e.duration(clock) >= col:
            continue
        if e.kind in ("send", "recv") and e.rank in spans:  # a step of a collective is not listed (nesting
            ranges = spans[e.rank]                          # is read on the wall clock, as the summary does)
            k = bisect_right(ranges, (e.wall_start, math.inf)) - 1
            if k >= 0 and ranges[k][1] >= e.wall_end:
                continue
        out.append(e)
    return sorted(out, key=lambda e: (e.start(clock), e.rank))


def _describe(e: Event, clock: str, pad: int, name: str) -> str:
    peer = "" if e.peer is None else f" {'to' if e.kind == 'send' else 'from'} {e.peer}"
    what = f"{e.kind} {e.name}{peer}" if e.name != e.kind else f"{e.kind}{peer}"
    return f"  {name:<{pad}}  {what:<28} at {seconds(e.start(clock)):<10} for {seconds(e.duration(clock))}"


def to_text(trace: Trace, clock: str = "model", width: int = WIDTH) -> str:
    """The text timeline of ``trace`` on ``clock``, every line at most ``width`` characters (see
    the module doc; a line of the short-action list is cut to fit too).

    An empty trace gives ``"(no events)"``.  Rows are labelled with the device names; devices that
    recorded nothing show as all idle.
    """
    check_clock(clock, "to_text")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise UsageError(f"to_text: width must be a positive int (columns), got {width!r}")
    if not len(trace):
        return "(no events)"
    t0, t1 = trace.bounds(clock)
    labels = {r: trace.device_name(r) for r in trace.ranks}
    pad = max(len(s) for s in labels.values())
    cols = max(width - pad - 3, _MIN_GRID)  # "label |grid|"
    if pad + 3 + cols > width:  # names too long for the width: short ones, so that the grid keeps its columns
        labels = {r: f"{r}" for r in labels}
        pad = max(len(s) for s in labels.values())
        cols = max(width - pad - 3, 1)
    span = t1 - t0
    col = span / cols
    n = len(trace.ranks)
    head = (f"timeline ({clock} clock): {n} device{'s' if n != 1 else ''}, {seconds(t0)} .. {seconds(t1)}, "
            f"1 column = {seconds(col)}")
    lines = fit(head, width)
    for rank, events in trace.by_rank().items():
        masks = [0] * cols
        for e in events:
            if col > 0:
                first = int((e.start(clock) - t0) / col)
                # the 1e-9 keeps an end that lands on a column edge from spilling into the next one
                last = math.ceil((e.end(clock) - t0) / col - 1e-9) - 1
            else:
                first = last = 0
            first = min(max(first, 0), cols - 1)
            last = min(max(last, first), cols - 1)
            bit = _BIT[e.kind]
            for i in range(first, last + 1):
                masks[i] |= bit
        lines.append(f"{labels[rank]:<{pad}} |{''.join(_symbol(m) for m in masks)}|")

    marks, ticks = time_axis(t0, t1, cols)
    lines.append(" " * (pad + 1) + marks)
    lines.append((" " * (pad + 1) + ticks)[:width])
    lines += fit(LEGEND, width)
    short = _short(trace, clock, col) if col > 0 else []
    if short:
        lines += fit(f"too short to show (under 1 column = {seconds(col)}), in time order:", width)
        for e in short[:MAX_SHORT]:
            row = _describe(e, clock, pad, labels[e.rank])
            lines.append(row if len(row) <= width else row[: width - 1] + "…")
        if len(short) > MAX_SHORT:
            lines.append(f"  ... and {len(short) - MAX_SHORT} more")
    return "\n".join(lines)
