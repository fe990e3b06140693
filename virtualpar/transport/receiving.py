"""The receiving half of ``Endpoint``'s progress engine: pull frames out of a ring, match them to
receives, finish them.

``_pull(src)`` consumes everything ``src`` has published: each header is matched FIFO per
(source, tag) to a posted receive, or becomes an *unexpected* one a later ``irecv`` adopts.  Then:

* a frame whole in the ring (always so for a fast-path frame) is copied into its target in one call,
  and a whole pickle is unpickled straight from the ring;
* otherwise the payload is copied out in ``CHUNK`` pieces as it arrives, the request staying the
  channel's *partial* receive in between, and the producer is rung after each piece only while it
  asks for room (:mod:`.want_room`);
* a rendezvous offer is taken out of the sender's memory (:mod:`.rendezvous`); if that fails, its
  payload comes later, streamed behind a ``FLAG_RESENT`` header that names the offer's message
  number, and is copied out as above into the receive the offer matched.

A message the endpoint sends itself never touches a ring: ``deliver_to_self`` matches it exactly as
a frame from a peer (to the earliest-posted receive that takes it, a specific one or a wildcard
one, else it waits as an unexpected message in arrival order), so MPI's ordering and ANY_SOURCE /
ANY_TAG hold for it too.  Its header is a control header: it crosses no link, so it costs no
modelled time.

An array lands in the receive's ``out=`` when shape, dtype and layout fit (its byte view is taken
when the receive is posted, off the message's path); otherwise in a fresh or pooled array, and a bad
``out=`` is reported at ``wait()`` after the bytes are drained, so the ring keeps flowing.

``Receiving`` is a mixin: the state it uses (channels, queues, pool, doorbells) is ``Endpoint``'s.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from ..errors import PayloadError, UsageError
from .channel import (FLAG_CONTROL, FLAG_RENDEZVOUS, FLAG_RESENT, FLAG_SYNC, KIND_ARRAY, KIND_PICKLE, Header,
                      VirtualChannel)
from .payload import byte_view, check_out, header_dtype, plain_array
from .rendezvous import TAG_TAKEN, take_offer, taken, tell_taken
from .requests import RecvRequest
from .want_room import FENCED, fence
from .wildcard import match_any

__all__ = ["Receiving", "CHUNK"]

CHUNK = 1 << 18  # 256 KiB: the copy granularity of eager messages, so sender and receiver overlap


class Receiving:
    """``_pull``, ``_match`` and ``finish`` of :class:`~virtualpar.transport.endpoint.Endpoint`."""

    def _pull(self, src: int) -> None:
        ch = self._in[src]
        freed = False
        try:
            while True:
                req = self._partial.get(src)
                if req is None:
                    if ch.head[0] == ch.local:
                        return
                    header = ch.read_header()
                    freed = True
                    if header is None:
                        continue  # an end-of-ring marker
                    if header.tag == TAG_TAKEN:  # a receive took a message of ours that waited for one
                        taken(self, src, int(header.stamp))
                        continue
                    if header.kind & FLAG_RESENT:  # an offer we could not read, streamed: its receive waits
                        req = self._partial[src] = self._refused.pop((src, header.seq))
                        if header.kind & FLAG_SYNC and req.claimed:  # (not if its receive gave up since)
                            req.owed = header.seq  # its sender waits to hear it was taken, once it is in
                        continue
                    req = self._match(src, header)
                    if header.kind & FLAG_RENDEZVOUS:
                        take_offer(self, ch, req)  # taken, held (strict mode) or to come streamed
                        continue
                    if req.expect == 0:
                        self.finish(req)
                        continue
                    elif req.buf is not None and ch.head[0] - ch.local >= req.expect:
                        # The whole array is in the ring (always so for a fast-path frame): one copy.
                        ch.read_into(req.buf, header.nbytes, req.expect)
                        req.buf = req.target = None
                        req.done = True
                        if req.owed:
                            self._tell_taken(req)
                        continue
                    elif req.buf is None and ch.readable() >= req.expect:  # a whole pickle in the ring
                        view = ch.peek(req.header.nbytes)
                        if view is not None:
                            self.finish(req, view)
                            ch.skip_read(req.expect)
                            continue
                    self._partial[src] = req
                    if req.buf is None:
                        req.target = self.pool.raw(req.header.nbytes)
                        req.buf = memoryview(req.target)
                while req.got < req.expect:
                    avail = ch.readable()
                    if avail <= 0:
                        return
                    n = min(avail, req.expect - req.got, CHUNK)
                    data_n = min(n, req.header.nbytes - req.got)
                    if data_n > 0:
                        ch.read_into(req.buf[req.got :], data_n)
                    if n > data_n:
                        ch.skip_read(n - max(data_n, 0))
                    req.got += n
                    freed = False
                    if req.got < req.expect:
                        self._room_freed(ch, src)  # room for the sender's next chunk
                    else:
                        freed = True
                self._partial.pop(src, None)
                self.finish(req)
        finally:
            if freed:
                self._room_freed(ch, src)

    def _room_freed(self, ch: VirtualChannel, src: int) -> None:
        """Ring ``src``'s doorbell if it waits for room in ``ch`` (always, where we cannot fence)."""
        if FENCED:
            fence()
            if not ch.want[0]:
                return
        self.doorbells[src].release()

    def _match(self, src: int, header: Header) -> RecvRequest:
        key = (src, header.tag)
        posted = self._posted.get(key)
        wild = None
        if self._posted_any:  # a wildcard receive posted before the head of ``posted`` takes it
            wild = match_any(self.queues, src, header.tag, posted[0] if posted else None)
        if wild is not None or posted:
            req = wild if wild is not None else posted.popleft()
            req.claimed = True
            if header.kind & FLAG_SYNC and not header.kind & FLAG_RENDEZVOUS:  # (an offer: take_offer says)
                req.owed = header.seq  # its sender waits to hear it was taken: once it is in (finish)
        else:
            req = RecvRequest(self, src, header.tag)
            queues = self.queues
            req.order = queues.order = queues.order + 1  # arrival order, for receives from any source
            self._unexpected[key].append(req)
        req.header = header
        req.expect = 0 if header.kind & FLAG_RENDEZVOUS else (header.nbytes + 7) & ~7  # header.padded
        if header.kind & 0xFF == KIND_ARRAY:
            target = None
            out = req.out
            if out is not None:
                if out.shape == header.shape and out.dtype is header_dtype(header.dtype):
                    if req.out_bytes is not None:
                        target = out  # the common case, checked in full below otherwise
                else:
                    try:
                        check_out(out, header)
                        if req.out_bytes is not None:
                            target = out
                    except UsageError as exc:
                        req.error = exc  # still drain the bytes, then report at wait()
            if target is None:
                if header.nbytes < self.pool.min_bytes:  # what the pool would do, minus its np.prod
                    target = np.empty(header.shape, header_dtype(header.dtype))
                else:
                    target = self.pool.array(header.shape, header_dtype(header.dtype))
            req.value = target
            if header.nbytes:
                req.target = target  # C-contiguous: a rendezvous reads into its address
                req.buf = req.out_bytes if target is out else byte_view(target)
        return req

    def _drop_partial(self) -> None:
        """Forget the partly received messages and those still to be streamed (a reset), giving
        back their pickles' raw buffers (one may be the pool's reserve, which would otherwise stay
        lent for good)."""
        for req in (*self._partial.values(), *self._refused.values()):
            header = req.header
            if req.target is not None and header is not None and header.kind & 0xFF == KIND_PICKLE:
                req.buf = None
                self.pool.give_back(req.target)
                req.target = None
        self._partial.clear()
        self._refused.clear()

    def finish(self, req: RecvRequest, data: Any = None) -> None:
        """Complete a receive whose payload is in (``data``: a whole pickle still in the ring)."""
        header = req.header
        if header is not None and header.kind & 0xFF == KIND_PICKLE:
            try:
                req.value = pickle.loads(data if data is not None else req.target)
            except Exception as exc:
                req.error = PayloadError(f"message from endpoint {req.src} (tag {req.tag}) could not be "
                                         f"unpickled: {exc}")
            if data is None:
                req.buf = None  # drop our view before the raw buffer goes back to the pool
                self.pool.give_back(req.target)
        req.buf = req.target = None
        req.done = True
        if req.owed:
            self._tell_taken(req)

    def _tell_taken(self, req: RecvRequest) -> None:
        """A receive took ``req``'s message whole: its sender waits to hear so (rendezvous.acknowledge)."""
        tell_taken(self, req.src, req.owed)
        req.owed = 0

    def deliver_to_self(self, tag: int, value: Any, nbytes: int,
                        posted_only: bool = False) -> RecvRequest | None:
        """A message to this endpoint itself (``value`` already a private copy; ``nbytes``: what a
        peer would receive of it), matched as a frame from a peer would be (see the module doc);
        returns the receive that took it, or the unexpected message a later one adopts.  With
        ``posted_only``, only to a receive already posted (else nothing happens: None)."""
        array = plain_array(value)
        kind = FLAG_CONTROL | (KIND_ARRAY if array else KIND_PICKLE)
        header = Header(kind, tag, nbytes, 0.0, 0, value.dtype.str if array else "",
                        tuple(value.shape) if array else (), 0)
        key = (self.me, tag)
        posted = self._posted.get(key)
        wild = match_any(self.queues, self.me, tag, posted[0] if posted else None) if self._posted_any \
            else None
        if wild is not None or posted:
            req = wild if wild is not None else posted.popleft()
            req.claimed = True
        elif posted_only:
            return None
        else:
            req = RecvRequest(self, self.me, tag)
            queues = self.queues
            req.order = queues.order = queues.order + 1
            self._unexpected[key].append(req)
        req.header, req.value, req.done = header, value, True
        return req
