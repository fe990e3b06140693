"""Rendezvous: a large payload copied by its receiver straight out of the sender's memory.

MPI's eager/rendezvous split: payloads the ring cannot hold (and those of ``RENDEZVOUS_FLOOR`` =
64 KiB or more that would have to wait for room) are not copied into the ring.  The sender writes
only a header with its pid, the payload's address and a token (``SEND_OFFERED``); the receiver's
progress engine calls :func:`take_offer`, which copies the payload with ``process_vm_readv`` into
its final buffer (one copy instead of two, and no dependence on both processes being on a core at
once), writes ``token << 2`` into the channel's answer word for the offer's slot and rings the
sender, whose send then completes.

A channel holds up to ``OFFER_SLOTS`` (7) offers at once, each answered in a word of its own, so
later messages do not wait behind an offer nobody has taken yet: in strict mode, and for a
synchronous send (``FLAG_SYNC``, MPI's ``Ssend``, of any size, even empty), the receiver takes an
offer only once its receive is posted, and receives may be posted in any order (MPI's rendezvous
sends complete in whatever order their receives come).  With every slot taken, a further large send
to that peer is streamed through the ring instead; a synchronous one waits for a slot.

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
from typing import TYPE_CHECKING

from .channel import FLAG_CONTROL, FLAG_RENDEZVOUS, FLAG_RESENT, FLAG_SYNC, OFFER_SLOTS, offer_slot
from .payload import byte_view
from .requests import SEND_NEW
from .shm import PERMANENT_ERRORS, read_remote

if TYPE_CHECKING:  # pragma: no cover
    from .channel import VirtualChannel
    from .endpoint import Endpoint
    from .requests import RecvRequest, SendRequest

__all__ = ["take_offer", "new_offer", "collect_answers"]

log = logging.getLogger(__name__)


def take_offer(ep: "Endpoint", ch: "VirtualChannel", req: "RecvRequest") -> None:
    """Copy the offered payload of ``req`` out of its sender's memory (``req`` completes), or ask
    for it through the ring (``req`` then waits, by its message number, for its ``FLAG_RESENT``
    frame)."""
    h = req.header
    assert h is not None
    limit = ep.eager_limit
    if (h.kind & FLAG_SYNC or limit is not None and h.nbytes > limit) and not h.kind & FLAG_CONTROL:
        held = ep._unexpected.get((req.src, req.tag))
        if held and held[-1] is req:
            return  # strict mode or Ssend: no receive is posted yet; Endpoint.irecv takes it when one is
    if req.target is None and h.nbytes:  # (an empty Ssend reads nothing)
        req.target = ep._pool.raw(h.nbytes)
    err = 0 if not h.nbytes else read_remote(h.pid, h.addr, req.target, h.nbytes) if ep._can_read else errno.EPERM
    if not err:
        ch.answer(h.token)
        ep._bells[req.src].release()
        ep._finish(req)
        return
    if err in PERMANENT_ERRORS:
        ep._can_read = False  # the kernel will always refuse: stream every later offer too
        log.info("endpoint %d cannot read endpoint %d's memory (%s): large messages go through the rings",
                 ep.me, req.src, os.strerror(err))
    req.expect = (h.nbytes + 7) & ~7
    req.buf = byte_view(req.target) if h.nbytes else None
    ep._refused[(req.src, h.seq)] = req
    ch.answer(h.token, refused=True, for_good=not ep._can_read)
    ep._bells[req.src].release()


def new_offer(ep: "Endpoint", req: "SendRequest", offers: dict[int, "SendRequest"]) -> int | None:
    """The sender's side: give ``req`` a free offer slot of its channel and a fresh token (the slot
    in its low 3 bits): ``FLAG_RENDEZVOUS``; with every slot holding an offer not answered yet,
    make it an eager message, streamed through the ring: 0 — or, for a synchronous send, which
    must stay an offer, None: it waits for a slot.  A token, once given, is kept (while
    ``req`` waits for room its slot stays free: the sends behind it in the queue cannot take it),
    so that a wait that published it on the wait board keeps naming the offer that goes out."""
    if req.token and offer_slot(req.token) not in offers:
        return FLAG_RENDEZVOUS
    for slot in range(OFFER_SLOTS):
        if slot not in offers:
            ep._token += 1
            req.token = ep._token << 3 | slot
            return FLAG_RENDEZVOUS
    if req.kind & FLAG_SYNC:
        return None
    req.kind &= ~FLAG_RENDEZVOUS
    return 0


def collect_answers(ep: "Endpoint", dst: int, ch: "VirtualChannel", offers: dict[int, "SendRequest"], queue) -> None:
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
                ep._offer_to[dst] = False
            req.kind ^= FLAG_RENDEZVOUS | FLAG_RESENT
            req.state = SEND_NEW
            queue.append(req)
        else:
            req.done = True
