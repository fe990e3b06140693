"""Arrival counters: the fences of shared-memory collectives, in the arena, without messages.

A shared-memory algorithm needs to know that every member of its group has reached the same point
(its data is in its scratch; its reduced slice is published; it has stopped reading).  Groups are
sets of mesh axes, so a device belongs to exactly one group of each *kind* (one kind per set of
axes, see runtime/fence_kinds.py), and the members of a group enter its fences in the same program
order.  Word ``count[k][r]`` says how many fences device r has entered in its group of kind k (only
r writes it); word ``done[k][l]`` how many fences the group of kind k led by device l (its lowest
rank) has completed.  A fence, the c-th of this member in this group::

    count[k][me] = c;  full memory barrier                            (arrive)
    if count[k][r] >= c for every member r:                           (everybody is here:
        done[k][leader] = c;  ring every other member's doorbell        I arrived last)
    else: sleep until done[k][leader] >= c                            (the last one wakes me)

Every member does O(1) work of its own plus one C-level read of the group's counts (a strided
memoryview: the members of a group of one axis are evenly spaced ranks); only the last rings
anybody: n−1 wake-ups per fence, longest waiter first (below).  The per-pair counters this replaced
made every member store and load a word per peer, in Python, twice per fence — at 64 devices on two
cores ~130 µs of CPU per member per fence once the caches had gone cold between wake-ups, most of a
barrier's cost.  No wake-up is lost: of the members' (store, barrier, load) sequences, the one whose
barrier comes last in the global order loads after every store, so at least one member sees
everybody and rings the rest (two may; the second ring is a harmless spurious wake-up).  The barrier
is the lock-prefixed compare-and-swap of taking and dropping an uncontended private lock (x86-64
lets a load pass an earlier plain store to another address without one — the Dekker case); it costs
~0.1 µs and no system call.  ``done`` only grows: a stale last member of fence c cannot write after
fence c+1 completed, because c+1 needs that member's arrival.

A call's last fence may be a *release* (``release``): every member counts it, but only the
member whose scratch the others still read (the all_reduce's first member, collectives/shm.py)
waits for it — and not there, but before it next writes its scratch (``unreleased``; usually
everybody has arrived by then and nobody sleeps).  The last member to arrive rings that owner
alone.  The other members go on at once: each member of a 512 KiB all_reduce but the first
sleeps twice per call instead of three times (benchmarks/README.md).

A fence can also carry two words from each member: a 64-bit digest of its call (the collective
contract check) and its modelled clock on entry (shared-memory algorithms price themselves from
their members' entry clocks).  Member r stores them in ``digest[c mod 2][k][r]`` and
``clock[c mod 2][k][r]`` before it counts fence c, and every member reads the group's after the
fence, before it enters fence c+1.  Two slots are enough: r cannot store fence c+2's before fence
c+1 completed, which needs every reader of fence c's to have arrived at c+1, done reading — or, if
fence c+1 is a release, which nobody waits for, before fence c completed, and a release only ever
follows a fence that carries nothing (``GroupComm.release`` refuses another), so fence c's slots
have no readers.  Data written before the count is visible to a member that has seen ``done``
(x86-64 and AArch64 keep a process's stores in order for an aligned word published after them,
the same assumption the rings rely on).

A fence can also carry a small array from each member (``Layout.fence_payload_bytes``, up to
8 KiB): member r copies it into its slot ``payload[c mod 2][k][r]`` before it counts fence c, and
every member reads the group's slots after the fence — the one-fence all_reduce of small arrays
(collectives/shm.py).  The same two-slot argument holds: nobody rewrites a slot of fence c before
every reader of it has arrived at fence c+1.

Each member also stamps its arrival time (``time.monotonic``, one clock for every process) in
plane ``STAMP`` before it counts, and the last member rings the others in the order they arrived.
With more devices than cores the woken members queue for a core, and the kernel tends to run them
in the order they were woken; rung in rank order, a member that arrived first might run last and
so wait through two waves of wake-ups (the one that brought the others here, and this one).  Rung
in arrival order, every member waits about one wave: at 64 devices on 2 cores a barrier right
after another collective took 4.0–5.6 ms instead of 6.3–7.7 (benchmarks/README.md).  The stamps
only order the wake-ups; nothing depends on them for correctness (a stale one, already
overwritten for the next fence, merely moves one member in the order).

The driver zeroes every word when it resets the cluster after a failure, together with the rings.
"""

from __future__ import annotations

import sys
import threading
from time import monotonic
from typing import Any, Sequence

import numpy as np

from .shm import FENCE_PLANES, Layout, SharedArena
from .waitboard import FenceWait, rank_mask

