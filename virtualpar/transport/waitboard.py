"""The wait board: what each blocked device waits for, published in shared memory.

Each device's flight-recorder line (64 bytes, of which the record count uses the first 8) holds
seven more int64 words, written only while the device *sleeps* on its doorbell (after its poll
phase), so a wait that ends while polling writes nothing::

    KIND | PEER | TAG | MASK | GEN | POKE | ACK

* ``KIND``: what the wait is for (``NONE`` once it returned): a receive from ``PEER`` with ``TAG``
  (``ANY_TAG``, -1, for any tag; any in ``[TAG, MASK)`` when ``MASK`` is set, the mpi4py facade's
  ANY_TAG within one communicator; ``KIND`` ``ANY`` for any source; ``ANY`` with ``PEER``
  ``SEVERAL``, -2, for ``wait_any`` on several requests, which anybody might end),
  a send to ``PEER`` with ``TAG`` (that the receiver has not taken yet; ``MASK`` holds the token of
  its rendezvous offer, 0 for an eager send waiting for room), fence number ``TAG`` of its group of
  kind ``PEER`` (transport/arrivals.py), whose members are in ``MASK`` (bit ``r`` for device ``r``;
  -1 when there are more than 63 devices), or something else
  (``OTHER``: never part of a deadlock).
* ``GEN``: odd while the device sleeps, even while awake inside the wait (+1 before each sleep and
  after each wake-up), so a reader that sees the same odd ``GEN`` twice knows it slept in between.
* ``POKE`` is written by the deadlock detector before it rings the device; the device reads it
  when it wakes and copies it to ``ACK`` before it sleeps again.  ``ACK == POKE`` thus proves the
  device re-checked its wait *after* the poke and still found it unfinished (see
  runtime/deadlock.py for why that makes detection free of false positives).
"""

from __future__ import annotations

import numpy as np

from .shm import Layout, SharedArena

__all__ = ["board_view", "describe_wait", "NONE", "RECV", "SEND", "FENCE", "ANY", "OTHER",
           "KIND", "PEER", "TAG", "MASK", "GEN", "POKE", "ACK", "ANY_TAG", "KIND_NAMES", "FenceWait", "AnyOf",
           "SEVERAL", "rank_mask"]

NONE, RECV, SEND, FENCE, ANY, OTHER = 0, 1, 2, 3, 4, 5
KIND_NAMES = {RECV: "recv from", SEND: "send to", FENCE: "fence with", ANY: "recv from any", OTHER: "wait"}
KIND, PEER, TAG, MASK, GEN, POKE, ACK = range(7)
ANY_TAG = -1  # the TAG word of a receive that takes any tag


def board_view(arena: SharedArena, layout: Layout, rank: int) -> memoryview:
    """Device ``rank``'s seven board words (int64), right after its flight-record count."""
    return memoryview(arena.view(layout.recorder_offset(rank) + 8, 7, np.int64))


class FenceWait:
    """What a fence waits for: every member in ``ranks`` (a group of ``kind``) to have entered
    fence number ``count`` (prints as ``a fence``)."""

    __slots__ = ("ranks", "kind", "count", "mask")

    def __init__(self, ranks, kind: int = 0, count: int = 0, mask: int | None = None) -> None:
        self.ranks = tuple(ranks)
        self.kind = kind
        self.count = count
        self.mask = rank_mask(self.ranks) if mask is None else mask

    def __str__(self) -> str:
        return "a fence"


SEVERAL = -2  # the PEER word of a wait for any of several requests (``AnyOf``)


class AnyOf:
    """What ``wait_any`` waits for: any of several requests, sends and receives, from or to
    anybody (``text`` names them).  Published as a receive from any source with any tag, which
    the deadlock detector takes for live while anybody is, and which any blocked send to this
    device could end: never a false deadlock, and a true one, everybody asleep, still named."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


def rank_mask(ranks) -> int:
    """Bit r set for each of ``ranks``; -1 if any is 63 or more (the board word is an int64)."""
    mask = 0
    for r in ranks:
        if r >= 63:
            return -1
        mask |= 1 << r
    return mask


def describe_wait(board: memoryview, what: object) -> None:
    """Publish what ``what`` (a request, a :class:`FenceWait`, anything else) waits for."""
    if type(what) is FenceWait:
        board[MASK] = what.mask
        board[PEER] = what.kind
        board[TAG] = what.count
        board[KIND] = FENCE
        return
    if type(what) is AnyOf:
        board[TAG], board[MASK], board[PEER] = ANY_TAG, 0, SEVERAL
        board[KIND] = ANY
        return
    if not hasattr(what, "tag"):
        board[KIND] = OTHER
        return
    tag = what.tag
    dst = getattr(what, "dst", None)
    if dst is not None:
        board[TAG] = tag
        board[MASK] = getattr(what, "token", 0)  # a rendezvous offer's token (0: eager, waiting for room)
        board[PEER] = dst
        board[KIND] = SEND
        return
    if type(tag) is range:  # any tag in [TAG, MASK): the mpi4py facade's ANY_TAG, within one communicator
        board[TAG], board[MASK] = tag.start, tag.stop
    else:
        board[TAG], board[MASK] = ANY_TAG if tag is None else tag, 0  # None: any tag
    src = getattr(what, "src", None)
    if src is None or src < 0:
        board[PEER] = -1
        board[KIND] = ANY
        return
    board[PEER] = src
    board[KIND] = RECV
