"""Rendezvous: a large payload copied by its receiver straight out of the sender's memory.

MPI's eager/rendezvous split: payloads the ring cannot hold (and those of ``RENDEZVOUS_FLOOR`` =
64 KiB or more that would have to wait for room) are not copied into the ring.  The sender writes
only a header with its pid, the payload's address and a token (``SEND_OFFERED``); the receiver's
progress engine calls :func:`take_offer`, which copies the payload with ``process_vm_readv`` into
its final buffer (one copy instead of two, and no dependence on both processes being on a core at
once), writes ``token << 2`` into the channel's answer word for the offer's slot and rings the
sender, whose send then completes.

A channel holds up to ``OFFER_SLOTS`` (7) offers at once, each answered in a word of its own, so
later messages do not wait behind an offer nobody has taken yet.  A send that must wait for its
receive (``FLAG_SYNC``: strict mode above the limit, and MPI's ``Issend`` of any size, even empty)
is an offer the receiver takes only once its receive is posted (:func:`acknowledge`), and
receives may be posted in any order (MPI's rendezvous sends complete in whatever order their
receives come).  With every slot taken, a further large send to that peer is streamed through the
ring instead; one that must wait for its receive is then done when the receiver, once a receive
took it, sends back a control message (``TAG_TAKEN``) naming its message number.

If the kernel refuses (another OS, a ptrace policy), the receiver answers ``token << 2 | 1`` and
the sender streams the payload through the ring after all, behind a header of its own
(``FLAG_RESENT``, carrying the offer's message number, which routes it to the receive the offer
matched: other headers may have been written since the offer): the fast path is never a
requirement.  A refusal the kernel will always repeat (``PERMANENT_ERRORS``) makes the receiver
refuse every later offer without trying, and says so (``| 2``): the sender then streams its
later large messages at once — except in strict mode, where every send above the limit stays an
offer, held until its receive is posted, whether or not its payload can be read in place.  As
with MPI's rendezvous, the sender must not modify the array between ``isend`` and ``wait``.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .channel import FLAG_RENDEZVOUS, FLAG_RESENT, FLAG_SYNC, OFFER_SLOTS, offer_slot
from .lazy import Lazy
from .payload import byte_view
from .requests import SEND_NEW
from .shm import PERMANENT_ERRORS, read_remote

if TYPE_CHECKING:  # pragma: no cover
    from .channel import VirtualChannel
    from .endpoint import Endpoint
    from .requests import RecvRequest, SendRequest

__all__ = ["RendezvousState", "take_offer", "new_offer", "collect_answers", "acknowledge", "tell_taken",
           "taken", "TAG_TAKEN"]

TAG_TAKEN = -(1 << 40)  # control message to a sender: a receive took your message number <the stamp>
_NOTHING = np.empty(0, np.uint8)

log = logging.getLogger(__name__)


class RendezvousState:
    """An endpoint's rendezvous state, the one object these functions and the progress engine share.

    The sender's side: ``offered`` (per destination, built on first use: offer slot -> send whose
    offer is not answered yet), ``token`` (the last offer token given), ``offer_to`` (per peer: False
    once it could not read our memory) and ``unacked`` ((destination, message number) -> send: sent,
    done once a receive took it).  The receiver's: ``refused`` ((source, message number) -> receive:
    offers this endpoint could not read, to come streamed)."""

    __slots__ = ("offered", "token", "offer_to", "unacked", "refused")

    def __init__(self, peers: list[int], cross_memory: bool) -> None:
        self.offered: Lazy = Lazy(lambda p: {})
        self.token = 0
        self.offer_to = {p: cross_memory for p in peers}
        self.unacked: dict[tuple[int, int], SendRequest] = {}
        self.refused: dict[tuple[int, int], RecvRequest] = {}


def take_offer(ep: "Endpoint", ch: "VirtualChannel", req: "RecvRequest") -> None:
    """Copy the offered payload of ``req`` out of its sender's memory (``req`` completes), or ask
    for it through the ring (``req`` then waits, by its message number, for its ``FLAG_RESENT``
    frame)."""
    h = req.header
    assert h is not None
    if h.kind & FLAG_SYNC:
        held = ep.queues.unexpected.get((req.src, req.tag))
        if held and held[-1] is req:
            return  # strict mode or Issend: no receive is posted yet; acknowledge() takes it when one is
    if req.target is None and h.nbytes:  # (an empty Ssend reads nothing)
        req.target = ep.pool.raw(h.nbytes)
    err = 0 if not h.nbytes else \
        read_remote(h.pid, h.addr, req.target, h.nbytes) if ep.can_read else errno.EPERM
    if not err:
        ch.answer(h.token)
        ep.doorbells[req.src].release()
        ep.finish(req)
        return
    if err in PERMANENT_ERRORS:
        ep.can_read = False  # the kernel will always refuse: stream every later offer too
        log.info("endpoint %d cannot read endpoint %d's memory (%s): large messages go through the rings",
                 ep.me, req.src, os.strerror(err))
    req.expect = (h.nbytes + 7) & ~7
    req.buf = byte_view(req.target) if h.nbytes else None
    ep.rendezvous.refused[(req.src, h.seq)] = req
    ch.answer(h.token, refused=True, for_good=not ep.can_read)
    ep.doorbells[req.src].release()


def new_offer(ep: "Endpoint", req: "SendRequest", offers: dict[int, "SendRequest"]) -> int:
    """The sender's side: give ``req`` a free offer slot of its channel and a fresh token (the slot
    in its low 3 bits): ``FLAG_RENDEZVOUS``; with every slot holding an offer not answered yet,
    make it an eager message, streamed through the ring: 0 (one that waits for its receive,
    ``FLAG_SYNC``, is then done when its receiver acknowledges it).  A token, once given, is kept (while
    ``req`` waits for room its slot stays free: the sends behind it in the queue cannot take it),
    so that a wait that published it on the wait board keeps naming the offer that goes out."""
    if req.token and offer_slot(req.token) not in offers:
        return FLAG_RENDEZVOUS
    for slot in range(OFFER_SLOTS):
        if slot not in offers:
            state = ep.rendezvous
            state.token += 1
            req.token = state.token << 3 | slot
            return FLAG_RENDEZVOUS
    req.kind &= ~FLAG_RENDEZVOUS
    return 0


def collect_answers(ep: "Endpoint", dst: int, ch: "VirtualChannel", offers: dict[int, "SendRequest"],
                    queue: Any) -> None:
    """The sender's side: finish every offer to ``dst`` its receiver has taken; queue every one it
    could not read to be streamed, behind a ``FLAG_RESENT`` header (and, if it never will, later
    ones at once, outside strict mode)."""
    for slot, req in list(offers.items()):
        answer = ch.reply(slot)
        if answer >> 2 != req.token:
            continue  # not answered yet (or the slot still shows an earlier offer's answer)
        del offers[slot]
        if answer & 1:  # it could not read our memory: stream this one (and, if for good, later ones)
            if answer & 2:
                ep.rendezvous.offer_to[dst] = False
            req.kind ^= FLAG_RENDEZVOUS | FLAG_RESENT
            req.state = SEND_NEW
            queue.append(req)
        else:
            req.done = True


def acknowledge(ep: "Endpoint", req: "RecvRequest") -> None:
    """A receive took ``req``'s message, whose sender waits for that (``FLAG_SYNC``: strict mode,
    ``Issend``): take its offer if it is one still held, or tell its sender (a control message,
    ``TAG_TAKEN``, its number as the stamp: control messages carry no modelled time) once the
    message is in whole."""
    h = req.header
    if h.kind & FLAG_RENDEZVOUS and not req.done and req.expect == 0:  # an offer still held
        take_offer(ep, ep.inbound(req.src), req)
    elif req.done:  # (an eager one, or a refused offer streamed since: its sender waits for TAG_TAKEN)
        tell_taken(ep, req.src, h.seq)
    else:  # still arriving: once it is in whole (Receiving._finish), so that a receive that gives up
        req.owed = h.seq  # on it meanwhile (leftovers.withdraw) has not told its sender it was taken


def tell_taken(ep: "Endpoint", src: int, seq: int) -> None:
    """Tell ``src`` that a receive took its message ``seq`` (see :func:`acknowledge`)."""
    ep.isend(_NOTHING, src, TAG_TAKEN, stamp=float(seq), control=True)


def taken(ep: "Endpoint", src: int, seq: int) -> None:
    """The sender's side of :func:`acknowledge`: message ``seq`` to ``src`` is done once all of it
    is written (a receive may take it as soon as its header arrives)."""
    req = ep.rendezvous.unacked.pop((src, seq), None)
    if req is not None and req.written >= req.padded:
        req.done = True