__all__ = ["ArrivalCounters", "FenceGroup"]

# planes: entered, completed, digest, clock (+ parity), arrival
COUNT, DONE, DIGEST, CLOCK, STAMP = 0, 1, 2, 4, 6
_VIEWS_KEPT = 64  # payload views and expected digests kept per device: a handful per group and call in use


class FenceGroup:
    """One group as its member ``me`` fences in it: word indices, the members, their doorbells."""

    __slots__ = ("kind", "ranks", "peers", "others", "mine", "done", "bells", "mask", "_base", "_cols")

    def __init__(self, kind: int, ranks: Sequence[int], me: int, devices: int, doorbells: list[Any]) -> None:
        self.kind = kind
        self.ranks = tuple(ranks)
        self._base = kind * devices  # the group's row in a plane
        self.mine = self._base + me  # our word in a plane
        self.done = self._base + self.ranks[0]  # the leader's word in the ``done`` plane
        self.bells = [None if r == me else doorbells[r] for r in self.ranks]  # in group order
        self.peers = np.array([r for r in self.ranks if r != me], dtype=np.intp)  # to index per-peer counters
        self.others = np.array([i for i, r in enumerate(self.ranks) if r != me], dtype=np.intp)  # positions
        self.mask = rank_mask(self.ranks)  # for the wait board
        # the members' columns as one slice when they are evenly spaced (every group of one axis,
        # and of adjacent axes): a strided memoryview read costs one C loop, not a Python loop
        r = self.ranks
        step = r[1] - r[0] if len(r) > 1 else 1
        even = all(b - a == step for a, b in zip(r, r[1:]))
        self._cols = slice(r[0], r[-1] + 1, step) if even else list(r)

    @property
    def span(self) -> slice | None:
        """The members' ranks as one slice when they are evenly spaced, else None."""
        return self._cols if type(self._cols) is slice else None

    def words(self, plane: memoryview, first: int) -> Any:
        """The members' words of the plane that starts at word ``first`` of ``plane``, in group order
        (a memoryview slice, or a list)."""
        cols, base = self._cols, first + self._base
        if type(cols) is slice:
            return plane[base + cols.start : base + cols.stop : cols.step]
        return [plane[base + c] for c in cols]


