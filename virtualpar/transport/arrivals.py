"""Arrival counters: the fences of shared-memory collectives, in the arena, without messages.

A shared-memory algorithm needs to know that every member of its group has reached the same point
(its data is in its scratch; its reduced slice is published; it has stopped reading).  Word
``count[i][j]`` of the arena says how many fences device i has entered *together with* device j;
only i writes it.  A fence over a group is::

    count[me][j] += 1 for each peer j;  full memory barrier          (arrive)
    if count[j][me] >= count[me][j] for every peer j:                (everybody is here:
        ring every peer's doorbell                                     I arrived last)
    else: sleep until that holds                                     (the last one wakes me)

Only the last member to arrive rings anybody: n−1 wake-ups per fence, not the n(n−1) of every
member ringing every peer, which at 64 devices on 2 cores was a storm of context switches.  No
wake-up is lost: of the members' (store, barrier, load) sequences, the one whose barrier comes
last in the global order loads after every store, so at least one member sees everybody and
rings the rest.  The barrier is the lock-prefixed compare-and-swap of taking and dropping an
uncontended private lock (x86-64 lets a load pass an earlier plain store to another address
without one — the Dekker case); it costs ~0.1 µs and no system call.

Members of a group enter their fences in the same program order, so the k-th fence i enters with j
is the k-th fence j enters with i, whichever groups each also fenced with others in between: the
pairwise counts need no group identifier and no local state.  Cost: n−1 word stores and one
semaphore post per member, n−1 posts by the last, then a poll (a message-based dissemination barrier costs ⌈log2 n⌉
messages, ~10 µs each here).  Data written before ``arrive`` is visible to a peer that has seen
the count (x86-64 and AArch64 keep a process's stores in order for an aligned word published
after them, the same assumption the rings rely on).

A fence can also carry a word or two from each member to each peer: a 64-bit digest of its call
(the collective contract check) and its modelled clock on entry (shared-memory algorithms price
themselves from their members' entry clocks).  Member i stores them in ``slot[i][j][c mod 2]``
before it counts fence c with j, and j reads them after the fence.  Two slots per pair are
enough: i cannot store fence c+2's before j arrived at fence c+1, by which time j has read c's.
(A single shared word per member would not do: a member leaving a one-fence collective early
could overwrite it while a slower peer is still about to read it.)

The driver zeroes every count when it resets the cluster after a failure, together with the rings.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from .lazy import Lazy
from .shm import ARRIVAL_WORDS, Layout, SharedArena

__all__ = ["ArrivalCounters"]


class ArrivalCounters:
    """Device ``me``'s view of the arrival counters (a fence is ``arrive`` then wait for ``arrived``)."""

    def __init__(self, arena: SharedArena, layout: Layout, me: int, doorbells: list[Any]) -> None:
        raw = arena.bytes_at(layout.arrival_offset(me, 0), ARRIVAL_WORDS * 8 * layout.devices)
        self._row, self._row_f = raw.cast("Q"), raw.cast("d")
        self._out = self._row[::ARRIVAL_WORDS]  # count[me][j] at index j
        # peer j's slot for us (its count, digests and clocks), viewed as words and as floats, on first use
        slot = lambda j: arena.bytes_at(layout.arrival_offset(j, me), ARRIVAL_WORDS * 8)  # noqa: E731
        self._in = Lazy(lambda j: slot(j).cast("Q"))
        self._in_f = Lazy(lambda j: slot(j).cast("d"))
        self._bells = doorbells
        self._fence = threading.Lock()

    def arrive(self, peers: Sequence[int], digest: int | None = None, clock: float | None = None) -> bool:
        """Count one more fence with each of ``peers``, publishing first the ``digest`` of our call
        and our ``clock`` if given; True if every peer had already arrived, in which case they have
        been woken."""
        out = self._out
        if digest is not None or clock is not None:
            row, row_f, words = self._row, self._row_f, ARRIVAL_WORDS
            for j in peers:
                c = out[j]
                if digest is not None:
                    row[words * j + 1 + (c & 1)] = digest
                if clock is not None:
                    row_f[words * j + 3 + (c & 1)] = clock
                out[j] = c + 1
        else:
            for j in peers:
                out[j] += 1
        with self._fence:  # a full memory barrier between the stores and the loads
            pass
        if not self.arrived(peers):
            return False
        bells = self._bells
        for j in peers:
            bells[j].release()
        return True

    def differing(self, peers: Sequence[int], digest: int) -> list[int]:
        """After a fence that published digests: the peers whose digest differs from ``digest``."""
        out, words = self._out, self._in
        return [j for j in peers if words[j][1 + ((out[j] - 1) & 1)] != digest]

    def clocks(self, peers: Sequence[int]) -> list[float]:
        """After a fence that published clocks: each peer's clock on entering it."""
        out, slots = self._out, self._in_f
        return [slots[j][3 + ((out[j] - 1) & 1)] for j in peers]

    def arrived(self, peers: Sequence[int]) -> bool:
        """Has every peer entered as many fences with us as we have with it?"""
        out, words = self._out, self._in
        for j in peers:
            if words[j][0] < out[j]:
                return False
        return True
