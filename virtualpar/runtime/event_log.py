"""A device's trace events, kept as flat scalars until the trace is read.

Every message, collective and compute charge of a traced run keeps one event, so keeping one is
on the path of every op.  An event is ``STRIDE`` consecutive slots of one flat list: how its
fields were kept, kind, name, wall start and end (seconds since the cluster's start), modelled
start and end, op number, then six slots of fields that depend on how they were kept::

    message     nbytes, peer, flow src, flow dst, flow number, resets    (src None: no flow id)
    collective  nbytes moved, (group, shape, dtype, algorithm), group_seq, -, -, -
    compute     flops, bytes, -, -, -, -
    keep / add  the fields dict, -, -, -, -, -

None of these slots holds a container made for the event (the collective's middle tuple is the
one its cached call holds, shared by all its calls), so keeping an event leaves nothing behind
for the garbage collector.  It used to keep a tuple per event, with the message's flow id in
another: every ~230 events a generation-0 collection, and as the log grew collections of the older
generations that walked it — 1.1 µs per event in one process, about 1.2 µs of the default
configuration's 4 KiB one-way latency of 13 µs (benchmarks/README.md).  The events are built as
:class:`~virtualpar.trace.event.Event` only when the log is read: a frozen 15-field ``Event`` costs
~2 µs to build, more than the rest of the bookkeeping of the op it records.
"""

from __future__ import annotations

import sys
from time import monotonic
from typing import Any, Iterator

from ..trace.event import Event

__all__ = ["EventLog", "STRIDE"]

STRIDE = 14  # slots per event: how its fields were kept, 7 common ones, 6 of fields
_NO_FLOW = (None, None, None, None)
_MESSAGE, _COLLECTIVE, _COMPUTE, _FIELDS = "message", "collective", "compute", "fields"  # (shared strs)


class EventLog:
    """Device ``rank``'s trace events (at most ``cap``, fixed at construction; None: no cap), wall
    times kept as seconds since ``t0`` (the cluster's start).  ``dropped`` counts the events the
    cap turned away."""

    def __init__(self, rank: int, cap: int | None = None, t0: float = 0.0) -> None:
        self.rank = rank
        self.cap = cap
        self.t0 = t0
        self.dropped = 0
        self._flat: list[Any] = []
        self._room = sys.maxsize if cap is None else cap * STRIDE  # slots the cap allows

    def message(self, kind: str, wall0: float, model0: float, model1: float, seq: int, nbytes: int, peer: int,
                flow: tuple[int, int, int, int] | None) -> None:
        """A send or receive that began at ``time.monotonic()`` = ``wall0`` and ends now; ``flow``
        is ``(src, dst, message number, resets)``, the id shared with its other end, or None."""
        if len(self._flat) >= self._room:
            self.dropped += 1
            return
        t0 = self.t0
        src, dst, number, resets = _NO_FLOW if flow is None else flow
        self._flat += (_MESSAGE, kind, kind, wall0 - t0, monotonic() - t0, model0, model1, seq,
                       nbytes, peer, src, dst, number, resets)

    def collective(self, name: str, wall0: float, model0: float, model1: float, seq: int, moved: int,
                   traced: tuple, group_seq: int) -> None:
        """A collective that began at ``wall0`` and ends now: ``moved`` bytes, ``traced`` its
        cached ``(group, shape, dtype, algorithm)``, ``group_seq`` its number in its group."""
        if len(self._flat) >= self._room:
            self.dropped += 1
            return
        t0 = self.t0
        self._flat += (_COLLECTIVE, "collective", name, wall0 - t0, monotonic() - t0, model0, model1, seq,
                       moved, traced, group_seq, None, None, None)

    def compute(self, name: str, wall0: float, model0: float, model1: float, seq: int, flops: float,
                nbytes: float) -> None:
        """A compute charge of ``flops`` and ``nbytes`` whose work began at ``wall0`` and ends now."""
        if len(self._flat) >= self._room:
            self.dropped += 1
            return
        t0 = self.t0
        self._flat += (_COMPUTE, "compute", name, wall0 - t0, monotonic() - t0, model0, model1, seq,
                       float(flops), float(nbytes), None, None, None, None)

    def keep(self, kind: str, name: str, wall0: float, model0: float, model1: float, seq: int,
             fields: dict[str, Any]) -> None:
        """Any other event, its ``Event`` fields in a dict: it began at ``wall0`` and ends now."""
        if len(self._flat) >= self._room:
            self.dropped += 1
            return
        self.add(kind, name, wall0 - self.t0, monotonic() - self.t0, model0, model1, seq, fields)

    def add(self, kind: str, name: str, wall_start: float, wall_end: float, model_start: float,
            model_end: float, seq: int, fields: dict[str, Any]) -> None:
        """An event whose wall times are given (seconds since ``t0``); the cap is the caller's to check."""
        self._flat += (_FIELDS, kind, name, wall_start, wall_end, model_start, model_end, seq,
                       fields, None, None, None, None, None)

    def __len__(self) -> int:
        return len(self._flat) // STRIDE

    def __iter__(self) -> Iterator[Event]:
        rank, flat = self.rank, list(self._flat)
        for i in range(0, len(flat), STRIDE):
            form, kind, name, ws, we, ms, me, seq, a, b, c, d, e, f = flat[i:i + STRIDE]
            if form == _MESSAGE:
                fields = {"nbytes": a, "peer": b, "flow": None if c is None else _flow_id(c, d, e, f)}
            elif form == _COLLECTIVE:
                group, shape, dtype, algorithm = b
                fields = {"nbytes": a, "group": group, "shape": shape, "dtype": dtype,
                          "args": (("algorithm", algorithm), ("group_seq", c))}
            elif form == _COMPUTE:
                fields = {"args": (("flops", a), ("bytes", b))}
            else:
                fields = a
            yield Event(rank=rank, kind=kind, name=name, wall_start=ws, wall_end=we, model_start=ms,
                        model_end=me, seq=seq, **fields)

    def clear(self) -> None:
        self._flat.clear()
        self.dropped = 0


def _flow_id(src: int, dst: int, seq: int, resets: int) -> str:
    """``"2>5#17"``: message 17 from device 2 to 5; after a reset message numbers restart, so a
    cluster reset r times writes ``"2>5#17@r"`` and the ids stay unique over its life."""
    return f"{src}>{dst}#{seq}@{resets}" if resets else f"{src}>{dst}#{seq}"