class ArrivalCounters:
    """Device ``me``'s view of the arrival words (a fence is ``arrive``, then wait for ``arrived``)."""

    def __init__(self, arena: SharedArena, layout: Layout, me: int, doorbells: list[Any]) -> None:
        K, D = layout.fence_kinds, layout.devices
        raw = arena.bytes_at(layout.arrivals_offset, 8 * FENCE_PLANES * K * D)
        self._w, self._f = raw.cast("Q"), raw.cast("d")  # word access, ~40 ns each
        self._plane = K * D  # words per plane
        self._me, self._devices, self._bells = me, D, doorbells
        self._groups: dict[int, FenceGroup] = {}
        self._fence = threading.Lock()
        self._expect: dict[tuple[int, int], bytes] = {}  # (digest, members) -> that digest repeated, as bytes
        P = layout.fence_payload_bytes
        self.payload_bytes = P
        self._slots = arena.view(layout.payloads_offset, 2 * K * D * P).reshape(2, K, D, P) if P else None
        self._views: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
        self.unreleased: dict[int, tuple[FenceGroup, int]] = {}  # kind -> (group, release) this owner awaits

    def group(self, kind: int, ranks: Sequence[int]) -> FenceGroup:
        """The group of ``kind`` (its members ``ranks``, this device among them), kept per kind."""
        grp = self._groups.get(kind)
        if grp is None:
            grp = self._groups[kind] = FenceGroup(kind, ranks, self._me, self._devices, self._bells)
        return grp

    def arrive(self, grp: FenceGroup, digest: int | None = None, clock: float | None = None,
               owner: int | None = None) -> int:
        """Enter the next fence of ``grp``, publishing first the ``digest`` of our call and our
        ``clock`` if given; returns its number c.  If every member has arrived, completes it and
        wakes the others — only the member at position ``owner`` of a release (see ``release``)
        — so that then ``arrived(grp, c)`` holds already."""
        w, mine, plane = self._w, grp.mine, self._plane
        c = w[mine] + 1
        if digest is not None:
            w[(DIGEST + (c & 1)) * plane + mine] = digest
        if clock is not None:
            self._f[(CLOCK + (c & 1)) * plane + mine] = clock
        self._f[STAMP * plane + mine] = monotonic()
        w[mine] = c
        with self._fence:  # a full memory barrier between the store and the loads
            pass
        if min(grp.words(w, COUNT)) >= c and w[plane + grp.done] < c:
            w[plane + grp.done] = c
            if owner is None:
                self._ring(grp)
            elif grp.bells[owner] is not None:
                grp.bells[owner].release()
        return c

    def release(self, grp: FenceGroup, owner: int, mine: bool) -> None:
        """Enter the next fence of ``grp`` as a release: nobody waits for it here.  The member at
        position ``owner`` (``mine``: we are it) must not write its scratch again until every
        member has arrived, which ``unreleased`` remembers for it to wait for (see the module
        docstring).  The fence before it must carry nothing (no digest, clock or payload)."""
        c = self.arrive(grp, owner=owner)
        if mine and not self.arrived(grp, c):
            self.unreleased[grp.kind] = (grp, c)  # (a later release of the kind implies an earlier one)

    def reset(self) -> None:
        """Forget the releases awaited (the driver zeroed the words after a failure)."""
        self.unreleased.clear()

    def _ring(self, grp: FenceGroup) -> None:
        """Wake the other members of ``grp``, the one that arrived first first (by their stamps)."""
        bells = grp.bells
        for i in np.asarray(grp.words(self._f, STAMP * self._plane)).argsort(kind="stable").tolist():
            bell = bells[i]
            if bell is not None:
                bell.release()

    def next_fence(self, grp: FenceGroup) -> int:
        """The number of the fence of ``grp`` this member enters next."""
        return self._w[grp.mine] + 1

    def payload_views(self, grp: FenceGroup, c: int, dtype: np.dtype,
                      count: int) -> tuple[np.ndarray, np.ndarray | None]:
        """For fence ``c`` of ``grp`` carrying ``count`` items of ``dtype`` from each member: this
        member's slot, a 1-d array to fill before the fence, and every member's slot as rows
        (members, count) in group order to read after it (valid until this member enters fence
        ``c`` + 1) — or None for members not evenly spaced, whose rows :meth:`payloads` copies
        after the fence.  Views of fixed memory, so they are kept per (parity, kind, dtype,
        count): a repeated small all_reduce makes none (five numpy indexing calls, ~1.5 µs warm;
        paired blocks of barrier + one-float all_reduce in one cluster ran 4–8% faster at 2, 4 and
        8 devices, and not measurably so at 64, where the wake-ups dominate)."""
        key = (c & 1, grp.kind, dtype, count)
        views = self._views.get(key)
        if views is None:
            slots, nbytes = self._slots[c & 1, grp.kind], count * dtype.itemsize
            rows = slots[grp._cols, :nbytes].view(dtype) if grp.span is not None else None
            if len(self._views) >= _VIEWS_KEPT:
                self._views.clear()
            views = self._views[key] = (slots[self._me, :nbytes].view(dtype), rows)
        return views

    def payloads(self, grp: FenceGroup, c: int, dtype: np.dtype, count: int) -> np.ndarray:
        """After fence ``c`` of ``grp``: the first ``count`` items of every member's slot as
        ``dtype``, shape (members, count), in group order — a view for evenly spaced members,
        else a copy; valid until this member enters fence ``c`` + 1."""
        return self._slots[c & 1, grp.kind, :, : count * dtype.itemsize][grp._cols].view(dtype)

    def arrived(self, grp: FenceGroup, c: int) -> bool:
        """Has fence ``c`` of ``grp`` completed (every member entered it)?"""
        return self._w[self._plane + grp.done] >= c

    def differing(self, grp: FenceGroup, c: int, digest: int) -> list[int]:
        """After fence ``c``, which published digests: the members whose digest differs from ``digest``."""
        theirs = grp.words(self._w, (DIGEST + (c & 1)) * self._plane)
        if type(theirs) is memoryview:  # compared as bytes: 64-bit ints would each be a new object
            key = (digest, len(theirs))  # (kept per call: a loop alternates the digests of its calls)
            expect = self._expect.get(key)
            if expect is None:
                if len(self._expect) >= _VIEWS_KEPT:
                    self._expect.clear()
                expect = self._expect[key] = digest.to_bytes(8, sys.byteorder) * len(theirs)
            if theirs.tobytes() == expect:
                return []
        return [r for r, d in zip(grp.ranks, theirs) if d != digest]

    def clocks(self, grp: FenceGroup, c: int) -> list[float]:
        """After fence ``c``, which published clocks: every member's clock on entering it, in group order."""
        theirs = grp.words(self._f, (CLOCK + (c & 1)) * self._plane)
        return theirs.tolist() if type(theirs) is memoryview else theirs

    def waiting_for(self, grp: FenceGroup, c: int) -> FenceWait:
        """What a wait for fence ``c`` of ``grp`` publishes on the wait board."""
        return FenceWait(grp.ranks, grp.kind, c, grp.mask)
