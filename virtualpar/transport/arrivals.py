"""Arrival counters: the fences of shared-memory collectives, in the arena, without messages.

A shared-memory algorithm needs to know that every member of its group has reached the same point
(its data is in its scratch; its reduced slice is published; it has stopped reading).  Word
``count[i][j]`` of the arena says how many fences device i has entered *together with* device j;
only i writes it.  A fence over a group is, for each peer j::

    count[me][j] += 1;  ring j's doorbell          (arrive)
    wait until count[j][me] >= count[me][j]          (j has arrived at this fence too)

Members of a group enter their fences in the same program order, so the k-th fence i enters with j
is the k-th fence j enters with i, whichever groups each also fenced with others in between: the
pairwise counts need no group identifier and no local state.  Cost: n−1 word stores and n−1
semaphore posts per member, then a poll (a message-based dissemination barrier costs ⌈log2 n⌉
messages, ~10 µs each here).  Data written before ``arrive`` is visible to a peer that has seen
the count (x86-64 and AArch64 keep a process's stores in order for an aligned word published
after them, the same assumption the rings rely on).

The driver zeroes every count when it resets the cluster after a failure, together with the rings.
"""

from __future__ import annotations

from typing import Any, Sequence

from .shm import Layout, SharedArena

__all__ = ["ArrivalCounters"]


class ArrivalCounters:
    """Device ``me``'s view of the arrival counters (a fence is ``arrive`` then wait for ``arrived``)."""

    def __init__(self, arena: SharedArena, layout: Layout, me: int, doorbells: list[Any]) -> None:
        self._out = arena.bytes_at(layout.arrival_offset(me, 0), 8 * layout.devices).cast("Q")
        self._in = [arena.word_at(layout.arrival_offset(j, me)) for j in range(layout.devices)]
        self._bells = doorbells

    def arrive(self, peers: Sequence[int]) -> None:
        """Count one more fence with each of ``peers`` and wake them."""
        out, bells = self._out, self._bells
        for j in peers:
            out[j] += 1
            bells[j].release()

    def arrived(self, peers: Sequence[int]) -> bool:
        """Has every peer entered as many fences with us as we have with it?"""
        out, words = self._out, self._in
        for j in peers:
            if words[j][0] < out[j]:
                return False
        return True
