"""What a device records about its ops: the flight recorder (shared memory); and the merging of the
devices' trace events (kept by ``event_log.EventLog``) into one trace.

The flight recorder keeps each device's last 64 ops in shared memory.

Because the records live in the cluster's shared arena rather than in the device's own memory,
they survive the device: the driver reads a SIGKILLed device's last op, and a device whose
collective timed out reads what each of its peers is doing right now.  Each record is 256 bytes::

    seq i64 | wall_start f64 | model_start f64 | run i32 | state i32 | wall_end f64 | model_end f64
    | text 208s

(``state``, ``wall_end`` and ``model_end`` are adjacent so that finishing an op is one write.)

``run`` numbers the ``cluster.run`` calls (the same on every device, since every device serves every
run), so that "op #2 on group G" of this run is never confused with one of an earlier run.

Starting an op costs one ``struct.pack_into`` of the whole record and finishing it one of 20
bytes (each well under a microsecond).  ``text`` may be passed already encoded: :class:`OpTexts`
keeps the encoded text of a device's recent point-to-point ops, so a loop of sends formats it once,
and a slot that already holds that very ``bytes`` object (a loop of as many ops as there are slots,
or a divisor of it) is not written again: only the 52 bytes before the text are.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._words import counted
from ..trace.event import Event
from ..transport.shm import RECORD_BYTES, RECORD_SLOTS, Layout, SharedArena

__all__ = ["FlightRecorder", "OpRecord", "OpTexts", "describe_payload", "format_records", "merged_trace"]

_REC = struct.Struct("<qddiidd208s")
_HEAD = struct.Struct("<qddiidd")  # a record without its text
_END = struct.Struct("<idd")  # state, wall_end, model_end
_END_OFFSET = 28
assert _REC.size == RECORD_BYTES and RECORD_SLOTS & (RECORD_SLOTS - 1) == 0  # slot = count & (SLOTS - 1)
STARTED, DONE, FAILED = 1, 2, 3
_STATE_NAMES = {STARTED: "started", DONE: "done", FAILED: "failed"}


@dataclass(frozen=True)
class OpRecord:
    """One recorded op of one device (wall times are ``time.monotonic()`` seconds; ``run``: see the
    module doc)."""

    rank: int
    seq: int
    state: str
    wall_start: float
    wall_end: float
    model_start: float
    model_end: float
    text: str
    run: int = 0

    def describe(self, now: float | None = None) -> str:
        if self.state == "started":
            ago = (time.monotonic() if now is None else now) - self.wall_start
            return f"op #{self.seq} {self.text} [started {ago:.2f} s ago, not finished]"
        took = 1e3 * (self.wall_end - self.wall_start)
        return f"op #{self.seq} {self.text} [{self.state} in {took:.2f} ms]"


class FlightRecorder:
    """Device ``rank``'s ring of op records (any process of the cluster may read it)."""

    def __init__(self, arena: SharedArena, layout: Layout, rank: int) -> None:
        self.rank = rank
        base = layout.recorder_offset(rank)
        self._count = memoryview(arena.view(base, 1, np.int64))  # one aligned word: cheaper than numpy's []
        self._buf = arena.view(base + 64, RECORD_SLOTS * RECORD_BYTES)
        self._mv = memoryview(self._buf)
        self._texts: list[bytes | None] = [None] * RECORD_SLOTS  # the encoded text each slot holds now

    def start(self, seq: int, text: str | bytes, model: float, run: int = 0) -> int:
        """Record op ``seq`` as started; ``text`` is a str or its UTF-8 encoding (cut to 208 bytes)."""
        count = self._count[0]
        slot = count & (RECORD_SLOTS - 1)
        if text is self._texts[slot]:  # a loop of ops: the slot already holds this very text
            _HEAD.pack_into(self._mv, slot * RECORD_BYTES, seq, time.monotonic(), model, run, STARTED, 0.0,
                            0.0)
        else:
            raw = text if type(text) is bytes else text.encode("utf-8", "replace")  # type: ignore[union-attr]
            # struct's "208s" cuts longer text (a cut UTF-8 sequence decodes as U+FFFD) and pads with NULs
            _REC.pack_into(self._mv, slot * RECORD_BYTES, seq, time.monotonic(), model, run, STARTED,
                           0.0, 0.0, raw)
            self._texts[slot] = raw if raw is text else None
        self._count[0] = count + 1
        return slot

    def finish(self, slot: int, model: float, failed: bool = False) -> None:
        _END.pack_into(self._mv, slot * RECORD_BYTES + _END_OFFSET, FAILED if failed else DONE,
                       time.monotonic(), model)

    def records(self) -> list[OpRecord]:
        """Every kept record, oldest first."""
        count = int(self._count[0])
        out = []
        for i in range(max(0, count - RECORD_SLOTS), count):
            seq, ws, ms, run, state, we, me, raw = _REC.unpack_from(self._mv,
                                                                    (i % RECORD_SLOTS) * RECORD_BYTES)
            text = raw.rstrip(b"\0").decode("utf-8", "replace")
            out.append(OpRecord(self.rank, seq, _STATE_NAMES.get(state, "?"), ws, we, ms, me, text, run))
        return out

    def last(self) -> OpRecord | None:
        recs = self.records()
        return recs[-1] if recs else None

    def reset(self) -> None:
        self._count[0] = 0


