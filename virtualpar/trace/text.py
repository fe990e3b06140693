"""A text timeline of a trace, for terminals, logs and error messages.

One row per device, time on the x axis: the trace's span ``[t0, t1]`` (earliest start to latest
end) is cut into ``width`` equal columns of ``(t1 - t0) / width`` seconds, and an event covers every
column its interval ``[start, end)`` touches -- at least one, so a zero-length event still shows::

    timeline (model clock): 2 devices, 0 s .. 4 ms, 1 column = 100 µs
    device 0 |####################>>>>>>>>>>..........|
    device 1 |..........<<<<<<<<<<<<<<<<<<<<##########|
              0 s                                 4 ms
    legend (by priority): # compute  = collective  x send+recv  > send  < recv  ~ wait  . idle

Several events in one column: the symbol of the highest priority wins, in this order::

    #  compute      (what the device computes matters most: comm behind it is overlapped)
    =  collective   (a whole collective reads as one block; its send/recv detail is in Chrome)
    x  send+recv    (both directions in the same column, e.g. a ring step)
    >  send, <  recv
    ~  wait
    .  idle
"""

from __future__ import annotations

import math

from virtualpar.errors import UsageError
from virtualpar.trace.event import check_clock
from virtualpar.trace.events import Trace

__all__ = ["to_text", "format_seconds", "SYMBOLS", "LEGEND"]

#: The symbol of each event kind (``x`` marks a column holding both a send and a recv).
SYMBOLS: dict[str, str] = {"compute": "#", "collective": "=", "send": ">", "recv": "<", "wait": "~"}
LEGEND = "legend (by priority): # compute  = collective  x send+recv  > send  < recv  ~ wait  . idle"

_BIT = {"compute": 1, "collective": 2, "send": 4, "recv": 8, "wait": 16}


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


def format_seconds(t: float) -> str:
    """``t`` seconds in a readable unit with 4 significant digits: ``"12.5 ms"``, ``"3 µs"``."""
    a = abs(t)
    if a < 1e-12:  # below a picosecond is float rounding of differences, not time
        return "0 s"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if a >= scale:
            return f"{t / scale:.4g} {unit}"
    return f"{t / 1e-9:.4g} ns"


def to_text(trace: Trace, clock: str = "model", width: int = 100) -> str:
    """The text timeline of ``trace`` on ``clock``, ``width`` columns wide (see the module doc).

    An empty trace gives ``"(no events)"``.  Rows are labelled with the device names; devices that
    recorded nothing show as all idle.
    """
    check_clock(clock, "to_text")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise UsageError(f"to_text: width must be a positive int (columns), got {width!r}")
    if not len(trace):
        return "(no events)"
    t0, t1 = trace.bounds(clock)
    span = t1 - t0
    col = span / width

    labels = {r: trace.device_name(r) for r in trace.ranks}
    pad = max(len(s) for s in labels.values())
    lines = [f"timeline ({clock} clock): {len(trace.ranks)} device{'s' if len(trace.ranks) != 1 else ''}, "
             f"{format_seconds(t0)} .. {format_seconds(t1)}, 1 column = {format_seconds(col)}"]
    for rank, events in trace.by_rank().items():
        masks = [0] * width
        for e in events:
            if col > 0:
                first = int((e.start(clock) - t0) / col)
                # the 1e-9 keeps an end that lands on a column edge from spilling into the next one
                last = math.ceil((e.end(clock) - t0) / col - 1e-9) - 1
            else:
                first = last = 0
            first = min(max(first, 0), width - 1)
            last = min(max(last, first), width - 1)
            bit = _BIT[e.kind]
            for i in range(first, last + 1):
                masks[i] |= bit
        lines.append(f"{labels[rank]:<{pad}} |{''.join(_symbol(m) for m in masks)}|")

    left, right = format_seconds(t0), format_seconds(t1)
    gap = width - len(left) - len(right)
    axis = left + " " * gap + right if gap >= 1 else f"{left} .. {right}"
    lines.append(" " * (pad + 2) + axis)
    lines.append(LEGEND)
    return "\n".join(lines)
