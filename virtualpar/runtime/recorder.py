"""The flight recorder: each device's last 64 ops, kept in shared memory.

Because the records live in the cluster's shared arena rather than in the device's own memory,
they survive the device: the driver reads a SIGKILLed device's last op, and a device whose
collective timed out reads what each of its peers is doing right now.  Each record is 256 bytes::

    seq i64 | state i32 | run i32 | wall_start f64 | wall_end f64 | model_start f64 | model_end f64 | text 208s

``run`` numbers the ``cluster.run`` calls (the same on every device, since every device serves every
run), so that "op #2 on group G" of this run is never confused with one of an earlier run.

Writing one record costs one ``struct.pack_into`` (about a microsecond).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

import numpy as np

from ..transport.shm import RECORD_BYTES, RECORD_SLOTS, Layout, SharedArena

__all__ = ["FlightRecorder", "OpRecord", "format_records"]

_REC = struct.Struct("<qii4d208s")
assert _REC.size == RECORD_BYTES
STARTED, DONE, FAILED = 1, 2, 3
_STATE_NAMES = {STARTED: "started", DONE: "done", FAILED: "failed"}


@dataclass(frozen=True)
class OpRecord:
    """One recorded op of one device (wall times are ``time.monotonic()`` seconds; ``run``: see module doc)."""

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
        return f"op #{self.seq} {self.text} [{self.state} in {1e3 * (self.wall_end - self.wall_start):.2f} ms]"


class FlightRecorder:
    """Device ``rank``'s ring of op records (any process of the cluster may read it)."""

    def __init__(self, arena: SharedArena, layout: Layout, rank: int) -> None:
        self.rank = rank
        base = layout.recorder_offset(rank)
        self._count = arena.view(base, 1, np.int64)
        self._buf = arena.view(base + 64, RECORD_SLOTS * RECORD_BYTES)
        self._mv = memoryview(self._buf)

    def start(self, seq: int, text: str, model: float, run: int = 0) -> int:
        slot = int(self._count[0]) % RECORD_SLOTS
        raw = text.encode("utf-8", "replace")[:208]
        _REC.pack_into(self._mv, slot * RECORD_BYTES, seq, STARTED, run, time.monotonic(), 0.0, model, 0.0, raw)
        self._count[0] += 1
        return slot

    def finish(self, slot: int, model: float, failed: bool = False) -> None:
        off = slot * RECORD_BYTES
        struct.pack_into("<i", self._mv, off + 8, FAILED if failed else DONE)
        struct.pack_into("<d", self._mv, off + 24, time.monotonic())
        struct.pack_into("<d", self._mv, off + 40, model)

    def records(self) -> list[OpRecord]:
        """Every kept record, oldest first."""
        count = int(self._count[0])
        out = []
        for i in range(max(0, count - RECORD_SLOTS), count):
            seq, state, run, ws, we, ms, me, raw = _REC.unpack_from(self._mv, (i % RECORD_SLOTS) * RECORD_BYTES)
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
