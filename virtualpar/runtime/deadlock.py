"""Deadlock detection: the driver reads the wait board while it waits for a run's replies.

Every device that *sleeps* in a wait has published on the wait board (transport/waitboard.py) what
it waits for.  Every ``WATCH_EVERY`` seconds the driver takes a snapshot and computes which devices
can still make progress, as a least fixed point:

* *live*: a device of the run that is not asleep in a wait (user compute, polling, a wait of any
  other kind), and a sleeping device with bytes unread in any ring into it (in flight);
* then, repeatedly, a sleeping device one of whose waited-for devices is live (a receive or send:
  its peer; a fence: any member that has not arrived, read from the arrival counters; an
  any-source receive: anybody), or a fence every member has arrived at.

The rest are *dead*: they sleep, nothing is in flight to them, and they wait only for each other
or for devices that already returned from the run.  Taking "any dependency live" as live never
declares too much: a fence waiting on two devices, one of which computes, is live.

Evidence that a sleeping device will wake: bytes unread in a ring into it (a header, an offer, a
streamed chunk), an answer to the rendezvous offer its send waits on (the channel's reply word holds
its token), or a matching pair (it waits to receive from ``p`` with tag ``t`` while ``p`` waits to send
it ``t``).  Every change that ends a wait leaves one of these, or moves the arrival counters read for
fences, so a device that was rung but has not run yet never looks dead.

Being dead in one snapshot is still not enough: a device may have been woken but not have run yet (a
loaded machine), or a change may be on its way.  So the driver *pokes* the dead set (writes a
fresh number into each member's ``POKE`` word, then rings its doorbell) and declares a deadlock
only when a later snapshot finds the same dead set with the same waits, every member asleep with
``ACK`` equal to that number -- each re-checked its wait after the poke and still found it
unfinished -- and every member's ``GEN`` unchanged across the snapshot (nobody woke while it was
taken).  A state in which no member can change anything unless another member does, and every
member has checked after the last change, is stuck for good.  Cost: a few hundred word reads per
scan in the driver; the devices write the board only when they go to sleep.

A scan's cost grows with the devices (measured: ~0.4 ms at 16, 1.4 ms at 64, 4.5 ms at 128), and
the driver shares the cores with them, so the time to the next scan is ``WATCH_EVERY`` or 1 /
``SCAN_SHARE`` times the last scan's cost, whichever is longer (the scans then take at most 5% of
the driver's time: at 128 devices they took 11% of a core), and ``WATCH_EVERY`` again while a
candidate waits to be confirmed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..errors import Deadlock
from ..mesh import Mesh
from ..transport.channel import OFFER_SLOTS, offer_slot
from ..transport.shm import FENCE_PLANES, Layout, SharedArena, ring_control
from ..transport.waitboard import (ACK, ANY, ANY_TAG, FENCE, GEN, KIND, KIND_NAMES, MASK, NONE, PEER, POKE,
                                  RECV, SEND, SEVERAL, TAG, board_view)
from .fence_kinds import kind_axes
from .recorder import FlightRecorder

__all__ = ["DeadlockWatch", "WATCH_EVERY", "SCAN_SHARE"]

WATCH_EVERY = 0.02  # seconds between scans of the wait board while the driver waits, at least
SCAN_SHARE = 0.05  # ... and at most this share of the driver's time goes to scans
_BLOCKING = (RECV, SEND, FENCE, ANY)


class DeadlockWatch:
    """The driver's view of one cluster's wait board and rings."""

    def __init__(self, mesh: Mesh, arena: SharedArena, layout: Layout, recorders: list[FlightRecorder],
                 doorbells: list[Any]) -> None:
        n = layout.devices
        self.mesh = mesh
        self.n = n
        self._boards = [board_view(arena, layout, r) for r in range(n)]
        self._recorders = recorders
        self._bells = doorbells
        # numpy views of the shared words, indexed [src, dst]: built in O(1), read only when needed
        ctrl = ring_control(arena, layout)
        self._heads, self._tails = ctrl[:, :n, 0], ctrl[:, :n, 8]
        self._replies = ctrl[:n, :n, 9 : 9 + OFFER_SLOTS]
        words = arena.view(layout.arrivals_offset, FENCE_PLANES * layout.fence_kinds * n, np.uint64)
        self._counts = words.reshape(FENCE_PLANES, layout.fence_kinds, n)[0]  # fences entered [kind, rank]
        self._candidate: tuple | None = None
        self.every = WATCH_EVERY  # seconds until the next scan
        self._pokes = 0

    def release(self) -> None:
        """Drop every view of the arena, so that it can be unmapped even while an interrupted
        driver frame (an exception's traceback) still holds this watch."""
        self._boards, self._recorders, self._bells = [], [], []
        self._heads = self._tails = self._replies = self._counts = None  # type: ignore[assignment]

    def _read(self) -> list[tuple[int, ...]]:
        """Every device's board words, each entry read whole or marked awake (``KIND`` ``NONE``):
        ``GEN`` is read before and after the other words, and a device writes them only while
        awake, between two changes of ``GEN`` — so the same ``GEN`` twice means one wait's words
        (a seqlock).  Read across a wake-up, an entry mixed two waits' words: a fence's kind read
        with a later send's peer crashed the scan with an IndexError."""
        out = []
        for b in self._boards:
            gen = b[GEN]
            words = tuple(b[:ACK + 1])
            out.append(words if words[GEN] == gen else (NONE,) + words[1:])
        return out

    def _deps(self, d: int, entry: tuple[int, ...]) -> list[int]:
        kind = entry[KIND]
        if kind in (RECV, SEND):
            return [entry[PEER]]
        if kind == FENCE:  # the members that have not entered its fence yet (transport/arrivals.py)
            group, c = self.mesh.group_of(d, kind_axes(self.mesh, entry[PEER])), entry[TAG]
            counts = self._counts[entry[PEER]]
            return [r for r in group if r != d and counts[r] < c]
        return [r for r in range(self.n) if r != d]

    def dead_set(self, running: set[int], snap: list[tuple[int, ...]]) -> set[int]:
        """Devices of ``running`` that sleep in a wait nothing can end (one snapshot's verdict)."""
        blocked = {d for d in running if snap[d][KIND] in _BLOCKING and snap[d][GEN] & 1}
        live = set(running) - blocked
        for d in blocked:
            if (self._heads[:, d] != self._tails[:, d]).any() or self._answered(d, snap[d]):
                live.add(d)  # bytes in flight to it, or its offer answered: it will wake and go on
            elif snap[d][KIND] in (RECV, ANY):
                for p in blocked:  # a posted receive and its matching send always complete
                    e = snap[p]
                    if e[KIND] == SEND and e[PEER] == d and _takes(snap[d], e[TAG]) and (
                            snap[d][KIND] == ANY or snap[d][PEER] == p):
                        live.update((d, p))
        changed = True
        while changed:
            changed = False
            for d in blocked - live:
                deps = self._deps(d, snap[d])
                if not deps or any(p >= self.n or p in live for p in deps):  # p >= n: the host, never stuck
                    live.add(d)
                    changed = True
        return blocked - live

    def _answered(self, d: int, entry: tuple[int, ...]) -> bool:
        """Has the receiver answered the rendezvous offer ``d`` waits on (taken, or asked to stream)?"""
        token = entry[MASK]
        if entry[KIND] != SEND or not token or not 0 <= entry[PEER] < self.n:
            return False
        return int(self._replies[d, entry[PEER], offer_slot(token)]) >> 2 == token

    def reset(self) -> None:
        """Forget the candidate (a new round of replies begins)."""
        self._candidate = None
        self.every = WATCH_EVERY

    def scan(self, running: set[int]) -> Deadlock | None:
        """One look at the board (see the module doc): a ``Deadlock`` once one is certain, else None;
        sets ``every``, the seconds until the next look."""
        began = time.perf_counter()
        found = self._scan(running)
        cost = time.perf_counter() - began
        self.every = WATCH_EVERY if self._candidate is not None else max(WATCH_EVERY, cost / SCAN_SHARE)
        return found

    def _scan(self, running: set[int]) -> Deadlock | None:
        snap = self._read()
        dead = self.dead_set(running, snap)
        if not dead:
            self._candidate = None
            return None
        again = self._read()
        if any(again[d] != snap[d] for d in dead):
            return None  # somebody woke while we looked
        waits = {d: snap[d][:MASK + 1] for d in sorted(dead)}
        cand = self._candidate
        if cand is None or cand[0] != waits or any(snap[d][GEN] > cand[2][d] + 2 for d in dead):
            self._pokes += 1
            for d in dead:
                self._boards[d][POKE] = self._pokes
            for d in dead:
                self._bells[d].release()
            self._candidate = (waits, self._pokes, {d: snap[d][GEN] for d in dead})
            return None
        poke, gens = cand[1], cand[2]
        # each member woke once since the poke (reading it), re-checked, and sleeps again
        if all(snap[d][ACK] == poke and snap[d][GEN] == gens[d] + 2 for d in dead):
            self._candidate = None
            return self._error(dead, snap, running)
        return None

    # -- the message ------------------------------------------------------------------------------
    def _wait_text(self, d: int, entry: tuple[int, ...]) -> str:
        kind = entry[KIND]
        tag = "any" if kind != SEND and (entry[TAG] == ANY_TAG or entry[MASK]) else entry[TAG]
        if kind in (RECV, SEND):
            return f"{KIND_NAMES[kind]} {entry[PEER]} (tag {tag})"
        if kind == FENCE:
            return f"fence with {self._deps(d, entry)}"
        if entry[PEER] == SEVERAL:
            return "any of several requests (wait_any)"
        return f"recv from any source (tag {tag})"

    def _op_text(self, d: int) -> str:
        rec = self._recorders[d].last() if self._recorders else None
        return f"op #{rec.seq} {rec.text}" if rec is not None else "no op recorded"

    def _error(self, dead: set[int], snap: list[tuple[int, ...]], running: set[int]) -> Deadlock:
        start = min(dead)
        chain, seen = [start], {start}
        end_note = ""
        while True:
            deps = self._deps(chain[-1], snap[chain[-1]])
            nxt = next((p for p in deps if p in dead), None)
            if nxt is None:
                gone = [p for p in deps if p < self.n and p not in running]
                end_note = f" ← device {gone[0]} has returned from the run" if gone else ""
                break
            if nxt in seen:
                chain = chain[chain.index(nxt):]
                break
            chain.append(nxt)
            seen.add(nxt)
        cycle = " ← ".join(f"device {d} waits {self._wait_text(d, snap[d])}" for d in chain) + end_note
        what = "a cycle of waits" if not end_note else "waits that nothing can end"
        lines = [f"deadlock ({what}): {cycle}"]
        for d in sorted(dead):
            lines.append(f"  device {d} {self.mesh.index(d)} in {self._op_text(d)}: "
                         f"waits {self._wait_text(d, snap[d])}")
        lines.append("  every device listed sleeps with nothing in flight to it; none of them can act first.")
        waits = {d: self._wait_text(d, snap[d]) for d in sorted(dead)}
        return Deadlock("\n".join(lines), cycle=chain, waits=waits)


def _takes(entry: tuple[int, ...], tag: int) -> bool:
    """Does the receive on this board entry take a message with ``tag``?  Its ``TAG`` word, or any
    (``ANY_TAG``), or any in ``[TAG, MASK)`` when ``MASK`` is set (a span of tags: one mpi4py
    communicator's ANY_TAG, which a message of another communicator does not match)."""
    lo, hi = entry[TAG], entry[MASK]
    return lo <= tag < hi if hi else lo in (tag, ANY_TAG)
