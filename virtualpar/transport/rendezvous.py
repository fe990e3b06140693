"""The receiver's side of a rendezvous: copy a large payload straight out of the sender's memory.

MPI's eager/rendezvous split: payloads the ring cannot hold (and those of ``RENDEZVOUS_FLOOR`` =
64 KiB or more that would have to wait for room) are not copied into the ring.  The sender writes
only a header with its pid, the payload's address and a token (``SEND_OFFERED``); the receiver's
progress engine calls :func:`take_offer`, which copies the payload with ``process_vm_readv`` into
its final buffer (one copy instead of two, and no dependence on both processes being on a core at
once), writes ``token << 1`` into the channel's reply word and rings the sender, whose send then
completes.

If the kernel refuses (another OS, a ptrace policy), the receiver answers ``(token << 1) | 1`` and
the payload is streamed through the ring after all (the sender goes ``SEND_STREAM``): the fast path
is never a requirement.  A refusal the kernel will always repeat (``PERMANENT_ERRORS``) makes this
endpoint stream every later offer too.  As with MPI's rendezvous, the sender must not modify the
array between ``isend`` and ``wait``.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import TYPE_CHECKING

from .channel import FLAG_CONTROL
from .payload import byte_view
from .shm import PERMANENT_ERRORS, read_remote

if TYPE_CHECKING:  # pragma: no cover
    from .channel import VirtualChannel
    from .endpoint import Endpoint
    from .requests import RecvRequest

__all__ = ["take_offer"]

log = logging.getLogger(__name__)


def take_offer(ep: "Endpoint", ch: "VirtualChannel", req: "RecvRequest") -> None:
    """Copy the offered payload of ``req`` out of its sender's memory (``req`` completes), or ask
    for it through the ring (``req`` becomes ``ep``'s partial receive from that sender)."""
    h = req.header
    assert h is not None
    limit = ep.eager_limit
    if limit is not None and h.nbytes > limit and not h.kind & FLAG_CONTROL:
        held = ep._unexpected.get((req.src, req.tag))
        if held and held[-1] is req:
            return  # strict mode: no receive is posted yet; Endpoint.irecv takes it when one is
    if req.target is None:
        req.target = ep._pool.raw(h.nbytes)
    err = read_remote(h.pid, h.addr, req.target, h.nbytes) if ep._can_read else errno.EPERM
    if not err:
        ch.answer(h.token << 1)
        ep._bells[req.src].release()
        ep._finish(req)
        return
    if err in PERMANENT_ERRORS:
        ep._can_read = False  # the kernel will always refuse: stream every later offer too
        log.info("endpoint %d cannot read endpoint %d's memory (%s): large messages go through the rings",
                 ep.me, req.src, os.strerror(err))
    req.expect = (h.nbytes + 7) & ~7
    req.buf = byte_view(req.target) if h.nbytes else None
    ch.answer((h.token << 1) | 1)
    ep._bells[req.src].release()
    ep._partial[req.src] = req