def format_records(records: list[OpRecord], limit: int = 8) -> str:
    """The last ``limit`` records as indented lines, for error messages."""
    now = time.monotonic()
    lines = [f"    {r.describe(now)}" for r in records[-limit:]]
    return "\n".join(lines) if lines else "    (no ops recorded)"


def describe_payload(x: Any) -> str:
    """How a send's payload appears in its record: ``array(shape=(4, 8), float32)`` or the type name."""
    if isinstance(x, np.ndarray):
        return f"array(shape={x.shape}, {x.dtype})"
    return type(x).__name__


class OpTexts:
    """Flight-recorder texts of point-to-point ops, formatted once per kind of op and reused.

    ``str(dtype)`` alone costs ~2 µs, more than the rest of a send's bookkeeping, so the texts are
    kept per ``(dst, tag, shape, dtype)`` (or ``(dst, tag, type)``) of a send and per ``(src, tag)``
    of a receive, each as ``(text, its UTF-8 encoding)``.  At most ``limit`` of each are kept; a
    loop over many tags or shapes just formats again.  Structured dtypes are never kept: two equal
    ones can print differently (``align=True``), and the text must name the one actually sent.
    """

    def __init__(self, limit: int = 1024) -> None:
        self._limit = limit
        self._sends: dict[tuple, tuple[str, bytes]] = {}
        self._recvs: dict[tuple, tuple[str, bytes]] = {}

    def send(self, x: Any, dst: int, tag: int, verb: str = "send") -> tuple[str, bytes]:
        """``send to {dst} tag={tag} {describe_payload(x)}`` (or ``ssend``), and its encoding."""
        if isinstance(x, np.ndarray):
            key: tuple = (dst, tag, x.shape, x.dtype, verb)
            entry = self._sends.get(key)
            if entry is None:
                text = f"{verb} to {dst} tag={tag} {describe_payload(x)}"
                if x.dtype.names is not None:
                    return text, text.encode("utf-8", "replace")
                entry = self._keep(self._sends, key, text)
            return entry
        key = (dst, tag, type(x), verb)
        entry = self._sends.get(key)
        if entry is None:
            entry = self._keep(self._sends, key, f"{verb} to {dst} tag={tag} {describe_payload(x)}")
        return entry

    def recv(self, src: int, tag: int) -> tuple[str, bytes]:
        """``recv from {src} tag={tag}``, and its encoding."""
        key = (src, tag)
        entry = self._recvs.get(key)
        if entry is None:
            text = f"recv from {'any' if src < 0 else src} tag={'any' if tag < 0 else tag}"
            entry = self._keep(self._recvs, key, text)
        return entry

    def _keep(self, cache: dict[tuple, tuple[str, bytes]], key: tuple, text: str) -> tuple[str, bytes]:
        if len(cache) >= self._limit:
            cache.clear()
        entry = cache[key] = (text, text.encode("utf-8", "replace"))
        return entry


def merged_trace(replies: list[tuple[list[Event], int]], names: dict[int, str], cap: int) -> Any:
    """Every device's ``(events, dropped)`` as one :class:`~virtualpar.trace.Trace`; a device whose
    log filled up is reported (RuntimeWarning), never silently cut short."""
    import warnings

    from ..trace.events import Trace

    full = {r: dropped for r, (_, dropped) in enumerate(replies) if dropped}
    if full:
        where = ", ".join(f"device {r} dropped {counted(n, 'event')}" for r, n in full.items())
        warnings.warn(f"trace: {where} past the {cap} a device keeps; the trace holds only the first "
                      f"{cap} of each: read it with cluster.trace(clear=True) between phases to keep them "
                      "all",
                      RuntimeWarning, stacklevel=3)
    return Trace([e for evs, _ in replies for e in evs], device_names=names)
